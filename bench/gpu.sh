#!/usr/bin/env bash
# mlxcel against llama.cpp's CUDA build and mlx-lm on the lent H200, on the
# same GGUFs, in one run (results in docs/benchmarks.md, "GPU"). Runs on the
# GPU machine, in the repository's copy there, after
# `source scripts/gpu/remote.sh env` (docs/cuda.md has the recipe: what to
# carry, in which calls).
#
#   bash bench/gpu.sh prepare   # llama.cpp with CUDA, the bundles, the mlx-lm exports (~8 min)
#   bash bench/gpu.sh run       # llama-bench, mlx-lm and mlxcel bench; the table (~2 min)
#   bash bench/gpu.sh profile   # what one mlxcel decode step launches, from Nsight Compute (~2 min)
#
# Two steps because one call to the machine runs at most 10 minutes; the
# machine keeps /root between calls made within its warm window. `prepare`
# skips what is already there.
#
# prepare:
#   - llama.cpp from llama-cpp-python 0.3.36's vendored copy (LLAMA_SRC, a
#     tarball of its CMakeLists.txt, cmake/, common/, ggml/, include/, src/,
#     tools/, vendor/, licenses/, examples/, pocs/, app/, which
#     `scripts/gpu/pack.sh` writes), configured with -DGGML_CUDA=ON
#     -DCMAKE_CUDA_ARCHITECTURES=90 and built for llama-bench alone with the
#     machine's nvcc and CMake;
#   - for each model, the bundle `mlxcel-compile MODEL.gguf --target
#     cuda-sm90` makes (row-major weights, MLX's CUDA kernels compiled into
#     it with the machine's NVRTC), and that bundle's weights exported for
#     mlx-lm (the export_mlx_lm example);
#   - mlx-lm 0.32.2 and MLX 0.32.4's Python bindings from carried wheels
#     (WHEELS), into WORK/pysite, over the carried CUDA MLX tree.
# run, for each model, one after another on the one GPU:
#   - llama-bench -m MODEL.gguf -p PP -n TG -r REPS -ngl 99, flash attention
#     off and on (-fa 0/1);
#   - mlx-lm: bench/mlx_lm_bench.py --device gpu on the exported weights
#     (its activations are the exported weights' float dtype);
#   - mlxcel bench BUNDLE -p PP -n TG -r REPS --dtype D for each of DTYPES
#     (f32, the default: the bundle carries MLX's kernels for f32 activations
#     only, so another dtype makes MLX compile its own at the first run);
# and prints one table (tokens per second, ratios against llama.cpp's best
# and mlx-lm), also written to $OUT/gpu-table.md and $OUT/gpu-results.jsonl
# when OUT is set (the device tool brings $OUT back).
#
# profile: `ncu --metrics gpu__time_duration.sum` over `mlxcel bench -p 0 -n 8`
# for each model; prints, for one decode step (the kernels after one launch
# of the output projection up to the next), how many kernels of each kind it
# launches and their summed GPU time. ncu runs each kernel alone and the
# clocks are not locked (--clock-control none, as the machine's notes ask),
# so the sum is an upper bound on the step's kernel time; set against the
# step's time in `run`, the rest is the host issuing the launches.
#
# Settings (environment): MODELS ("smollm2 gemma3": /root/models/NAME.gguf,
# the Q4_0 GGUFs of bench/cpu.sh, carried in parts), BIN (.gpu/bin: the CUDA
# build's mlxcel, mlxcel-compile and export_mlx_lm), LLAMA_SRC
# (/root/stash/llama-src.tar.xz, else .gpu/src/llama-src.tar.xz), WHEELS
# (/root/stash, else .gpu/src: mlx-0.32.4 and mlx_lm-0.32.2 wheels), WORK
# (/root/gpu-bench), PP (512), TG (128), REPS (3), DTYPES (f32).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

step=${1:-}
models=${MODELS:-smollm2 gemma3}
bin=${BIN:-$root/.gpu/bin}
work=${WORK:-/root/gpu-bench}
pp=${PP:-512}
tg=${TG:-128}
reps=${REPS:-3}
dtypes=${DTYPES:-f32}
llama_dir=$work/llama.cpp
llama_bench=$llama_dir/build/bin/llama-bench
pysite=$work/pysite
say() { echo "bench/gpu.sh: $*" >&2; }
die() { say "$*"; exit 1; }
first_file() { for f in "$@"; do [ -f "$f" ] && { echo "$f"; return 0; }; done; return 1; }

