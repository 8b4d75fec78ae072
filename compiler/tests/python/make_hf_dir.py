"""Makes a Hugging Face model directory from a Llama-architecture GGUF, for
the ingest tests (SmolLM2 as a safetensors model).

    make_hf_dir.py GGUF OUTDIR [f32|bf16]

Independent of mlxcel's Rust code: the config comes from transformers' GGUF
config mapping, the weights from the pip `gguf` package's dequantization and
transformers' llama tensor processor (q/k rows un-permuted), the names from
the table below (Hugging Face's Llama module names), the tokenizer from
transformers' GGUF tokenizer conversion. mlx-lm loads the result (the tests
convert it to an MLX 4-bit directory with mlx-lm's `convert`).
"""

import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

import _torch_stub

_torch_stub.install()
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # noqa: E402
from transformers.integrations.gguf.gguf_tokenizer_mapping import (  # noqa: E402
    convert_gguf_tokenizer,
    get_gguf_tokenizer,
)
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS  # noqa: E402

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(name):
    base, suffix = name.rsplit(".", 1)
    if base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    _, layer, leaf = base.split(".", 2)
    return f"model.layers.{layer}.{LAYER_NAMES[leaf]}.{suffix}"


def main(path, out, dtype="f32"):
    reader = GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = fields["general.architecture"]
    if arch != "llama":
        raise SystemExit(f"make_hf_dir.py handles llama GGUFs, not {arch}")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    for key, hf in GGUF_CONFIG_MAPPING[arch].items():
        if hf and f"{arch}.{key}" in fields:
            config[hf] = fields[f"{arch}.{key}"]
    names = {t.name for t in reader.tensors}
    config["tie_word_embeddings"] = "output.weight" not in names
    config["hidden_act"] = "silu"
    config["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in reader.fields:
            config[key.replace("padding", "pad")] = int(reader.fields[f"tokenizer.ggml.{key}"].contents())

    processor = TENSOR_PROCESSORS[arch](
        {"num_attention_heads": config["num_attention_heads"], "num_key_value_heads": config["num_key_value_heads"]}
    )
    tensors = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(d) for d in reversed(t.shape)])
        values = processor.process(values, t.name).weights
        if dtype == "bf16":
            # Round to nearest even, as torch and MLX do.
            bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            tensors[hf_name(t.name)] = bits
        else:
            tensors[hf_name(t.name)] = np.ascontiguousarray(values, dtype=np.float32)

    os.makedirs(out, exist_ok=True)
    if dtype == "bf16":
        # safetensors.numpy has no bfloat16: write the header by hand.
        write_bf16(tensors, os.path.join(out, "model.safetensors"))
    else:
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    tok_arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(os.path.abspath(path))
    tokenizer, _ = convert_gguf_tokenizer(tok_arch, tokenizer_dict)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)


def write_bf16(tensors, path):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = tensors[name].tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main(*sys.argv[1:])
