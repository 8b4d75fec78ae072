"""Writes a tiny Qwen3-MoE, as mlx-lm built it, in the source formats a
mixture of experts comes in, for the compiler's MoE tests.

    moe_sources.py MLX_DIR OUT_DIR

MLX_DIR is tests/python/tiny_reference.py's float `qwen3_moe` model (mlx-lm's
layout: experts stacked as `mlp.switch_mlp.{gate,up,down}_proj.weight`
[experts, out, in]). Written into OUT_DIR:

  hf/       a Hugging Face directory as transformers saves Qwen3-MoE: every
            expert its own `mlp.experts.{e}.{proj}.weight`, in two shards with
            an index (the experts of each layer split across both), the
            config with `architectures`;
  f32.gguf, q8_0.gguf, q4_0.gguf
            GGUFs as llama.cpp's converter names and shapes Qwen3-MoE
            (`general.architecture = qwen3moe`, `blk.N.ffn_gate_inp` router,
            3-D `blk.N.ffn_{gate,up,down}_exps`, the dense layer's `ffn_gate`
            etc.), written with the pip `gguf` package; in the quantized ones
            every matrix but the router (kept F32, as llama.cpp does) is
            quantized with `gguf.quants.quantize`, norms stay F32.

Independent of mlxcel's Rust code: names and layouts come from mlx-lm's
qwen3_moe.py (its `sanitize` stacks what `hf/` unstacks) and gguf-py.
"""

import json
import pathlib
import shutil
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.numpy import load_file, save_file

PROJS = ("gate_proj", "up_proj", "down_proj")

GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.switch_mlp.gate_proj.weight": "ffn_gate_exps.weight",
    "mlp.switch_mlp.up_proj.weight": "ffn_up_exps.weight",
    "mlp.switch_mlp.down_proj.weight": "ffn_down_exps.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(name):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{GGUF_LAYER_NAMES[rest]}"


def write_hf(weights, config, src, out):
    out.mkdir(parents=True, exist_ok=True)
    n = config["num_experts"]
    shards = ({}, {})
    for name, w in weights.items():
        if ".switch_mlp." not in name:
            shards[0][name] = w
            continue
        prefix, proj = name.split(".mlp.switch_mlp.")
        assert w.shape[0] == n
        for e in range(n):
            # Experts 0..n/2 in the first shard, the rest in the second.
            shards[e * 2 // n][f"{prefix}.mlp.experts.{e}.{proj}"] = np.ascontiguousarray(w[e])
    files = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    weight_map = {}
    for shard, file in zip(shards, files):
        save_file(shard, str(out / file))
        weight_map.update({k: file for k in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    hf_config = dict(config, architectures=["Qwen3MoeForCausalLM"])
    (out / "config.json").write_text(json.dumps(hf_config, indent=1))
    shutil.copy(src / "tokenizer.json", out / "tokenizer.json")


def byte_tokens():
    """GPT-2's byte-to-unicode table: token i is byte i (tiny_reference's tokenizer)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = [], 0
    for b in range(256):
        if b in printable:
            table.append(chr(b))
        else:
            table.append(chr(256 + extra))
            extra += 1
    return table


# llama.cpp's qwen3moe metadata keys (after "qwen3moe.") and the
# Hugging Face config keys they hold.
GGUF_UINT_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.value_length": "head_dim",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}
GGUF_FLOAT_KEYS = {"rope.freq_base": "rope_theta", "attention.layer_norm_rms_epsilon": "rms_norm_eps"}


def write_gguf(weights, config, path, qtype):
    w = GGUFWriter(str(path), "qwen3moe")
    for key, hf in GGUF_UINT_KEYS.items():
        w.add_uint32(f"qwen3moe.{key}", config[hf])
    for key, hf in GGUF_FLOAT_KEYS.items():
        w.add_float32(f"qwen3moe.{key}", config[hf])
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    # gguf-py drops an empty array, and a gpt2 vocabulary needs merges: one
    # merge, into token 255. Every id must have an embedding row (the
    # compiler refuses a tokenizer that can produce id 256 for 256 rows), and
    # byte 0xFF, token 255's byte, never occurs in UTF-8 text.
    w.add_array("tokenizer.ggml.tokens", byte_tokens()[:255] + ["ab"])
    w.add_array("tokenizer.ggml.token_type", [1] * 256)
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.add_uint32("tokenizer.ggml.eos_token_id", 255)
    for name, t in weights.items():
        gname = gguf_name(name)
        t = t.astype(np.float32)
        keep_f32 = t.ndim < 2 or gname.endswith("ffn_gate_inp.weight") or qtype == GGMLQuantizationType.F32
        if keep_f32:
            w.add_tensor(gname, t)
        else:
            w.add_tensor(gname, quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    config = json.loads((src / "config.json").read_text())
    weights = {k: np.asarray(v) for k, v in load_file(str(src / "model.safetensors")).items()}
    write_hf(weights, config, src, out / "hf")
    for file, qtype in (("f32.gguf", GGMLQuantizationType.F32), ("q8_0.gguf", GGMLQuantizationType.Q8_0),
                        ("q4_0.gguf", GGMLQuantizationType.Q4_0)):
        write_gguf(weights, config, out / file, qtype)


if __name__ == "__main__":
    main()
