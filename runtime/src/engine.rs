//! The engine: a model on a thread of its own, driven over channels.
//!
//! MLX arrays are tied to the thread that builds them (`Array` is `!Send`),
//! and the backend takes `&mut self`; a server needs a handle many request
//! handlers can share. [`Engine`] is that handle (`Send + Sync`): it starts a
//! dedicated thread that loads the bundle and owns the backend, takes
//! requests over a channel and answers each with a stream of [`Event`]s
//! (tokens with their text, finish reason, timings).
//!
//! The thread batches continuously: between two decode steps it admits new
//! requests (prefilling their prompts), and each step feeds one token of
//! every running sequence through the model as one forward pass. A
//! sequence's tokens do not depend on which others share its steps (the
//! backend is batch-invariant), so concurrent greedy output equals serial.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mlxcel_arch::ModelConfig;

use crate::backend::{Backend, MlxBackend, SeqId};
use crate::chat::{ChatTemplate, Message};
use crate::error::{Error, Result};
use crate::generate::{
    FinishReason, Generation, GenerationOptions, GenerationStats, SequenceState, TextStream, check_prompt_tokens,
};
use crate::loader::{GenerationDefaults, LoadOptions, LoadedModel, load};
use crate::tokenizer::Tokenizer;

/// How to start an [`Engine`].
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// How to load the bundle.
    pub load: LoadOptions,
    /// The most sequences decoded together; more requests wait their turn.
    pub max_batch: usize,
    /// The most requests waiting for a slot; [`Engine::submit`] refuses
    /// more with [`Error::QueueFull`].
    pub max_waiting: usize,
    /// Prompt tokens prefilled between two decode steps, so that running
    /// streams keep flowing while a long prompt is read.
    pub prefill_chunk: usize,
    /// The most tokens one sequence may hold (prompt and generation); at
    /// most the model's context (`None`: the model's context).
    pub context: Option<usize>,
    /// Bytes of KV cache the running sequences may hold together (`None`:
    /// no limit). A request waits until its KV cache fits, and is refused
    /// with [`Error::KvBudget`] when it could never fit.
    pub kv_budget: Option<u64>,
    /// Bytes of KV state kept from finished requests for later ones that
    /// share their prefix (0: no prefix cache); least recently used first out.
    pub prefix_cache: u64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            load: LoadOptions::default(),
            max_batch: 8,
            max_waiting: 256,
            prefill_chunk: 256,
            context: None,
            kv_budget: None,
            prefix_cache: 0,
        }
    }
}

/// A snapshot of what the engine is doing ([`Engine::stats`]), for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Sequences being prefilled or decoded.
    pub running: usize,
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Bytes of KV cache the running sequences hold.
    pub kv_bytes: u64,
    /// Positions the running sequences hold.
    pub kv_tokens: u64,
    /// Bytes of KV state in the prefix cache.
    pub prefix_cache_bytes: u64,
    /// Entries in the prefix cache.
    pub prefix_cache_entries: usize,
    /// Requests that reused a cached prefix.
    pub prefix_cache_hits: u64,
    /// Requests that found no cached prefix to reuse.
    pub prefix_cache_misses: u64,
    /// Prompt tokens taken from the prefix cache instead of prefilled.
    pub prefix_cache_tokens: u64,
    /// Decode steps run.
    pub decode_steps: u64,
}

/// What the engine's callers need to know about the model, and use without
/// the engine thread: its tokenizer and chat template, config and defaults.
pub struct ModelInfo {
    /// The bundle's model name.
    pub name: String,
    /// The bundle's architecture name.
    pub architecture: String,
    /// The most tokens a sequence may hold (the model's context, or less
    /// when the engine was asked: [`EngineOptions::context`]).
    pub context: usize,
    /// The normalized config.
    pub config: ModelConfig,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, if the bundle has one.
    pub chat_template: Option<ChatTemplate>,
    /// Generation defaults the model ships with.
    pub defaults: GenerationDefaults,
    /// Bytes of tensor data loaded.
    pub weight_bytes: u64,
    /// Time from opening the bundle to the model being ready.
    pub load_time: Duration,
}

impl ModelInfo {
    /// The most tokens a sequence may hold.
    pub fn context_length(&self) -> usize {
        self.context
    }

    /// The prompt tokens of a conversation, through the chat template, ending
    /// with the assistant's turn opener.
    pub fn encode_chat(&self, messages: &[Message]) -> Result<Vec<u32>> {
        let template =
            self.chat_template.as_ref().ok_or_else(|| Error::ChatTemplate("the bundle has no chat template".into()))?;
        let text = template.render(messages, true, self.tokenizer.bos_text(), self.tokenizer.eos_text())?;
        // The template wrote the special tokens (BOS) itself.
        self.tokenizer.encode(&text, false)
    }

