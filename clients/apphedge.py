#!/usr/bin/env python3
"""App-hedged benchmark client in Python, faithful to the thesis's select-based client
(Fornaini 2026, Algorithm 4): send the request; select() until the hedge delay (10 ms); if
nothing arrived, send the hedge (same address, or --alt); select() until the timeout; record
the latency with time.perf_counter(). Responses whose id is not the current one (late answers
to earlier requests) are ignored and counted. The one change to Algorithm 4: the timeout is
measured from the first send (not restarted after the hedge), like the Go clients.

--mode baseline gives the thesis's baseline / kernel-hedged client (Algorithm 5): send, then a
blocking receive with a timeout, no hedging.

Standard library only. Same flags and the same result schema (kedge.bench/v1) as
`kedge chaos client`, so `kedge chaos report` merges its output with the Go clients'.

Example:
  python3 clients/apphedge.py --target 127.0.0.1:9999 -n 5000 --warmup 200 --out py.json
"""

import argparse
import datetime
import json
import math
import os
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time

SCHEMA = "kedge.bench/v1"
ID_LEN = 4
MAX_DATAGRAM = 2048

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text):
    """Parses a Go-style duration ("10ms", "1s", "1m30s", "250us") into seconds."""
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 10ms, 1s)")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def resolve(hostport):
    host, sep, port = hostport.rpartition(":")
    if not sep:
        raise ValueError(f"address {hostport!r} has no port")
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)
    family, _, _, _, addr = infos[0]
    return family, addr


def loop_span(total, concurrency):
    """Id range of each loop: its share rounded up to a multiple of 100 (as in the Go client)."""
    per = (total + concurrency - 1) // concurrency
    return (per + 99) // 100 * 100


def share(total, concurrency, k):
    return total // concurrency + (1 if k < total % concurrency else 0)


class Loop:
    """One sequential client with its own socket(s)."""

    def __init__(self, args, target, alt):
        family, self.dest = target
        self.hedge_dest = alt[1] if alt else self.dest
        self.connected = args.connected
        self.delay = args.delay
        self.timeout = args.timeout
        self.hedges = 0
        self.late = 0
        self.strays = []  # ids of the late responses that carried one
        self.socks = [socket.socket(family, socket.SOCK_DGRAM)]
        if self.connected:
            self.socks[0].connect(self.dest)
            if alt and self.hedge_dest != self.dest:
                s = socket.socket(family, socket.SOCK_DGRAM)
                s.connect(self.hedge_dest)
                self.socks.append(s)

    def close(self):
        for s in self.socks:
            s.close()

    def send(self, pkt, hedge):
        if self.connected:
            self.socks[-1 if hedge else 0].send(pkt)
        else:
            self.socks[0].sendto(pkt, self.hedge_dest if hedge else self.dest)

    def matches(self, sock, rid):
        try:
            data = sock.recv(MAX_DATAGRAM)
        except ConnectionRefusedError:  # ICMP unreachable on a connected socket
            return False
        if len(data) >= ID_LEN and struct.unpack_from("!I", data)[0] == rid:
            return True
        self.late += 1
        if len(data) >= ID_LEN:
            self.strays.append(struct.unpack_from("!I", data)[0])
        return False

    def apphedge(self, pkt, rid):
        """Algorithm 4. Returns (latency seconds, ok)."""
        start = time.perf_counter()
        self.send(pkt, False)
        hedged = False
        while True:
            now = time.perf_counter()
            if not hedged:
                wait = start + self.delay - now
                if wait <= 0:
                    self.send(pkt, True)  # the hedge
                    self.hedges += 1
                    hedged = True
                    continue
            else:
                wait = start + self.timeout - now
                if wait <= 0:
                    return now - start, False
            ready, _, _ = select.select(self.socks, [], [], wait)
            for s in ready:
                if self.matches(s, rid):
                    return time.perf_counter() - start, True

    def baseline(self, pkt, rid):
        """Algorithm 5: send, blocking receive with a timeout."""
        start = time.perf_counter()
        self.send(pkt, False)
        sock = self.socks[0]
        while True:
            remaining = start + self.timeout - time.perf_counter()
            if remaining <= 0:
                return time.perf_counter() - start, False
            sock.settimeout(remaining)
            try:
                if self.matches(sock, rid):
                    return time.perf_counter() - start, True
            except socket.timeout:
                return time.perf_counter() - start, False


def run_loop(args, target, alt, first, warmup, n, out, k):
    loop = Loop(args, target, alt)
    do = loop.apphedge if args.mode == "apphedge" else loop.baseline
    pkt = bytearray(args.payload)
    samples = []
    answered = set()
    start = time.perf_counter()
    try:
        for i in range(warmup + n):
            if i == warmup:
                loop.hedges = loop.late = 0
                loop.strays = []
                start = time.perf_counter()
            rid = first + i
            struct.pack_into("!I", pkt, 0, rid)
            lat, ok = do(bytes(pkt), rid)
            if ok:
                answered.add(rid)
            if i >= warmup:
                samples.append((rid, lat, ok))
        # Duplicates: late responses whose request had been answered (not timed out).
        duplicates = sum(1 for s in loop.strays if s in answered)
        out[k] = (samples, loop.hedges, loop.late, time.perf_counter() - start, duplicates)
    finally:
        loop.close()


