#!/usr/bin/env python3
"""One decode step's kernels from Nsight Compute's CSV (`ncu --metrics
gpu__time_duration.sum --csv`): the last whole step (from one output
projection to the next: MLX's 8-bit `qmv` or mlxcel's 8-bit product, the
tied 8-bit embedding of the bundles measured), its kernels by kind with
their summed GPU time, as a Markdown table.

    step_kernels.py NCU.csv LABEL

Used by bench/gpu.sh profile and scripts/gpu/step_profile.sh.
"""
import collections, csv, io, sys
rows = list(csv.DictReader(io.StringIO("".join(l for l in open(sys.argv[1]) if l.startswith('"')))))
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
ends = [i for i, n in enumerate(names) if output_projection(n)]
if len(ends) < 2:
    sys.exit(f"{sys.argv[1]}: fewer than two decode steps found ({len(names)} kernels)")
a, b = ends[-2], ends[-1]
agg = collections.defaultdict(lambda: [0, 0.0])
for n, t in zip(names[a + 1 : b + 1], ns[a + 1 : b + 1]):
    agg[kind(n)][0] += 1
    agg[kind(n)][1] += t
total = sum(v[1] for v in agg.values())
print(f"{sys.argv[2]}: one decode step, {b - a} kernels, {total / 1000:,.0f} µs of GPU time summed\n")
print("| kernels | launches | µs | share |")
print("|---|--:|--:|--:|")
for k, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {k} | {c} | {t / 1000:,.1f} | {100 * t / total:.0f}% |")
