#!/usr/bin/env bash
# Decode steps replayed as recorded CUDA graphs (docs/cuda.md "Decode steps
# replayed as one CUDA graph"), on the lent NVIDIA machine after
# `source scripts/gpu/remote.sh env`:
#
#   bash scripts/gpu/step_graphs.sh BUNDLE...
#
# 1. the kernels against MLX's operations and the CPU kernels, and record
#    and replay of a small step (the gpu_kernels test);
# 2. per bundle (compiled with --target cuda-sm90): the parity check
#    against the CPU with step graphs on (the default; scripts/gpu/parity.sh,
#    f32 only); the same GPU trace with MLXCEL_STEP_GRAPHS=0 must be
#    byte-identical (a replay computes what the node-by-node step does, bit
#    for bit); free-running greedy tokens on the GPU must be the CPU's;
# 3. step_phases with step graphs on and off;
# 4. `mlxcel bench` with step graphs on, off, and MLX's operations only
#    (MLXCEL_KERNELS=mlx), alternating, so the ratios come from one run.
set -uo pipefail
# Step graphs are on by default (since this script passed on an H200,
# 2026-12-05); the variable is set so a caller's MLXCEL_STEP_GRAPHS=0 is
# the only way to turn them off here.
export MLXCEL_STEP_GRAPHS=${MLXCEL_STEP_GRAPHS:-1}
bin=${BIN:-.gpu/bin}
runs=${RUNS:-2}
steps=${STEPS:-32}
status=0
# SKIP_KERNEL_TESTS=1 skips step 1 (about 100 s on the H200) when the same
# binaries' gpu_kernels already passed on this machine.
if [ "${SKIP_KERNEL_TESTS:-0}" != 1 ]; then
  echo "== kernels against MLX's operations; record and replay"
  "$bin/gpu_kernels" --test-threads=1 || status=1
fi
for bundle in "$@"; do
  out=${OUT:-/tmp}/parity-$(basename "$bundle" .mlxb)
  echo "== $bundle: parity with the CPU, step graphs on"
  SKIP_BF16=1 bash "$(dirname "$0")/parity.sh" "$bundle" "$steps" || status=1
  trace() { "$bin/logit_trace" "$bundle" "$@" --prefill-chunk "${CHUNK:-512}" --gpu-kernels refuse; }
  echo "== $bundle: the same trace node by node (MLXCEL_STEP_GRAPHS=0)"
  MLXCEL_STEP_GRAPHS=0 MLXCEL_DEVICE=gpu trace "$out/gpu-f32-nodes.json" --steps "$steps" --follow "$out/cpu.json" \
    >/dev/null || status=1
  if cmp -s "$out/gpu-f32.json" "$out/gpu-f32-nodes.json"; then
    echo "replayed and node-by-node traces: identical"
  else
    echo "replayed and node-by-node traces: DIFFER"
    status=1
  fi
  echo "== $bundle: free-running greedy tokens on the GPU against the CPU's"
  MLXCEL_DEVICE=gpu trace "$out/gpu-free.json" --steps "$steps" || status=1
  python3 - "$out/cpu.json" "$out/gpu-free.json" <<'PY' || status=1
import json, sys
cpu, gpu = (json.load(open(p)) for p in sys.argv[1:3])
same = sum(a["tokens"] == b["tokens"] for a, b in zip(cpu, gpu))
print(f"greedy tokens equal to the CPU's: {same} of {len(cpu)} prompts")
sys.exit(0 if same == len(cpu) else 1)
PY
  for graphs in 1 0; do
    echo "== $bundle: step_phases, MLXCEL_STEP_GRAPHS=$graphs"
    MLXCEL_STEP_GRAPHS=$graphs "$bin/step_phases" "$bundle" --steps 128 || status=1
  done
  for i in $(seq "$runs"); do
    for mode in "MLXCEL_STEP_GRAPHS=1" "MLXCEL_STEP_GRAPHS=0" "MLXCEL_KERNELS=mlx"; do
      echo "== $bundle: mlxcel bench, $mode (run $i)"
      env "$mode" "$bin/mlxcel" bench "$bundle" -p 512 -n 128 -r 3 || status=1
    done
  done
done
exit $status
