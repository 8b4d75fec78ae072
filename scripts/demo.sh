#!/usr/bin/env bash
# The main job: compile the real SmolLM2 into a bundle, then generate text from it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release
"$bin/mlxcel" --version
echo
echo "mlxcel demo: compiling SmolLM2 into a bundle and generating from it is not built yet"
echo "(issues [2] bundle, [3] mlxcel-compile and [4] mlxcel run). The MLX bridge above is."
