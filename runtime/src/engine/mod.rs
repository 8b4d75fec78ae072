//! The engine: a model on a thread of its own, driven over channels.
//!
//! MLX arrays are tied to the thread that builds them (`Array` is `!Send`),
//! and the backend takes `&mut self`; a server needs a handle many request
//! handlers can share. [`Engine`] is that handle (`Send + Sync`): it starts a
//! dedicated thread that loads the bundle and owns the backend, takes
//! requests over a channel and answers each with a stream of [`Event`]s
//! (tokens with their text, finish reason, timings).
//!
//! # Scheduling
//!
//! The thread batches continuously. Each iteration it
//! 1. admits queued requests, in order, while fewer than
//!    [`EngineOptions::max_batch`] are admitted and the first one's KV cache
//!    fits the budget (a request that does not fit waits, and the ones
//!    behind it wait too: no overtaking);
//! 2. ends cancelled sequences (prefilling or decoding);
//! 3. prefills one chunk of [`EngineOptions::prefill_chunk`] prompt tokens of
//!    the oldest sequence still reading its prompt;
//! 4. runs one decode step: one forward pass feeding one token of every
//!    sequence whose prompt is in (its last prompt token first, then each
//!    sampled one).
//!
//! So a long prompt is read a chunk at a time between decode steps, and
//! running streams keep getting tokens meanwhile. A sequence's tokens do
//! not depend on which others share its steps (the backend is
//! batch-invariant), so concurrent greedy output equals serial.
//!
//! Prompt chunks always start at multiples of the chunk size: the CPU
//! kernels' bits for a position depend on the number of rows its forward
//! pass had (splitting a prefill at an arbitrary point changes the logits:
//! tests/tests/prefill_chunks.rs), so a given prompt is always computed in
//! the same pieces, with the prefix cache or without it.
//!
//! # Memory: the KV budget and the prefix cache
//!
//! With [`EngineOptions::kv_budget`], each admitted request reserves the
//! bytes its caches can reach, [`ModelInfo::kv_bytes_for`]`(min(prompt +
//! max_tokens, context))` (more when a reused prefix's buffers are larger).
//! A request is admitted when the reservations plus its own fit the budget,
//! and refused at once with [`Error::KvBudget`] when its own alone do not.
//!
//! With [`EngineOptions::prefix_cache`] bytes, a finished (or cancelled)
//! sequence's caches are kept, with the tokens they hold, in a
//! least-recently-used pool instead of being freed. A new request takes the
//! entry sharing the longest prefix with its prompt (with
//! [`PrefixReuse::Exact`], counted in whole prefill chunks that the entry
//! prefilled), and not its prompt's last token
//! (which goes through the decode step); the entry's caches are cut back to
//! that length and only the rest of the prompt is prefilled. Its length is
//! the request's [`GenerationStats::cached_tokens`]. A sliding-window layer
//! can be cut back only while its ring has not wrapped, so an entry longer
//! than a window is not reused there. With [`PrefixReuse::Exact`] (the
//! default) greedy output is the same with the cache as without it, bit for
//! bit; [`PrefixReuse::Longest`] also reuses partial chunks and generated
//! tokens (a chat's next turn skips its whole history) at the price of
//! last-bit differences from a cold prefill.
//!
//! The two budgets: the pool holds at most `prefix_cache` bytes, and with a
//! KV budget the pool and the reservations together hold at most
//! `kv_budget`: the pool gives way, least recently used entries first, to
//! the requests (an entry is dropped before a request waits for memory).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use mlxcel_arch::ModelConfig;

use crate::chat::{ChatTemplate, Message};
use crate::constraint::{Constraint, ConstraintCompiler, Grammar};
use crate::error::{Error, Result};
use crate::generate::{FinishReason, Generation, GenerationOptions, GenerationStats, check_prompt_tokens};
use crate::loader::{GenerationDefaults, LoadOptions, LoadedModel, default_compute_dtype, load_backend};
use crate::tokenizer::Tokenizer;

mod budget;
mod prefix_cache;
mod scheduler;
mod warm_up;

pub use budget::{KvSizing, LayerKv};
use scheduler::Scheduler;

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
    /// streams keep flowing while a long prompt is read. Chunks start at
    /// multiples of it (see the module docs: the bits of a position depend
    /// on its chunk); set the backend's `MlxOptions::prefill_chunk` to the
    /// same value to prefill exactly as [`crate::generate::generate`] does.
    pub prefill_chunk: usize,
    /// The most tokens one sequence may hold (prompt and generation); at
    /// most the model's context (`None`: the model's context).
    pub context: Option<usize>,
    /// Bytes of KV cache the admitted sequences and the prefix cache may
    /// hold together (`None`: no limit). Each request reserves
    /// [`ModelInfo::kv_bytes_for`] its `min(prompt + max_tokens, context)`
    /// tokens; it waits until that fits (prefix cache entries are dropped
    /// first), and is refused with [`Error::KvBudget`] when it never could.
    pub kv_budget: Option<u64>,
    /// Bytes of KV state kept from finished requests for later ones that
    /// share their prefix (0: no prefix cache); least recently used first
    /// out.
    pub prefix_cache: u64,
    /// Which cached positions a request may reuse.
    pub prefix_reuse: PrefixReuse,
    /// When the grammars' token masks are computed.
    pub mask_timing: MaskTiming,
    /// Warm the model up before [`Engine::load`] returns: one prefill (64
    /// tokens on a GPU, 2 on the CPU; one chunk at most) and one decode step
    /// on a sequence of its own, so that the first request does not pay the
    /// process's one-time costs (the weights' first touch; on a CUDA GPU
    /// about 0.3 s in the first launches of MLX's operations). Its time is
    /// [`ModelInfo::warm_up_time`].
    pub warm_up: bool,
}

