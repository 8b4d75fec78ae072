"""Checks an OpenAI-compatible server with the official `openai` Python client.

    python tests/python/openai_client_check.py BASE_URL [--api-key KEY] [--model ID]
        [--strict-unknown-fields] [--strict-n] [--strict-completions] [--strict]

BASE_URL is the API root, e.g. http://127.0.0.1:8080/v1. Each check prints one
line ("ok" or "FAIL", its name and what it saw); the script exits 1 when any
check failed, naming them, and 0 when all passed. The server must serve one
small chat model (tests use SmolLM2-135M-Instruct); checks are written to hold
for any model: they compare the server against itself (greedy output with and
without a stop string, one seed twice), and against OpenAI's documented shapes.

What is checked:
  - GET /v1/models lists a model (the first one is used unless --model);
  - chat and text completions, streamed and not: text, finish_reason, usage;
  - stop strings: the output is the unstopped greedy output cut before the
    stop string, which it excludes, and finish_reason is "stop";
  - seed: temperature 0.8 with one seed gives the same text twice (a second
    seed's output is printed, not asserted to differ);
  - logprobs: chat `choice.logprobs.content[i].token/logprob/bytes/top_logprobs`
    with top_logprobs=3; completions `logprobs.tokens/token_logprobs/
    top_logprobs/text_offset` with logprobs=2;
  - stream_options.include_usage: exactly one final chunk with empty choices
    and usage; without it, no chunk carries usage;
  - usage.prompt_tokens_details.cached_tokens is present, and the second turn
    of a conversation reports cached tokens covering (nearly) all of the first
    turn's prompt;
  - tool calls (with --tools): a forced call (a named function) comes back as
    message.tool_calls with finish_reason "tool_calls" and arguments that
    parse and validate against the tool's parameters (jsonschema); sent back
    with a role "tool" result it renders and answers; the same request
    streamed, assembled from delta.tool_calls by index, gives the same call;
  - errors: with --strict-n, n=2 raises openai.BadRequestError; with --strict-unknown-fields, an
    unknown request field raises openai.BadRequestError naming it; with an API
    key, a wrong key raises openai.AuthenticationError.

llama.cpp's llama-server (0.3.36's vendored llama.cpp) serves the same API and
is what this script was first validated against (all checks pass without
the --strict flags). Where it departs from OpenAI the check is behind a flag
(--strict turns all of them on; mlxcel-server's test passes it):
  - it ignores unknown request fields (--strict-unknown-fields);
  - it accepts n=2 and returns one choice (--strict-n);
  - it serves tools only with --jinja (--tools);
  - its /v1/completions logprobs have the chat shape (`logprobs.content`), not
    the legacy tokens/token_logprobs/top_logprobs/text_offset, and its
    completions stream ends with usage even without stream_options, in a chunk
    that carries a choice with empty text (--strict-completions). Without the flag either logprobs shape passes.
"""

import argparse
import json
import math
import sys

import openai

PROMPT_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colours of the rainbow and say one thing about each."},
]
PROMPT_TEXT = "The history of the bicycle begins in"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER_SCHEMA}}]
TOOL_PROMPT = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


class CheckFailed(Exception):
    pass


def expect(cond, message):
    if not cond:
        raise CheckFailed(message)


