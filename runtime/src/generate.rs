//! The generation loop: prefill a prompt, then sample and decode token by
//! token, streaming text, until an end token, a stop string or the token
//! budget.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::backend::{Backend, SeqId};
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
}

impl Default for GenerationOptions {
    fn default() -> Self {
        GenerationOptions {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            stop_tokens: Vec::new(),
            ignore_eos: false,
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
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
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

/// Generates a continuation of `prompt` on a fresh sequence of `backend`,
/// calling `on_text` with each new piece of text; `on_text` returning
/// `ControlFlow::Break` cancels.
pub fn generate(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerationOptions,
    on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
) -> Result<Generation> {
    let seq = backend.new_sequence();
    let result = generate_on(backend, seq, tokenizer, prompt, options, on_text);
    backend.release_sequence(seq);
    result
}

fn generate_on(
    backend: &mut dyn Backend,
    seq: SeqId,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerationOptions,
    on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::InvalidParameter { name: "prompt", message: "is empty".into() });
    }
    let context = backend.context_length();
    if prompt.len() >= context {
        return Err(Error::ContextOverflow { prompt: prompt.len(), requested: options.max_tokens, context });
    }
    let mut sampler = Sampler::new(options.sampling.clone())?;
    let start = Instant::now();
    // Like mlx-lm: the prompt minus its last token fills the cache, the last
    // token goes through the same single-token step as every decode.
    let (head, last) = prompt.split_at(prompt.len() - 1);
    if !head.is_empty() {
        backend.prefill(seq, head, false)?;
    }
    let mut logits = backend.decode(&[(seq, last[0])])?.pop().ok_or_else(|| Error::Config("no logits".into()))?;
    let prefill_time = start.elapsed();

    let mut history: Vec<u32> = prompt.to_vec();
    let mut stops = StopMatcher {
        stops: options.stop_strings.iter().filter(|s| !s.is_empty()).cloned().collect(),
        pending: String::new(),
    };
    let mut detok = Detokenizer::new();
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut logprobs = Vec::new();
    let mut first_token_at = None;
    let end_tokens: Vec<u32> =
        tokenizer.eos_ids().iter().chain(&options.stop_tokens).copied().filter(|_| !options.ignore_eos).collect();
    let mut emit = |piece: &str, text: &mut String| -> bool {
        text.push_str(piece);
        !piece.is_empty() && on_text(piece).is_break()
    };
    // `stopped_on_text`: a stop string ended it and the text is already cut.
    let (mut finish, stopped_on_text) = loop {
        if tokens.len() >= options.max_tokens {
            break (FinishReason::Length, false);
        }
        let Sampled { token, logprob } = sampler.sample(&mut logits, &history)?;
        first_token_at.get_or_insert_with(Instant::now);
        tokens.push(token);
        logprobs.push(logprob);
        history.push(token);
        if end_tokens.contains(&token) {
            break (FinishReason::Stop, false);
        }
        if let Some(piece) = detok.push(tokenizer, token)? {
            let (out, stopped) = stops.push(&piece);
            if emit(&out, &mut text) {
                break (FinishReason::Cancelled, false);
            }
            if stopped {
                break (FinishReason::Stop, true);
            }
        }
        if tokens.len() >= options.max_tokens || backend.position(seq)? + 1 >= context {
            break (FinishReason::Length, false);
        }
        logits = backend.decode(&[(seq, token)])?.pop().ok_or_else(|| Error::Config("no logits".into()))?;
    };
    if finish != FinishReason::Cancelled && !stopped_on_text {
        // Whatever was held back: an incomplete character at the very end, and
        // text that could still have become a stop string.
        let mut tail = String::new();
        if let Some(rest) = detok.flush(tokenizer)? {
            let (out, stopped) = stops.push(&rest);
            tail.push_str(&out);
            if stopped {
                finish = FinishReason::Stop;
            }
        }
        tail.push_str(&stops.flush());
        emit(&tail, &mut text);
    }
    let now = Instant::now();
    let stats = GenerationStats {
        prompt_tokens: prompt.len(),
        generated_tokens: tokens.len(),
        time_to_first_token: first_token_at.map_or(Duration::ZERO, |t| t - start),
        prefill_time,
        decode_time: first_token_at.map_or(Duration::ZERO, |t| now - t),
    };
    Ok(Generation { text, tokens, logprobs, finish_reason: finish, stats })
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    #[test]
    fn stop_strings_hold_back_prefixes_and_cut_matches() {
        let mut m = StopMatcher { stops: vec!["</s>".into(), "STOP".into()], pending: String::new() };
        assert_eq!(m.push("Hello <"), ("Hello ".to_string(), false));
        assert_eq!(m.push("/"), (String::new(), false));
        assert_eq!(m.push("x> world ST"), ("</x> world ".to_string(), false));
        assert_eq!(m.push("OP and more"), (String::new(), true));
        let mut m = StopMatcher { stops: vec!["ab".into()], pending: String::new() };
        assert_eq!(m.push("é a"), ("é ".to_string(), false));
        assert_eq!(m.flush(), "a");
    }
}
