#!/usr/bin/env python3
"""Compares two `mlxcel inspect --json --tensors` outputs: every tensor's
name, dtype, shape, quantization, layout, length and blake3 must be
identical (offsets may differ), and so must everything else the bundle
holds (sections with their hashes, tokenizer, chat template, generation
defaults, metadata, provenance, extensions) but the model config, whose
differing keys are printed. Exits 1 on any other difference.

    compare_tensors.py BEFORE.json AFTER.json
"""

import json
import sys

FIELDS = ("dtype", "shape", "quantization", "length", "blake3", "layout")


def tensors(path):
    doc = json.load(open(path))
    return doc, {t["name"]: {k: t.get(k) for k in FIELDS} for t in doc["tensors"]}


def main():
    (before_doc, before), (after_doc, after) = tensors(sys.argv[1]), tensors(sys.argv[2])
    problems = [f"only before: {n}" for n in sorted(before.keys() - after.keys())]
    problems += [f"only after: {n}" for n in sorted(after.keys() - before.keys())]
    for name in sorted(before.keys() & after.keys()):
        for field in FIELDS:
            if before[name][field] != after[name][field]:
                problems.append(f"{name}: {field} {before[name][field]} != {after[name][field]}")
    # Everything but the tensors' places, the config and what hashes the file.
    placement = {"path", "file_len", "manifest", "root_hash", "tensors", "model"}
    for key in sorted((before_doc.keys() | after_doc.keys()) - placement):
        if before_doc.get(key) != after_doc.get(key):
            problems.append(f"{key} differs")
    if before_doc["model"].get("name") != after_doc["model"].get("name"):
        problems.append("model name differs")
    print(f"{len(before)} tensors before, {len(after)} after; {len(problems)} differences outside the config")
    for p in problems[:50]:
        print("  " + p)
    old, new = before_doc["model"]["config"], after_doc["model"]["config"]
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    print(f"architecture {before_doc['model']['architecture']} -> {after_doc['model']['architecture']}")
    print("config keys that differ:", ", ".join(f"{k}: {json.dumps(old.get(k))} -> {json.dumps(new.get(k))}" for k in changed))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