class Checker:
    def __init__(self, args):
        self.args = args
        self.client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key or "none", max_retries=0, timeout=args.timeout)
        self.model = args.model
        self.failed = []
        self.passed = 0

    def run(self, name, fn):
        try:
            detail = fn()
        except CheckFailed as e:
            self.failed.append(name)
            print(f"FAIL {name}: {e}", flush=True)
        except Exception as e:  # an unexpected error from the client or the server
            self.failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        else:
            self.passed += 1
            print(f"ok   {name}" + (f": {detail}" if detail else ""), flush=True)

    # ------------------------------------------------------------- helpers
    def chat(self, **kw):
        kw.setdefault("model", self.model)
        kw.setdefault("messages", PROMPT_CHAT)
        return self.client.chat.completions.create(**kw)

    def complete(self, **kw):
        kw.setdefault("model", self.model)
        kw.setdefault("prompt", PROMPT_TEXT)
        return self.client.completions.create(**kw)

    @staticmethod
    def check_usage(usage, max_completion):
        expect(usage is not None, "no usage")
        expect(isinstance(usage.prompt_tokens, int) and usage.prompt_tokens > 0, f"prompt_tokens {usage.prompt_tokens!r}")
        expect(
            isinstance(usage.completion_tokens, int) and 0 < usage.completion_tokens <= max_completion,
            f"completion_tokens {usage.completion_tokens!r} (max_tokens {max_completion})",
        )
        expect(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"total_tokens {usage.total_tokens} != prompt + completion")

    # -------------------------------------------------------------- checks
    def models(self):
        models = self.client.models.list().data
        expect(len(models) >= 1, "GET /models listed no model")
        expect(all(m.object == "model" and m.id for m in models), f"malformed model entries {models!r}")
        if self.model is None:
            self.model = models[0].id
        return f"{[m.id for m in models]}, using {self.model!r}"

    def chat_plain(self):
        r = self.chat(max_tokens=24, temperature=0)
        expect(r.object == "chat.completion", f"object {r.object!r}")
        expect(len(r.choices) == 1, f"{len(r.choices)} choices")
        c = r.choices[0]
        expect(c.index == 0, f"index {c.index}")
        expect(c.message.role == "assistant", f"role {c.message.role!r}")
        expect(isinstance(c.message.content, str) and c.message.content, f"content {c.message.content!r}")
        expect(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}")
        self.check_usage(r.usage, 24)
        if c.finish_reason == "length":
            expect(r.usage.completion_tokens == 24, f"finish_reason length after {r.usage.completion_tokens} of 24 tokens")
        return f"{c.message.content[:40]!r}..., finish {c.finish_reason}, usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}"

    def chat_stream(self):
        plain = self.chat(max_tokens=16, temperature=0).choices[0].message.content
        chunks = list(self.chat(max_tokens=16, temperature=0, stream=True))
        expect(chunks, "no chunks")
        expect(all(ch.object == "chat.completion.chunk" for ch in chunks), "a chunk's object is not chat.completion.chunk")
        expect(len({ch.id for ch in chunks}) == 1, "chunks carry different ids")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        expect(finishes in (["stop"], ["length"]), f"finish_reasons over the stream {finishes!r} (one expected, on the last)")
        last_with_choice = [ch for ch in chunks if ch.choices][-1]
        expect(last_with_choice.choices[0].finish_reason is not None, "the last chunk with a choice has no finish_reason")
        expect(text == plain, f"streamed text {text!r} differs from the non-streamed {plain!r} (greedy)")
        return f"{len(chunks)} chunks, text equals the non-streamed one"

    def completion_plain(self):
        r = self.complete(max_tokens=24, temperature=0)
        expect(r.object == "text_completion", f"object {r.object!r}")
        expect(len(r.choices) == 1, f"{len(r.choices)} choices")
        c = r.choices[0]
        expect(isinstance(c.text, str) and c.text, f"text {c.text!r}")
        expect(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}")
        self.check_usage(r.usage, 24)
        return f"{c.text[:40]!r}..., finish {c.finish_reason}"

    def completion_stream(self):
        plain = self.complete(max_tokens=16, temperature=0).choices[0].text
        chunks = list(self.complete(max_tokens=16, temperature=0, stream=True))
        expect(chunks, "no chunks")
        text = "".join(ch.choices[0].text or "" for ch in chunks if ch.choices)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        expect(finishes in (["stop"], ["length"]), f"finish_reasons over the stream {finishes!r}")
        expect(text == plain, f"streamed text {text!r} differs from the non-streamed {plain!r} (greedy)")
        return f"{len(chunks)} chunks, text equals the non-streamed one"

    def stop_strings(self):
        full = self.complete(max_tokens=40, temperature=0).choices[0].text
        words = full.split(" ")
        # A word from the middle of the greedy output, with its leading space:
        # the stopped output must be everything before its first occurrence.
        candidates = [w for w in words[2:] if len(w.strip()) >= 3]
        expect(candidates, f"the greedy output {full!r} has no word to stop at")
        stop = " " + candidates[0]
        want = full[: full.index(stop)]
        for stream in (False, True):
            if stream:
                chunks = list(self.complete(max_tokens=40, temperature=0, stop=[stop], stream=True))
                text = "".join(ch.choices[0].text or "" for ch in chunks if ch.choices)
                finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
                finish = finish[-1] if finish else None
            else:
                c = self.complete(max_tokens=40, temperature=0, stop=[stop]).choices[0]
                text, finish = c.text, c.finish_reason
            kind = "streamed" if stream else "plain"
            expect(stop not in text, f"{kind}: output {text!r} contains the stop string {stop!r}")
            expect(text == want, f"{kind}: output {text!r}, expected {want!r} (the greedy output cut before {stop!r})")
            expect(finish == "stop", f"{kind}: finish_reason {finish!r}, expected 'stop'")
        # Chat too: the same property on the chat endpoint.
        full_chat = self.chat(max_tokens=40, temperature=0).choices[0].message.content
        cw = [w for w in full_chat.split(" ")[2:] if len(w.strip()) >= 3]
        expect(cw, f"the greedy chat output {full_chat!r} has no word to stop at")
        cstop = " " + cw[0]
        c = self.chat(max_tokens=40, temperature=0, stop=cstop).choices[0]
        expect(c.message.content == full_chat[: full_chat.index(cstop)], f"chat: output {c.message.content!r} is not the greedy output cut before {cstop!r}")
        expect(c.finish_reason == "stop", f"chat: finish_reason {c.finish_reason!r}")
        return f"stop {stop!r} -> {want!r}; chat stop {cstop!r}"

    def seed(self):
        texts = [self.complete(max_tokens=24, temperature=0.8, seed=s).choices[0].text for s in (1234, 1234, 4321)]
        expect(texts[0] == texts[1], f"seed 1234 twice gave different text: {texts[0]!r} vs {texts[1]!r}")
        ctexts = [self.chat(max_tokens=24, temperature=0.8, seed=s).choices[0].message.content for s in (99, 99)]
        expect(ctexts[0] == ctexts[1], f"chat, seed 99 twice gave different text: {ctexts[0]!r} vs {ctexts[1]!r}")
        return f"same seed same text; another seed {'differs' if texts[2] != texts[0] else 'gave the same text'}"

    def chat_logprobs(self):
        r = self.chat(max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
        c = r.choices[0]
        expect(c.logprobs is not None and c.logprobs.content is not None, "no choice.logprobs.content")
        content = c.logprobs.content
        expect(len(content) == r.usage.completion_tokens, f"{len(content)} logprob entries for {r.usage.completion_tokens} tokens")
        for i, t in enumerate(content):
            expect(isinstance(t.token, str), f"[{i}].token {t.token!r}")
            expect(isinstance(t.logprob, float) and t.logprob <= 1e-6 and math.isfinite(t.logprob), f"[{i}].logprob {t.logprob!r}")
            expect(t.bytes is None or (isinstance(t.bytes, list) and all(isinstance(b, int) and 0 <= b < 256 for b in t.bytes)), f"[{i}].bytes {t.bytes!r}")
            expect(t.bytes is None or bytes(t.bytes).decode("utf-8", "replace") == t.token or not t.token.isprintable(), f"[{i}].bytes {t.bytes!r} do not spell {t.token!r}")
            expect(len(t.top_logprobs) == 3, f"[{i}] has {len(t.top_logprobs)} top_logprobs, asked 3")
            lps = [tl.logprob for tl in t.top_logprobs]
            expect(all(isinstance(x, float) and x <= 1e-6 for x in lps), f"[{i}].top_logprobs logprobs {lps}")
            expect(lps == sorted(lps, reverse=True), f"[{i}].top_logprobs not in descending order: {lps}")
            expect(all(isinstance(tl.token, str) for tl in t.top_logprobs), f"[{i}].top_logprobs tokens")
            # Greedy: the chosen token is the most likely one.
            expect(t.token == t.top_logprobs[0].token, f"[{i}] greedy token {t.token!r} is not the top one {t.top_logprobs[0].token!r}")
            expect(abs(t.logprob - lps[0]) < 1e-3, f"[{i}] logprob {t.logprob} != top logprob {lps[0]}")
        text = "".join(t.token for t in content)
        expect(text == c.message.content, f"the tokens spell {text!r}, the message is {c.message.content!r}")
        return f"{len(content)} tokens, e.g. {content[0].token!r} {content[0].logprob:.3f} top {[(x.token, round(x.logprob, 3)) for x in content[0].top_logprobs]}"

    def completion_logprobs(self):
        r = self.complete(max_tokens=8, temperature=0, logprobs=2)
        c = r.choices[0]
        lp = c.logprobs
        expect(lp is not None, "no choice.logprobs")
        n = r.usage.completion_tokens
        content = (lp.model_extra or {}).get("content")
        if lp.tokens is None and content is not None and not self.args.strict_completions:
            # llama-server's shape: the chat one, under logprobs.content.
            expect(len(content) == n, f"{len(content)} logprobs.content entries for {n} tokens")
            for i, t in enumerate(content):
                expect(isinstance(t.get("logprob"), float) and t["logprob"] <= 1e-6, f"content[{i}].logprob {t.get('logprob')!r}")
                expect(len(t.get("top_logprobs", [])) == 2, f"content[{i}] has {len(t.get('top_logprobs', []))} top_logprobs, asked 2")
            return f"{n} tokens in the chat shape (logprobs.content; the legacy shape is required with --strict-completions)"
        expect(lp.tokens is not None and len(lp.tokens) == n, f"tokens {lp.tokens!r} for {n} completion tokens")
        expect(lp.token_logprobs is not None and len(lp.token_logprobs) == n, f"token_logprobs {lp.token_logprobs!r}")
        expect(all(isinstance(x, float) and x <= 1e-6 for x in lp.token_logprobs), f"token_logprobs {lp.token_logprobs}")
        expect(lp.top_logprobs is not None and len(lp.top_logprobs) == n, f"top_logprobs {lp.top_logprobs!r}")
        for i, top in enumerate(lp.top_logprobs):
            expect(isinstance(top, dict) and len(top) == 2, f"top_logprobs[{i}] {top!r} (2 entries asked)")
            expect(all(isinstance(k, str) and isinstance(v, float) for k, v in top.items()), f"top_logprobs[{i}] {top!r}")
            expect(lp.tokens[i] in top, f"greedy token {lp.tokens[i]!r} missing from top_logprobs[{i}] {top!r}")
        expect("".join(lp.tokens) == c.text, f"tokens spell {''.join(lp.tokens)!r}, text is {c.text!r}")
        expect(lp.text_offset is not None, "no text_offset")
        expect(len(lp.text_offset) == n, f"text_offset {lp.text_offset}")
        # OpenAI's offsets index into prompt + completion text.
        expect(lp.text_offset[0] == len(PROMPT_TEXT), f"text_offset[0] {lp.text_offset[0]}, expected len(prompt) {len(PROMPT_TEXT)}")
        for i in range(1, n):
            expect(lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1]), f"text_offset {lp.text_offset} does not follow the tokens' lengths")
        return f"{n} tokens, text_offset {lp.text_offset[:3]}..."

    def include_usage(self):
        out = []
        for kind, create in (("chat", self.chat), ("completions", self.complete)):
            chunks = list(create(max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}))
            with_usage = [i for i, ch in enumerate(chunks) if ch.usage is not None]
            expect(with_usage == [len(chunks) - 1], f"{kind}: chunks {with_usage} of {len(chunks)} carry usage (exactly the last expected)")
            last = chunks[-1]
            # llama-server's completions usage chunk carries a choice with empty text.
            lenient = kind == "completions" and not self.args.strict_completions
            expect(last.choices == [] or (lenient and all(not ch.text for ch in last.choices)), f"{kind}: the usage chunk has choices {last.choices!r}")
            self.check_usage(last.usage, 8)
            expect(all(ch.choices for ch in chunks[:-1]), f"{kind}: a chunk before the usage chunk has no choices")
            plain = list(create(max_tokens=8, temperature=0, stream=True))
            # llama-server always ends a completions stream with usage.
            expect(all(ch.usage is None for ch in plain) or lenient, f"{kind}: without stream_options a chunk carries usage")
            out.append(f"{kind} usage {last.usage.prompt_tokens}+{last.usage.completion_tokens}")
        return ", ".join(out)

    def cached_tokens(self):
        turn1 = PROMPT_CHAT[:1] + [{"role": "user", "content": "Write one sentence about the sea. " + "Keep it short. " * 6}]
        r1 = self.chat(messages=turn1, max_tokens=12, temperature=0)
        d1 = r1.usage.prompt_tokens_details
        expect(d1 is not None and isinstance(d1.cached_tokens, int), f"usage.prompt_tokens_details {d1!r} has no cached_tokens")
        turn2 = turn1 + [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "Now one about the mountains."},
        ]
        r2 = self.chat(messages=turn2, max_tokens=12, temperature=0)
        d2 = r2.usage.prompt_tokens_details
        expect(d2 is not None and isinstance(d2.cached_tokens, int), f"turn 2 usage.prompt_tokens_details {d2!r}")
        p1, c2 = r1.usage.prompt_tokens, d2.cached_tokens
        print(f"     turn 1: prompt {p1}, cached {d1.cached_tokens}; turn 2: prompt {r2.usage.prompt_tokens}, cached {c2}", flush=True)
        expect(c2 <= r2.usage.prompt_tokens, f"turn 2 cached {c2} > its prompt {r2.usage.prompt_tokens}")
        expect(c2 >= p1 - 4, f"turn 2 cached {c2} tokens, expected >= turn 1's prompt {p1} - 4")
        return f"turn 2 reused {c2} of turn 1's {p1} prompt tokens"

    def forced_tool_call(self):
        r = self.chat(messages=TOOL_PROMPT, tools=TOOLS, tool_choice=FORCED, max_tokens=60, temperature=0)
        choice = r.choices[0]
        expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
        calls = choice.message.tool_calls or []
        expect(len(calls) == 1, f"{len(calls)} tool calls: {choice.message!r}")
        call = calls[0]
        expect(call.type == "function" and call.id and call.function.name == "get_weather", f"call {call!r}")
        args = json.loads(call.function.arguments)
        try:
            import jsonschema
        except ImportError:
            jsonschema = None
        if jsonschema is not None:
            jsonschema.validate(args, WEATHER_SCHEMA)
        else:
            expect(set(args) == {"city", "unit"}, f"arguments {args!r}")
        turn2 = TOOL_PROMPT + [
            choice.message.model_dump(exclude_none=True),  # the reply as sent back by agents
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "cloudy"}'},
        ]
        r2 = self.chat(messages=turn2, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0)
        expect(r2.choices[0].message.content, f"no answer after the tool result: {r2.choices[0].message!r}")
        return f"{call.function.name}({call.function.arguments}), then {r2.choices[0].message.content!r}"

    def streamed_tool_call(self):
        kw = dict(messages=TOOL_PROMPT, tools=TOOLS, tool_choice=FORCED, max_tokens=60, temperature=0)
        whole = self.chat(**kw).choices[0].message.tool_calls or []
        calls = {}
        reason = None
        for chunk in self.chat(stream=True, **kw):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            reason = chunk.choices[0].finish_reason or reason
            expect(not delta.content, f"content streamed with a forced call: {delta.content!r}")
            for entry in delta.tool_calls or []:
                call = calls.setdefault(entry.index, {"id": entry.id, "name": "", "arguments": ""})
                call["name"] += entry.function.name or ""
                call["arguments"] += entry.function.arguments or ""
        streamed = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
        expected = [(c.function.name, c.function.arguments) for c in whole]
        expect(streamed == expected, f"streamed {streamed!r} != whole {expected!r}")
        expect(all(c["id"] for c in calls.values()), f"a streamed call without an id: {calls!r}")
        expect(reason == "tool_calls", f"finish_reason {reason!r}")
        return f"{streamed!r}"

    def n2(self):
        try:
            self.chat(max_tokens=4, n=2)
        except openai.BadRequestError as e:
            return f"400: {e.message[:100]!r}"
        raise CheckFailed("n=2 was accepted")

    def unknown_field(self):
        try:
            self.chat(max_tokens=4, extra_body={"bogus": 1})
        except openai.BadRequestError as e:
            expect("bogus" in str(e.message) or "bogus" in str(e.body), f"the error does not name the field: {e.message!r}")
            return f"400: {e.message[:100]!r}"
        raise CheckFailed("an unknown field 'bogus' was accepted (llama-server ignores unknown fields; see --strict-unknown-fields)")

    def wrong_key(self):
        bad = openai.OpenAI(base_url=self.args.base_url, api_key=self.args.api_key + "-wrong", max_retries=0, timeout=self.args.timeout)
        try:
            bad.chat.completions.create(model=self.model, messages=PROMPT_CHAT, max_tokens=4)
        except openai.AuthenticationError as e:
            return f"401: {e.message[:80]!r}"
        raise CheckFailed("a wrong API key was accepted")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base_url", help="API root, e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default=None, help="the server's API key (also checks that a wrong one gets 401)")
    ap.add_argument("--model", default=None, help="model id (default: the first one GET /models lists)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--strict-unknown-fields", action="store_true", help="check that an unknown field is a 400 naming it (llama-server ignores them)")
    ap.add_argument(
        "--strict-completions",
        action="store_true",
        help="hold /v1/completions to OpenAI's legacy shapes: logprobs as tokens/token_logprobs/top_logprobs/text_offset, "
        "and a usage chunk with empty choices (llama-server departs from both)",
    )
    ap.add_argument("--strict-n", action="store_true", help="check that n=2 is a 400 (llama-server accepts it and returns one choice)")
    ap.add_argument("--tools", action="store_true", help="check function tool calls, forced and streamed (llama-server needs --jinja)")
    ap.add_argument("--strict", action="store_true", help="all of the --strict-* checks and --tools (what mlxcel-server is held to)")
    args = ap.parse_args()
    if args.strict:
        args.strict_unknown_fields = args.strict_completions = args.strict_n = args.tools = True

    ch = Checker(args)
    ch.run("models", ch.models)
    if ch.model is None:
        print("FAIL: no model to test", flush=True)
        return 1
    ch.run("chat", ch.chat_plain)
    ch.run("chat streamed", ch.chat_stream)
    ch.run("completions", ch.completion_plain)
    ch.run("completions streamed", ch.completion_stream)
    ch.run("stop strings", ch.stop_strings)
    ch.run("seed", ch.seed)
    ch.run("chat logprobs", ch.chat_logprobs)
    ch.run("completions logprobs", ch.completion_logprobs)
    ch.run("stream_options.include_usage", ch.include_usage)
    ch.run("cached_tokens", ch.cached_tokens)
    if args.tools:
        ch.run("forced tool call", ch.forced_tool_call)
        ch.run("streamed tool call", ch.streamed_tool_call)
    if args.strict_n:
        ch.run("n=2 is a 400", ch.n2)
    if args.strict_unknown_fields:
        ch.run("unknown field is a 400 naming it", ch.unknown_field)
    if args.api_key:
        ch.run("wrong API key is a 401", ch.wrong_key)
    print(f"{ch.passed} passed, {len(ch.failed)} failed", flush=True)
    if ch.failed:
        print("failed checks: " + ", ".join(ch.failed), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
