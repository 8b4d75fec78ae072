#!/usr/bin/env bash
# Two builds of the binaries on the same bundles, alternating, so that a
# change's effect on decode comes from one run on one machine (the lent
# machines of one kind differ by several percent). On the lent NVIDIA
# machine after `source scripts/gpu/remote.sh env`:
#
#   A=/root/old/bin B=/root/bin RUNS=2 bash scripts/gpu/ab_bins.sh BUNDLE...
#
# A and B are folders holding `mlxcel` and `step_phases` (docs/cuda.md
# "The recipe on the lent H200"). Per run, bundle and build: the backend's
# decode step from step_phases (128 steps after 64 positions) and
# `mlxcel bench -p 512 -n 128 -r 3`.
set -uo pipefail
a=${A:?A=folder of the first build}
b=${B:?B=folder of the second build}
runs=${RUNS:-2}
status=0
for bundle in "$@"; do
  for i in $(seq "$runs"); do
    for build in "$a" "$b"; do
      echo "== $bundle, run $i: $build"
      "$build/step_phases" "$bundle" --steps 128 | grep -F "backend decode step" || status=1
      "$build/mlxcel" bench "$bundle" -p 512 -n 128 -r 3 | grep -E "pp512|tg128" || status=1
    done
  done
done
exit $status
