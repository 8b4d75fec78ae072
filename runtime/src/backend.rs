//! The token-level seam every backend implements, and its MLX implementation.
//!
//! A backend owns a model and the KV caches of its sequences. The generation
//! loop (and later the server's scheduler) talks to it only in tokens and
//! logits: prefill a sequence's prompt, then decode one token per sequence per
//! step, for as many sequences as are running.

use std::collections::HashMap;

use mlxcel_mlx::{Array, Dtype, fast};

use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::models::LanguageModel;

/// Identifies one sequence (one conversation's KV state) within a backend.
pub type SeqId = u64;

/// Next-token logits over the vocabulary, on the host.
pub type Logits = Vec<f32>;

/// A backend: token-level access to one model.
pub trait Backend {
    /// Starts an empty sequence.
    fn new_sequence(&mut self) -> SeqId;
    /// Frees a sequence's KV cache.
    fn release_sequence(&mut self, seq: SeqId);
    /// Feeds `tokens` to `seq` (in chunks), returning the logits after the last
    /// one when `want_logits`.
    fn prefill(&mut self, seq: SeqId, tokens: &[u32], want_logits: bool) -> Result<Option<Logits>>;
    /// Feeds one token to each listed sequence and returns each one's logits,
    /// in the same order.
    fn decode(&mut self, batch: &[(SeqId, u32)]) -> Result<Vec<Logits>>;
    /// Tokens a sequence has consumed.
    fn position(&self, seq: SeqId) -> Result<usize>;
    /// Vocabulary size.
    fn vocab_size(&self) -> usize;
    /// The most tokens a sequence may hold.
    fn context_length(&self) -> usize;
}

/// Defaults of [`MlxBackend`].
#[derive(Clone, Debug)]
pub struct MlxOptions {
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
    /// Caps every layer's cache to this many positions (a sliding window).
    pub max_kv: Option<usize>,
}

impl Default for MlxOptions {
    fn default() -> Self {
        MlxOptions { prefill_chunk: 512, max_kv: None }
    }
}

/// The MLX backend: runs a [`LanguageModel`] on the thread that owns it.
pub struct MlxBackend {
    model: Box<dyn LanguageModel>,
    options: MlxOptions,
    sequences: HashMap<SeqId, Vec<KvCache>>,
    next_id: SeqId,
}

impl MlxBackend {
    /// A backend over `model`.
    pub fn new(model: Box<dyn LanguageModel>, options: MlxOptions) -> Result<MlxBackend> {
        if options.prefill_chunk == 0 {
            return Err(Error::InvalidParameter { name: "prefill_chunk", message: "must be at least 1".into() });
        }
        Ok(MlxBackend { model, options, sequences: HashMap::new(), next_id: 0 })
    }

    fn caches(&mut self, seq: SeqId) -> Result<&mut Vec<KvCache>> {
        self.sequences.get_mut(&seq).ok_or(Error::UnknownSequence(seq))
    }

    /// Runs `tokens` through the model for `seq`; returns the last position's
    /// logits when asked. The step's cache writes are evaluated with it so the
    /// lazy graph never spans more than one step.
    fn step(&mut self, seq: SeqId, tokens: &[u32], want_logits: bool) -> Result<Option<Logits>> {
        let input = Array::from_slice(tokens, &[1, tokens.len() as i32])?;
        let caches = self.sequences.get_mut(&seq).ok_or(Error::UnknownSequence(seq))?;
        let hidden = self.model.hidden_states(&input, caches)?;
        let mut outputs: Vec<&Array> = caches.iter().flat_map(KvCache::arrays).collect();
        let last = if want_logits {
            // Only the last position's logits are needed: project that row alone.
            let s = hidden.shape();
            let row = hidden.slice(&[0, s[1] - 1, 0], &[1, s[1], s[2]], &[1, 1, 1])?;
            // Left [1, 1, vocab]: `to_vec` reads it whole, and a reshape here
            // would be an MLX node that keeps the step off `fast::eval`'s
            // inline path.
            let logits = self.model.logits(&row)?;
            Some(if logits.dtype() == Dtype::F32 { logits } else { logits.astype(Dtype::F32)? })
        } else {
            None
        };
        if let Some(l) = &last {
            outputs.push(l);
        }
        // Inline when the step is all mlxcel kernels (the CPU path): no MLX
        // stream task per node.
        fast::eval(&outputs)?;
        Ok(match last {
            Some(l) => Some(l.to_vec::<f32>()?),
            None => None,
        })
    }
}

impl Backend for MlxBackend {
    fn new_sequence(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.sequences.insert(id, self.model.new_caches(self.options.max_kv));
        id
    }

    fn release_sequence(&mut self, seq: SeqId) {
        self.sequences.remove(&seq);
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32], want_logits: bool) -> Result<Option<Logits>> {
        let start = self.position(seq)?;
        let limit = self.context_length();
        if self.options.max_kv.is_none() && start + tokens.len() > limit {
            return Err(Error::ContextOverflow { prompt: start + tokens.len(), requested: 0, context: limit });
        }
        let chunk = self.options.prefill_chunk;
        let n_chunks = tokens.len().div_ceil(chunk);
        let mut out = None;
        for (i, part) in tokens.chunks(chunk).enumerate() {
            out = self.step(seq, part, want_logits && i + 1 == n_chunks)?;
        }
        Ok(out)
    }

    fn decode(&mut self, batch: &[(SeqId, u32)]) -> Result<Vec<Logits>> {
        batch
            .iter()
            .map(|&(seq, token)| {
                let pos = self.position(seq)?;
                if self.options.max_kv.is_none() && pos + 1 > self.context_length() {
                    return Err(Error::ContextOverflow {
                        prompt: pos + 1,
                        requested: 0,
                        context: self.context_length(),
                    });
                }
                self.step(seq, &[token], true)?.ok_or_else(|| Error::Config("decode step produced no logits".into()))
            })
            .collect()
    }

    fn position(&self, seq: SeqId) -> Result<usize> {
        let caches = self.sequences.get(&seq).ok_or(Error::UnknownSequence(seq))?;
        Ok(caches.first().map_or(0, KvCache::offset))
    }

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn context_length(&self) -> usize {
        self.model.context_length()
    }
}

impl MlxBackend {
    /// Bytes held by a sequence's KV cache.
    pub fn cache_bytes(&mut self, seq: SeqId) -> Result<usize> {
        Ok(self.caches(seq)?.iter().map(KvCache::nbytes).sum())
    }
}