def percentile(sorted_vals, p):
    """Nearest rank, as internal/bench.Percentile."""
    if not sorted_vals:
        return float("nan")
    if p <= 0:
        return sorted_vals[0]
    rank = math.ceil(p / 100 * len(sorted_vals) - 1e-9)
    return sorted_vals[max(1, min(rank, len(sorted_vals))) - 1]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name":
                    return val.strip()
    except OSError:
        pass
    return ""


def git_commit():
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return res.stdout.strip() if res.returncode == 0 else "unknown"


def load_avg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["apphedge", "baseline"], default="apphedge")
    ap.add_argument("--target", default="127.0.0.1:9999", help="server address host:port")
    ap.add_argument("--alt", default="", help="apphedge: send hedges to this replica instead of --target")
    ap.add_argument("--connected", action="store_true", help="use connect()ed sockets")
    ap.add_argument("-n", "--requests", type=int, default=5000, dest="n", help="measured requests")
    ap.add_argument("--warmup", type=int, default=200, help="warm-up requests, discarded")
    ap.add_argument("--base-id", type=int, default=0, help="first request id")
    ap.add_argument("--delay", type=parse_duration, default=0.010, help="hedge delay (default 10ms)")
    ap.add_argument("--timeout", type=parse_duration, default=1.0, help="request timeout (default 1s)")
    ap.add_argument("--concurrency", type=int, default=1, help="independent loops (threads), disjoint id ranges")
    ap.add_argument("--payload", type=int, default=32, help="datagram length in bytes (>= 4)")
    ap.add_argument("--name", default="", help="series name (default from --mode)")
    ap.add_argument("--scenario", default="chaos", help="scenario name recorded in the result")
    ap.add_argument("--out", required=True, help="result file (JSON)")
    args = ap.parse_args(argv)

    if args.n < 1 or args.warmup < 0:
        ap.error("need -n >= 1 and --warmup >= 0")
    if not 1 <= args.concurrency <= args.n:
        ap.error(f"--concurrency must be in 1..{args.n}")
    if not ID_LEN <= args.payload <= MAX_DATAGRAM:
        ap.error(f"--payload must be in {ID_LEN}..{MAX_DATAGRAM}")
    if args.mode == "apphedge" and not 0 < args.delay < args.timeout:
        ap.error("--delay must be positive and below --timeout")
    if args.mode == "baseline" and args.alt:
        ap.error("the baseline client does not hedge: --alt is for apphedge")
    span = loop_span(args.n + args.warmup, args.concurrency)
    if not 0 <= args.base_id or args.base_id + span * args.concurrency > 1 << 32:
        ap.error("request ids overflow 32 bits")
    try:
        target = resolve(args.target)
        alt = resolve(args.alt) if args.alt else None
    except (OSError, ValueError) as e:
        ap.error(f"resolve address: {e}")
    if alt and alt[0] != target[0]:
        ap.error("--target and --alt are of different address families")

    load = load_avg()
    results = [None] * args.concurrency
    threads = [
        threading.Thread(target=run_loop, args=(args, target, alt, args.base_id + k * span,
                                                share(args.warmup, args.concurrency, k),
                                                share(args.n, args.concurrency, k), results, k))
        for k in range(args.concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(r is None for r in results):
        print("apphedge.py: run client: a loop failed (see above)", file=sys.stderr)
        return 1

    samples = [s for r in results for s in r[0]]
    hedges = sum(r[1] for r in results)
    name = args.name or {"apphedge": "app-hedged (Python)", "baseline": "baseline (Python)"}[args.mode]
    series = {
        "name": name,
        "client": "py-" + args.mode,
        "ids": [s[0] for s in samples],
        "latencies_us": [round(s[1] * 1e6, 3) for s in samples],
        "ok": [s[2] for s in samples],
        "timeouts": sum(1 for s in samples if not s[2]),
        "late_duplicates": sum(r[2] for r in results),
        "duplicates": sum(r[4] for r in results),
        "elapsed_s": max(r[3] for r in results),
    }
    params = {"mode": args.mode, "target": args.target, "connected": args.connected, "n": args.n,
              "warmup": args.warmup, "base_id": args.base_id, "timeout_ms": args.timeout * 1e3,
              "concurrency": args.concurrency, "payload_len": args.payload}
    if args.mode == "apphedge":
        series["hedges_sent"] = hedges
        series["backend"] = "alt replica" if alt and alt[1] != target[1] else "same"
        params["delay_ms"] = args.delay * 1e3
        if args.alt:
            params["alt"] = args.alt
    result = {
        "schema": SCHEMA,
        "scenario": args.scenario,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"hostname": socket.gethostname(), "cpu_model": cpu_model(), "nproc": os.cpu_count() or 0},
        "kernel": os.uname().release,
        "commit": git_commit(),
        "load_avg": load,
        "parameters": params,
        "series": [series],
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)

    ms = sorted(s[1] * 1e3 for s in samples)
    print(f"{name}: P50 {percentile(ms, 50):.2f} ms, P95 {percentile(ms, 95):.2f} ms, "
          f"P99 {percentile(ms, 99):.2f} ms, P99.9 {percentile(ms, 99.9):.2f} ms, MAX {ms[-1]:.2f} ms, "
          f"{series['timeouts']} timeouts, {series['late_duplicates']} late duplicates"
          + (f", {hedges} hedges sent" if args.mode == "apphedge" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
