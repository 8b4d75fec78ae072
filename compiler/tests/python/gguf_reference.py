"""Reference values of a GGUF's tensors, for the ingest tests.

    gguf_reference.py GGUF OUT.json

For every tensor: its ggml type, numpy shape, the SHA-256 of the pip `gguf`
package's dequantization (`gguf.quants.dequantize`, little-endian f32), and
the SHA-256 after transformers' GGUF tensor processor for the architecture
(llama: q/k rows un-permuted; gemma3: norm weights minus one), the same
reverse transforms transformers applies when it loads a GGUF. A few leading
values are kept for diagnostics.
"""

import hashlib
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

import _torch_stub

_torch_stub.install()
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS  # noqa: E402


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def main(path, out):
    reader = GGUFReader(path)
    arch = field(reader, "general.architecture")
    heads = field(reader, f"{arch}.attention.head_count")
    kv = field(reader, f"{arch}.attention.head_count_kv") or heads
    processor = TENSOR_PROCESSORS.get(arch)
    processor = processor({"num_attention_heads": heads, "num_key_value_heads": kv}) if processor else None
    result = {"architecture": arch, "tensors": {}}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = [int(d) for d in reversed(t.shape)]
        values = values.reshape(shape)
        raw = np.ascontiguousarray(values, dtype="<f4")
        hf = raw
        if processor is not None:
            hf = np.ascontiguousarray(processor.process(values, t.name).weights, dtype="<f4")
        result["tensors"][t.name] = {
            "type": t.tensor_type.name,
            "shape": shape,
            "sha256": hashlib.sha256(raw.tobytes()).hexdigest(),
            "sha256_hf": hashlib.sha256(hf.tobytes()).hexdigest(),
            # With -0.0 as +0.0: the affine transcode computes d*q + (-8d)
            # where the reference computes d*(q-8), equal up to a zero's sign.
            "sha256_hf_canon": hashlib.sha256(np.where(hf == 0, np.float32(0), hf).astype("<f4").tobytes()).hexdigest(),
            "head": [float(v) for v in raw.reshape(-1)[:4]],
            "head_hf": [float(v) for v in hf.reshape(-1)[:4]],
        }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
