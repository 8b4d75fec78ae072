//! Generation in two layers, as mlx-lm separates `generate_step` from
//! `stream_generate`:
//!
//! - tokens: [`SequenceState`] turns one sequence's logits into its next token
//!   (sampling, end tokens, the token budget), and [`TokenGenerator`] drives
//!   it over a backend for one sequence, as an iterator of tokens;
//! - text: [`TextStream`] turns tokens into text deltas (streaming
//!   detokenization that never splits a character, and stop strings that are
//!   held back until they can no longer match).
//!
//! [`generate`] puts the two together for one prompt; the engine
//! ([`crate::engine`]) drives many sequences at once with the same parts.

use std::time::{Duration, Instant};

use crate::backend::{Backend, Logits, SeqId};
use crate::constraint::{Constraint, Grammar};
use crate::error::{Error, Result};
use crate::sampler::{Sampled, Sampler, SamplingParams};
use crate::tokenizer::{Detokenizer, Tokenizer};

/// What to generate and when to stop.
#[derive(Clone, Debug)]
pub struct GenerationOptions {
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// Text that ends generation; it is not part of the output.
    pub stop_strings: Vec<String>,
    /// Token ids that end generation, besides the tokenizer's end tokens.
    pub stop_tokens: Vec<u32>,
    /// Keep going past end tokens (benchmarks).
    pub ignore_eos: bool,
    /// How many of the most likely alternatives to report with each token
    /// (0: none; at most [`MAX_TOP_LOGPROBS`]).
    pub top_logprobs: usize,
    /// A grammar the output must match, enforced token by token
    /// ([`crate::constraint`]); generation stops when it is complete.
    pub grammar: Option<Grammar>,
}

/// The most alternatives a token reports ([`GenerationOptions::top_logprobs`]),
/// as OpenAI's API allows.
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for GenerationOptions {
    fn default() -> Self {
        GenerationOptions {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            stop_tokens: Vec::new(),
            ignore_eos: false,
            top_logprobs: 0,
            grammar: None,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end token or a stop string.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
    /// The caller asked to stop.
    Cancelled,
}

/// Counts and timings of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    /// Prompt tokens (cached ones included).
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV state came from the prefix cache instead of
    /// being prefilled.
    pub cached_tokens: usize,
    /// Tokens generated (the end token included when there was one).
    pub generated_tokens: usize,
    /// Time from the start to the first generated token.
    pub time_to_first_token: Duration,
    /// Time spent in prefill.
    pub prefill_time: Duration,
    /// Time from the first to the last generated token.
    pub decode_time: Duration,
}

impl GenerationStats {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second after the first.
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// One sampled token and whether generation ends with it.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenStep {
    /// The token and its log-probability.
    pub sampled: Sampled,
    /// The most likely tokens at this step with their log-probabilities,
    /// most likely first ([`GenerationOptions::top_logprobs`] of them).
    pub top_logprobs: Vec<(u32, f32)>,
    /// `Some` when this token ends the generation: an end token or the
    /// grammar complete (`Stop`), the budget or the context reached (`Length`).
    pub finish: Option<FinishReason>,
    /// The token is an end token: it has no text of its own.
    pub end_token: bool,
}

/// The `k` most likely tokens of `logits` with their log-probabilities,
/// most likely first (ties: lower id first), given the logits'
/// log-normaliser `log_z` (the sampler's, [`Sampled::log_z`], so the
/// alternatives and the chosen token's logprob come from one normalisation).
/// NaN logits count as impossible.
pub fn top_logprobs(logits: &[f32], k: usize, log_z: f32) -> Vec<(u32, f32)> {
    if k == 0 || !log_z.is_finite() {
        return Vec::new();
    }
    let mut cands: Vec<(u32, f32)> =
        logits.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l - log_z)).collect();
    let by_prob_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k < cands.len() {
        cands.select_nth_unstable_by(k - 1, by_prob_desc);
        cands.truncate(k);
    }
    cands.sort_unstable_by(by_prob_desc);
    cands
}

/// Refuses a prompt with a token the model has no embedding row for: the
/// embedding lookup does not check its indices, so such a token would read
/// outside the table (garbage or a crash) instead of failing. Every prompt
/// reaches the backend through here, whoever tokenized it (the bundle's
/// tokenizer, a client's token ids).
pub fn check_prompt_tokens(prompt: &[u32], vocab_size: usize) -> Result<()> {
    match prompt.iter().position(|&t| t as usize >= vocab_size) {
        None => Ok(()),
        Some(i) => Err(Error::InvalidParameter {
            name: "prompt",
            message: format!(
                "token {} at position {i} is not in the model's vocabulary of {vocab_size} tokens",
                prompt[i]
            ),
        }),
    }
}

