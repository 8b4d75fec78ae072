#!/usr/bin/env bash
# Serving throughput and latency of mlxcel-server against llama.cpp's
# llama-server and mlx-lm's mlx_lm.server, on the same weights, in the same run
# (results in docs/benchmarks.md, "Server").
#
#   bash bench/server.sh                        # every server, 1/4/16 streams, 128 in / 64 out
#   STREAMS="1 4" ISL=256 OSL=128 bash bench/server.sh
#   SERVERS="llama-server" QUANTS=Q4_0 bash bench/server.sh
#   SKIP_MLX_LM=1 bash bench/server.sh          # mlx_lm.server on CPU is slow
#   MLXCEL_BIN_DIR=/work/main/target/release bash bench/server.sh   # build no mlxcel binary
#
# Settings (environment): STREAMS (concurrent streams per run, "1 4 16"),
# ISL / OSL (prompt / output tokens per request, 128 / 64), REQS (requests per
# stream in each run, 4; each run first sends one warm-up request per stream),
# PARALLEL (server slots, -np, 16), THREADS (server threads, 2), QUANTS
# ("Q4_1 Q4_0"), SERVERS ("mlxcel-server llama-server mlx_lm.server";
# `mlxcel-server@rows16` serves a bundle compiled with --weight-layout rows16,
# `mlxcel-server@row-major` one compiled with row-major, plain `mlxcel-server`
# one compiled with the compiler's default),
# ENDPOINT (completions or chat; completions keeps the prompt at exactly ISL
# tokens, chat adds the template's), BENCH_DIR (target/bench).
#
# The load generator is NVIDIA's AIPerf (aiperf==0.13.0, pinned with hashes in
# deps/bench.txt, installed in its own venv .deps/bench-venv). Why AIPerf:
# it installs from PyPI wheels alone on Python 3.11 without torch, drives any
# OpenAI-compatible endpoint with synthetic prompts of a fixed token length
# (--synthetic-input-tokens-stddev 0) and a fixed output length
# (--output-tokens-stddev 0, with ignore_eos so that an end token does not cut
# a request short) at a fixed concurrency, and writes output token throughput,
# TTFT and ITL percentiles as JSON. guidellm 0.8.1, the other candidate,
# requires torch, which from PyPI brings ~4 GB of CUDA wheels to a CPU machine.
# AIPerf counts tokens with the model's own tokenizer (the tokenizer.json the
# bundle carries, exported with the weights).
#
# Every run draws its own prompts (seed = its stream count, each prompt sent
# once), so no server answers from a prompt cache filled by an earlier run.
#
# For each model (the SmolLM2-135M Q4_1 GGUF of `make setup`; a Q4_0 made from
# it by llama-quantize, since llama.cpp repacks only Q4_0 for x86 and Q4_1
# would flatter us) and each server:
#   - mlxcel-server --bundle (mlxcel-compile of the GGUF) -np PARALLEL -t THREADS;
#   - llama-server -m GGUF -np PARALLEL -t THREADS (llama.cpp 0.3.36's vendored
#     copy, built by bench/llama_cpp.sh);
#   - mlx_lm.server on the bundle's weights exported by the export_mlx_lm
#     example (the reference venv's mlx-lm, CPU, --decode-concurrency PARALLEL);
# the script starts the server, waits for GET /health 200, runs AIPerf once per
# stream count, and stops the server (SIGTERM). For every run it also records
# the CPU time the load generator and the server spent (in cores: CPU seconds
# over wall seconds), since all of them share this machine's cores.
#
# It prints one table (server, streams, output tok/s, TTFT p50/p99, ITL
# p50/p99, ratios against llama-server) and mlxcel-server's targets:
# throughput at 16 streams >= 4x its single stream and >= 1.5x llama-server's;
# TTFT at 1 stream <= llama-server's; ITL p99 at 16 streams <= 3x at 1. The
# table is also written to BENCH_DIR/server/table.md, the raw results to
# BENCH_DIR/server/results.jsonl, AIPerf's exports to BENCH_DIR/server/runs/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/llama_cpp.sh
source bench/llama_cpp.sh

streams=${STREAMS:-1 4 16}
isl=${ISL:-128}
osl=${OSL:-64}
reqs=${REQS:-4}
parallel=${PARALLEL:-16}
threads=${THREADS:-2}
quants=${QUANTS:-Q4_1 Q4_0}
servers=${SERVERS:-mlxcel-server llama-server mlx_lm.server}
endpoint=${ENDPOINT:-completions}
work=${BENCH_DIR:-$root/target/bench}/server
deps=${MLXCEL_DEPS_DIR:-$root/.deps}
# Each slot gets the whole prompt and output, with room for the template
# (llama-server's -c is shared by its slots, mlxcel-server's is per request).
ctx_per_slot=$((isl + osl + 64))

