#!/usr/bin/env bash
# CPU throughput of mlxcel against llama.cpp and mlx-lm on the same models, in
# the same run (issues [7] and [13]; results in docs/benchmarks.md).
#
#   bash bench/cpu.sh            # 2 threads, 3 repetitions, pp512 / tg128
#   THREADS=1 REPS=5 bash bench/cpu.sh
#   SKIP_MLX_LM=1 bash bench/cpu.sh   # mlx-lm takes ~10 minutes on 2 cores
#   FORMATS="Q4_0 Q8_0" MODELS=smollm2 bash bench/cpu.sh
#   LAYOUT=row-major bash bench/cpu.sh   # --weight-layout of the bundles (default: auto, the compiler's)
#
# For each real model of `make setup` (MODELS: smollm2 = SmolLM2-135M Q4_1,
# gemma3 = Gemma 3 270M Q4_K_M) and each weight format (FORMATS, default
# "package Q4_0 Q8_0 BF16": the package's own file, then llama.cpp's fastest
# formats, made from it by `llama-quantize --allow-requantize`; the requantized
# weights are the package's dequantized, so both engines read the same numbers):
#   - llama.cpp: llama-bench -m MODEL.gguf -p 512 -n 128 -t THREADS -r REPS, built
#     from the llama-cpp-python==0.3.36 source package (it vendors llama.cpp)
#     into .deps/llama.cpp-0.3.36 on first use by bench/llama_cpp.sh (~5 min on 2 cores);
#   - mlxcel: `mlxcel bench` on the bundle `mlxcel-compile` makes from the same
#     GGUF (lossless transcode: the same codes, scales and biases; BF16 stays bf16);
#   - mlx-lm: bench/mlx_lm_bench.py on those exact weights (exported from the
#     bundle by the export_mlx_lm example), on the package files only (it is
#     slow on the CPU, and its own format is the affine 4-bit one);
# then prints one table with ratios, and the decode roofline per row: bytes of
# weights read per token over the machine's measured read bandwidth.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

threads=${THREADS:-2}
reps=${REPS:-3}
pp=${PP:-512}
tg=${TG:-128}
formats=${FORMATS:-package Q4_0 Q8_0 BF16}
models=${MODELS:-smollm2 gemma3}
layout=${LAYOUT:-auto}
work=${BENCH_DIR:-$root/target/bench}
mkdir -p "$work"

make -s setup

# ---- llama.cpp from the llama-cpp-python source package --------------------
# shellcheck source=bench/llama_cpp.sh
source bench/llama_cpp.sh
llama_cpp_build llama-bench llama-quantize
llama_bench=$llama_bin/llama-bench

# ---- mlxcel ------------------------------------------------------------------
# One cargo invocation: built separately, the examples' feature set and the
# binaries' differ, and each build would recompile mlxcel-mlx for the other.
cargo build -q --release -p mlxcel-cli -p mlxcel-compiler --bins \
  -p mlxcel-tests --example export_mlx_lm -p mlxcel-mlx --example kernel_bench
py=$root/.deps/venv/bin/python
export MLXCEL_DEVICE=cpu

