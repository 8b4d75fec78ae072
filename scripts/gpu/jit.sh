#!/usr/bin/env bash
# What MLX compiles at run time (NVRTC) for a bundle on the GPU, and what
# it costs: issue [9]'s inventory. Run on the lent NVIDIA machine after
# `source scripts/gpu/remote.sh env` (docs/cuda.md "Kernels compiled at
# run time"):
#
#   bash scripts/gpu/jit.sh BUNDLE ["LENGTHS"]
#
# With an empty kernel cache, `mlxcel run` completes raw prompts of about
# each of LENGTHS tokens (4 tokens each), in that order, timing the
# process and printing the modules each prompt added to the cache; then
# the same prompts again with the cache warm.
#
# MODE=jit (the default) lets MLX compile (`--gpu-kernels jit`, MLX's cache
# in MLX_PTX_CACHE_DIR). MODE=bundle uses the kernels the bundle carries
# (`mlxcel-compile --target cuda-smXY`), unpacked into the empty cache by
# the runtime (`--gpu-kernel-cache`), and fails when MLX compiled anything
# (it writes a NAME.cu beside each module it compiles; the bundle's have none).
set -uo pipefail
bundle=${1:?usage: jit.sh BUNDLE [LENGTHS]}
lengths=${2:-"4 16 24 40 100 300 600"}
bin=${BIN:-.gpu/bin}
# An empty cache (JIT_CACHE names one to keep for later runs).
cache=${JIT_CACHE:-$(mktemp -d /tmp/ptx.XXXX)}
mkdir -p "$cache"
[ -z "$(ls -A "$cache")" ] || { echo "jit.sh: $cache is not empty" >&2; exit 1; }
mode=${MODE:-jit}
case "$mode" in
  jit) export MLX_PTX_CACHE_DIR=$cache; flags=(--gpu-kernels jit) ;;
  bundle) unset MLX_PTX_CACHE_DIR; flags=(--gpu-kernels refuse --gpu-kernel-cache "$cache") ;;
  *) echo "jit.sh: MODE is jit or bundle" >&2; exit 2 ;;
esac
prompt() { python3 -c "import sys; print(' '.join(['the'] * int(sys.argv[1])))" "$1"; }
run_one() {
  local n=$1 t0 t1
  t0=$(date +%s.%N)
  "$bin/mlxcel" run "$bundle" --no-chat-template -p "$(prompt "$n")" -n 4 --temp 0 -v "${flags[@]}" 2>&1 >/dev/null |
    grep -o 'prompt: [0-9]* tokens\|first token after [0-9.]* ms' | paste -sd' ' | tr '\n' ' '
  t1=$(date +%s.%N)
  python3 -c "import sys; print(f' | process {float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$t0" "$t1"
}
modules() { (cd "$cache" && find . -name '*.ptx' | sed 's|^\./||' | sort); }
compiled() { find "$cache" -name '*.cu' | wc -l; }

echo "== $bundle, empty cache ($cache), MODE=$mode"
before=
for n in $lengths; do
  printf '%s words: ' "$n"
  run_one "$n"
  now=$(modules)
  comm -13 <(echo "$before") <(echo "$now") | sed 's/^/    + /'
  before=$now
done
echo "== the same prompts, warm cache"
for n in $lengths; do
  printf '%s words: ' "$n"
  run_one "$n"
done
echo "== cache: $(modules | wc -l) modules, $(du -sh "$cache" | cut -f1)"
(cd "$cache" && find . -name '*.ptx' -printf '%s %p\n' | sort -k2)
echo "== modules MLX compiled: $(compiled)"
[ "$mode" = jit ] || [ "$(compiled)" = 0 ]