/// The token-level state of one sequence being generated: its sampler, the
/// tokens so far (for penalties), its end tokens and budget, and its timings.
pub struct SequenceState {
    sampler: Sampler,
    constraint: Option<Constraint>,
    history: Vec<u32>,
    prompt_tokens: usize,
    end_tokens: Vec<u32>,
    max_tokens: usize,
    top_logprobs: usize,
    context: usize,
    generated: usize,
    cached_tokens: usize,
    start: Instant,
    prefill_done: Option<Instant>,
    first_token: Option<Instant>,
}

impl SequenceState {
    /// The state of a generation continuing `prompt` under `options`, for a
    /// model of `context` positions whose tokenizer ends generation with
    /// `eos_ids`. Refuses an empty prompt and one that fills the context.
    pub fn new(prompt: &[u32], options: &GenerationOptions, eos_ids: &[u32], context: usize) -> Result<SequenceState> {
        if prompt.is_empty() {
            return Err(Error::InvalidParameter { name: "prompt", message: "is empty".into() });
        }
        if options.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(Error::InvalidParameter {
                name: "top_logprobs",
                message: format!("must be at most {MAX_TOP_LOGPROBS}, got {}", options.top_logprobs),
            });
        }
        if prompt.len() >= context {
            return Err(Error::ContextOverflow { prompt: prompt.len(), requested: options.max_tokens, context });
        }
        let end_tokens =
            if options.ignore_eos { Vec::new() } else { eos_ids.iter().chain(&options.stop_tokens).copied().collect() };
        Ok(SequenceState {
            sampler: Sampler::new(options.sampling.clone())?,
            constraint: None,
            history: prompt.to_vec(),
            prompt_tokens: prompt.len(),
            end_tokens,
            max_tokens: options.max_tokens,
            top_logprobs: options.top_logprobs,
            context,
            generated: 0,
            cached_tokens: 0,
            start: Instant::now(),
            prefill_done: None,
            first_token: None,
        })
    }

    /// Enforces `constraint` (compiled from [`GenerationOptions::grammar`])
    /// on every token from now on.
    pub fn constrain(&mut self, constraint: Constraint) {
        self.constraint = Some(constraint);
    }

    /// The grammar this sequence follows, if any.
    pub fn constraint_mut(&mut self) -> Option<&mut Constraint> {
        self.constraint.as_mut()
    }

    /// Marks the end of prefill (the first logits are about to be sampled).
    pub fn prefill_finished(&mut self) {
        self.prefill_done.get_or_insert_with(Instant::now);
    }

    /// Records that the first `tokens` of the prompt came from the prefix cache.
    pub fn set_cached_tokens(&mut self, tokens: usize) {
        self.cached_tokens = tokens;
    }

    /// The tokens so far: the prompt, then every generated token.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Whether the budget allows no token at all (`max_tokens` 0).
    pub fn is_exhausted(&self) -> bool {
        self.generated >= self.max_tokens
    }

    /// Samples the next token from `logits` (which sampling may modify).
    pub fn accept(&mut self, logits: &mut [f32]) -> Result<TokenStep> {
        if let Some(c) = &mut self.constraint {
            c.mask(logits)?;
        }
        let sampled = self.sampler.sample(logits, &self.history)?;
        if let Some(c) = &mut self.constraint {
            c.commit(sampled.token)?;
        }
        // The sampler left the penalised logits in place and returns their
        // normaliser: the alternatives come from the same distribution as
        // `sampled.logprob`, normalised once.
        let top_logprobs = top_logprobs(logits, self.top_logprobs, sampled.log_z);
        self.prefill_finished();
        self.first_token.get_or_insert_with(Instant::now);
        self.generated += 1;
        self.history.push(sampled.token);
        let end_token = self.end_tokens.contains(&sampled.token);
        let finish = if end_token || self.constraint.as_ref().is_some_and(Constraint::is_complete) {
            Some(FinishReason::Stop)
        } else if self.generated >= self.max_tokens || self.history.len() >= self.context {
            Some(FinishReason::Length)
        } else {
            None
        };
        Ok(TokenStep { sampled, top_logprobs, finish, end_token })
    }

    /// Counts and timings so far.
    pub fn stats(&self) -> GenerationStats {
        let now = Instant::now();
        let prefill_end = self.prefill_done.unwrap_or(now);
        GenerationStats {
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            generated_tokens: self.generated,
            time_to_first_token: self.first_token.map_or(Duration::ZERO, |t| t - self.start),
            prefill_time: prefill_end - self.start,
            decode_time: self.first_token.map_or(Duration::ZERO, |t| now - t),
        }
    }
}

