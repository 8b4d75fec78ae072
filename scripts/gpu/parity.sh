#!/usr/bin/env bash
# The GPU parity check of issue [9], run on the lent NVIDIA machine after
# `source scripts/gpu/remote.sh env` (docs/cuda.md "GPU parity"):
#
#   bash scripts/gpu/parity.sh BUNDLE [STEPS]
#
# Decodes the reference prompts greedily on the CPU (logit_trace), then on
# the GPU following the CPU's tokens, and compares each step's
# log-probabilities: f32 activations with TF32 matrix products (MLX's
# default on the GPU), f32 with full-precision products
# (MLX_ENABLE_TF32=0), and bf16 activations for the record. The f32 runs
# must stay within TOL of the CPU and pick the CPU's token at every step
# whose top two tokens are more than MARGIN apart; bf16 is reported, not
# judged. Exit status: 1 when an f32 run fails.
set -uo pipefail
bundle=${1:?usage: parity.sh BUNDLE [STEPS]}
steps=${2:-32}
bin=${BIN:-.gpu/bin}
tol=${TOL:-0.02}
margin=${MARGIN:-0.05}
out=${OUT:-/tmp}/parity-$(basename "$bundle" .mlxb)
mkdir -p "$out"
# The bundle's own GPU kernels (mlxcel-compile --target); GPU_KERNELS=jit
# for a bundle without them, where prompt rows per forward pass of at most
# 16 (CHUNK) keep MLX's run-time compilation to one tile (scripts/gpu/jit.sh).
# With the bundle's kernels, prompts run as the runtime runs them (512 rows a
# pass), so those of more than 32 tokens (the chat prompts, the long raw one)
# take mlxcel's prompt products (prompt.cuh) and MLX's prompt attention
# rather than mlxcel's decode kernels.
# SKIP_BF16=1 skips the bf16 run (its CUTLASS kernels are not in bundles).
if [ "${GPU_KERNELS:-refuse}" = jit ]; then chunk=${CHUNK:-16}; else chunk=${CHUNK:-512}; fi
trace() { "$bin/logit_trace" "$bundle" "$@" --prefill-chunk "$chunk" --gpu-kernels "${GPU_KERNELS:-refuse}"; }

echo "== $bundle: CPU reference, f32"
MLXCEL_DEVICE=cpu trace "$out/cpu.json" --steps "$steps" || exit 1
status=0
echo "== GPU, f32 activations, TF32 products (the default)"
MLXCEL_DEVICE=gpu trace "$out/gpu-f32.json" --steps "$steps" --follow "$out/cpu.json" --tol "$tol" --margin "$margin" || status=1
echo "== GPU, f32 activations, f32 products (MLX_ENABLE_TF32=0)"
MLX_ENABLE_TF32=0 MLXCEL_DEVICE=gpu trace "$out/gpu-f32-notf32.json" --steps "$steps" --follow "$out/cpu.json" \
  --tol "$tol" --margin "$margin" || status=1
if [ "${SKIP_BF16:-0}" != 1 ]; then
  echo "== GPU, bf16 activations (--dtype bf16; reported, not judged)"
  MLXCEL_DEVICE=gpu trace "$out/gpu-bf16.json" --steps "$steps" --dtype bf16 --follow "$out/cpu.json" \
    --tol "$tol" --margin "$margin" || true
fi
echo "== GPU, f32, greedy on its own"
MLXCEL_DEVICE=gpu trace "$out/gpu-own.json" --steps "$steps"
exit $status