    /// The prompt tokens of raw text, with the tokenizer's special tokens (BOS).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text, true)
    }
}

// A ModelInfo is shared by every request handler.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ModelInfo>();
    assert_send_sync::<Engine>();
};

/// One generation request: prompt tokens and how to continue them.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt, as token ids ([`ModelInfo::encode_chat`], [`ModelInfo::encode_text`]).
    pub prompt: Vec<u32>,
    /// Sampling, stopping and the token budget.
    pub options: GenerationOptions,
}

/// What a request's stream reports, in order: tokens, then one `Done` or
/// one `Failed`.
#[derive(Debug)]
pub enum Event {
    /// A generated token and the text it completes (possibly empty: part of
    /// a character, or text that may still turn out to be a stop string; an
    /// end token has none).
    Token {
        /// The token id.
        token: u32,
        /// Its log-probability under the model.
        logprob: f32,
        /// The most likely tokens at this step and their log-probabilities
        /// ([`GenerationOptions::top_logprobs`] of them, most likely first).
        top_logprobs: Vec<(u32, f32)>,
        /// The text it adds.
        text: String,
    },
    /// Text held back until the end (released after the last token).
    Text(String),
    /// Generation ended.
    Done {
        /// Why.
        finish_reason: FinishReason,
        /// Counts and timings.
        stats: GenerationStats,
    },
    /// The request failed; nothing follows.
    Failed(Error),
}

/// Stops a request from any thread (a signal handler, a closed connection).
#[derive(Clone, Debug)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    /// Asks the engine to stop the request; it ends with [`FinishReason::Cancelled`].
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A request being generated: iterate it for its [`Event`]s. Dropping it
/// cancels the request.
pub struct Generating {
    events: Receiver<Event>,
    cancel: Canceller,
}

impl Generating {
    /// Asks the engine to stop this request.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// A handle that cancels this request from another thread.
    pub fn canceller(&self) -> Canceller {
        self.cancel.clone()
    }

    /// Collects the whole generation (text, tokens, log-probabilities).
    pub fn collect_generation(self) -> Result<Generation> {
        let (mut text, mut tokens, mut logprobs) = (String::new(), Vec::new(), Vec::new());
        for event in self {
            match event {
                Event::Token { token, logprob, text: piece, .. } => {
                    tokens.push(token);
                    logprobs.push(logprob);
                    text.push_str(&piece);
                }
                Event::Text(piece) => text.push_str(&piece),
                Event::Done { finish_reason, stats } => {
                    return Ok(Generation { text, tokens, logprobs, finish_reason, stats });
                }
                Event::Failed(e) => return Err(e),
            }
        }
        Err(Error::EngineStopped)
    }
}

impl Iterator for Generating {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.events.recv().ok()
    }
}

