//! The engine thread's loop: admission (queue, KV budget, prefix cache),
//! chunked prefill and one batched decode step per iteration.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};

use super::prefix_cache::PrefixCache;
use super::{Command, EngineOptions, EngineStats, Event, Job, MaskTiming, ModelInfo, PrefixReuse, Request, Shared};
use crate::backend::{Backend, SeqId};
use crate::constraint::Constraint;
use crate::error::{Error, Result};
use crate::generate::{FinishReason, SequenceState, TextStream};

/// One admitted sequence: prefilling its prompt, then decoding.
struct Running {
    seq: SeqId,
    state: SequenceState,
    text: TextStream,
    /// The prompt (all of it: the last token goes through the first decode step).
    prompt: Vec<u32>,
    /// Prompt positions in the cache (prefilled, or taken from the prefix
    /// cache); always a multiple of the prefill chunk until the last chunk.
    fed: usize,
    /// The token the next decode step feeds (the prompt's last, then each sampled one).
    next_input: u32,
    /// KV bytes held for it against the budget.
    reserved: u64,
    events: Sender<Event>,
    cancel: Arc<AtomicBool>,
}

impl Running {
    /// Whether all of the prompt but its last token is in the cache.
    fn prefilled(&self) -> bool {
        self.fed + 1 >= self.prompt.len()
    }
}

/// The engine thread's state.
pub(super) struct Scheduler {
    backend: Box<dyn Backend>,
    model: Arc<ModelInfo>,
    max_batch: usize,
    /// The most tokens a sequence may hold.
    context: usize,
    /// Prompt tokens prefilled per iteration; chunks start at its multiples.
    prefill_chunk: usize,
    /// Which cached positions a request may reuse.
    prefix_reuse: PrefixReuse,
    /// Reused prefixes are multiples of this (the chunk when exact, else 1).
    reuse_unit: usize,
    /// Bytes of KV the running sequences and the prefix cache may hold together.
    kv_budget: Option<u64>,
    /// When the grammars' masks are computed (never `Auto`).
    mask_timing: MaskTiming,
    shared: Arc<Shared>,
    waiting: VecDeque<Box<Job>>,
    /// Admitted sequences still prefilling, oldest first.
    prefilling: VecDeque<Running>,
    /// Sequences decoding.
    running: Vec<Running>,
    pool: PrefixCache,
    /// The counters of [`EngineStats`] the scheduler keeps.
    counters: EngineStats,
}

/// What admission decided for the request at the head of the queue.
enum Admission {
    /// Admitted (or ended at once: failed, cancelled, nothing to generate).
    Done(Option<Box<Running>>),
    /// Its KV cache does not fit yet: it stays first in the queue.
    Wait(Box<Job>),
}

impl Scheduler {
    /// The loop over `backend`, for sequences of at most `context` tokens.
    pub fn new(
        backend: Box<dyn Backend>,
        model: Arc<ModelInfo>,
        context: usize,
        options: &EngineOptions,
        shared: Arc<Shared>,
    ) -> Scheduler {
        Scheduler {
            backend,
            model,
            max_batch: options.max_batch,
            context,
            prefill_chunk: options.prefill_chunk,
            reuse_unit: match options.prefix_reuse {
                PrefixReuse::Exact => options.prefill_chunk,
                PrefixReuse::Longest => 1,
            },
            prefix_reuse: options.prefix_reuse,
            kv_budget: options.kv_budget,
            mask_timing: options.mask_timing.resolve(),
            shared,
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            running: Vec::new(),
            pool: PrefixCache::new(options.prefix_cache),
            counters: EngineStats::default(),
        }
    }

    pub fn run(mut self, inbox: Receiver<Command>) {
        let mut shutting_down = false;
        loop {
            // Idle: wait for work (or for every handle to go).
            if self.running.is_empty() && self.prefilling.is_empty() && self.waiting.is_empty() {
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
                for r in self.running.iter().chain(&self.prefilling) {
                    r.cancel.store(true, Ordering::SeqCst);
                }
            }
            self.admit_waiting();
            self.end_cancelled();
            self.prefill_one_chunk();
            self.step();
            self.fit_pool();
            self.publish();
        }
    }

    /// Queues a command's job; true for a shutdown.
    fn take(&mut self, command: Command) -> bool {
        match command {
            Command::Generate(job) => {
                self.waiting.push_back(job);
                false
            }
            Command::Shutdown => true,
        }
    }

    /// Admits queued requests in order while there are slots and their KV
    /// caches fit; the first that does not fit waits, and so do those behind
    /// it (no overtaking: a large request is not starved by small ones).
    fn admit_waiting(&mut self) {
        // Cancelled requests leave the queue at once, wherever they are in
        // it (one may wait behind a request the KV budget holds back).
        let before = self.waiting.len();
        self.waiting.retain(|job| {
            let cancelled = job.cancel.load(Ordering::SeqCst);
            if cancelled {
                let done = Event::Done { finish_reason: FinishReason::Cancelled, stats: Default::default() };
                let _ = job.events.send(done);
            }
            !cancelled
        });
        self.shared.waiting.fetch_sub(before - self.waiting.len(), Ordering::SeqCst);
        while self.running.len() + self.prefilling.len() < self.max_batch
            && let Some(job) = self.waiting.pop_front()
        {
            match self.admit(job) {
                Admission::Done(r) => {
                    self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
                    self.prefilling.extend(r.map(|r| *r));
                }
                Admission::Wait(job) => {
                    self.waiting.push_front(job);
                    break;
                }
            }
        }
    }

