"""Dequantizes raw ggml blocks with the pip `gguf` package, for the tests of
quantization types the real models do not use.

    dequant_blocks.py TYPE IN.bin OUT.bin

TYPE is a ggml type name (Q4_0, Q5_1, Q2_K, ...); OUT.bin gets little-endian f32.
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def main(type_name, src, dst):
    qtype = GGMLQuantizationType[type_name]
    data = np.fromfile(src, dtype=np.uint8)
    values = dequantize(data, qtype).astype("<f4")
    values.tofile(dst)


if __name__ == "__main__":
    main(*sys.argv[1:])