/// When a constrained sequence's token mask for the next step is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MaskTiming {
    /// [`MaskTiming::Overlapped`] when the forward pass leaves a CPU core
    /// free (it runs on the GPU, or the CPU kernels use fewer threads than
    /// this process may run on), else [`MaskTiming::AfterStep`].
    #[default]
    Auto,
    /// On a worker thread while the forward pass runs: hidden behind the
    /// step when a core is free for it.
    Overlapped,
    /// On the engine thread once the forward pass is done. When the kernels
    /// hold every core, a worker would preempt one of their threads and
    /// stall the others at the next barrier (1.1 ms a step on two cores,
    /// measured, for 0.05 ms of mask work).
    AfterStep,
}

impl MaskTiming {
    /// `Auto` decided for this process's device and kernel threads.
    pub fn resolve(self) -> MaskTiming {
        if self != MaskTiming::Auto {
            return self;
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let on_gpu = mlxcel_mlx::device::default_device() == mlxcel_mlx::device::Device::Gpu;
        if on_gpu || mlxcel_mlx::fast::threads() < cores { MaskTiming::Overlapped } else { MaskTiming::AfterStep }
    }
}

/// Which positions of a prefix cache entry a new request may reuse: a
/// trade between exact reproducibility and how much prefill is skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefixReuse {
    /// Whole prefill chunks that the entry prefilled: every reused position
    /// was computed exactly as a cold prefill computes it, so output is the
    /// same with the cache as without it, bit for bit (and concurrent
    /// greedy output equals serial whatever the cache holds). Prompts
    /// shorter than a chunk reuse nothing, and neither do the tokens a
    /// request generated.
    #[default]
    Exact,
    /// The longest common prefix, the tokens the entry generated included (a
    /// conversation's next turn reuses all of its history). The reused
    /// positions were computed in other pieces than a cold prefill would
    /// use (decode steps, other chunk boundaries), and the CPU kernels' bits
    /// depend on the piece size: the continuation's logits may differ from
    /// a cold prefill's in the last bits, as with llama.cpp's prompt cache.
    Longest,
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
            prefix_reuse: PrefixReuse::Exact,
            mask_timing: MaskTiming::Auto,
            warm_up: false,
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
    /// The bundle's GPU kernels, when the model runs on a CUDA GPU.
    pub gpu_kernels: Option<crate::gpu_kernels::Installed>,
    /// Time from opening the bundle to the model being ready.
    pub load_time: Duration,
    /// Time the warm-up took ([`EngineOptions::warm_up`]; `None` when it
    /// did not run), after `load_time`.
    pub warm_up_time: Option<Duration>,
    /// The KV cache sizes of its layers ([`ModelInfo::kv_bytes_for`]).
    pub kv: KvSizing,
}

impl ModelInfo {
    /// The most tokens a sequence may hold.
    pub fn context_length(&self) -> usize {
        self.context
    }

