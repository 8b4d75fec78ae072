//! Requests of OpenAI's API: `/v1/chat/completions` and `/v1/completions`,
//! checked field by field and turned into a prompt and
//! [`GenerationOptions`].
//!
//! Every field the server does not implement is refused (400 naming it in
//! `message` and `param`), never ignored: first the body's keys are checked
//! against what each route knows ([`COMMON_FIELDS`] and [`CHAT_FIELDS`] or
//! [`COMPLETION_FIELDS`]),
//! then the typed parse names the field of a wrong type
//! (`serde_path_to_error`), then ranges are checked with the runtime's
//! wording ([`Param`]).
//!
//! Defaults: `temperature` is the bundle's suggested one, else 1 (OpenAI's);
//! `top_p` and `top_k` are the bundle's when sampling (temperature > 0),
//! else off. `max_tokens` (or `max_completion_tokens`) defaults to, and is
//! capped by, the room the prompt leaves in the context; a prompt that
//! fills the context is 400 `context_length_exceeded`.

use mlxcel_runtime::chat::{Message, ToolFormat};
use mlxcel_runtime::constraint::Grammar;
use mlxcel_runtime::engine::ModelInfo;
use mlxcel_runtime::generate::{GenerationOptions, MAX_TOP_LOGPROBS};
use mlxcel_runtime::sampler::{Param, SamplingParams};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::errors::ApiError;
use crate::tools::{self, Tools};

/// Which API a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

impl Kind {
    /// The request field the prompt comes in, which errors about the
    /// prompt name.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Kind::Chat => "messages",
            Kind::Text => "prompt",
        }
    }
}

/// The fields both routes implement (those of [`Common`], but chat's
/// `max_completion_tokens`): sampling, stopping, streaming and the token
/// budget.
pub const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "logprobs",
    "stream",
    "stream_options",
    "n",
    "user",
    "response_format",
];

/// The fields only `/v1/chat/completions` implements (with [`COMMON_FIELDS`]).
pub const CHAT_FIELDS: &[&str] =
    &["messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"];

/// The fields only `/v1/completions` implements (with [`COMMON_FIELDS`]).
pub const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// OpenAI fields this server knows but does not implement (a `null` value
/// counts as absent).
const UNSUPPORTED_FIELDS: &[&str] = &[
    "functions",
    "function_call",
    "logit_bias",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "service_tier",
    "store",
    "metadata",
    "web_search_options",
    "grammar",
    "json_schema",
];

/// The most stop strings a request may give. OpenAI allows 4; a few more
/// cost little (each is matched against the text held back) and agents
/// often pass more.
pub const MAX_STOP: usize = 16;

/// The largest `logprobs` of `/v1/completions` (OpenAI's limit).
pub const MAX_COMPLETION_LOGPROBS: usize = 5;

/// A request ready for the engine.
#[derive(Debug)]
pub struct Prepared {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The prompt's length in characters (completions' `text_offset`
    /// starts there, as OpenAI's does).
    pub prompt_chars: usize,
    /// How to generate.
    pub options: GenerationOptions,
    /// Answer as server-sent events.
    pub stream: bool,
    /// Streams end with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Report log-probabilities, with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// The chat request's tools (none when it offers none).
    pub tools: Option<Tools>,
}

/// Fields both routes share.
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    /// llama-server's extension: generate past end tokens (benchmarks with
    /// fixed output lengths).
    ignore_eos: Option<bool>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    #[allow(dead_code)] // accepted, as OpenAI's end-user id: nothing to do with it
    user: Option<String>,
    response_format: Option<ResponseFormat>,
}

/// OpenAI's `response_format`: free text, any JSON object, or JSON valid
/// against a schema, the last two enforced token by token.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`. `strict` is accepted either way: the
/// schema is always enforced (or the request refused).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // name, description and strict are OpenAI's labels; nothing to do with them
struct JsonSchemaFormat {
    name: Option<String>,
    description: Option<String>,
    schema: Option<Value>,
    strict: Option<bool>,
}

