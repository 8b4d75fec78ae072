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
# bound on the GPU time. Printed: from the embedding's gather to the first
# output projection (the prompt but its last token in one pass, then the
# last token's step, as generation runs it; the load's conversions before
# it are left out), the kernels grouped by name, longest first.
set -euo pipefail
bundle=${1:?usage: prompt_profile.sh BUNDLE [WORDS]}
words=${2:-511}
bin=${BIN:-.gpu/bin}
csv=${OUT:-/tmp}/ncu-prompt-${MLXCEL_KERNELS:-auto}.csv
prompt=$(python3 -c "import sys; print(' '.join(['the'] * int(sys.argv[1])))" "$words")
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
  --print-summary none -c 5000 "$bin/mlxcel" run "$bundle" --no-chat-template -p "$prompt" -n 1 --temp 0 \
  >"$csv" 2>"$csv.err" || { tail -20 "$csv.err" >&2; exit 1; }
python3 - "$csv" "$words" <<'PY'
import collections, csv, io, sys
rows = list(csv.DictReader(io.StringIO("".join(l for l in open(sys.argv[1]) if l.startswith('"')))))
rows = [r for r in rows if r["Metric Name"] == "gpu__time_duration.sum"]
names = [r["Kernel Name"] for r in rows]
ns = [float(r["Metric Value"].replace(",", "")) for r in rows]
gather = lambda n: "gather" in n
projection = lambda n: ("qmv_kernel" in n and "unsigned char" in n) or n.startswith("void mlxcel::product<8,")
a = next(i for i, n in enumerate(names) if gather(n))
b = next(i for i in range(a, len(names)) if projection(names[i]))
agg = collections.defaultdict(lambda: [0, 0.0])
for n, t in zip(names[a : b + 1], ns[a : b + 1]):
    key = n.split("(")[0][:100]
    agg[key][0] += 1
    agg[key][1] += t
total = sum(v[1] for v in agg.values())
print(f"prompt of {sys.argv[2]} words: {b + 1 - a} kernels, {total / 1000:,.0f} µs of GPU time summed\n")
print("| kernel | launches | µs | share |")
print("|---|--:|--:|--:|")
for k, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:16]:
    print(f"| `{k}` | {c} | {t / 1000:,.1f} | {100 * t / total:.0f}% |")
PY