impl Drop for Generating {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A request handed to the engine thread.
struct Job {
    request: Request,
    events: Sender<Event>,
    cancel: Arc<AtomicBool>,
}

enum Command {
    Generate(Box<Job>),
    /// Cancel everything and stop.
    Shutdown,
}

/// A handle to a model running on its own thread. `Send + Sync`: share it
/// (in an `Arc`) between request handlers. Dropping it cancels the requests
/// in flight and stops the thread.
pub struct Engine {
    commands: Sender<Command>,
    model: Arc<ModelInfo>,
    max_batch: usize,
    max_waiting: usize,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// State the engine thread publishes to its handles.
#[derive(Default)]
struct Shared {
    /// Requests submitted and not yet admitted (or dropped from the queue).
    waiting: AtomicUsize,
    /// The scheduler's latest figures (`waiting` is overwritten from the counter).
    stats: Mutex<EngineStats>,
}

impl Engine {
    /// Starts the engine thread, which loads the bundle at `path`; returns
    /// once the model is ready (or failed to load).
    pub fn load(path: &Path, options: EngineOptions) -> Result<Engine> {
        if options.max_batch == 0 {
            return Err(Error::InvalidParameter { name: "max_batch", message: "must be at least 1".into() });
        }
        if options.prefill_chunk == 0 {
            return Err(Error::InvalidParameter { name: "prefill_chunk", message: "must be at least 1".into() });
        }
        if options.context == Some(0) {
            return Err(Error::InvalidParameter { name: "context", message: "must be at least 1".into() });
        }
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        let max_waiting = options.max_waiting;
        let (commands, inbox) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let path: PathBuf = path.to_path_buf();
        let max_batch = options.max_batch;
        let thread = std::thread::Builder::new()
            .name("mlxcel-engine".into())
            .spawn(move || {
                let loaded = match load(&path, &options.load) {
                    Ok(loaded) => loaded,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let LoadedModel {
                    backend,
                    tokenizer,
                    chat_template,
                    defaults,
                    config,
                    architecture,
                    name,
                    weight_bytes,
                    load_time,
                } = loaded;
                // The context a sequence may use: the model's, or less when asked.
                let context = options.context.map_or(backend.context_length(), |c| c.min(backend.context_length()));
                let model = Arc::new(ModelInfo {
                    name,
                    architecture,
                    context,
                    config,
                    tokenizer,
                    chat_template,
                    defaults,
                    weight_bytes,
                    load_time,
                });
                if ready_tx.send(Ok(model.clone())).is_ok() {
                    Scheduler {
                        backend,
                        model,
                        max_batch,
                        context,
                        shared: thread_shared,
                        waiting: VecDeque::new(),
                        running: Vec::new(),
                    }
                    .run(inbox);
                }
            })
            .map_err(|e| Error::Bundle(format!("starting the engine thread: {e}")))?;
        let model = match ready_rx.recv() {
            Ok(result) => result?,
            Err(_) => return Err(Error::EngineStopped),
        };
        Ok(Engine { commands, model, max_batch, max_waiting, shared, thread: Mutex::new(Some(thread)) })
    }

    /// The model: tokenizer, chat template, config, defaults.
    pub fn model(&self) -> &Arc<ModelInfo> {
        &self.model
    }

    /// The most sequences decoded together.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The most requests that may wait for a slot.
    pub fn max_waiting(&self) -> usize {
        self.max_waiting
    }

    /// What the engine is doing now.
    pub fn stats(&self) -> EngineStats {
        let mut stats = self.shared.stats.lock().map(|s| s.clone()).unwrap_or_default();
        stats.waiting = self.shared.waiting.load(Ordering::SeqCst);
        stats
    }

    /// Queues a request; its events arrive on the returned stream. Refused
    /// with [`Error::QueueFull`] when `max_waiting` requests already wait.
    pub fn submit(&self, request: Request) -> Result<Generating> {
        let waiting = self.shared.waiting.fetch_add(1, Ordering::SeqCst);
        if waiting >= self.max_waiting {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::QueueFull { waiting });
        }
        let (events, receiver) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job { request, events, cancel: cancel.clone() };
        if self.commands.send(Command::Generate(Box::new(job))).is_err() {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::EngineStopped);
        }
        Ok(Generating { events: receiver, cancel: Canceller(cancel) })
    }

    /// Generates `request` to the end.
    pub fn generate(&self, request: Request) -> Result<Generation> {
        self.submit(request)?.collect_generation()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = thread.join();
        }
    }
}

/// One running sequence.
struct Running {
    seq: SeqId,
    state: SequenceState,
    text: TextStream,
    /// The token the next step feeds (the prompt's last, then each sampled one).
    next_input: u32,
    events: Sender<Event>,
    cancel: Arc<AtomicBool>,
}

/// The engine thread's loop: admit requests between steps, decode every
/// running sequence together.
struct Scheduler {
    backend: MlxBackend,
    model: Arc<ModelInfo>,
    max_batch: usize,
    /// The most tokens a sequence may hold.
    context: usize,
    shared: Arc<Shared>,
    waiting: VecDeque<Job>,
    running: Vec<Running>,
}

impl Scheduler {
    fn run(mut self, inbox: Receiver<Command>) {
        let mut shutting_down = false;
        loop {
            // Idle: wait for work (or for every handle to go).
            if self.running.is_empty() && self.waiting.is_empty() {
                if shutting_down {
                    return;
                }
                match inbox.recv() {
                    Ok(command) => shutting_down |= self.take(command),
                    Err(_) => return,
                }
            }
            while let Ok(command) = inbox.try_recv() {
                shutting_down |= self.take(command);
            }
            if shutting_down {
                self.shared.waiting.fetch_sub(self.waiting.len(), Ordering::SeqCst);
                for job in self.waiting.drain(..) {
                    job.cancel.store(true, Ordering::SeqCst);
                    let _ = job.events.send(Event::Failed(Error::EngineStopped));
                }
                for r in &self.running {
                    r.cancel.store(true, Ordering::SeqCst);
                }
            }
            while self.running.len() < self.max_batch
                && let Some(job) = self.waiting.pop_front()
            {
                self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
                if let Some(r) = self.admit(job) {
                    self.running.push(r);
                }
            }
            self.step();
            self.publish();
        }
    }

    /// Publishes the figures of [`Engine::stats`].
    fn publish(&mut self) {
        let kv_bytes: u64 = self.running.iter().map(|r| self.backend.cache_bytes(r.seq).unwrap_or(0) as u64).sum();
        let kv_tokens: u64 = self.running.iter().map(|r| self.backend.position(r.seq).unwrap_or(0) as u64).sum();
        if let Ok(mut stats) = self.shared.stats.lock() {
            stats.running = self.running.len();
            stats.kv_bytes = kv_bytes;
            stats.kv_tokens = kv_tokens;
            stats.decode_steps += 1;
        }
    }

