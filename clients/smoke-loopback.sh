#!/usr/bin/env bash
# Loopback smoke run of the Deterministic Chaos benchmark, thesis setting (Table 4.1): one
# server replica on 127.0.0.1, 5000 requests + 200 warm-up per client, 2% of ids stall 400 ms,
# hedge after 10 ms to the same address (the replay memory answers the hedge fast).
# Clients: baseline (Go), app-hedged (Go), app-hedged (Python). No BPF, no root needed.
#
#   clients/smoke-loopback.sh [OUT_DIR]      (default results/tmp/chaos-loopback)
#
# Prints the table and writes the client results, the merged result and the charts to OUT_DIR.
# Every process is bounded: the server stops after 10 minutes at the latest.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/tmp/chaos-loopback}
n=${N:-5000}
warmup=${WARMUP:-200}
port=${PORT:-39999}
mkdir -p "$out"

kedge=$(mktemp -d)/kedge
CGO_ENABLED=0 go build -o "$kedge" ./cmd/kedge

"$kedge" chaos serve --listen "127.0.0.1:$port" --stall-pct 2 --stall 400ms --fast 2ms --ttl 1s \
	--duration 10m -o json >"$out/server-stats.json" 2>"$out/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$(dirname "$kedge")"' EXIT
# Wait (bounded) until the server answers.
for _ in $(seq 100); do
	grep -q "listening" "$out/server.log" 2>/dev/null && break
	sleep 0.1
done

# Distinct id ranges (multiples of 100, so the same stall pattern) keep one client's ids out
# of the replay memory of the previous one.
common=(--target "127.0.0.1:$port" -n "$n" --warmup "$warmup" --timeout 1s --scenario chaos-loopback)
"$kedge" chaos client --mode baseline --base-id 0 --out "$out/baseline.json" "${common[@]}" >/dev/null
"$kedge" chaos client --mode apphedge --delay 10ms --base-id 1000000 --out "$out/apphedge-go.json" "${common[@]}" >/dev/null
python3 clients/apphedge.py --mode apphedge --delay 10ms --base-id 2000000 --out "$out/apphedge-py.json" "${common[@]}" >/dev/null

kill -INT "$server"
wait "$server" || true
"$kedge" chaos report "$out/baseline.json" "$out/apphedge-go.json" "$out/apphedge-py.json" \
	--stall-pct 2 --delay 10ms --merged "$out/merged.json" --charts "$out"
echo "server counters: $(tr -d ' \n' <"$out/server-stats.json")"
