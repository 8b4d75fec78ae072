//! The generation routes: `/v1/chat/completions` and `/v1/completions`
//! (and their un-prefixed aliases), whole or streamed.
//!
//! A request is checked and tokenized on a blocking task (templates and
//! tokenizers are CPU work), submitted, and its first event awaited before
//! the status is chosen: an error the engine finds at submission (the KV
//! budget, a token id outside the vocabulary) or at admission is still an
//! HTTP error, not a stream that fails; errors about the prompt name the
//! route's prompt field ([`ApiError::for_prompt`]).
//! After that a stream reports errors in-band: `data: {"error": {...}}`
//! then `data: [DONE]`. One log line per request ends it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use mlxcel_runtime::constraint::Grammar;
use mlxcel_runtime::engine::{Engine, Event, ModelInfo, Request};
use mlxcel_runtime::generate::{FinishReason, GenerationStats};
use serde_json::Value;

use crate::bridge::Events;
use crate::errors::ApiError;
use crate::openai::{self, Kind, Prepared};
use crate::responses::{Envelope, TokenLogprob, finish_reason};
use crate::state::Shared;
use crate::tool_calls::{CallReader, Piece, assemble, delta};
use crate::tools::Tools;

/// Marks a response whose request the generation code logs itself (when
/// it ends), so the request layer does not log it again.
#[derive(Clone, Copy)]
pub struct LoggedByHandler;

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<Shared>, body: Bytes) -> Response {
    handle(state, Kind::Chat, body).await
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<Shared>, body: Bytes) -> Response {
    handle(state, Kind::Text, body).await
}

