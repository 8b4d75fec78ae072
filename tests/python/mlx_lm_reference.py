"""Greedy generation with mlx-lm (CPU) on a model directory, as a reference.

Usage: mlx_lm_reference.py MODEL_DIR REQUESTS_JSON OUT_JSON

MODEL_DIR is an mlx-lm model directory (config.json with `quantization` when
quantized, model.safetensors, tokenizer.json, tokenizer_config.json with the
chat template). REQUESTS_JSON is a list of objects:
  {"prompt": str, "chat": bool, "max_tokens": int, "eos": [int, ...]}
For each request, OUT_JSON gets
  {"prompt_ids": [...], "tokens": [...], "first_logits": [...]}
where prompt_ids come from mlx-lm's tokenizer (chat template applied with
add_generation_prompt when "chat", encoded without special tokens as mlx-lm's
generate does; raw prompts get the tokenizer's special tokens), tokens are the
greedy continuation from mlx_lm.generate.generate_step (stopping after an end
token), and first_logits are the logits of the first generated position.
"""

import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step


def main():
    model_dir, requests_path, out_path = sys.argv[1:4]
    mx.set_default_device(mx.cpu)
    model, tokenizer = load(model_dir)
    results = []
    for req in json.load(open(requests_path)):
        if req["chat"]:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": req["prompt"]}], tokenize=False, add_generation_prompt=True
            )
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = tokenizer.encode(req["prompt"])
        prompt = mx.array(ids, dtype=mx.uint32)
        tokens, first_logits = [], None
        for tok, logprobs in generate_step(
            prompt, model, max_tokens=req["max_tokens"], sampler=lambda x: mx.argmax(x, axis=-1)
        ):
            if first_logits is None:
                # generate_step yields log-probabilities; logits up to a
                # per-position constant, which the comparison removes.
                first_logits = logprobs.astype(mx.float32).tolist()
            tokens.append(int(tok))
            if int(tok) in req["eos"]:
                break
        results.append(dict(prompt_ids=list(map(int, ids)), tokens=tokens, first_logits=first_logits))
    json.dump(results, open(out_path, "w"))


if __name__ == "__main__":
    main()