impl ResponseFormat {
    fn grammar(self) -> Option<Grammar> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(Grammar::JsonObject),
            // No schema: any JSON value.
            ResponseFormat::JsonSchema { json_schema } => {
                Some(Grammar::JsonSchema(json_schema.schema.unwrap_or_else(|| Value::Object(Map::new()))))
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct ChatFields {
    messages: Vec<ChatMessage>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Value,
    /// An assistant's calls.
    tool_calls: Option<Vec<Value>>,
    /// A tool result's call.
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
struct CompletionFields {
    prompt: Value,
    logprobs: Option<i64>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<i64>,
}

/// Parses the body as a JSON object and refuses the fields none of the
/// lists in `known` has.
pub fn parse_object(body: &[u8], known: &[&[&str]]) -> Result<Map<String, Value>, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err(ApiError::invalid("the body must be a JSON object"));
    };
    for (key, value) in &object {
        if known.iter().any(|fields| fields.contains(&key.as_str())) {
            continue;
        }
        if UNSUPPORTED_FIELDS.contains(&key.as_str()) {
            if value.is_null() {
                continue;
            }
            return Err(ApiError::unsupported(key, ""));
        }
        return Err(ApiError::invalid_param(key.clone(), format!("unknown field {key:?}")));
    }
    Ok(object)
}

/// The typed reading of `object`, naming the field of a wrong type.
pub fn typed<T: DeserializeOwned>(object: &Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(object.clone())).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            ApiError::invalid(inner)
        } else {
            ApiError::invalid_param(path.clone(), format!("{path}: {inner}"))
        }
    })
}

fn param(p: Param, value: Option<f32>, default: f32) -> Result<f32, ApiError> {
    Ok(p.check(value.unwrap_or(default))?)
}

/// The sampling parameters, with the bundle's defaults where the request
/// gives none.
fn sampling(c: &Common, model: &ModelInfo) -> Result<SamplingParams, ApiError> {
    let d = &model.defaults;
    let temperature = param(Param::Temperature, c.temperature, d.temperature.unwrap_or(1.0))?;
    let sampled = temperature > 0.0;
    let top_p = param(Param::TopP, c.top_p, if sampled { d.top_p.unwrap_or(1.0) } else { 1.0 })?;
    let top_k = match c.top_k {
        Some(k) if k < 0 => return Err(ApiError::invalid_param("top_k", format!("must be >= 0 (0: all), got {k}"))),
        Some(k) => k as usize,
        None if sampled => d.top_k.unwrap_or(0),
        None => 0,
    };
    Ok(SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p: param(Param::MinP, c.min_p, 0.0)?,
        repetition_penalty: param(Param::RepetitionPenalty, c.repetition_penalty, 1.0)?,
        presence_penalty: param(Param::PresencePenalty, c.presence_penalty, 0.0)?,
        frequency_penalty: param(Param::FrequencyPenalty, c.frequency_penalty, 0.0)?,
        // A negative seed is as good a seed as any: keep its bits.
        seed: c.seed.map(|s| s as u64),
        ..SamplingParams::default()
    })
}

fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stops.len() > MAX_STOP {
        return Err(ApiError::invalid_param("stop", format!("at most {MAX_STOP} stop strings, got {}", stops.len())));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param("stop", "a stop string must not be empty"));
    }
    Ok(stops)
}

