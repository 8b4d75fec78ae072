#!/usr/bin/env bash
# Start-up of mlxcel against mlx-lm on the same weights (SmolLM2-135M, 4-bit,
# the lossless transcode of its Q4_1 GGUF), with a warm page cache:
#   - bundle open to model ready (mlxcel run --verbose's "ready in");
#   - process start to first token (mlxcel run -p Hi -n 1, wall clock);
#   - mlx-lm: mlx_lm.load() time, and process start to first token of
#     `python -m mlx_lm generate --max-tokens 1`.
# Five runs each after one warm-up; prints the median and the range.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
make -s setup
cargo build -q --release -p mlxcel-cli -p mlxcel-compiler
cargo build -q --release -p mlxcel-tests --example export_mlx_lm
work=${BENCH_DIR:-$root/target/bench}
mkdir -p "$work"
bundle=$work/smollm2-q4.mlxb
target/release/mlxcel-compile .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf -o "$bundle" --quiet
rm -rf "$work/smollm2-q4-mlx"
target/release/examples/export_mlx_lm "$bundle" "$work/smollm2-q4-mlx"
py=.deps/venv/bin/python
export MLXCEL_DEVICE=cpu

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f (%.1f-%.1f)", m, a[1], a[NR]}'; }

ready=(); first=(); mlx_load=(); mlx_first=()
for i in 0 1 2 3 4 5; do
  t=$(now)
  out=$(target/release/mlxcel run "$bundle" -p Hi -n 1 --verbose 2>&1 >/dev/null)
  e=$(now)
  [ "$i" = 0 ] && continue
  first+=("$(awk "BEGIN{print ($e - $t) * 1000}")")
  ready+=("$(echo "$out" | sed -n 's/.*ready in \([0-9.]*\) ms.*/\1/p')")
done
for i in 0 1 2 3 4 5; do
  j=$($py bench/mlx_lm_bench.py "$work/smollm2-q4-mlx" -p 0 -n 0 -r 0)
  t=$(now)
  $py -m mlx_lm generate --model "$work/smollm2-q4-mlx" --prompt Hi --max-tokens 1 >/dev/null 2>&1
  e=$(now)
  [ "$i" = 0 ] && continue
  mlx_load+=("$(echo "$j" | $py -c 'import json,sys; print(json.load(sys.stdin)["load_seconds"]*1000)')")
  mlx_first+=("$(awk "BEGIN{print ($e - $t) * 1000}")")
done
printf '| SmolLM2-135M 4-bit, ms (median, range of 5) | mlxcel | mlx-lm |\n|---|--:|--:|\n'
printf '| open to model ready / load() | %s | %s |\n' "$(printf '%s\n' "${ready[@]}" | median)" "$(printf '%s\n' "${mlx_load[@]}" | median)"
printf '| process start to first token | %s | %s |\n' "$(printf '%s\n' "${first[@]}" | median)" "$(printf '%s\n' "${mlx_first[@]}" | median)"
