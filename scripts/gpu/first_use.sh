#!/usr/bin/env bash
# Where a fresh process's first use of MLX's operations on the GPU spends
# its ~0.3 s (docs/cuda.md "The server's warm-up" has what it found). Run on the
# lent NVIDIA machine after `source scripts/gpu/remote.sh env`:
#
#   bash scripts/gpu/first_use.sh BUNDLE [WORDS]
#
# A raw prompt of WORDS words (default 100: longer than the 32 rows
# mlxcel's kernels take, so prefill runs MLX's operations), 4 tokens,
# kernels from the bundle, each case three times in fresh processes:
#   - as shipped (CUDA loads each module at its first launch);
#   - CUDA_MODULE_LOADING=EAGER (every module loaded with its image): if
#     the first use is lazy loading, it moves from "first token" to "ready";
#   - once with LD_DEBUG=files, its stderr lines timestamped, to list the
#     shared libraries the process opens after it is ready (cuDNN and
#     cuBLAS load their kernel libraries on first use).
set -uo pipefail
bundle=${1:?usage: first_use.sh BUNDLE [WORDS]}
words=${2:-100}
bin=${BIN:-.gpu/bin}
cache=$(mktemp -d /tmp/first-use.XXXX)
unset MLX_PTX_CACHE_DIR
prompt=$(python3 -c "import sys; print(' '.join(['the'] * int(sys.argv[1])))" "$words")
run() {
  "$bin/mlxcel" run "$bundle" --no-chat-template -p "$prompt" -n 4 --temp 0 -v \
    --gpu-kernels refuse --gpu-kernel-cache "$cache" 2>&1 >/dev/null
}
times() { grep -o 'ready in [0-9.]* ms\|prompt: [0-9]* tokens\|first token after [0-9.]* ms' | paste -sd' '; }
# Timestamps each line of stdin, milliseconds since the first.
stamp() { python3 -u -c '
import sys, time
t0 = time.time()
for line in sys.stdin:
    print(f"{(time.time() - t0) * 1e3:9.1f} ms  {line}", end="")'; }

echo "== $bundle, $words words"
for i in 1 2 3; do echo "as shipped:          $(run | times)"; done
for i in 1 2 3; do echo "CUDA_MODULE_LOADING=EAGER: $(CUDA_MODULE_LOADING=EAGER run | times)"; done
echo "== shared libraries opened, in order (LD_DEBUG=files), with mlxcel's own lines"
LD_DEBUG=files run | stamp | grep -E 'file=.*(dynamically loaded|needed by)|ready in|first token|prompt:' |
  grep -v 'needed by /lib\|needed by /usr/lib' | sed 's/;  *\(dynamically loaded\|needed\) by .*/ (\1)/' |
  awk '!seen[$0]++' | tail -60
rm -rf "$cache"