/// Checks what both routes share and builds the options for `prompt`.
fn finish(
    kind: Kind,
    c: Common,
    model: &ModelInfo,
    prompt: Vec<u32>,
    prompt_chars: usize,
    logprobs: Option<usize>,
) -> Result<Prepared, ApiError> {
    let _ = &c.model; // any name is accepted: the server has one model
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::unsupported("n", &format!(" (only n = 1; got {n})")));
    }
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_param("stream_options", "stream_options is only allowed when stream is true"));
    }
    let include_usage = c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    let (name, max_tokens) = match (c.max_completion_tokens, c.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, n) => ("max_tokens", n),
    };
    if let Some(n) = max_tokens
        && n < 1
    {
        return Err(ApiError::invalid_param(name, format!("{name} must be at least 1, got {n}")));
    }
    if prompt.is_empty() {
        return Err(ApiError::invalid_param(kind.prompt_field(), "the prompt gives no tokens"));
    }
    // Token ids outside the vocabulary are the engine's to refuse (at
    // submission, named by `ApiError::for_prompt`).
    let context = model.context_length();
    if prompt.len() >= context {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid_param(
                kind.prompt_field(),
                format!("the prompt has {} tokens but the context holds {context}: no room to generate", prompt.len()),
            )
        });
    }
    // What the context leaves; a larger request is capped to it.
    let room = context - prompt.len();
    let max_tokens = max_tokens.map_or(room, |n| (n as u64).min(room as u64) as usize);
    let options = GenerationOptions {
        max_tokens,
        sampling: sampling(&c, model)?,
        stop_strings: stop_strings(c.stop)?,
        top_logprobs: logprobs.unwrap_or(0),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        grammar: c.response_format.and_then(ResponseFormat::grammar),
        ..GenerationOptions::default()
    };
    Ok(Prepared { prompt, prompt_chars, options, stream, include_usage, logprobs, tools: None })
}

/// The messages of a chat request, checked (past tool calls and results
/// as they came: [`tools::conversation`] puts them in the template's form).
pub fn messages(object: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    #[derive(Deserialize)]
    struct Only {
        messages: Vec<ChatMessage>,
    }
    to_messages(typed::<Only>(object)?.messages)
}

/// How `model`'s template takes tools (no template: none, refused later).
pub fn tool_format(model: &ModelInfo) -> ToolFormat {
    model.chat_template.as_ref().map_or(ToolFormat::None, |t| t.tool_format())
}

fn to_messages(messages: Vec<ChatMessage>) -> Result<Vec<Message>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                other => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        format!("role {other:?} is not supported (system, developer, user, assistant, tool)"),
                    ));
                }
            };
            let calls = m.tool_calls.unwrap_or_default();
            if !calls.is_empty() && role != "assistant" {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].tool_calls"),
                    "only assistant messages carry tool_calls",
                ));
            }
            let content = match &m.content {
                // An assistant's calls may come without text.
                Value::Null if !calls.is_empty() => String::new(),
                content => content_text(content, i)?,
            };
            let mut message = Message::new(role, content);
            message.tool_calls =
                calls.iter().enumerate().map(|(j, c)| tools::history_call(i, j, c)).collect::<Result<_, _>>()?;
            message.tool_call_id = match (role, m.tool_call_id) {
                ("tool", Some(id)) => Some(id),
                ("tool", None) => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].tool_call_id"),
                        "a tool message needs the tool_call_id it answers",
                    ));
                }
                (_, Some(_)) => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].tool_call_id"),
                        "only tool messages carry a tool_call_id",
                    ));
                }
                (_, None) => None,
            };
            Ok(message)
        })
        .collect()
}

/// A message's text: a string, or a list of `{"type": "text", "text": ...}` parts.
fn content_text(content: &Value, i: usize) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("messages[{i}].content[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match kind {
                    Some("text") => match part.get("text").and_then(Value::as_str) {
                        Some(t) => text.push_str(t),
                        None => {
                            return Err(ApiError::invalid_param(
                                format!("{at}.text"),
                                "a text part needs a string `text`",
                            ));
                        }
                    },
                    Some(other) => {
                        return Err(ApiError::unsupported(
                            &format!("{at}.type"),
                            &format!(": content parts of type {other:?} (only \"text\")"),
                        ));
                    }
                    None => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.type"),
                            "a content part needs a string `type`",
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid_param(
            format!("messages[{i}].content"),
            "content must be a string or a list of text parts",
        )),
    }
}