[ -f /root/mlx-cuda/mlx/lib/libmlx.so ] || die "no CUDA MLX tree in /root/mlx-cuda: source scripts/gpu/remote.sh env first"
[ "${MLXCEL_DEVICE:-}" = gpu ] || die "MLXCEL_DEVICE is not gpu: source scripts/gpu/remote.sh env first"
mkdir -p "$work"

gguf_of() { echo "/root/models/$1.gguf"; }
bundle_of() { echo "$work/$1.mlxb"; }
export_of() { echo "$work/$1-mlx"; }

# llama.cpp with CUDA (in the background of `prepare`: it and the bundles'
# NVRTC compilations take minutes each, on different cores).
build_llama() {
  if [ ! -x "$llama_bench" ]; then
    src=$(first_file "${LLAMA_SRC:-/root/stash/llama-src.tar.xz}" .gpu/src/llama-src.tar.xz) ||
      die "no llama.cpp source tarball (LLAMA_SRC, /root/stash or .gpu/src: scripts/gpu/pack.sh writes it)"
    rm -rf "$llama_dir" && mkdir -p "$llama_dir"
    xz -dc "$src" | tar -C "$llama_dir" -xf -
    say "configuring llama.cpp with CUDA (sm_90)"
    cmake -S "$llama_dir" -B "$llama_dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
      >"$work/llama-cmake.log" 2>&1 || { tail -30 "$work/llama-cmake.log" >&2; die "llama.cpp: cmake failed"; }
    say "building llama-bench ($(nproc) jobs)"
    t0=$(date +%s)
    cmake --build "$llama_dir/build" --target llama-bench -j "$(nproc)" >"$work/llama-build.log" 2>&1 ||
      { tail -30 "$work/llama-build.log" >&2; die "llama.cpp: build failed"; }
    say "llama-bench built in $(($(date +%s) - t0)) s"
  fi
}

prepare() {
  build_llama &
  llama_pid=$!
  # mlx-lm over the carried CUDA MLX tree.
  if [ ! -d "$pysite/mlx_lm" ]; then
    wheels=$(dirname "$(first_file "${WHEELS:-/root/stash}"/mlx-0.32.4-*.whl .gpu/src/mlx-0.32.4-*.whl)") ||
      die "no mlx-0.32.4 wheel (WHEELS, /root/stash or .gpu/src)"
    python3 -m pip install -q --no-deps --no-index --target "$pysite" "$wheels"/mlx-0.32.4-*.whl "$wheels"/mlx_lm-0.32.2-*.whl
    # The bindings load mlx/lib/libmlx.so; the CUDA build's comes with its
    # headers (the JIT's) and, two folders up from it, its bundled libraries.
    ln -sfn /root/mlx-cuda/mlx/lib "$pysite/mlx/lib"
    ln -sfn /root/mlx-cuda/mlx/include "$pysite/mlx/include"
  fi
  site=$(python3 -c 'import nvidia,os;print(os.path.dirname(list(nvidia.__path__)[0]))')
  for m in $models; do
    gguf=$(gguf_of "$m")
    [ -f "$gguf" ] || die "$gguf is missing (carry it in parts: docs/cuda.md)"
    if [ ! -f "$(bundle_of "$m")" ]; then
      say "$m: mlxcel-compile --target cuda-sm90"
      t0=$(date +%s)
      MLXCEL_DEVICE=cpu "$bin/mlxcel-compile" "$gguf" -o "$(bundle_of "$m")" --target cuda-sm90 \
        --nvrtc "$site" --mlx-cuda /root/mlx-cuda/mlx --quiet
      say "$m: compiled in $(($(date +%s) - t0)) s"
    fi
    if [ ! -d "$(export_of "$m")" ]; then
      MLXCEL_DEVICE=cpu "$bin/export_mlx_lm" "$(bundle_of "$m")" "$(export_of "$m").part"
      mv "$(export_of "$m").part" "$(export_of "$m")"
    fi
  done
  wait "$llama_pid" || die "llama.cpp: see $work/llama-cmake.log and $work/llama-build.log"
  say "prepared: $(ls "$work" | tr '\n' ' ')"
}

