#!/usr/bin/env bash
# Two mlxcel builds on the same models in one run, interleaved (A, B, A, B,
# ...), so that a change's effect on speed is measured against the noise of
# this machine rather than against a table from another day.
#
#   bash bench/ab.sh OLD_MLXCEL OLD_BUNDLE_DIR NEW_MLXCEL NEW_BUNDLE_DIR
#   ROUNDS=3 PP=512 TG=128 REPS=3 bash bench/ab.sh ...
#
# Each bundle directory holds SmolLM2-135M-Instruct.Q4_1.mlxb and
# gemma-3-270m-q4_k_m.mlxb (each build's `mlxcel-compile` of the packages'
# GGUFs, so that each side reads the bundle layout it was written for). Every
# round runs `mlxcel bench -p PP -n TG -r REPS --json` once per build and
# model; the summary gives each build's mean over rounds of the mean t/s, the
# spread across rounds, and B/A.
set -euo pipefail
[ $# -eq 4 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
a_bin=$1 a_dir=$2 b_bin=$3 b_dir=$4
rounds=${ROUNDS:-3} pp=${PP:-512} tg=${TG:-128} reps=${REPS:-3}
models=(SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$rounds"); do
  for m in "${models[@]}"; do
    for side in A B; do
      if [ "$side" = A ]; then bin=$a_bin dir=$a_dir; else bin=$b_bin dir=$b_dir; fi
      echo "round $round: $side $m" >&2
      "$bin" bench "$dir/$m.mlxb" -p "$pp" -n "$tg" -r "$reps" --json |
        python3 -c 'import json,sys; side,m=sys.argv[1:]; [print(side, m, r["test"], r["tokens_per_second"]) for r in json.load(sys.stdin)]' "$side" "$m" >>"$out"
    done
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, model, test, tps = line.split()
    rates[(model, test, side)].append(float(tps))
print("| model | test | A t/s | B t/s | B/A |")
print("|---|---|--:|--:|--:|")
for model, test in sorted({(m, t) for m, t, _ in rates}):
    a, b = rates[(model, test, "A")], rates[(model, test, "B")]
    fmt = lambda v: f"{statistics.mean(v):.1f} ± {statistics.pstdev(v):.1f}"
    print(f"| {model} | {test} | {fmt(a)} | {fmt(b)} | {statistics.mean(b) / statistics.mean(a):.3f} |")
PY
