#!/usr/bin/env bash
# Where one decode step's GPU time goes, on the lent NVIDIA machine after
# `source scripts/gpu/remote.sh env` (docs/cuda.md "mlxcel's own CUDA
# kernels"):
#
#   bash scripts/gpu/step_profile.sh BUNDLE [auto|mlx]
#
# Runs `mlxcel bench BUNDLE -p 0 -n 8 -r 1` under Nsight Compute (kernel
# durations only; the clocks are not locked, as the machine's notes ask),
# with mlxcel's kernels (auto, the default) or MLX's ops only (mlx), and
# prints, for the last whole decode step (from one output projection to the
# next: the 8-bit product of a bundle whose tied embedding is 8-bit, as
# SmolLM2's), the kernels it launched by kind with their summed GPU time.
# ncu runs each kernel alone, so the sum is an upper bound on the step's
# kernel time; set against the step's time from `mlxcel bench`, the rest is
# the host (graph building, launches, synchronisation).
set -euo pipefail
bundle=${1:?usage: step_profile.sh BUNDLE [auto|mlx]}
kernels=${2:-auto}
bin=${BIN:-.gpu/bin}
csv=${OUT:-/tmp}/ncu-$kernels.csv
MLXCEL_KERNELS=$kernels ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-summary none \
  -c 4000 "$bin/mlxcel" bench "$bundle" -p 0 -n 8 -r 1 >"$csv" 2>"$csv.err" || { tail -20 "$csv.err" >&2; exit 1; }
python3 "$(dirname "$0")/step_kernels.py" "$csv" "MLXCEL_KERNELS=$kernels"
