<?php
// mcload.php - a closed-loop memcached load generator built on PHP's pecl memcache
// extension (Debian: php-cli php-memcache), used by `kedge bench hedge --scenario memcached`.
//
// The memcached protocol is the extension's, not ours: its MemcachePool sends a get of an
// array of keys over UDP (memcached's 8-byte frame header, request id per server) when the
// server was added with a UDP port, and every write over TCP. This script only chooses the
// operations (a seeded share of sets), times them and writes what it saw as JSON.
//
// usage: php mcload.php HOST PORT OPS WARMUP SET_PCT KEYS SEED OUT.json
// Keys are k0..k{KEYS-1}; the harness stores them on every replica first. A get that returns
// no value (a miss, or the extension's timeout) is recorded with ok false.

if ($argc != 9) {
	fwrite(STDERR, "usage: php mcload.php HOST PORT OPS WARMUP SET_PCT KEYS SEED OUT.json\n");
	exit(2);
}
[, $host, $port, $ops, $warmup, $setPct, $keys, $seed, $out] = $argv;
if (!class_exists('MemcachePool')) {
	fwrite(STDERR, "mcload: the memcache extension is not loaded: apt-get install php-memcache\n");
	exit(2);
}
$port = (int)$port;
// Reads: UDP (and TCP only if UDP fails); writes: TCP. Not persistent: one process, one pool.
$pool = new MemcachePool();
if (!$pool->addServer($host, $port, $port, false, 1, 1, 15)) {
	fwrite(STDERR, "mcload: addServer $host:$port failed\n");
	exit(1);
}
mt_srand((int)$seed);
$lat = [];
$ok = [];
$sets = 0;
$setsAll = 0; // warm-up included: what memcached's cmd_set counts
$setFailed = 0;
$setUS = [];
$start = 0;
$total = (int)$ops + (int)$warmup;
for ($i = 0; $i < $total; $i++) {
	if ($i == (int)$warmup) {
		$start = hrtime(true);
	}
	$key = 'k' . mt_rand(0, (int)$keys - 1);
	if (mt_rand(0, 99) < (int)$setPct) {
		$t0 = hrtime(true);
		$r = $pool->set($key, 'v' . $i);
		$t1 = hrtime(true);
		$setsAll++;
		if ($i >= (int)$warmup) {
			$sets++;
			$setUS[] = ($t1 - $t0) / 1000;
			if (!$r) {
				$setFailed++;
			}
		}
		continue;
	}
	$t0 = hrtime(true);
	$v = $pool->get([$key]);
	$t1 = hrtime(true);
	if ($i >= (int)$warmup) {
		$lat[] = ($t1 - $t0) / 1000;
		$ok[] = is_array($v) && isset($v[$key]);
	}
}
$elapsed = (hrtime(true) - $start) / 1e9;
$res = ['client' => 'php-memcache ' . phpversion('memcache'), 'gets' => count($lat), 'sets' => $sets, 'sets_all' => $setsAll,
	'set_failed' => $setFailed, 'elapsed_s' => $elapsed, 'get_latencies_us' => $lat, 'get_ok' => $ok,
	'set_latencies_us' => $setUS];
if (file_put_contents($out, json_encode($res)) === false) {
	fwrite(STDERR, "mcload: cannot write $out\n");
	exit(1);
}