results=$work/cpu-results.jsonl
: >"$results"
for model in $models; do
  case "$model" in
    smollm2) package=SmolLM2-135M-Instruct.Q4_1.gguf ;;
    gemma3) package=gemma-3-270m-q4_k_m.gguf ;;
    *) echo "bench/cpu.sh: unknown model '$model' in MODELS (smollm2, gemma3)" >&2; exit 2 ;;
  esac
  for format in $formats; do
    if [ "$format" = package ]; then
      name=${package%.gguf}
      src=$root/.deps/models/$package
    else
      name="${package%%.*}"
      name="${name%-q4_k_m} $format"
      src=$work/${package%.gguf}.$format.gguf
      if [ ! -f "$src" ]; then
        echo "llama-quantize --allow-requantize $package $format" >&2
        "$llama_bin/llama-quantize" --allow-requantize "$root/.deps/models/$package" "$src.part" "$format" \
          >"$work/quantize.log" 2>&1 || { tail -20 "$work/quantize.log" >&2; exit 1; }
        mv "$src.part" "$src"
      fi
    fi
    bundle=$work/${name// /.}.$layout.mlxb
    echo "== $name" >&2
    target/release/mlxcel-compile "$src" -o "$bundle" --quiet --weight-layout "$layout"
    echo "llama.cpp: llama-bench -p $pp -n $tg -t $threads -r $reps" >&2
    "$llama_bench" -m "$src" -p "$pp" -n "$tg" -t "$threads" -r "$reps" -o json 2>/dev/null |
      "$py" bench/results.py llama-bench "$name" llama.cpp >>"$results"
    echo "mlxcel: mlxcel bench -p $pp -n $tg -t $threads -r $reps" >&2
    target/release/mlxcel bench "$bundle" -p "$pp" -n "$tg" -t "$threads" -r "$reps" --json |
      "$py" bench/results.py mlxcel "$name" mlxcel >>"$results"
    if [ -z "${SKIP_MLX_LM:-}" ] && [ "$format" = package ]; then
      echo "mlx-lm: bench/mlx_lm_bench.py -p $pp -n $tg -r 1 (slow: one repetition)" >&2
      export_dir=$work/$name-mlx
      rm -rf "$export_dir"
      target/release/examples/export_mlx_lm "$bundle" "$export_dir"
      # MLX's CPU backend sizes its own pool; mlx-lm gets the same cores.
      taskset -c "0-$((threads - 1))" "$py" bench/mlx_lm_bench.py "$export_dir" -p "$pp" -n "$tg" -r 1 |
        "$py" bench/results.py mlx-lm "$name" mlx-lm "$pp" "$tg" >>"$results"
    fi
    # Roofline inputs: weight bytes one decode step reads (every tensor; a tied
    # embedding is read whole as the output projection, an untied one a row at a time).
    target/release/mlxcel inspect --json --tensors "$bundle" | "$py" -c '
import json, sys
d = json.load(sys.stdin)
ts = d["tensors"]
total = sum(t["length"] for t in ts)
if any(t["name"].startswith("lm_head.") for t in ts):
    total -= sum(t["length"] for t in ts if t["name"].startswith("model.embed_tokens."))
print(json.dumps({"model": sys.argv[1], "engine": "bytes", "test": "weights", "tps": total, "sd": 0}))
' "$name" >>"$results"
  done
done
bandwidth=$(target/release/examples/kernel_bench --bandwidth --threads "$threads")

"$py" - "$results" "$threads" "$bandwidth" "$pp" "$tg" "$layout" <<'EOF'
import json, sys
path, threads, bw, pp, tg = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = [json.loads(l) for l in open(path)]
get = lambda m, e, t: next((r for r in rows if r["model"] == m and r["engine"] == e and r["test"] == t), None)
fmt = lambda r: f"{r['tps']:.1f} ± {r['sd']:.1f}" if r else "–"
ratio = lambda a, b: f"{a['tps'] / b['tps']:.2f}×" if a and b else "–"
models = list(dict.fromkeys(r["model"] for r in rows))
print(f"\n{threads} thread(s), mlxcel bundles in the {sys.argv[6]} layout; tokens per second, mean ± standard deviation\n")
print("| model | test | llama.cpp | mlx-lm | mlxcel | mlxcel / llama.cpp | mlxcel / mlx-lm |")
print("|---|---|--:|--:|--:|--:|--:|")
for m in models:
    for t in (f"pp{pp}", f"tg{tg}"):
        l, x, o = get(m, "llama.cpp", t), get(m, "mlx-lm", t), get(m, "mlxcel", t)
        print(f"| {m} | {t} | {fmt(l)} | {fmt(x)} | {fmt(o)} | {ratio(o, l)} | {ratio(o, x)} |")
print(f"\nDecode roofline ({threads} thread(s), read bandwidth {bw:.1f} GB/s over 256 MiB):\n")
print("| model | weight MB per token | floor ms/token (max tok/s) | mlxcel ms/token | of the roofline |")
print("|---|--:|--:|--:|--:|")
for m in models:
    b, o = get(m, "bytes", "weights"), get(m, "mlxcel", f"tg{tg}")
    if b and o:
        floor_ms = b["tps"] / (bw * 1e9) * 1e3
        print(f"| {m} | {b['tps'] / 1e6:.1f} | {floor_ms:.2f} ({1e3 / floor_ms:.0f}) | {1e3 / o['tps']:.2f} | {floor_ms * o['tps'] / 1e3 * 100:.0f}% |")
EOF