    /// KV bytes reserved by the admitted sequences.
    fn reserved(&self) -> u64 {
        self.running.iter().chain(&self.prefilling).map(|r| r.reserved).sum()
    }

    /// Starts a request: checks it, reserves its KV bytes, and gives it a
    /// sequence (a prefix cache entry's when one shares a whole chunk with
    /// its prompt, else a new one). Its prompt is prefilled a chunk per
    /// iteration ([`Scheduler::prefill_one_chunk`]).
    fn admit(&mut self, mut job: Box<Job>) -> Admission {
        if job.cancel.load(Ordering::SeqCst) {
            let _ = job.events.send(Event::Done { finish_reason: FinishReason::Cancelled, stats: Default::default() });
            return Admission::Done(None);
        }
        let Request { prompt, options } = &job.request;
        // The prompt's tokens were checked against the vocabulary at
        // `Engine::submit`.
        let state = SequenceState::new(prompt, options, self.model.tokenizer.eos_ids(), self.context);
        let mut state = match state {
            Ok(s) => s,
            Err(e) => {
                let _ = job.events.send(Event::Failed(e));
                return Admission::Done(None);
            }
        };
        if let Some(constraint) = job.constraint.take() {
            state.constrain(*constraint);
        }
        if state.is_exhausted() {
            state.prefill_finished();
            let _ = job.events.send(Event::Done { finish_reason: FinishReason::Length, stats: state.stats() });
            return Admission::Done(None);
        }
        let tokens = prompt.len().saturating_add(options.max_tokens).min(self.context);
        let need = self.model.kv.bytes_for(tokens);
        let mut hit = if self.pool.enabled() {
            let backend = &self.backend;
            self.pool.best(prompt, self.reuse_unit, |s, len| backend.can_truncate(s, len).unwrap_or(false))
        } else {
            None
        };
        if let Some(budget) = self.kv_budget {
            if need > budget {
                let _ = job.events.send(Event::Failed(Error::KvBudget { tokens, needed: need, budget }));
                return Admission::Done(None);
            }
            // An entry's buffers may be larger than a new sequence's would be.
            let reserved = self.reserved();
            let take = |hit: Option<(SeqId, usize)>, pool: &PrefixCache| {
                hit.and_then(|(s, _)| pool.bytes_of(s)).map_or(need, |b| b.max(need))
            };
            if hit.is_some() && reserved + take(hit, &self.pool) > budget {
                hit = None;
            }
            if reserved + take(hit, &self.pool) > budget {
                return Admission::Wait(job);
            }
            // It fits once enough other entries go: the pool gives way to requests.
            let keep = hit.map(|(s, _)| s);
            while reserved + self.pool.bytes() - keep.and_then(|s| self.pool.bytes_of(s)).unwrap_or(0)
                + take(hit, &self.pool)
                > budget
            {
                match self.pool.evict_lru_except(keep) {
                    Some(s) => self.backend.release_sequence(s),
                    None => break,
                }
            }
        }
        let (seq, cached) = match hit.and_then(|(s, len)| self.pool.take(s).map(|e| (e, len))) {
            Some((entry, len)) => match self.backend.truncate(entry.seq, len) {
                Ok(()) => (entry.seq, len),
                Err(_) => {
                    // `best` checked it can be cut; should it not, start afresh.
                    self.backend.release_sequence(entry.seq);
                    (self.backend.new_sequence(), 0)
                }
            },
            None => (self.backend.new_sequence(), 0),
        };
        if self.pool.enabled() {
            if cached > 0 {
                self.counters.prefix_cache_hits += 1;
                self.counters.prefix_cache_tokens += cached as u64;
            } else {
                self.counters.prefix_cache_misses += 1;
            }
        }
        state.set_cached_tokens(cached);
        let reserved = need.max(self.backend.cache_bytes(seq).unwrap_or(0) as u64);
        let Job { request, events, cancel, .. } = *job;
        let text = TextStream::new(&request.options.stop_strings);
        let prompt = request.prompt;
        let next_input = prompt[prompt.len() - 1];
        Admission::Done(Some(Box::new(Running {
            seq,
            state,
            text,
            prompt,
            fed: cached,
            next_input,
            reserved,
            events,
            cancel,
        })))
    }

