"""How fast MLX's CUDA matrix-vector products read weights, by format and shape.

Usage (on the H200, MLX's Python bindings over the CUDA MLX tree, as
`bench/gpu.sh prepare` installs them): PYTHONPATH=/root/gpu-bench/pysite python3 scripts/gpu/qmv_probe.py

For each shape [N, K] (a decode step's output projections and layer
matrices of SmolLM2-135M and Gemma 3 270M) and each weight format (affine
8-bit and 4-bit in groups of 32 with f32 scales and biases, which is what
the runtime hands MLX with f32 activations; dense f32 and f16), times
x [1, K] @ Wᵀ: COUNT independent products in one evaluation (so launch
latency overlaps and the figure is the kernels' own), cycling over COPIES
distinct matrices (so that the vocabulary-sized ones come from memory, not
the 50 MB L2), after a warm-up, best of REPS. Prints one JSON line per case: microseconds per product and the
weight bytes read per second.
"""

import json
import time

import mlx.core as mx

SHAPES = [
    ("SmolLM2 output projection", 49152, 576),
    ("Gemma 3 output projection", 262144, 640),
    ("SmolLM2 MLP up", 1536, 576),
    ("SmolLM2 MLP down", 576, 1536),
]
COUNT = 64
COPIES = 4
REPS = 5


def best_time(fn):
    mx.eval(fn())
    mx.synchronize()
    best = float("inf")
    for _ in range(REPS):
        t = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        best = min(best, time.perf_counter() - t)
    return best / COUNT


def main():
    mx.set_default_device(mx.gpu)
    for name, n, k in SHAPES:
        ws = [mx.random.normal((n, k)).astype(mx.float32) for _ in range(COPIES)]
        xs = [mx.random.normal((1, k)) for _ in range(COUNT)]
        cases = {}
        for bits in (8, 4):
            qs = [mx.quantize(w, group_size=32, bits=bits) for w in ws]
            mx.eval(qs)
            wq, s, b = qs[0]
            nbytes = wq.nbytes + s.nbytes + b.nbytes
            cases[f"affine {bits}-bit"] = (
                lambda qs=qs, bits=bits: [
                    mx.quantized_matmul(x, *qs[i % COPIES], transpose=True, group_size=32, bits=bits)
                    for i, x in enumerate(xs)
                ],
                nbytes,
            )
        for dtype in (mx.float32, mx.float16):
            wds = [w.astype(dtype) for w in ws]
            mx.eval(wds)
            cases[f"dense {dtype}".replace("mlx.core.", "")] = (
                lambda wds=wds, dtype=dtype: [x.astype(dtype) @ wds[i % COPIES].T for i, x in enumerate(xs)],
                wds[0].nbytes,
            )
        del ws
        for fmt, (fn, nbytes) in cases.items():
            s = best_time(fn)
            print(json.dumps({"matrix": name, "N": n, "K": k, "format": fmt, "us": round(s * 1e6, 2),
                              "TB_per_s": round(nbytes / s / 1e12, 3)}))


if __name__ == "__main__":
    main()
