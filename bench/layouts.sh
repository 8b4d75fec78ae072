#!/usr/bin/env bash
# The two weight layouts of `mlxcel-compile --weight-layout` (row-major, rows16)
# on the same GGUF, in the same run: prompt processing and batched decode
# (`mlxcel bench -b B`: B sequences per decode step, tokens of all of them per
# second), with the rows16/row-major ratio (docs/benchmarks.md "Weight
# layouts"; docs/kernels.md says why the layouts differ).
#
#   bash bench/layouts.sh                        # SmolLM2 Q4_1, 2 threads
#   GGUF=path/to/model.gguf THREADS=1 bash bench/layouts.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

threads=${THREADS:-2}
reps=${REPS:-3}
gguf=${GGUF:-$root/.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf}
batches=${BATCHES:-1 4 8 16}
work=${BENCH_DIR:-$root/target/bench/layouts}
mkdir -p "$work"

make -s setup
cargo build -q --release -p mlxcel-cli -p mlxcel-compiler
bin=$root/target/release

name=$(basename "$gguf" .gguf)
for layout in row-major rows16; do
  "$bin/mlxcel-compile" "$gguf" -o "$work/$name-$layout.mlxb" --weight-layout "$layout" --quiet >/dev/null 2>&1
done

# The mean tokens/s of one `mlxcel bench --json` test.
measure() { # layout args...
  local layout=$1
  shift
  "$bin/mlxcel" bench "$work/$name-$layout.mlxb" -t "$threads" -r "$reps" --json "$@" |
    python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["tokens_per_second"])'
}

echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $threads threads, $reps repetitions; $name"
echo
echo "| test | row-major tok/s | rows16 tok/s | rows16 / row-major |"
echo "|---|--:|--:|--:|"
row() { # label args...
  local label=$1
  shift
  local a b
  a=$(measure row-major "$@")
  b=$(measure rows16 "$@")
  python3 -c "print('| $label | $a | $b | %.2fx |' % ($b / $a))"
}
row "pp512" -p 512 -n 0
for b in $batches; do
  row "tg64, $b sequence(s)" -p 0 -n 64 -b "$b"
done