/// Generates one sequence's tokens on a backend: the prompt minus its last
/// token fills the cache, the last token goes through the same single-token
/// step as every decode (as mlx-lm does), then each sampled token is fed
/// back. Yields tokens until an end token, the budget or the context; the
/// sequence is released when the generator is dropped.
pub struct TokenGenerator<'a> {
    backend: &'a mut dyn Backend,
    seq: SeqId,
    state: SequenceState,
    /// The token the next step feeds (the prompt's last, then each sampled one).
    next_input: Option<u32>,
    finish: Option<FinishReason>,
}

impl<'a> TokenGenerator<'a> {
    /// Prefills `prompt` on a new sequence of `backend`.
    pub fn new(
        backend: &'a mut dyn Backend,
        prompt: &[u32],
        options: &GenerationOptions,
        eos_ids: &[u32],
    ) -> Result<TokenGenerator<'a>> {
        let state = SequenceState::new(prompt, options, eos_ids, backend.context_length())?;
        check_prompt_tokens(prompt, backend.vocab_size())?;
        let seq = backend.new_sequence();
        let (head, last) = prompt.split_at(prompt.len() - 1);
        if !head.is_empty()
            && let Err(e) = backend.prefill(seq, head, false)
        {
            backend.release_sequence(seq);
            return Err(e);
        }
        let finish = state.is_exhausted().then_some(FinishReason::Length);
        Ok(TokenGenerator { backend, seq, state, next_input: Some(last[0]), finish })
    }

    /// Why generation ended, once it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Counts and timings so far.
    pub fn stats(&self) -> GenerationStats {
        self.state.stats()
    }

    fn step(&mut self) -> Result<Option<TokenStep>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        let Some(input) = self.next_input.take() else { return Ok(None) };
        let mut logits: Logits =
            self.backend.decode(&[(self.seq, input)])?.into_first().ok_or_else(|| Error::Config("no logits".into()))?;
        let step = self.state.accept(&mut logits)?;
        self.finish = step.finish;
        self.next_input = Some(step.sampled.token);
        Ok(Some(step))
    }
}

impl Iterator for TokenGenerator<'_> {
    type Item = Result<TokenStep>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(step) => step.map(Ok),
            Err(e) => {
                self.finish = Some(FinishReason::Stop);
                Some(Err(e))
            }
        }
    }
}

impl Drop for TokenGenerator<'_> {
    fn drop(&mut self) {
        self.backend.release_sequence(self.seq);
    }
}

/// Holds back text that might be the start of a stop string.
struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    /// Adds `piece`; returns the text safe to emit and whether a stop string completed.
    fn push(&mut self, piece: &str) -> (String, bool) {
        self.pending.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest tail that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let tail = &self.pending[i..];
                if s.starts_with(tail) {
                    keep = keep.max(tail.len());
                    break;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// What one token added to the text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextDelta {
    /// Text safe to show now (may be empty: an incomplete character, or text
    /// that could still become a stop string, is held back).
    pub text: String,
    /// A stop string completed: generation ends, and `text` stops before it.
    pub stopped: bool,
}

/// Turns generated tokens into text: streaming detokenization and stop strings.
pub struct TextStream {
    detokenizer: Detokenizer,
    stops: StopMatcher,
    stopped: bool,
}

impl TextStream {
    /// A stream that ends at the first of `stop_strings` (empty ones are ignored).
    pub fn new(stop_strings: &[String]) -> TextStream {
        TextStream {
            detokenizer: Detokenizer::new(),
            stops: StopMatcher {
                stops: stop_strings.iter().filter(|s| !s.is_empty()).cloned().collect(),
                pending: String::new(),
            },
            stopped: false,
        }
    }

    /// Adds a generated token (not an end token: those have no text).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<TextDelta> {
        if self.stopped {
            return Ok(TextDelta { text: String::new(), stopped: true });
        }
        let Some(piece) = self.detokenizer.push(tokenizer, token)? else { return Ok(TextDelta::default()) };
        let (text, stopped) = self.stops.push(&piece);
        self.stopped = stopped;
        Ok(TextDelta { text, stopped })
    }

    /// The text held back, once generation has ended without a stop string:
    /// an incomplete character at the very end, and text that could still
    /// have become a stop string (`stopped` when the flushed bytes complete one).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<TextDelta> {
        if self.stopped {
            return Ok(TextDelta { text: String::new(), stopped: true });
        }
        let mut text = String::new();
        if let Some(rest) = self.detokenizer.flush(tokenizer)? {
            let (out, stopped) = self.stops.push(&rest);
            text.push_str(&out);
            if stopped {
                self.stopped = true;
                return Ok(TextDelta { text, stopped: true });
            }
        }
        text.push_str(&self.stops.flush());
        Ok(TextDelta { text, stopped: false })
    }
}