die() { printf 'bench/server.sh: error: %s\n' "$*" >&2; exit 1; }
say() { printf 'bench/server.sh: %s\n' "$*" >&2; }
if [ -n "${SKIP_MLX_LM:-}" ]; then servers=${servers//mlx_lm.server/}; fi
case "$endpoint" in completions | chat) ;; *) die "ENDPOINT must be completions or chat, not $endpoint" ;; esac
mkdir -p "$work/runs"

make -s setup
py=$deps/venv/bin/python

# ---- the load generator, pinned, in its own venv -----------------------------
bench_venv=$deps/bench-venv
bench_lock=$root/deps/bench.txt
lock_hash=$(sha256sum "$bench_lock" | cut -d' ' -f1)
if [ ! -x "$bench_venv/bin/aiperf" ] || [ "$(cat "$bench_venv/.lock-hash" 2>/dev/null)" != "$lock_hash" ]; then
  say "installing the load generator (aiperf, deps/bench.txt) into $bench_venv"
  [ -x "$bench_venv/bin/python" ] || python3 -m venv "$bench_venv"
  "$bench_venv/bin/python" -m pip install --quiet --no-deps --require-hashes --only-binary=:all: -r "$bench_lock" ||
    die "could not install the load generator pinned in $bench_lock"
  echo "$lock_hash" >"$bench_venv/.lock-hash"
fi

# ---- llama.cpp ----------------------------------------------------------------
llama_cpp_build llama-server llama-quantize

# ---- mlxcel -------------------------------------------------------------------
if [ -n "${MLXCEL_BIN_DIR:-}" ]; then
  bin=$MLXCEL_BIN_DIR
  export_mlx_lm=${EXPORT_MLX_LM:-$bin/examples/export_mlx_lm}
else
  bin=$root/target/release
  export_mlx_lm=$bin/examples/export_mlx_lm
  say "building mlxcel (release)"
  cargo build -q --release -p mlxcel-cli -p mlxcel-compiler
  cargo build -q --release -p mlxcel-tests --example export_mlx_lm
fi
[ -x "$bin/mlxcel-compile" ] || die "$bin/mlxcel-compile is missing"
[ -x "$export_mlx_lm" ] || die "$export_mlx_lm is missing (cargo build --release -p mlxcel-tests --example export_mlx_lm)"
if [[ " $servers " == *" mlxcel-server"* ]] && [ ! -x "$bin/mlxcel-server" ]; then
  say "$bin/mlxcel-server does not exist: mlxcel-server's rows are left out (pending)"
  servers=$(printf '%s\n' $servers | grep -v '^mlxcel-server' | tr '\n' ' ')
fi
export MLXCEL_DEVICE=cpu

# ---- servers --------------------------------------------------------------------
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
server_pid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$server_pid" 2>/dev/null; then
      say "server $server_pid did not exit 30 s after SIGTERM: killing it"
      kill -KILL "$server_pid"
    fi
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
trap stop_server EXIT

# start_server NAME LOG CMD... : starts CMD in the background and waits for GET
# /health to answer 200 (up to 300 s); dies with the log's tail when it exits.
start_server() {
  local name=$1 log=$2; shift 2
  "$@" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 3000); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      tail -20 "$log" >&2
      server_pid=""
      die "$name exited before /health answered 200 (log: $log)"
    fi
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.1
  done
  tail -20 "$log" >&2
  die "$name: /health did not answer 200 within 300 s (log: $log)"
}

# cached_tokens : prompt tokens mlxcel-server has taken from its prefix cache so
# far (its /metrics), empty for other servers. Every run draws prompts no
# earlier run used (its own seed, no entry twice), so this stays 0 unless
# AIPerf repeats itself (the table's last column shows it).
cached_tokens() {
  curl -s "http://127.0.0.1:$port/metrics" 2>/dev/null | awk '/^mlxcel_prefix_cache_tokens_total /{print $2}'
}