    /// Queues a command's job; true for a shutdown.
    fn take(&mut self, command: Command) -> bool {
        match command {
            Command::Generate(job) => {
                self.waiting.push_back(*job);
                false
            }
            Command::Shutdown => true,
        }
    }

    /// Starts a request: checks it, prefills all of its prompt but the last
    /// token (which the next step feeds, as every decode token).
    fn admit(&mut self, job: Job) -> Option<Running> {
        if job.cancel.load(Ordering::SeqCst) {
            let _ = job.events.send(Event::Done { finish_reason: FinishReason::Cancelled, stats: Default::default() });
            return None;
        }
        let Request { prompt, options } = job.request;
        let state = SequenceState::new(&prompt, &options, self.model.tokenizer.eos_ids(), self.context)
            .and_then(|state| check_prompt_tokens(&prompt, self.backend.vocab_size()).map(|()| state));
        let mut state = match state {
            Ok(s) => s,
            Err(e) => {
                let _ = job.events.send(Event::Failed(e));
                return None;
            }
        };
        if state.is_exhausted() {
            state.prefill_finished();
            let _ = job.events.send(Event::Done { finish_reason: FinishReason::Length, stats: state.stats() });
            return None;
        }
        let seq = self.backend.new_sequence();
        let (head, last) = prompt.split_at(prompt.len() - 1);
        if !head.is_empty()
            && let Err(e) = self.backend.prefill(seq, head, false)
        {
            self.backend.release_sequence(seq);
            let _ = job.events.send(Event::Failed(e));
            return None;
        }
        Some(Running {
            seq,
            state,
            text: TextStream::new(&options.stop_strings),
            next_input: last[0],
            events: job.events,
            cancel: job.cancel,
        })
    }

    /// One decode step of every running sequence.
    fn step(&mut self) {
        // Cancelled requests end before the step.
        let (cancelled, running): (Vec<Running>, Vec<Running>) =
            std::mem::take(&mut self.running).into_iter().partition(|r| r.cancel.load(Ordering::SeqCst));
        self.running = running;
        for r in cancelled {
            self.finish(r, FinishReason::Cancelled);
        }
        if self.running.is_empty() {
            return;
        }
        let batch: Vec<(SeqId, u32)> = self.running.iter().map(|r| (r.seq, r.next_input)).collect();
        let logits = match self.backend.decode(&batch) {
            Ok(logits) => logits,
            Err(e) => {
                let message = e.to_string();
                for r in std::mem::take(&mut self.running) {
                    self.backend.release_sequence(r.seq);
                    let _ = r.events.send(Event::Failed(Error::Step(message.clone())));
                }
                return;
            }
        };
        let running = std::mem::take(&mut self.running);
        for (mut r, mut logits) in running.into_iter().zip(logits) {
            match self.advance(&mut r, &mut logits) {
                Ok(None) => self.running.push(r),
                Ok(Some(reason)) => self.finish(r, reason),
                Err(e) => {
                    self.backend.release_sequence(r.seq);
                    let _ = r.events.send(Event::Failed(e));
                }
            }
        }
    }

    /// Samples a sequence's next token and reports it; `Some` when the
    /// sequence is done.
    fn advance(&self, r: &mut Running, logits: &mut [f32]) -> Result<Option<FinishReason>> {
        let step = r.state.accept(logits)?;
        let token = step.sampled.token;
        let logprob = step.sampled.logprob;
        let top_logprobs = step.top_logprobs;
        // An end token has no text of its own.
        let (text, finish) = if step.finish == Some(FinishReason::Stop) {
            (String::new(), step.finish)
        } else {
            let delta = r.text.push(&self.model.tokenizer, token)?;
            (delta.text, if delta.stopped { Some(FinishReason::Stop) } else { step.finish })
        };
        r.next_input = token;
        if r.events.send(Event::Token { token, logprob, top_logprobs, text }).is_err() {
            // Nobody listens any more.
            return Ok(Some(FinishReason::Cancelled));
        }
        Ok(finish)
    }

    /// Ends a sequence: releases its cache, sends what text was held back
    /// (unless cancelled), then `Done`.
    fn finish(&mut self, mut r: Running, mut reason: FinishReason) {
        self.backend.release_sequence(r.seq);
        if reason != FinishReason::Cancelled {
            match r.text.finish(&self.model.tokenizer) {
                Ok(tail) => {
                    if tail.stopped {
                        reason = FinishReason::Stop;
                    }
                    if !tail.text.is_empty() {
                        let _ = r.events.send(Event::Text(tail.text));
                    }
                }
                Err(e) => {
                    let _ = r.events.send(Event::Failed(e));
                    return;
                }
            }
        }
        let _ = r.events.send(Event::Done { finish_reason: reason, stats: r.state.stats() });
    }
}