/// A `/v1/chat/completions` request, tokenized through the chat template.
pub fn chat(body: &[u8], model: &ModelInfo) -> Result<Prepared, ApiError> {
    let object = parse_object(body, &[COMMON_FIELDS, CHAT_FIELDS])?;
    let common: Common = typed(&object)?;
    let fields: ChatFields = typed(&object)?;
    let logprobs = match (fields.logprobs.unwrap_or(false), fields.top_logprobs) {
        (_, Some(k)) if k < 0 || k as usize > MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid_param("top_logprobs", format!("must be in 0..={MAX_TOP_LOGPROBS}, got {k}")));
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid_param("top_logprobs", "top_logprobs needs logprobs set to true"));
        }
        (true, k) => Some(k.unwrap_or(0) as usize),
        (false, None) => None,
    };
    let tools = tools::parse(&object)?.map(|t| t.for_template(tool_format(model)));
    let active = tools.as_ref().is_some_and(Tools::active);
    if active && common.response_format.as_ref().is_some_and(|f| !matches!(f, ResponseFormat::Text)) {
        return Err(ApiError::unsupported(
            "response_format",
            " together with tools (unless tool_choice is \"none\": the calls are the answer's format)",
        ));
    }
    if active && logprobs.is_some() {
        return Err(ApiError::unsupported("logprobs", " together with tools (unless tool_choice is \"none\")"));
    }
    let messages = to_messages(fields.messages)?;
    let (messages, specs) = tools::conversation(messages, tools.as_ref(), tool_format(model));
    let prompt = model.encode_chat_with_tools(&messages, &specs)?;
    let mut prepared = finish(Kind::Chat, common, model, prompt, 0, logprobs)?;
    if let Some(grammar) = tools.as_ref().and_then(tools::grammar) {
        prepared.options.grammar = Some(grammar);
    }
    prepared.tools = tools;
    Ok(prepared)
}

/// A `/v1/completions` request.
pub fn completion(body: &[u8], model: &ModelInfo) -> Result<Prepared, ApiError> {
    let object = parse_object(body, &[COMMON_FIELDS, COMPLETION_FIELDS])?;
    let common: Common = typed(&object)?;
    let fields: CompletionFields = typed(&object)?;
    if fields.echo == Some(true) {
        return Err(ApiError::unsupported("echo", " (only echo = false)"));
    }
    if fields.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", ""));
    }
    if let Some(b) = fields.best_of
        && b != 1
    {
        return Err(ApiError::unsupported("best_of", &format!(" (only best_of = 1; got {b})")));
    }
    let logprobs = match fields.logprobs {
        Some(k) if k < 0 || k as usize > MAX_COMPLETION_LOGPROBS => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("must be in 0..={MAX_COMPLETION_LOGPROBS}, got {k}"),
            ));
        }
        k => k.map(|k| k as usize),
    };
    let (prompt, chars) = completion_prompt(&fields.prompt, model)?;
    finish(Kind::Text, common, model, prompt, chars, logprobs)
}