    /// Bytes of KV cache per position (every layer's keys and values) while
    /// a sequence is within every sliding window.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.kv.bytes_per_token()
    }

    /// The most bytes of KV cache a sequence of `tokens` positions holds: what
    /// the KV budget ([`EngineOptions::kv_budget`]) reserves for a request of
    /// `min(prompt + max_tokens, context)` tokens.
    pub fn kv_bytes_for(&self, tokens: usize) -> u64 {
        self.kv.bytes_for(tokens)
    }

    /// The prompt tokens of a conversation, through the chat template, ending
    /// with the assistant's turn opener.
    pub fn encode_chat(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.encode_chat_with_tools(messages, &[])
    }

    /// [`ModelInfo::encode_chat`] with `tools` given to the template
    /// ([`ChatTemplate::render_with_tools`]).
    pub fn encode_chat_with_tools(&self, messages: &[Message], tools: &[serde_json::Value]) -> Result<Vec<u32>> {
        let template =
            self.chat_template.as_ref().ok_or_else(|| Error::ChatTemplate("the bundle has no chat template".into()))?;
        let text =
            template.render_with_tools(messages, tools, true, self.tokenizer.bos_text(), self.tokenizer.eos_text())?;
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

    /// The next event if the engine has sent it already, without waiting.
    pub fn try_next(&self) -> Option<Event> {
        self.events.try_recv().ok()
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
    /// `request.options.grammar`, compiled at [`Engine::submit`].
    constraint: Option<Box<Constraint>>,
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
    kv_budget: Option<u64>,
    shared: Arc<Shared>,
    /// Built on the first request with a grammar (it walks the vocabulary);
    /// the error, if building failed, is kept and repeated.
    constraints: OnceLock<std::result::Result<ConstraintCompiler, String>>,
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
        let kv_budget = options.kv_budget;
        let (commands, inbox) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let path: PathBuf = path.to_path_buf();
        let max_batch = options.max_batch;
        let thread = std::thread::Builder::new()
            .name("mlxcel-engine".into())
            .spawn(move || {
                let loaded = match load_backend(&path, &options.load) {
                    Ok(loaded) => loaded,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let LoadedModel {
                    mut backend,
                    tokenizer,
                    chat_template,
                    defaults,
                    config,
                    architecture,
                    name,
                    weight_bytes,
                    gpu_kernels,
                    load_time,
                } = loaded;
                // The context a sequence may use: the model's, or less when asked.
                let context = options.context.map_or(backend.context_length(), |c| c.min(backend.context_length()));
                let warm_up_time = match options.warm_up {
                    true => match warm_up::warm_up(backend.as_mut(), options.prefill_chunk, context) {
                        Ok(time) => time,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    },
                    false => None,
                };
                let dtype = options.load.compute_dtype.unwrap_or_else(default_compute_dtype);
                let kv = match backend.fixed_cache_bytes() {
                    Some(bytes) => KvSizing::fixed(config.num_hidden_layers, backend.context_length(), bytes),
                    None => KvSizing::from_config(&config, dtype, options.load.backend.max_kv),
                };
                let model = Arc::new(ModelInfo {
                    name,
                    architecture,
                    context,
                    config,
                    tokenizer,
                    chat_template,
                    defaults,
                    weight_bytes,
                    gpu_kernels,
                    load_time,
                    warm_up_time,
                    kv,
                });
                if ready_tx.send(Ok(model.clone())).is_ok() {
                    Scheduler::new(backend, model, context, &options, thread_shared).run(inbox);
                }
            })
            .map_err(|e| Error::Bundle(format!("starting the engine thread: {e}")))?;
        let model = match ready_rx.recv() {
            Ok(result) => result?,
            Err(_) => return Err(Error::EngineStopped),
        };
        Ok(Engine {
            commands,
            model,
            max_batch,
            max_waiting,
            kv_budget,
            shared,
            constraints: OnceLock::new(),
            thread: Mutex::new(Some(thread)),
        })
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

    /// The KV budget in bytes ([`EngineOptions::kv_budget`]).
    pub fn kv_budget(&self) -> Option<u64> {
        self.kv_budget
    }

    /// Queues a request; its events arrive on the returned stream. Refused
    /// at once with [`Error::InvalidParameter`] (`prompt`) when a prompt
    /// token is outside the model's vocabulary, with [`Error::KvBudget`]
    /// when its KV cache could never fit the budget, and with
    /// [`Error::QueueFull`] when `max_waiting` requests already wait (other
    /// problems with a request arrive as its stream's `Failed`).
    pub fn submit(&self, request: Request) -> Result<Generating> {
        check_prompt_tokens(&request.prompt, self.model.config.vocab_size)?;
        if let Some(budget) = self.kv_budget {
            let tokens = request.prompt.len().saturating_add(request.options.max_tokens).min(self.model.context);
            let needed = self.model.kv_bytes_for(tokens);
            if needed > budget {
                return Err(Error::KvBudget { tokens, needed, budget });
            }
        }
        let waiting = self.shared.waiting.fetch_add(1, Ordering::SeqCst);
        if waiting >= self.max_waiting {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::QueueFull { waiting });
        }
        let constraint = match &request.options.grammar {
            Some(grammar) => Some(Box::new(self.constraint_compiler()?.compile(grammar)?)),
            None => None,
        };
        let (events, receiver) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job { request, constraint, events, cancel: cancel.clone() };
        if self.commands.send(Command::Generate(Box::new(job))).is_err() {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::EngineStopped);
        }
        Ok(Generating { events: receiver, cancel: Canceller(cancel) })
    }

    /// Checks that `grammar` compiles for this model (the error it would
    /// be refused with at [`Engine::submit`]), without submitting anything:
    /// what a caller uses to name the part of a request at fault.
    pub fn check_grammar(&self, grammar: &Grammar) -> Result<()> {
        self.constraint_compiler()?.compile(grammar).map(drop)
    }

    /// Builds the model's grammar compiler now rather than at the first
    /// constrained request (a server calls it once loaded); the error a
    /// constrained request would get when it cannot be built.
    pub fn prepare_grammars(&self) -> Result<()> {
        self.constraint_compiler().map(drop)
    }

    /// The model's grammar compiler, built on first use.
    fn constraint_compiler(&self) -> Result<&ConstraintCompiler> {
        self.constraints
            .get_or_init(|| {
                ConstraintCompiler::new(&self.model.tokenizer, self.model.config.vocab_size).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Config(e.clone()))
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
