#!/usr/bin/env bash
# Prompts on the GPU (docs/cuda.md "mlxcel's own prompt products", and
# "Prompts through cuBLAS, measured and not kept"), on the lent NVIDIA
# machine after
# `source scripts/gpu/remote.sh env`:
#
#   bash scripts/gpu/prompt_products.sh BUNDLE...
#
# For each bundle (compiled with --target cuda-sm90):
# 1. the parity check against the CPU (scripts/gpu/parity.sh, f32 only; its
#    chat prompts and its long raw prompt are prefilled in one pass of more
#    than 32 rows, the prompt path);
# 2. `mlxcel bench -p PP -n 128 -r 3` for each PP of PPS, the default
#    against MLXCEL_KERNELS=mlx (MLX's operations only), alternating, RUNS
#    times, so a change to the prompt path is judged in one run (the
#    default's prompts take mlxcel's tiled products, prompt.cuh; the other's
#    MLX's quantized matmul);
# 3. scripts/gpu/jit.sh MODE=bundle: fresh processes' first tokens for
#    prompts of 40 to 600 words, failing if MLX compiled any module.
set -uo pipefail
bin=${BIN:-.gpu/bin}
runs=${RUNS:-2}
pps=${PPS:-512 2048}
here=$(dirname "$0")
status=0
for bundle in "$@"; do
  echo "== $bundle: parity with the CPU"
  SKIP_BF16=1 BIN=$bin bash "$here/parity.sh" "$bundle" "${STEPS:-32}" || status=1
  for i in $(seq "$runs"); do
    for pp in $pps; do
      for mode in "MLXCEL_KERNELS=auto" "MLXCEL_KERNELS=mlx"; do
        echo "== $bundle: mlxcel bench -p $pp, $mode (run $i)"
        env "$mode" "$bin/mlxcel" bench "$bundle" -p "$pp" -n 128 -r 3 || status=1
      done
    done
  done
  echo "== $bundle: first tokens of fresh processes, the bundle's kernels only"
  MODE=bundle BIN=$bin bash "$here/jit.sh" "$bundle" "40 100 300 600" || status=1
done
exit $status
