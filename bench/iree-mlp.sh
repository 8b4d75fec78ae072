#!/usr/bin/env bash
# IREE on this CPU for one decode step's feed-forward half at SmolLM2-135M's
# sizes (RMS norm, 4-bit gate/up/down products in groups of 32 dequantized in
# the graph, SwiGLU, residual; batch 1), as `mlxcel-stablehlo` emits it, and
# the same gate product with f32 weights for scale (issue [8]; results in
# docs/stablehlo.md "Speed").
#
#   bash bench/iree-mlp.sh            # local-sync (one thread), then local-task with 1 and 2 groups
#   REPS=10 bash bench/iree-mlp.sh
#
# Weights are zeroed parameter files (iree-create-parameters; its patterned
# fill fails in 3.13): loaded at run time, so nothing is constant-folded and
# the kernels do the same work as on real weights.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=${MLXCEL_DEPS_DIR:-$root/.deps}
iree=$deps/iree/iree
compile=$iree/compiler/_mlir_libs/iree-compile
[ -x "$compile" ] || { echo "iree-mlp.sh: $compile is missing: run make setup" >&2; exit 2; }
reps=${REPS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM

cargo run -q --release -p mlxcel-stablehlo --example decode_mlp "$work/decls.txt" > "$work/mlp.mlir"
# The f32 baseline: the gate product alone, weights stored as f32.
cat > "$work/dense.mlir" <<'MLIR'
module @dense {
  util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<1536x576xf32>
  func.func @mv(%x: tensor<1x576xf32>) -> tensor<1x1536xf32> {
    %w = util.global.load @w : tensor<1536x576xf32>
    %y = "stablehlo.dot_general"(%x, %w) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>} : (tensor<1x576xf32>, tensor<1536x576xf32>) -> tensor<1x1536xf32>
    func.return %y : tensor<1x1536xf32>
  }
}
MLIR
flags=(--iree-input-type=stablehlo --iree-hal-target-device=local
  --iree-hal-local-target-device-backends=llvm-cpu --iree-llvmcpu-target-cpu=host)
"$compile" "${flags[@]}" "$work/mlp.mlir" -o "$work/mlp.vmfb"
"$compile" "${flags[@]}" "$work/dense.mlir" -o "$work/dense.vmfb"
mapfile -t decls < <(sed 's/^/--data=/' "$work/decls.txt")
"$iree/_runtime_libs/iree-create-parameters" "${decls[@]}" --output="$work/mlp.irpa" > /dev/null
"$iree/_runtime_libs/iree-create-parameters" --data=w=1536x576xf32 --output="$work/dense.irpa" > /dev/null

bench() { # NAME FUNCTION INPUT DEVICE-FLAGS...
  local name=$1 fn=$2 input=$3
  shift 3
  local ms
  ms=$("$iree/_runtime_libs/iree-benchmark-module" "$@" --module="$work/$name.vmfb" \
    --parameters=model="$work/$name.irpa" --function="$fn" --input="$input" \
    --benchmark_repetitions="$reps" 2>&1 | awk '/_median/ {print $2, $3}')
  printf '| %s | %s | %s |\n' "$name" "$*" "$ms"
}
echo "| graph | device | median |"
echo "|---|---|---|"
for name in mlp dense; do
  if [ $name = mlp ]; then fn=mlp input=1x1x576xf32=0.5; else fn=mv input=1x576xf32=0.5; fi
  bench $name $fn $input --device=local-sync
  bench $name $fn $input --device=local-task --task_topology_max_group_count=1
  bench $name $fn $input --device=local-task --task_topology_max_group_count=2
done