run() {
  [ -x "$llama_bench" ] || die "llama-bench is not built: bash bench/gpu.sh prepare"
  results=$work/gpu-results.jsonl
  : >"$results"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader >&2
  for m in $models; do
    gguf=$(gguf_of "$m")
    for fa in 0 1; do
      say "$m: llama-bench -p $pp -n $tg -r $reps -ngl 99 -fa $fa"
      "$llama_bench" -m "$gguf" -p "$pp" -n "$tg" -r "$reps" -ngl 99 -fa "$fa" -o json 2>"$work/llama-bench.err" |
        python3 bench/results.py llama-bench "$m" "llama.cpp fa$fa" >>"$results" || { tail -20 "$work/llama-bench.err" >&2; die "llama-bench failed on $m"; }
    done
    say "$m: mlx-lm (bench/mlx_lm_bench.py --device gpu)"
    PYTHONPATH=$pysite python3 bench/mlx_lm_bench.py "$(export_of "$m")" -p "$pp" -n "$tg" -r "$reps" --device gpu |
      python3 bench/results.py mlx-lm "$m" mlx-lm "$pp" "$tg" >>"$results"
    for dtype in $dtypes; do
      say "$m: mlxcel bench -p $pp -n $tg -r $reps --dtype $dtype"
      "$bin/mlxcel" bench "$(bundle_of "$m")" -p "$pp" -n "$tg" -r "$reps" --dtype "$dtype" --json |
        python3 bench/results.py mlxcel "$m" "mlxcel $dtype" >>"$results"
    done
  done
  python3 - "$results" "$pp" "$tg" <<'EOF' | tee "$work/gpu-table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
get = lambda m, e, t: next((r for r in rows if r["model"] == m and r["engine"] == e and r["test"] == t), None)
fmt = lambda r: f"{r['tps']:,.0f} ± {r['sd']:,.0f}" if r else "–"
ratio = lambda a, b: f"{a['tps'] / b['tps']:.2f}×" if a and b else "–"
engines = ["llama.cpp fa0", "llama.cpp fa1", "mlx-lm"] + list(dict.fromkeys(r["engine"] for r in rows if r["engine"].startswith("mlxcel")))
print("| model | test | " + " | ".join(engines) + " | mlxcel f32 / best llama.cpp | mlxcel f32 / mlx-lm |")
print("|---|---|" + "--:|" * (len(engines) + 2))
for m in dict.fromkeys(r["model"] for r in rows):
    for t in (f"pp{sys.argv[2]}", f"tg{sys.argv[3]}"):
        ls = [r for r in (get(m, "llama.cpp fa0", t), get(m, "llama.cpp fa1", t)) if r]
        best = max(ls, key=lambda r: r["tps"]) if ls else None
        o = get(m, "mlxcel f32", t)
        print(f"| {m} | {t} | " + " | ".join(fmt(get(m, e, t)) for e in engines) + f" | {ratio(o, best)} | {ratio(o, get(m, 'mlx-lm', t))} |")
EOF
  if [ -n "${OUT:-}" ]; then
    cp "$results" "$work/gpu-table.md" "$OUT/"
  fi
}

profile() {
  for m in $models; do
    [ -f "$(bundle_of "$m")" ] || die "$(bundle_of "$m") is missing: bash bench/gpu.sh prepare"
    say "$m: ncu over mlxcel bench -p 0 -n 8 -r 1"
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-summary none -c 8000 \
      "$bin/mlxcel" bench "$(bundle_of "$m")" -p 0 -n 8 -r 1 >"$work/ncu-$m.csv" 2>"$work/ncu-$m.err" ||
      { tail -20 "$work/ncu-$m.err" >&2; die "ncu failed on $m"; }
    python3 "$root/scripts/gpu/step_kernels.py" "$work/ncu-$m.csv" "$m" | tee "$work/profile-$m.md"
    if [ -n "${OUT:-}" ]; then cp "$work/profile-$m.md" "$OUT/"; fi
  done
}

case "$step" in
  prepare) prepare ;;
  run) run ;;
  profile) profile ;;
  *) echo "usage: bench/gpu.sh prepare | run | profile" >&2; exit 2 ;;
esac
