"""Token ids from transformers' own GGUF tokenizer conversion, for the
tokenizer parity tests.

    tokenize_reference.py GGUF STRINGS.json OUT.json

STRINGS.json is a list of strings. OUT.json gets, for each string, the ids
with no special tokens added (`add_special_tokens=False`), plus the
conversion's `tokenizer_config` facts.

Where transformers' conversion is known to deviate from llama.cpp, OUT.json
also has `ids_upstream`, from the same vocabulary with the pre-tokenizer the
model's own Hugging Face `tokenizer.json` uses (and llama.cpp's regexes
implement): for `tokenizer.ggml.pre = smollm`, transformers' table has no
entry and falls back to GPT-2's byte-level regex, while SmolLM2 (and
llama.cpp's `smollm`) first isolates every numeric character.
"""

import json
import os
import sys

import _torch_stub

_torch_stub.install()
from tokenizers import pre_tokenizers  # noqa: E402
from transformers.integrations.gguf.gguf_tokenizer_mapping import (  # noqa: E402
    convert_gguf_tokenizer,
    get_gguf_tokenizer,
)


def main(path, strings_path, out):
    arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(os.path.abspath(path))
    tokenizer, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
    with open(strings_path) as f:
        strings = json.load(f)
    ids = [tokenizer.encode(s, add_special_tokens=False).ids for s in strings]
    decoded = [tokenizer.decode(i, skip_special_tokens=False) for i in ids]
    config = {k: v for k, v in tokenizer_config.items() if k != "chat_template"}
    result = {"ids": ids, "decoded": decoded, "tokenizer_config": config}
    if tokenizer_dict.get("pre_tokenizer_type") == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
        result["ids_upstream"] = [tokenizer.encode(s, add_special_tokens=False).ids for s in strings]
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
