//! OpenAI's response shapes: `chat.completion` and `chat.completion.chunk`,
//! `text_completion` (whole and streamed), usage and both logprobs shapes.

use mlxcel_runtime::generate::{FinishReason, GenerationStats};
use mlxcel_runtime::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::openai::Kind;

/// One generated token's log-probabilities.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives.
    pub top: Vec<(u32, f32)>,
}

/// `finish_reason`'s value (a cancelled request is an error, not a finish).
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::Cancelled => "length",
    }
}

/// The `usage` object.
pub fn usage(stats: &GenerationStats) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    })
}

/// llama-server's `timings` object (an extension OpenAI clients ignore):
/// prompt tokens prefilled (`prompt_n`: the cached ones were not) and
/// their time, tokens generated and theirs, and the cached prompt tokens.
pub fn timings(stats: &GenerationStats) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let prefilled = stats.prompt_tokens - stats.cached_tokens.min(stats.prompt_tokens);
    json!({
        "cache_n": stats.cached_tokens,
        "prompt_n": prefilled,
        "prompt_ms": ms(stats.prefill_time),
        "prompt_per_second": prefilled as f64 / stats.prefill_time.as_secs_f64().max(1e-9),
        "predicted_n": stats.generated_tokens,
        "predicted_ms": ms(stats.decode_time),
        "predicted_per_second": stats.decode_tokens_per_second(),
    })
}

/// A token's text (what it decodes to alone) and bytes.
fn text_and_bytes(tokenizer: &Tokenizer, token: u32) -> (String, Vec<u8>) {
    let text = tokenizer.decode(&[token], false).unwrap_or_default();
    let bytes = tokenizer.token_bytes(token).unwrap_or_else(|_| text.clone().into_bytes());
    (text, bytes)
}

/// A logprob as JSON: -inf (an impossible token) has no JSON number, so
/// it is written as the lowest f32, as llama-server does.
fn lp(x: f32) -> f32 {
    if x.is_finite() { x } else { f32::MIN }
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
pub fn chat_logprobs(tokenizer: &Tokenizer, tokens: &[TokenLogprob]) -> Value {
    let entry = |token: u32, logprob: f32| {
        let (text, bytes) = text_and_bytes(tokenizer, token);
        json!({"token": text, "logprob": lp(logprob), "bytes": bytes})
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t.token, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|&(id, l)| entry(id, l)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// Completions' `logprobs`: `{tokens, token_logprobs, top_logprobs,
/// text_offset}`; `offset` is the character offset of the first token (the
/// prompt's length, as OpenAI counts) and is advanced past the tokens.
pub fn completion_logprobs(tokenizer: &Tokenizer, tokens: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut texts = Vec::new();
    let mut offsets = Vec::new();
    for t in tokens {
        let (text, _) = text_and_bytes(tokenizer, t.token);
        offsets.push(*offset);
        *offset += text.chars().count();
        texts.push(text);
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let map: serde_json::Map<String, Value> =
                t.top.iter().map(|&(id, l)| (text_and_bytes(tokenizer, id).0, json!(lp(l)))).collect();
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": texts,
        "token_logprobs": tokens.iter().map(|t| lp(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

/// What every response of one request shares.
#[derive(Clone, Debug)]
pub struct Envelope {
    /// The route.
    pub kind: Kind,
    /// `chatcmpl-...` or `cmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model's name.
    pub model: String,
}

impl Envelope {
    /// The envelope of request number `n`.
    pub fn new(kind: Kind, n: u64, model: String) -> Envelope {
        let created = crate::state::unix_now();
        let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
        Envelope { kind, id: format!("{prefix}-{created:x}{n:08x}"), created, model }
    }

    fn object(&self, streamed: bool) -> &'static str {
        match (self.kind, streamed) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    /// The whole answer: chat's message carries `tool_calls` when there
    /// are any (its `content` then null when there is no text).
    pub fn completion(
        &self,
        text: String,
        tool_calls: Vec<Value>,
        logprobs: Option<Value>,
        reason: &str,
        stats: &GenerationStats,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if !tool_calls.is_empty() {
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = tool_calls.into();
                }
                json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason})
            }
            Kind::Text => json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(stats),
            "timings": timings(stats),
        })
    }

    /// A streamed chunk. `content` is chat's delta (`role` first) or the
    /// completion's text; with `include_usage` the chunk carries
    /// `"usage": null` as OpenAI's do.
    pub fn chunk(
        &self,
        role: bool,
        content: Option<&str>,
        logprobs: Option<Value>,
        reason: Option<&str>,
        include_usage: bool,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(c) = content {
                    delta.insert("content".into(), c.into());
                }
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
            }
            Kind::Text => {
                json!({"index": 0, "text": content.unwrap_or(""), "logprobs": logprobs, "finish_reason": reason})
            }
        };
        self.chunk_of(choice, include_usage)
    }

    /// A chat chunk with the delta `delta` ([`crate::tool_calls::delta`]).
    pub fn delta_chunk(&self, delta: Value, include_usage: bool) -> Value {
        let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null});
        self.chunk_of(choice, include_usage)
    }

    fn chunk_of(&self, choice: Value, include_usage: bool) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The last chunk of a stream asked to include usage: no choices.
    pub fn usage_chunk(&self, stats: &GenerationStats) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(stats),
        })
    }

    /// Log-probabilities in this route's shape.
    pub fn logprobs(&self, tokenizer: &Tokenizer, tokens: &[TokenLogprob], offset: &mut usize) -> Value {
        match self.kind {
            Kind::Chat => chat_logprobs(tokenizer, tokens),
            Kind::Text => completion_logprobs(tokenizer, tokens, offset),
        }
    }
}