/// A completion's prompt: a string, a list of one string, token ids, or a
/// list of one list of token ids. Returns its tokens and its characters.
fn completion_prompt(prompt: &Value, model: &ModelInfo) -> Result<(Vec<u32>, usize), ApiError> {
    let many = || ApiError::unsupported("prompt", " as a list of several prompts (send one per request)");
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| {
                v.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
                    ApiError::invalid_param("prompt", "a prompt must be a string, a list of one string or token ids")
                })
            })
            .collect()
    };
    match prompt {
        Value::String(text) => Ok((model.encode_text(text)?, text.chars().count())),
        Value::Array(items) => match items.first() {
            None => Err(ApiError::invalid_param("prompt", "the prompt is empty")),
            Some(Value::String(text)) if items.len() == 1 => Ok((model.encode_text(text)?, text.chars().count())),
            Some(Value::Array(inner)) if items.len() == 1 => {
                let tokens = ids(inner)?;
                let chars = model.tokenizer.decode(&tokens, false).map(|t| t.chars().count()).unwrap_or(0);
                Ok((tokens, chars))
            }
            Some(Value::String(_) | Value::Array(_)) => Err(many()),
            Some(_) => {
                let tokens = ids(items)?;
                let chars = model.tokenizer.decode(&tokens, false).map(|t| t.chars().count()).unwrap_or(0);
                Ok((tokens, chars))
            }
        },
        _ => Err(ApiError::invalid_param("prompt", "a prompt must be a string, a list of one string or token ids")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &[&[&str]] = &[COMMON_FIELDS, CHAT_FIELDS];
    const COMPLETION: &[&[&str]] = &[COMMON_FIELDS, COMPLETION_FIELDS];

    fn refused(body: &str) -> ApiError {
        parse_object(body.as_bytes(), CHAT).unwrap_err()
    }

    #[test]
    fn unknown_and_unsupported_fields_are_named() {
        let e = refused(r#"{"messages": [], "frobnicate": 1}"#);
        assert_eq!(e.param.as_deref(), Some("frobnicate"));
        assert!(e.message.contains("unknown field"), "{}", e.message);
        let e = refused(r#"{"messages": [], "functions": []}"#);
        assert_eq!((e.param.as_deref(), e.code), (Some("functions"), Some("unsupported_parameter")));
        // A null unsupported field is an absent one.
        assert!(parse_object(br#"{"messages": [], "functions": null}"#, CHAT).is_ok());
        assert!(refused("[1]").message.contains("JSON object"));
        assert!(refused("{").message.contains("not valid JSON"));
        // Completions know no chat fields.
        let e = parse_object(br#"{"prompt": "x", "messages": []}"#, COMPLETION).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn each_field_is_listed_once() {
        let all: Vec<&str> = [COMMON_FIELDS, CHAT_FIELDS, COMPLETION_FIELDS].concat();
        let mut unique = all.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), all.len(), "a field in two lists: {all:?}");
        // The routes still differ where they should.
        assert!(parse_object(br#"{"prompt": "x", "max_completion_tokens": 1}"#, COMPLETION).is_err());
        assert!(parse_object(br#"{"messages": [], "echo": false}"#, CHAT).is_err());
        assert!(parse_object(br#"{"prompt": "x", "ignore_eos": true, "top_k": 2}"#, COMPLETION).is_ok());
    }

    #[test]
    fn a_wrong_type_names_its_path() {
        let object = parse_object(br#"{"messages": [{"role": "user", "content": "x"}], "seed": "s"}"#, CHAT).unwrap();
        let e = typed::<Common>(&object).err().unwrap();
        assert_eq!(e.param.as_deref(), Some("seed"));
        let object = parse_object(br#"{"messages": [{"role": 1, "content": "x"}]}"#, CHAT).unwrap();
        assert_eq!(messages(&object).unwrap_err().param.as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn messages_take_text_parts_and_map_developer_to_system() {
        let object = parse_object(
            br#"{"messages": [{"role": "developer", "content": "d"},
                              {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}"#,
            CHAT,
        )
        .unwrap();
        assert_eq!(messages(&object).unwrap(), [Message::new("system", "d"), Message::new("user", "ab")]);
        let object =
            parse_object(br#"{"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}"#, CHAT).unwrap();
        let e = messages(&object).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        assert!(e.message.contains("input_audio"), "{}", e.message);
        let object = parse_object(br#"{"messages": []}"#, CHAT).unwrap();
        assert!(messages(&object).is_err());
    }

    #[test]
    fn stop_strings_are_bounded_and_not_empty() {
        assert_eq!(stop_strings(Some(Stop::One("x".into()))).unwrap(), ["x"]);
        assert!(stop_strings(Some(Stop::Many(vec![String::new()]))).is_err());
        assert!(stop_strings(Some(Stop::Many(vec!["s".into(); MAX_STOP + 1]))).is_err());
        assert!(stop_strings(None).unwrap().is_empty());
    }
}