async fn handle(state: Shared, kind: Kind, body: Bytes) -> Response {
    match start(state, kind, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// What a request needs from its start to its log line.
struct Job {
    model: Arc<ModelInfo>,
    envelope: Envelope,
    prepared: Prepared,
    events: Events,
    started: Instant,
    n: u64,
    /// Set once the log line is written; a job dropped before (its client
    /// went away, its future dropped) logs then.
    logged: bool,
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.logged {
            // Nginx's "client closed request" for a whole answer; a stream
            // had already sent its 200. Dropping `events` cancels the request.
            let status = if self.prepared.stream { 200 } else { 499 };
            log_line(self, status, "client disconnected", None);
        }
    }
}

async fn start(state: Shared, kind: Kind, body: Bytes) -> Result<Response, ApiError> {
    let started = Instant::now();
    let engine = state.engine_for_request()?.clone();
    let model = engine.model().clone();
    let prepared = {
        let (model, engine) = (model.clone(), engine.clone());
        tokio::task::spawn_blocking(move || {
            let prepared = match kind {
                Kind::Chat => openai::chat(&body, &model),
                Kind::Text => openai::completion(&body, &model),
            }?;
            check_tool_schemas(&engine, &prepared)?;
            Ok::<_, ApiError>(prepared)
        })
        .await
        .map_err(|e| ApiError::internal(format!("request task failed: {e}")))??
    };
    let request = Request { prompt: prepared.prompt.clone(), options: prepared.options.clone() };
    let tools = prepared.tools.as_ref().is_some_and(Tools::active);
    let mut events = Events::submit(&engine, state.clone(), request).map_err(|e| refusal(e, kind, tools))?;
    // The first event decides the status.
    let first = match events.next().await {
        Some(Ok(Event::Failed(e))) => return Err(refusal(e, kind, tools)),
        Some(Ok(Event::Done { finish_reason: FinishReason::Cancelled, .. })) => {
            return Err(mlxcel_runtime::Error::EngineStopped.into());
        }
        Some(Err(e)) => return Err(e),
        Some(Ok(event)) => event,
        None => return Err(mlxcel_runtime::Error::EngineStopped.into()),
    };
    let n = state.next_id();
    let envelope = Envelope::new(kind, n, state.model_name().to_string());
    let job = Job { model, envelope, prepared, events, started, n, logged: false };
    let mut response = if job.prepared.stream { stream(job, first) } else { whole(job, first).await? };
    response.extensions_mut().insert(LoggedByHandler);
    Ok(response)
}

/// Each tool's `parameters` compiled alone, so that a schema llguidance
/// refuses is named (`tools[i].function.parameters`) with its reason.
fn check_tool_schemas(engine: &Engine, prepared: &Prepared) -> Result<(), ApiError> {
    let Some(tools) = prepared.tools.as_ref().filter(|t| t.active()) else {
        return Ok(());
    };
    for (i, tool) in tools.tools.iter().enumerate() {
        match engine.check_grammar(&Grammar::JsonSchema(tool.parameters.clone())) {
            Ok(()) => {}
            Err(mlxcel_runtime::Error::InvalidParameter { name: "grammar", message }) => {
                let param = format!("tools[{i}].function.parameters");
                return Err(ApiError {
                    code: Some("unsupported_schema"),
                    ..ApiError::invalid_param(param.clone(), format!("invalid parameter {param}: {message}"))
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A runtime error of a request ([`ApiError::for_prompt`]); with tools, a
/// grammar refused is the tools' (each schema was checked alone first, so
/// this is the calls' grammar as a whole).
fn refusal(e: mlxcel_runtime::Error, kind: Kind, tools: bool) -> ApiError {
    match e {
        mlxcel_runtime::Error::InvalidParameter { name: "grammar", message } if tools => ApiError {
            code: Some("unsupported_schema"),
            ..ApiError::invalid_param("tools", format!("invalid parameter tools: {message}"))
        },
        e => ApiError::for_prompt(e, kind.prompt_field()),
    }
}

/// The chat's `finish_reason`: `tool_calls` when the answer ended after
/// giving calls.
fn reason_with_calls(reason: FinishReason, calls: usize) -> &'static str {
    if calls > 0 && reason == FinishReason::Stop { "tool_calls" } else { finish_reason(reason) }
}

/// The per-request log line.
fn log_line(job: &mut Job, status: u16, outcome: &str, stats: Option<&GenerationStats>) {
    job.logged = true;
    let path = if job.envelope.kind == Kind::Chat { "/v1/chat/completions" } else { "/v1/completions" };
    // Without the engine's figures (a failure, a disconnect): what is known here.
    let s = stats.cloned().unwrap_or_else(|| GenerationStats {
        prompt_tokens: job.prepared.prompt.len(),
        generated_tokens: job.events.tokens,
        ..GenerationStats::default()
    });
    let ttft_ms = job.events.time_to_first_token.map_or(0.0, |t| t.as_secs_f64() * 1e3);
    tracing::info!(
        id = job.n,
        request = %format_args!("POST {path}"),
        status,
        outcome,
        stream = job.prepared.stream,
        prompt_tokens = s.prompt_tokens,
        cached_tokens = s.cached_tokens,
        generated_tokens = s.generated_tokens,
        ttft_ms = format_args!("{ttft_ms:.1}"),
        tokens_per_second = format_args!("{:.1}", s.decode_tokens_per_second()),
        total_ms = format_args!("{:.1}", job.started.elapsed().as_secs_f64() * 1e3),
        "request"
    );
}

/// Whether a token gets a logprobs entry: an end token (empty text, ends
/// the answer) is not part of the answer, as in OpenAI's.
fn reported(model: &ModelInfo, token: u32, text: &str) -> bool {
    !(text.is_empty() && model.tokenizer.eos_ids().contains(&token))
}

/// A whole (non-streamed) answer.
async fn whole(mut job: Job, first: Event) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut next = Some(Ok(first));
    loop {
        let event = match next.take() {
            Some(e) => e,
            None => job.events.next().await.unwrap_or(Err(mlxcel_runtime::Error::EngineStopped.into())),
        };
        match event {
            Ok(Event::Token { token, logprob, top_logprobs, text: piece }) => {
                if job.prepared.logprobs.is_some() && reported(&job.model, token, &piece) {
                    logprobs.push(TokenLogprob { token, logprob, top: top_logprobs });
                }
                text.push_str(&piece);
            }
            Ok(Event::Text(piece)) => text.push_str(&piece),
            Ok(Event::Done { finish_reason: FinishReason::Cancelled, stats }) => {
                let e: ApiError = mlxcel_runtime::Error::EngineStopped.into();
                log_line(&mut job, e.status.as_u16(), "cancelled", Some(&stats));
                return Err(e);
            }
            Ok(Event::Done { finish_reason: reason, stats }) => {
                let mut offset = job.prepared.prompt_chars;
                let lp =
                    job.prepared.logprobs.map(|_| job.envelope.logprobs(&job.model.tokenizer, &logprobs, &mut offset));
                let (text, calls) = match job.prepared.tools.as_ref().filter(|t| t.active()) {
                    Some(tools) => {
                        let mut reader = CallReader::new(tools.layout, tools.text_allowed());
                        let mut pieces = reader.push(&text);
                        pieces.extend(reader.finish());
                        assemble(pieces)
                    }
                    None => (text, Vec::new()),
                };
                let reason = reason_with_calls(reason, calls.len());
                let body = job.envelope.completion(text, calls, lp, reason, &stats);
                log_line(&mut job, 200, reason, Some(&stats));
                return Ok(axum::Json(body).into_response());
            }
            Ok(Event::Failed(e)) => {
                let tools = job.prepared.tools.as_ref().is_some_and(Tools::active);
                let e = refusal(e, job.envelope.kind, tools);
                log_line(&mut job, e.status.as_u16(), "failed", None);
                return Err(e);
            }
            Err(e) => {
                log_line(&mut job, e.status.as_u16(), e.code.unwrap_or("error"), None);
                return Err(e);
            }
        }
    }
}

/// A streamed answer's state.
struct Streaming {
    job: Job,
    first: Option<Event>,
    role_sent: bool,
    offset: usize,
    /// Reads the text for calls when the request has active tools.
    calls: Option<CallReader>,
}

fn data(value: &Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

fn done_marker() -> SseEvent {
    SseEvent::default().data("[DONE]")
}

impl Streaming {
    /// The chat's opening delta (`role`), once, before its first content.
    fn open(&mut self, out: &mut Vec<SseEvent>) {
        if self.job.envelope.kind == Kind::Chat && !self.role_sent {
            self.role_sent = true;
            out.push(data(&self.job.envelope.chunk(true, Some(""), None, None, self.job.prepared.include_usage)));
        }
    }

    /// Text to send: as it is, or read for calls.
    fn text(&mut self, text: &str, lp: Option<Value>, out: &mut Vec<SseEvent>) {
        let usage = self.job.prepared.include_usage;
        let Some(reader) = self.calls.as_mut() else {
            if !text.is_empty() || lp.is_some() {
                out.push(data(&self.job.envelope.chunk(false, Some(text), lp, None, usage)));
            }
            return;
        };
        let pieces = reader.push(text);
        self.pieces(pieces, out);
    }

    /// The chunks of what the call reader gave: text, or a call.
    fn pieces(&self, pieces: Vec<Piece>, out: &mut Vec<SseEvent>) {
        let usage = self.job.prepared.include_usage;
        for delta in pieces.into_iter().filter_map(delta) {
            out.push(data(&self.job.envelope.delta_chunk(delta, usage)));
        }
    }

    fn error(&mut self, e: ApiError, out: &mut Vec<SseEvent>) {
        log_line(&mut self.job, 200, e.code.unwrap_or("error"), None);
        out.push(data(&e.body()));
        out.push(done_marker());
    }

    /// The SSE events for one engine event; `true` when the stream ends.
    fn on(&mut self, event: Result<Event, ApiError>) -> (Vec<SseEvent>, bool) {
        let mut out = Vec::new();
        let usage = self.job.prepared.include_usage;
        match event {
            Ok(Event::Token { token, logprob, top_logprobs, text }) => {
                self.open(&mut out);
                let lp = match self.job.prepared.logprobs {
                    Some(_) if reported(&self.job.model, token, &text) => {
                        let entry = [TokenLogprob { token, logprob, top: top_logprobs }];
                        Some(self.job.envelope.logprobs(&self.job.model.tokenizer, &entry, &mut self.offset))
                    }
                    _ => None,
                };
                self.text(&text, lp, &mut out);
                (out, false)
            }
            Ok(Event::Text(text)) => {
                self.open(&mut out);
                self.text(&text, None, &mut out);
                (out, false)
            }
            Ok(Event::Done { finish_reason: FinishReason::Cancelled, .. }) => {
                self.error(mlxcel_runtime::Error::EngineStopped.into(), &mut out);
                (out, true)
            }
            Ok(Event::Done { finish_reason: reason, stats }) => {
                self.open(&mut out);
                let rest = self.calls.as_mut().map(CallReader::finish).unwrap_or_default();
                self.pieces(rest, &mut out);
                let reason = reason_with_calls(reason, self.calls.as_ref().map_or(0, |r| r.calls));
                let content = if self.job.envelope.kind == Kind::Text { Some("") } else { None };
                out.push(data(&self.job.envelope.chunk(false, content, None, Some(reason), usage)));
                if usage {
                    out.push(data(&self.job.envelope.usage_chunk(&stats)));
                }
                out.push(done_marker());
                log_line(&mut self.job, 200, reason, Some(&stats));
                (out, true)
            }
            Ok(Event::Failed(e)) => {
                let tools = self.calls.is_some();
                self.error(refusal(e, self.job.envelope.kind, tools), &mut out);
                (out, true)
            }
            Err(e) => {
                self.error(e, &mut out);
                (out, true)
            }
        }
    }
}

/// A streamed answer: server-sent events, `data: [DONE]` last. Dropping
/// the body (the client went away) drops the [`Events`], which cancels the
/// request.
fn stream(job: Job, first: Event) -> Response {
    let offset = job.prepared.prompt_chars;
    let calls = job.prepared.tools.as_ref().filter(|t| t.active()).map(|t| CallReader::new(t.layout, t.text_allowed()));
    let state = Streaming { job, first: Some(first), role_sent: false, offset, calls };
    let events = futures_util::stream::unfold((state, false), |(mut state, ended)| async move {
        if ended {
            return None;
        }
        let event = match state.first.take() {
            Some(e) => Ok(e),
            None => state.job.events.next().await.unwrap_or(Err(mlxcel_runtime::Error::EngineStopped.into())),
        };
        let (out, ended) = state.on(event);
        Some((futures_util::stream::iter(out.into_iter().map(Ok::<_, Infallible>)), (state, ended)))
    })
    .flatten();
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}