# cpu_ticks PID : user + system clock ticks the process has used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run_load SERVER QUANT MODEL_ID TOKENIZER : one AIPerf run per stream count,
# appending one JSON line per run to results.jsonl.
run_load() {
  local server=$1 quant=$2 model=$3 tokenizer=$4 n dir t0 t1 s0 s1 extra=()
  # ignore_eos (llama-server's field) makes every request generate exactly OSL
  # tokens. mlx_lm.server has no such field (it ignores it and stops at an end
  # token); a server that refuses it (400) runs without it. The "out tok/req"
  # column shows what each request really generated.
  if [ "$server" != mlx_lm.server ] && [ "$(curl -s -o /dev/null -w '%{http_code}' \
    -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/completions" \
    -d "{\"model\": \"$model\", \"prompt\": \"Hi\", \"max_tokens\": 1, \"ignore_eos\": true}")" = 200 ]; then
    extra=(--extra-inputs ignore_eos:true)
  else
    say "$server: no ignore_eos; requests may end before $osl tokens"
  fi
  for n in $streams; do
    dir=$work/runs/$server-$quant-c$n
    rm -rf "$dir"
    say "$server $quant: $n stream(s), $((n * reqs)) requests of $isl in / $osl out"
    c0=$(cached_tokens)
    s0=$(cpu_ticks "$server_pid")
    t0=$(date +%s.%N)
    # AIPerf's own CPU time is what /usr/bin/time reports for it and its
    # worker processes (they are its children).
    /usr/bin/time -f '%U %S %e' -o "$dir.time" "$bench_venv/bin/aiperf" profile \
      --model "$model" --url "http://127.0.0.1:$port" --endpoint-type "$endpoint" --streaming \
      --tokenizer "$tokenizer" \
      --synthetic-input-tokens-mean "$isl" --synthetic-input-tokens-stddev 0 \
      --output-tokens-mean "$osl" --output-tokens-stddev 0 "${extra[@]}" \
      --concurrency "$n" --request-count "$((n * reqs))" --warmup-request-count "$n" \
      --num-dataset-entries "$((n * (reqs + 1)))" --dataset-sampling-strategy shuffle \
      --random-seed "$n" --artifact-dir "$dir" --ui-type none >"$dir.log" 2>&1 ||
      { tail -30 "$dir.log" >&2; die "aiperf failed against $server (log: $dir.log)"; }
    t1=$(date +%s.%N)
    s1=$(cpu_ticks "$server_pid")
    c1=$(cached_tokens)
    "$py" - "$dir" "$server" "$quant" "$n" "$dir.time" "$s0" "$s1" "$t0" "$t1" "$(getconf CLK_TCK)" "$c0" "$c1" >>"$work/results.jsonl" <<'EOF'
import glob, json, sys
d, server, quant, n, timef, s0, s1, t0, t1, hz, c0, c1 = sys.argv[1:]
found = glob.glob(f"{d}/**/profile_export_aiperf.json", recursive=True)
if not found:
    sys.exit(f"no profile_export_aiperf.json under {d}")
m = json.load(open(found[0]))
m = m.get("records", m)
def metric(name, stat):
    v = m.get(name)
    if not isinstance(v, dict) or v.get(stat) is None:
        sys.exit(f"{found[0]}: no {name}.{stat}")
    return float(v[stat])
user, system, wall = map(float, open(timef).read().split()[-3:])
span = float(t1) - float(t0)
print(json.dumps({
    "server": server, "quant": quant, "streams": int(n),
    "tok_s": metric("output_token_throughput", "avg"),
    "ttft_p50": metric("time_to_first_token", "p50"), "ttft_p99": metric("time_to_first_token", "p99"),
    "itl_p50": metric("inter_token_latency", "p50"), "itl_p99": metric("inter_token_latency", "p99"),
    "osl_avg": metric("output_sequence_length", "avg"),
    "loadgen_cores": (user + system) / wall,
    "server_cores": (int(s1) - int(s0)) / int(hz) / span,
    "cached_tokens": int(c1) - int(c0) if c0 and c1 else None,
}))
EOF
  done
}

