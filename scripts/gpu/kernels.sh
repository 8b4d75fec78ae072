#!/usr/bin/env bash
# mlxcel's CUDA kernels on the lent NVIDIA machine (docs/cuda.md
# "mlxcel's own CUDA kernels"), after `source scripts/gpu/remote.sh env`:
#
#   bash scripts/gpu/kernels.sh BUNDLE...
#
# 1. the kernels against MLX's operations (the gpu_kernels test);
# 2. per bundle (compiled with --target cuda-sm90, so it carries the module):
#    the parity check against the CPU (scripts/gpu/parity.sh, f32 only),
#    then `mlxcel bench` with mlxcel's kernels (the default) and without
#    (MLXCEL_KERNELS=mlx: MLX's operations only), alternating, so the ratio
#    comes from one run.
set -uo pipefail
bin=${BIN:-.gpu/bin}
runs=${RUNS:-2}
status=0
echo "== kernels against MLX's operations"
"$bin/gpu_kernels" --test-threads=1 || status=1
for bundle in "$@"; do
  echo "== $bundle: parity with the CPU"
  SKIP_BF16=1 bash "$(dirname "$0")/parity.sh" "$bundle" "${STEPS:-32}" || status=1
  echo "== $bundle: -v load line"
  "$bin/mlxcel" run "$bundle" -p "Hi" -n 1 --temp 0 -v 2>&1 | grep -i "kernel" || true
  for i in $(seq "$runs"); do
    for kernels in auto mlx; do
      echo "== $bundle: mlxcel bench, MLXCEL_KERNELS=$kernels (run $i)"
      MLXCEL_KERNELS=$kernels "$bin/mlxcel" bench "$bundle" -p 512 -n 128 -r 3 || status=1
    done
  done
done
exit $status