    /// Ends the cancelled sequences, prefilling or decoding, before any
    /// more work is spent on them.
    fn end_cancelled(&mut self) {
        let cancelled = |r: &Running| r.cancel.load(Ordering::SeqCst);
        let (stopped, prefilling): (Vec<Running>, Vec<Running>) =
            std::mem::take(&mut self.prefilling).into_iter().partition(cancelled);
        self.prefilling = prefilling.into();
        let (mut stopped2, running): (Vec<Running>, Vec<Running>) =
            std::mem::take(&mut self.running).into_iter().partition(cancelled);
        self.running = running;
        for r in stopped.into_iter().chain(stopped2.drain(..)) {
            self.finish(r, FinishReason::Cancelled);
        }
    }

    /// Prefills the next chunk of the oldest prefilling sequence (positions
    /// `fed..` up to the next multiple of the chunk size, or the prompt's
    /// last token, exclusive); a sequence whose prompt is in moves to the
    /// decoding ones.
    fn prefill_one_chunk(&mut self) {
        let Some(mut r) = self.prefilling.pop_front() else { return };
        if !r.prefilled() {
            let end = ((r.fed / self.prefill_chunk + 1) * self.prefill_chunk).min(r.prompt.len() - 1);
            if let Err(e) = self.backend.prefill(r.seq, &r.prompt[r.fed..end], false) {
                self.backend.release_sequence(r.seq);
                let _ = r.events.send(Event::Failed(e));
                return;
            }
            r.fed = end;
        }
        if r.prefilled() {
            self.running.push(r);
        } else {
            self.prefilling.push_front(r);
        }
    }

    /// One decode step of every sequence whose prompt is in, as one batch.
    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        let batch: Vec<(SeqId, u32)> = self.running.iter().map(|r| (r.seq, r.next_input)).collect();
        self.counters.decode_steps += 1;
        // The grammars' masks for the tokens this step samples: on a worker
        // thread while the forward pass runs, or after it (MaskTiming).
        let backend = &mut self.backend;
        let mut constrained: Vec<&mut Constraint> =
            self.running.iter_mut().filter_map(|r| r.state.constraint_mut()).collect();
        let decoded = if constrained.is_empty() {
            backend.decode(&batch)
        } else if self.mask_timing == MaskTiming::Overlapped {
            std::thread::scope(|s| {
                s.spawn(|| constrained.iter_mut().for_each(|c| c.prepare()));
                backend.decode(&batch)
            })
        } else {
            let decoded = backend.decode(&batch);
            constrained.iter_mut().for_each(|c| c.prepare());
            decoded
        };
        let mut logits = match decoded {
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
        for (mut r, row) in running.into_iter().zip(logits.rows_mut()) {
            match self.advance(&mut r, row) {
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
        let (text, finish) = if step.end_token {
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

    /// Ends a sequence: keeps its cache in the prefix cache (or releases
    /// it), sends what text was held back (unless cancelled), then `Done`.
    fn finish(&mut self, mut r: Running, mut reason: FinishReason) {
        self.retire(&r);
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

    /// Hands a finished sequence's caches to the prefix cache, with the
    /// tokens they hold (the history up to its position: the last sampled
    /// token never went through the model), or releases them.
    fn retire(&mut self, r: &Running) {
        let held = self.backend.position(r.seq).unwrap_or(0);
        if !self.pool.enabled() || held == 0 || held > r.state.history().len() {
            self.backend.release_sequence(r.seq);
            return;
        }
        let tokens = r.state.history()[..held].to_vec();
        let reusable = match self.prefix_reuse {
            // Whole chunks only (a sequence cancelled mid-prompt prefilled `fed`).
            PrefixReuse::Exact => r.fed.min(r.prompt.len() - 1) / self.prefill_chunk * self.prefill_chunk,
            PrefixReuse::Longest => held,
        };
        let bytes = self.backend.cache_bytes(r.seq).unwrap_or(0) as u64;
        for s in self.pool.insert(r.seq, tokens, reusable, bytes) {
            self.backend.release_sequence(s);
        }
    }

    /// Keeps the prefix cache within what the KV budget leaves once the
    /// admitted sequences' reservations are counted (entries are added while
    /// a step's sequences are being handled, so this runs after the step).
    fn fit_pool(&mut self) {
        let Some(budget) = self.kv_budget else { return };
        let reserved = self.reserved();
        while reserved + self.pool.bytes() > budget {
            match self.pool.evict_lru() {
                Some(s) => self.backend.release_sequence(s),
                None => break,
            }
        }
    }

    /// Publishes the figures of [`super::Engine::stats`].
    fn publish(&mut self) {
        let admitted = || self.running.iter().chain(&self.prefilling);
        let kv_bytes: u64 = admitted().map(|r| self.backend.cache_bytes(r.seq).unwrap_or(0) as u64).sum();
        let kv_tokens: u64 = admitted().map(|r| self.backend.position(r.seq).unwrap_or(0) as u64).sum();
        let stats = EngineStats {
            running: self.running.len() + self.prefilling.len(),
            waiting: 0,
            kv_bytes,
            kv_tokens,
            prefix_cache_bytes: self.pool.bytes(),
            prefix_cache_entries: self.pool.len(),
            ..self.counters.clone()
        };
        if let Ok(mut s) = self.shared.stats.lock() {
            *s = stats;
        }
    }
}
