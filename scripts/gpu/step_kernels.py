#!/usr/bin/env python3
"""One decode step's kernels from Nsight Compute's CSV (`ncu --metrics
gpu__time_duration.sum --csv`): the last whole step (from one output
projection to the next: MLX's 8-bit `qmv` or mlxcel's 8-bit product, the
tied 8-bit embedding of the bundles measured), its kernels by kind with
their summed GPU time, as a Markdown table.

    step_kernels.py NCU.csv LABEL
    step_kernels.py --prompt NCU.csv LABEL

With --prompt: from the first gather (the embedding) to the first output
projection (a prompt but its last token in one pass, then the last token's
step, as generation runs it; what loading ran before is left out), its
kernels grouped by name, the 16 longest.

Used by bench/gpu.sh profile, scripts/gpu/step_profile.sh and (--prompt)
scripts/gpu/prompt_profile.sh.
"""
import collections, csv, io, sys
prompt = sys.argv[1:2] == ["--prompt"]
path, label = sys.argv[2:4] if prompt else sys.argv[1:3]
rows = list(csv.DictReader(io.StringIO("".join(l for l in open(path) if l.startswith('"')))))
names = [r["Kernel Name"] for r in rows]
ns = [float(r["Metric Value"].replace(",", "")) for r in rows]
def output_projection(n):
    return ("qmv_kernel" in n and "unsigned char" in n) or n.startswith("void mlxcel::product<8,")
def kind(n):
    if output_projection(n): return "output projection"
    if "mlxcel::product" in n: return "mlxcel products"
    if "mlxcel::gated" in n: return "mlxcel gated MLP"
    if "mlxcel::rope_write" in n or "mlxcel::cached_attention" in n: return "mlxcel attention"
    if "mlxcel::copy" in n: return "mlxcel cache copies"
    if "qmv_kernel" in n: return "MLX qmv"
    if any(k in n for k in ("sdpa", "softmax", "gemm", "splitK", "gemv")): return "MLX attention"
    if "rms_norm" in n: return "MLX RMS norms"
    if "rope" in n: return "MLX RoPE"
    if "copy" in n: return "MLX copies"
    return "MLX elementwise and other"
if prompt:
    a = next((i for i, n in enumerate(names) if "gather" in n), None)
    b = None if a is None else next((i for i in range(a, len(names)) if output_projection(names[i])), None)
    if b is None:
        sys.exit(f"{path}: no gather followed by an output projection ({len(names)} kernels)")
    span, key, top = range(a, b + 1), lambda n: "`" + n.split("(")[0][:100] + "`", 16
    title, column = f"{label}: {b + 1 - a} kernels", "kernel"
else:
    ends = [i for i, n in enumerate(names) if output_projection(n)]
    if len(ends) < 2:
        sys.exit(f"{path}: fewer than two decode steps found ({len(names)} kernels)")
    a, b = ends[-2], ends[-1]
    span, key, top = range(a + 1, b + 1), kind, None
    title, column = f"{label}: one decode step, {b - a} kernels", "kernels"
agg = collections.defaultdict(lambda: [0, 0.0])
for i in span:
    agg[key(names[i])][0] += 1
    agg[key(names[i])][1] += ns[i]
total = sum(v[1] for v in agg.values())
print(f"{title}, {total / 1000:,.0f} µs of GPU time summed\n")
print(f"| {column} | launches | µs | share |")
print("|---|--:|--:|--:|")
for k, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"| {k} | {c} | {t / 1000:,.1f} | {100 * t / total:.0f}% |")
