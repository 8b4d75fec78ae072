"""mlx-lm's speed, measured like `mlxcel bench` and `llama-bench`.

Usage: mlx_lm_bench.py MODEL_DIR [-p 512] [-n 128] [-r 3] [--device cpu|gpu]

Prints one JSON object: load_seconds (mlx_lm.load: weights and tokenizer),
first_token_seconds (load + a one-token prompt + one generated token, from a
fresh process's point of view minus interpreter start-up), and for pp and tg
the tokens per second of each repetition after one warm-up run. pp feeds N
random tokens through the model in one forward pass with a KV cache and
evaluates the last position's logits; tg generates N tokens greedily one at a
time (mlx_lm.generate.generate_step).
"""

import argparse
import json
import random
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    a = ap.parse_args()
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)

    t0 = time.perf_counter()
    model, tokenizer = load(a.model)
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t0
    ids = tokenizer.encode("Hi")
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=1, sampler=lambda x: mx.argmax(x, -1)):
        break
    first_s = time.perf_counter() - t0

    vocab = model.args.vocab_size
    rng = random.Random(0)
    pp, tg = [], []
    for rep in range(a.r + 1):
        if a.p:
            prompt = mx.array([rng.randrange(vocab) for _ in range(a.p)])[None]
            cache = make_prompt_cache(model)
            t = time.perf_counter()
            logits = model(prompt, cache=cache)[:, -1, :]
            mx.eval(logits)
            if rep:
                pp.append(a.p / (time.perf_counter() - t))
        if a.n:
            start = mx.array([rng.randrange(vocab)])
            t = time.perf_counter()
            n = 0
            for _tok, _ in generate_step(start, model, max_tokens=a.n, sampler=lambda x: mx.argmax(x, -1)):
                n += 1
            if rep:
                tg.append(n / (time.perf_counter() - t))
    print(json.dumps(dict(load_seconds=load_s, first_token_seconds=first_s, pp=pp, tg=tg)))


if __name__ == "__main__":
    main()
