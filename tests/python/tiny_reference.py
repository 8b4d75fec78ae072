"""Builds a tiny random model with mlx-lm and records what mlx-lm generates.

Usage: tiny_reference.py ARCH OUT_DIR [--bits N] [--seed S] [--prompt-len L] [--tokens T]

Writes OUT_DIR/tokenizer.json (a byte-level tokenizer: one token per byte,
no merges, so any text round-trips with the 256-entry vocabulary),
OUT_DIR/model.safetensors and OUT_DIR/config.json (mlx-lm's own layout:
weights under their Hugging Face names, quantized layers as weight/scales/biases
with `quantization` in the config) and OUT_DIR/reference.json:
  prompt            the prompt token ids
  tokens            mlx-lm's greedy continuation (generate_step, argmax sampler)
  prompt_logits     logits at the prompt's last position from one full forward
                    pass without a cache, as a flat float32 list
All computation is float32 on the CPU.
"""

import argparse
import json
import pathlib

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.utils import quantize_model

BASE = dict(
    hidden_size=64,
    num_hidden_layers=3,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=256,
    max_position_embeddings=512,
)

CONFIGS = {
    "llama": dict(model_type="llama", tie_word_embeddings=True, rope_theta=10000.0),
    "llama_untied_scaled": dict(
        model_type="llama",
        tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=True, rope_theta=1000000.0, head_dim=32),
    "gemma3": dict(
        model_type="gemma3_text",
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=8,
        sliding_window_pattern=2,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rms_norm_eps=1e-6,
    ),
    "phi3": dict(model_type="phi3", tie_word_embeddings=False, rope_theta=10000.0),
    # Every layer slides over a window smaller than the prompt (Hugging Face's
    # Mistral: `sliding_window` set and no `layer_types`).
    "mistral": dict(model_type="mistral", tie_word_embeddings=True, rope_theta=10000.0, sliding_window=8),
    # Layer 1 keeps a dense MLP (mlp_only_layers), layers 0 and 2 route each
    # token to 2 of 8 experts.
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        tie_word_embeddings=False,
        rope_theta=1000000.0,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    ),
}


def write_byte_tokenizer(path):
    """A byte-level BPE tokenizer with no merges: token id = byte value."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2's byte-to-unicode table, which the ByteLevel pre-tokenizer uses.
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))


def module_for(model_type):
    import importlib

    from mlx_lm.utils import MODEL_REMAPPING

    return importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(model_type, model_type)}")


def build_model(mod, config):
    if config["model_type"] != "mistral":
        return mod.Model(mod.ModelArgs.from_dict(config))
    # mlx-lm runs Mistral as its llama.py, which honours per-layer types but
    # cannot be built with no full-attention layer (`layer_types.index(
    # "full_attention")`), while Hugging Face's Mistral slides every layer
    # when `sliding_window` is set. Build it with one full layer, then make
    # that layer slide too; the config written out stays Hugging Face's
    # (no layer_types), which mlxcel must normalize to all-sliding.
    n = config["num_hidden_layers"]
    types = ["full_attention"] + ["sliding_attention"] * (n - 1)
    model = mod.Model(mod.ModelArgs.from_dict(dict(config, layer_types=types)))
    for layer in model.model.layers:
        layer.use_sliding = True
    model.model.swa_idx = 0
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("arch", choices=sorted(CONFIGS))
    p.add_argument("out")
    p.add_argument("--bits", type=int, default=0)
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-len", type=int, default=20)
    p.add_argument("--tokens", type=int, default=24)
    a = p.parse_args()

    mx.set_default_device(mx.cpu)
    mx.random.seed(a.seed)
    config = dict(BASE, **CONFIGS[a.arch])
    mod = module_for(config["model_type"])
    model = build_model(mod, config)
    # Random weights big enough that logits are not a near-tie: scale every
    # parameter up from nn's small default init (norm gains stay near 1).
    params = dict(tree_flatten(model.parameters()))
    new = {}
    for k, v in params.items():
        if "norm" in k:
            new[k] = v + 0.1 * mx.random.normal(v.shape)
        else:
            new[k] = mx.random.normal(v.shape) * (1.5 / (v.shape[-1] ** 0.5))
    model.load_weights(list(new.items()))
    if hasattr(model, "sanitize") and config["model_type"] == "gemma3_text":
        # Gemma ties its embeddings when there is no lm_head in the weights.
        model.sanitize({k: v for k, v in new.items() if not k.startswith("lm_head")})
        new = {k: v for k, v in new.items() if not k.startswith("lm_head")}
    if a.bits:
        model, config = quantize_model(model, config, a.group_size, a.bits)
    mx.eval(model.parameters())

    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    write_byte_tokenizer(out / "tokenizer.json")

    prompt = mx.array([(i * 37 + 11) % config["vocab_size"] for i in range(a.prompt_len)], dtype=mx.uint32)
    logits = model(prompt[None])[0, -1].astype(mx.float32)
    tokens = []
    for tok, _ in generate_step(prompt, model, max_tokens=a.tokens, sampler=lambda x: mx.argmax(x, axis=-1)):
        tokens.append(int(tok))
    ref = dict(prompt=prompt.tolist(), tokens=tokens, prompt_logits=logits.tolist())
    (out / "reference.json").write_text(json.dumps(ref))


if __name__ == "__main__":
    main()