: >"$work/results.jsonl"
gguf_q41=$deps/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf_q41" ] || die "$gguf_q41 is missing (make setup)"
for quant in $quants; do
  case "$quant" in
    Q4_1) gguf=$gguf_q41 ;;
    *)
      gguf=$work/SmolLM2-135M-Instruct.$quant.gguf
      if [ ! -f "$gguf" ]; then
        "$llama_bin/llama-quantize" --allow-requantize "$gguf_q41" "$gguf.part" "$quant" >"$work/quantize-$quant.log" 2>&1 ||
          { tail -20 "$work/quantize-$quant.log" >&2; die "llama-quantize to $quant failed"; }
        mv "$gguf.part" "$gguf"
      fi
      ;;
  esac
  bundle=$work/smollm2-$quant.mlxb
  export_dir=$work/smollm2-$quant-mlx
  say "compiling $gguf into $bundle and exporting its weights for mlx-lm"
  "$bin/mlxcel-compile" "$gguf" -o "$bundle" --quiet
  rm -rf "$export_dir"
  "$export_mlx_lm" "$bundle" "$export_dir"
  for server in $servers; do
    port=$(free_port)
    log=$work/$server-$quant.log
    case "$server" in
      mlxcel-server)
        start_server "$server" "$log" "$bin/mlxcel-server" --bundle "$bundle" --host 127.0.0.1 --port "$port" \
          -np "$parallel" -c "$ctx_per_slot" -t "$threads" --metrics
        ;;
      mlxcel-server@*)
        layout=${server#mlxcel-server@}
        laid_out=$work/smollm2-$quant-$layout.mlxb
        "$bin/mlxcel-compile" "$gguf" -o "$laid_out" --quiet --weight-layout "$layout" ||
          die "mlxcel-compile --weight-layout $layout failed"
        start_server "$server" "$log" "$bin/mlxcel-server" --bundle "$laid_out" --host 127.0.0.1 --port "$port" \
          -np "$parallel" -c "$ctx_per_slot" -t "$threads" --metrics
        ;;
      llama-server)
        start_server "$server" "$log" "$llama_bin/llama-server" -m "$gguf" --host 127.0.0.1 --port "$port" \
          -np "$parallel" -c "$((parallel * ctx_per_slot))" -t "$threads" -tb "$threads" --no-webui
        ;;
      mlx_lm.server)
        # MLX's CPU backend sizes its own pool: mlx-lm gets THREADS cores.
        # Its /v1/models scans the Hugging Face cache and fails (500) when
        # the folder does not exist: give it an empty one of its own.
        mkdir -p "$work/hf-cache"
        start_server "$server" "$log" env HF_HUB_CACHE="$work/hf-cache" \
          taskset -c "0-$((threads - 1))" "$py" -m mlx_lm server \
          --model "$export_dir" --host 127.0.0.1 --port "$port" \
          --decode-concurrency "$parallel" --prompt-concurrency "$parallel"
        ;;
      *) die "unknown server $server (SERVERS takes mlxcel-server, llama-server, mlx_lm.server)" ;;
    esac
    model=$(curl -s "http://127.0.0.1:$port/v1/models" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    run_load "$server" "$quant" "$model" "$export_dir"
    stop_server
  done
done

{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;"
  echo "SmolLM2-135M-Instruct, $endpoint endpoint, streamed, $isl prompt / $osl output tokens per request,"
  echo "$reqs requests per stream after one warm-up each, -np $parallel, $threads threads; AIPerf 0.13.0."
  echo
  "$py" - "$work/results.jsonl" "$streams" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
streams = [int(s) for s in sys.argv[2].split()]
get = lambda srv, q, n: next((r for r in rows if r["server"] == srv and r["quant"] == q and r["streams"] == n), None)
ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "–"
print("| model | server | streams | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | out tok/req | tok/s vs llama-server | TTFT p50 vs llama-server | load gen. cores | server cores | prompt tok. from cache |")
print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
quants = list(dict.fromkeys(r["quant"] for r in rows))
for q in quants:
    for srv in dict.fromkeys(r["server"] for r in rows):
        for n in streams:
            r, l = get(srv, q, n), get("llama-server", q, n)
            if not r:
                continue
            print(f"| SmolLM2 {q} | {srv} | {n} | {r['tok_s']:.1f} | {r['ttft_p50']:.1f} / {r['ttft_p99']:.1f} | {r['itl_p50']:.2f} / {r['itl_p99']:.2f} "
                  f"| {r['osl_avg']:.1f} | {ratio(r['tok_s'], l and l['tok_s'])} | {ratio(r['ttft_p50'], l and l['ttft_p50'])} | {r['loadgen_cores']:.2f} | {r['server_cores']:.2f} "
                  f"| {'–' if r.get('cached_tokens') is None else r['cached_tokens']} |")
print()
lo, hi = min(streams), max(streams)
ours = [s for s in dict.fromkeys(r["server"] for r in rows) if s.startswith("mlxcel-server")] or ["mlxcel-server"]
for q, srv in ((q, s) for q in quants for s in ours):
    m1, m16, l1, l16 = get(srv, q, lo), get(srv, q, hi), get("llama-server", q, lo), get("llama-server", q, hi)
    if not (m1 and m16):
        print(f"Targets ({q}, {srv}): not measured (pending).")
        continue
    checks = [
        (f"throughput at {hi} >= 4x at {lo}", m16["tok_s"] >= 4 * m1["tok_s"], f"{m16['tok_s'] / m1['tok_s']:.2f}x"),
        (f"throughput at {hi} >= 1.5x llama-server's", bool(l16) and m16["tok_s"] >= 1.5 * l16["tok_s"], ratio(m16["tok_s"], l16 and l16["tok_s"])),
        (f"TTFT p50 at {lo} <= llama-server's", bool(l1) and m1["ttft_p50"] <= l1["ttft_p50"], ratio(m1["ttft_p50"], l1 and l1["ttft_p50"])),
        (f"ITL p99 at {hi} <= 3x at {lo}", m16["itl_p99"] <= 3 * m1["itl_p99"], f"{m16['itl_p99'] / m1['itl_p99']:.2f}x"),
    ]
    print(f"Targets ({q}, {srv}): " + "; ".join(f"{name}: {val} {'met' if ok else ('not measured' if val == '–' else 'NOT met')}" for name, ok, val in checks) + ".")
EOF
} | tee "$work/table.md"
