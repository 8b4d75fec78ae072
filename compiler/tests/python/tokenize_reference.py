"""Token ids from transformers' own GGUF tokenizer conversion, for the
tokenizer parity tests.

    tokenize_reference.py GGUF STRINGS.json OUT.json

STRINGS.json is a list of strings. OUT.json gets, for each string, the ids
with no special tokens added (`add_special_tokens=False`), plus the
conversion's own `tokenizer.json` and `tokenizer_config` facts.
"""

import json
import os
import sys

import _torch_stub

_torch_stub.install()
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
    with open(out, "w") as f:
        json.dump({"ids": ids, "decoded": decoded, "tokenizer_config": config}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
