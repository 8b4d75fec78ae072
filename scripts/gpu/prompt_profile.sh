#!/usr/bin/env bash
# Where one prompt pass's GPU time goes (docs/cuda.md "Prompts through
# cuBLAS"), on the lent NVIDIA machine after `source scripts/gpu/remote.sh env`:
#
#   bash scripts/gpu/prompt_profile.sh BUNDLE [WORDS]
#
# Nsight Compute's kernel durations over `mlxcel run` of a raw prompt of
# WORDS (511) words and one token, with the caches not flushed between
# kernels (--cache-control none) and the clocks not locked (as the
# machine's notes ask); each kernel still runs alone, so the sum is an upper
# bound on the GPU time. Printed (step_kernels.py --prompt): from the
# embedding's gather to the first output projection (the prompt but its
# last token in one pass, then the last token's step, as generation runs
# it; the load's conversions before it are left out), the kernels grouped
# by name, longest first.
set -euo pipefail
bundle=${1:?usage: prompt_profile.sh BUNDLE [WORDS]}
words=${2:-511}
bin=${BIN:-.gpu/bin}
csv=${OUT:-/tmp}/ncu-prompt-${MLXCEL_KERNELS:-auto}.csv
prompt=$(python3 -c "import sys; print(' '.join(['the'] * int(sys.argv[1])))" "$words")
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
  --print-summary none -c 5000 "$bin/mlxcel" run "$bundle" --no-chat-template -p "$prompt" -n 1 --temp 0 \
  >"$csv" 2>"$csv.err" || { tail -20 "$csv.err" >&2; exit 1; }
python3 "$(dirname "$0")/step_kernels.py" --prompt "$csv" "prompt of $words words"