/// The result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// The generated text (stop strings and end tokens excluded).
    pub text: String,
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// Each generated token's log-probability.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Counts and timings.
    pub stats: GenerationStats,
}

/// Generates a continuation of `prompt` on a fresh sequence of `backend`,
/// calling `on_text` with each new piece of text; `on_text` returning
/// `ControlFlow::Break` cancels.
pub fn generate(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerationOptions,
    on_text: &mut dyn FnMut(&str) -> std::ops::ControlFlow<()>,
) -> Result<Generation> {
    let mut tokens = TokenGenerator::new(backend, prompt, options, tokenizer.eos_ids())?;
    let mut stream = TextStream::new(&options.stop_strings);
    let (mut text, mut ids, mut logprobs) = (String::new(), Vec::new(), Vec::new());
    let mut emit = |piece: &str, text: &mut String| -> bool {
        text.push_str(piece);
        !piece.is_empty() && on_text(piece).is_break()
    };
    let mut finish = FinishReason::Length;
    while let Some(step) = tokens.next().transpose()? {
        ids.push(step.sampled.token);
        logprobs.push(step.sampled.logprob);
        if step.end_token {
            // An end token: no text of its own.
            finish = FinishReason::Stop;
            break;
        }
        let delta = stream.push(tokenizer, step.sampled.token)?;
        if emit(&delta.text, &mut text) {
            finish = FinishReason::Cancelled;
            break;
        }
        if delta.stopped {
            finish = FinishReason::Stop;
            break;
        }
        if let Some(f) = step.finish {
            finish = f;
            break;
        }
    }
    if finish != FinishReason::Cancelled {
        let tail = stream.finish(tokenizer)?;
        if tail.stopped {
            finish = FinishReason::Stop;
        }
        emit(&tail.text, &mut text);
    }
    let stats = tokens.stats();
    Ok(Generation { text, tokens: ids, logprobs, finish_reason: finish, stats })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher { stops: stops.iter().map(|s| s.to_string()).collect(), pending: String::new() }
    }

    #[test]
    fn prompt_tokens_outside_the_vocabulary_are_refused() {
        assert!(check_prompt_tokens(&[0, 9], 10).is_ok());
        let err = check_prompt_tokens(&[0, 10, 3], 10).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid parameter prompt: token 10 at position 1 is not in the model's vocabulary of 10 tokens"
        );
    }

    #[test]
    fn stop_strings_are_held_back_until_they_cannot_match() {
        let mut m = matcher(&["</s>"]);
        assert_eq!(m.push("Hello <"), ("Hello ".to_string(), false));
        assert_eq!(m.push("/"), (String::new(), false));
        assert_eq!(m.push("x"), ("</x".to_string(), false));
        assert_eq!(m.push(" done </s> more"), (" done ".to_string(), true));
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("the EN"), ("the ".to_string(), false));
        assert_eq!(m.flush(), "EN");
    }

    #[test]
    fn top_logprobs_are_the_most_likely_tokens_normalised() {
        // Through the sampler, as `SequenceState::accept` does: it makes the
        // NaN impossible and returns the normaliser.
        let mut logits = [0.0f32, 2.0, f32::NAN, 1.0, 2.0];
        let mut sampler = Sampler::new(SamplingParams { temperature: 0.0, ..SamplingParams::default() }).unwrap();
        let sampled = sampler.sample(&mut logits, &[]).unwrap();
        let top = top_logprobs(&logits, 3, sampled.log_z);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 4, 3]);
        assert_eq!((sampled.token, sampled.logprob), top[0]);
        let z: f32 = [0.0f32, 2.0, 1.0, 2.0].iter().map(|l| l.exp()).sum::<f32>().ln();
        assert!((top[0].1 - (2.0 - z)).abs() < 1e-6 && (top[2].1 - (1.0 - z)).abs() < 1e-6);
        // The sampler made the NaN -inf: impossible, listed last.
        let all = top_logprobs(&logits, 10, sampled.log_z);
        assert_eq!(all.len(), 5);
        assert_eq!(all[4], (2, f32::NEG_INFINITY));
        assert!(top_logprobs(&logits, 0, sampled.log_z).is_empty());
        // NaN logits are impossible, not poison.
        assert_eq!(top_logprobs(&[f32::NAN, 1.0], 5, 1.0), vec![(1, 0.0)]);
    }
}
