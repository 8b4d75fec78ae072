#!/usr/bin/env bash
# What enforcing a JSON schema costs in decode: mlxcel-server on SmolLM2,
# 1 and 8 concurrent streams, the same requests with and without
# `response_format`, decode tokens/s from each answer's llama-server-style
# `timings.predicted_per_second`, and the time the masks add to a decode
# step (1/with − 1/without; the engine thread masks every constrained
# sequence of the batch in turn, so per token that is divided by the streams). Results go in docs/benchmarks.md
# ("Structured output").
#
#   bash bench/structured.sh                 # release binaries of this tree
#   STREAMS="1 8" REQS=3 ROUNDS=1 THREADS=2 bash bench/structured.sh
#
# ROUNDS > 1 alternates free and constrained batches (the order swapped
# each round) so minute-to-minute drift falls on both alike; the table
# gives the medians over every request, and the per-round ratios show the
# spread.
#
# The constrained answer is a JSON array of exactly 40 integers in 0..=999
# (~120–160 tokens, the length forced by the schema); the unconstrained one
# is 128 tokens with ignore_eos. Both are greedy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${MLXCEL_BIN_DIR:-$root/target/release}
python=${PYTHON:-$root/.deps/venv/bin/python}
streams=${STREAMS:-"1 8"}
reqs=${REQS:-3}
threads=${THREADS:-2}
rounds=${ROUNDS:-1}
work=$root/target/bench/structured
mkdir -p "$work"
bundle=$work/smollm2.mlxb
gguf=$root/.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -x "$bin/mlxcel-server" ] || { echo "structured.sh: $bin/mlxcel-server missing (cargo build --release)" >&2; exit 1; }
# Compiled afresh each run: a bundle left by an older build could lack what
# this one writes (the token-bytes section).
"$bin/mlxcel-compile" "$gguf" -o "$bundle" --quiet
log=$work/server.log
"$bin/mlxcel-server" --bundle "$bundle" --port 0 -np 8 -t "$threads" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
addr=
for _ in $(seq 600); do
  addr=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's|listening on http://||') || true
  [ -n "$addr" ] && curl -sf "http://$addr/health" >/dev/null 2>&1 && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "structured.sh: the server did not start:" >&2; cat "$log" >&2; exit 1; }
"$python" - "$addr" "$streams" "$reqs" "$threads" "$rounds" <<'EOF'
import json, sys, threading, time, urllib.request, statistics, platform
addr, streams, reqs, threads = sys.argv[1], [int(s) for s in sys.argv[2].split()], int(sys.argv[3]), sys.argv[4]
rounds = int(sys.argv[5])
schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 40, "maxItems": 40}

def ask(constrained, i):
    body = {"messages": [{"role": "user", "content": f"List forty numbers, take {i}."}], "temperature": 0}
    if constrained:
        body.update(max_tokens=400, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    else:
        body.update(max_tokens=128, ignore_eos=True)
    req = urllib.request.Request(f"http://{addr}/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=600))
    if constrained:
        assert len(json.loads(r["choices"][0]["message"]["content"])) == 40
    return r["timings"]["predicted_per_second"], r["timings"]["predicted_n"]

def run(constrained, n, warm):
    rates = []
    lock = threading.Lock()
    def worker(w):
        for k in range(reqs):
            rate, _ = ask(constrained, w * 100 + k)
            with lock:
                rates.append(rate)
    if warm:
        ask(constrained, 0)  # warm-up
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(n)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return rates

print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
      f"SmolLM2-135M-Instruct Q4_1, mlxcel-server -np 8 -t {threads}, greedy, {reqs} requests per stream, "
      f"{rounds} alternated round(s)\n")
print("| streams | decode tok/s per stream, free | with a JSON schema | slower by | added ms per step | mask ms per token |")
print("|--:|--:|--:|--:|--:|--:|")
spreads = []
for n in streams:
    frees, cons, ratios = [], [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {c: run(c, n, warm=(r == 0)) for c in order}
        frees += got[False]
        cons += got[True]
        ratios.append(statistics.median(got[False]) / statistics.median(got[True]) - 1)
    free, constrained = statistics.median(frees), statistics.median(cons)
    spreads.append((n, ratios))
    # Each step masks every constrained sequence of the batch in turn.
    step_ms = (1 / constrained - 1 / free) * 1e3
    print(f"| {n} | {free:.1f} | {constrained:.1f} | {100 * (free / constrained - 1):.1f}% | {step_ms:.2f} | {step_ms / n:.2f} |")
if rounds > 1:
    print()
    for n, ratios in spreads:
        print(f"{n} stream(s), slower by per round: " + ", ".join(f"{100 * x:.1f}%" for x in ratios))
EOF
