"""Checks that a server enforces `response_format` JSON schemas, with the
official `openai` client and the `jsonschema` package (both pinned in the
reference environment).

    python tests/python/structured_output_check.py BASE_URL CORPUS [--api-key KEY]
        [--model ID] [--workers N] [--max-tokens N]

CORPUS is tests/data/json_schemas.json: `schemas` (name, prompt, schema) and
`refused` (name, schema, construct). For every schema, a greedy chat request
with `response_format: {"type": "json_schema", ...}` must answer text that
parses as JSON and validates against the schema (formats checked too); one
schema is also requested streamed and the deltas assembled. For every
refused schema, the request must fail with openai.BadRequestError whose
message names the construct. `{"type": "json_object"}` must give a JSON
object. One line per check ("ok" or "FAIL"); exit status 1 when any failed.
"""

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai


def messages(prompt, schema):
    return [
        {"role": "system", "content": "You answer with JSON only."},
        {"role": "user", "content": f"{prompt}\nAnswer as JSON matching this schema: {json.dumps(schema)}"},
    ]


def response_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def validate(text, schema):
    """None when `text` is JSON valid against `schema`, else why not."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON ({e})"
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value), key=str)
    return f"invalid: {errors[0].message}" if errors else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("corpus")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=300)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    model = args.model or client.models.list().data[0].id
    corpus = json.load(open(args.corpus))
    failures = []

    def report(ok, name, detail):
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    def ask(entry, stream=False):
        return client.chat.completions.create(
            model=model,
            messages=messages(entry["prompt"], entry["schema"]),
            temperature=0,
            max_tokens=args.max_tokens,
            response_format=response_format(entry["name"], entry["schema"]),
            stream=stream,
        )

    def one(entry):
        start = time.monotonic()
        r = ask(entry)
        choice = r.choices[0]
        return entry, choice.message.content, choice.finish_reason, r.usage.completion_tokens, time.monotonic() - start

    with ThreadPoolExecutor(args.workers) as pool:
        for entry, text, finish, tokens, secs in pool.map(one, corpus["schemas"]):
            why = validate(text, entry["schema"])
            detail = f"{text!r} ({tokens} tokens, {secs:.1f} s, finish {finish})"
            report(why is None, f"schema {entry['name']}", detail if why is None else f"{why}: {detail}")

    # Streamed: the deltas assembled validate too.
    entry = corpus["schemas"][0]
    stream = ask(entry, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    why = validate(text, entry["schema"])
    report(why is None, "streamed schema", repr(text) if why is None else f"{why}: {text!r}")

    # Any JSON object.
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe the sea as a JSON object."}],
        temperature=0,
        max_tokens=args.max_tokens,
        response_format={"type": "json_object"},
    )
    text = r.choices[0].message.content
    try:
        ok = isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        ok = False
    report(ok, "json_object", repr(text))

    for entry in corpus["refused"]:
        try:
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=8,
                response_format=response_format(entry["name"], entry["schema"]),
            )
            report(False, f"refused {entry['name']}", "the server accepted it")
        except openai.BadRequestError as e:
            message = str(e)
            report(entry["construct"] in message, f"refused {entry['name']}", message)

    total = len(corpus["schemas"]) + 2 + len(corpus["refused"])
    print(f"{total - len(failures)}/{total} checks passed")
    if failures:
        print("failed: " + ", ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
