"""Loads a Hugging Face directory with mlx-lm and prints its mean next-token
loss (nats) on a fixed English paragraph, as JSON, for the end-to-end tests.

    mlx_lm_loss.py MODEL_DIR OUT.json
"""

import json
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm import load

TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower. "
    "Locally nicknamed the Iron Lady, it was constructed from 1887 to 1889 as the centerpiece "
    "of the 1889 World's Fair."
)


def main(path, out):
    model, tokenizer = load(path)
    ids = mx.array([tokenizer.encode(TEXT)])
    logits = model(ids[:, :-1])
    loss = nn.losses.cross_entropy(logits, ids[:, 1:]).mean().item()
    with open(out, "w") as f:
        json.dump({"loss": loss, "tokens": ids.shape[1], "first_ids": ids[0, :4].tolist()}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
