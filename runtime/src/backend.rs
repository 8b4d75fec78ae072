//! The token-level seam every backend implements, and its MLX implementation.
//!
//! A backend owns a model and the KV caches of its sequences. The generation
//! loop (and later the server's scheduler) talks to it only in tokens and
//! logits: prefill a sequence's prompt, then decode one token per sequence per
//! step, for as many sequences as are running.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use mlxcel_mlx::{Array, Dtype, fast};

use crate::error::{Error, Result};
use crate::kv_cache::{BatchCaches, KvCache, check_window};
use crate::models::LanguageModel;

/// Identifies one sequence (one conversation's KV state) within a backend.
pub type SeqId = u64;

/// Next-token logits over the vocabulary, on the host.
pub type Logits = Vec<f32>;

/// The next-token logits of every row of a batched step, in one buffer as
/// the step left them (`rows × vocab`): a row is a view, never a copy.
#[derive(Clone, Debug, PartialEq)]
pub struct LogitRows {
    values: Vec<f32>,
    vocab: usize,
}

impl LogitRows {
    /// Rows of `vocab` logits, back to back (`values.len()` a multiple of `vocab`).
    pub fn new(values: Vec<f32>, vocab: usize) -> Result<LogitRows> {
        if vocab == 0 || !values.len().is_multiple_of(vocab) {
            return Err(Error::Config(format!("{} logits are not whole rows of {vocab}", values.len())));
        }
        Ok(LogitRows { values, vocab })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.values.len() / self.vocab
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Each row, in order.
    pub fn iter(&self) -> std::slice::ChunksExact<'_, f32> {
        self.values.chunks_exact(self.vocab)
    }

    /// Each row, mutably (sampling applies penalties in place), in order.
    pub fn rows_mut(&mut self) -> std::slice::ChunksExactMut<'_, f32> {
        self.values.chunks_exact_mut(self.vocab)
    }

    /// The first row as an owned vector (no copy: the buffer is cut).
    pub fn into_first(mut self) -> Option<Logits> {
        if self.values.is_empty() {
            return None;
        }
        self.values.truncate(self.vocab);
        Some(self.values)
    }
}

impl<'a> IntoIterator for &'a LogitRows {
    type Item = &'a [f32];
    type IntoIter = std::slice::ChunksExact<'a, f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// A backend: token-level access to one model.
pub trait Backend {
    /// Starts an empty sequence.
    fn new_sequence(&mut self) -> SeqId;
    /// Frees a sequence's KV cache.
    fn release_sequence(&mut self, seq: SeqId);
    /// Feeds `tokens` to `seq` (in chunks), returning the logits after the last
    /// one when `want_logits`.
    fn prefill(&mut self, seq: SeqId, tokens: &[u32], want_logits: bool) -> Result<Option<Logits>>;
    /// Feeds one token to each listed sequence (distinct sequences) as one
    /// forward pass and returns each one's logits, in the same order. A
    /// sequence's logits do not depend on which others share the step.
    fn decode(&mut self, batch: &[(SeqId, u32)]) -> Result<LogitRows>;
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
    /// `options.max_kv`, checked.
    max_kv: Option<NonZeroUsize>,
    sequences: HashMap<SeqId, Vec<KvCache>>,
    next_id: SeqId,
}

impl MlxBackend {
    /// The model this backend runs (for tools that time or trace its
    /// forward pass, as tests/examples/step_phases.rs does).
    pub fn model(&self) -> &dyn LanguageModel {
        self.model.as_ref()
    }

    /// A backend over `model`.
    pub fn new(model: Box<dyn LanguageModel>, options: MlxOptions) -> Result<MlxBackend> {
        if options.prefill_chunk == 0 {
            return Err(Error::InvalidParameter { name: "prefill_chunk", message: "must be at least 1".into() });
        }
        let max_kv = options.max_kv.map(|m| check_window("max_kv_size", m)).transpose()?;
        Ok(MlxBackend { model, options, max_kv, sequences: HashMap::new(), next_id: 0 })
    }

    /// Refuses a step that would take `seq` past the context.
    fn check_room(&self, seq: SeqId, new: usize) -> Result<()> {
        let pos = self.position(seq)?;
        let context = self.context_length();
        if self.options.max_kv.is_none() && pos + new > context {
            return Err(Error::ContextOverflow { prompt: pos + new, requested: 0, context });
        }
        Ok(())
    }

    /// Runs `tokens: [B, L]` through the model, row `b` continuing sequence
    /// `seqs[b]` (distinct sequences); returns each row's logits at its last
    /// position when asked. The step's cache writes are evaluated with it so
    /// the lazy graph never spans more than one step.
    fn step(&mut self, seqs: &[SeqId], tokens: &Array, want_logits: bool) -> Result<Option<LogitRows>> {
        for (i, s) in seqs.iter().enumerate() {
            if seqs[..i].contains(s) {
                return Err(Error::InvalidParameter {
                    name: "batch",
                    message: format!("sequence {s} appears twice in one step"),
                });
            }
        }
        // Take the rows' caches out of the map for the step (a forward pass
        // needs several of them mutably at once), and put them back whatever
        // the outcome.
        let mut taken = Vec::with_capacity(seqs.len());
        for &s in seqs {
            match self.sequences.remove(&s) {
                Some(c) => taken.push((s, c)),
                None => {
                    self.sequences.extend(taken);
                    return Err(Error::UnknownSequence(s));
                }
            }
        }
        let result = {
            let mut rows: Vec<&mut Vec<KvCache>> = taken.iter_mut().map(|(_, c)| c).collect();
            forward(self.model.as_ref(), tokens, &mut rows, want_logits)
        };
        self.sequences.extend(taken);
        result
    }
}

/// One forward pass of `model` over `tokens: [B, L]` with each row's caches.
fn forward(
    model: &dyn LanguageModel,
    tokens: &Array,
    rows: &mut [&mut Vec<KvCache>],
    want_logits: bool,
) -> Result<Option<LogitRows>> {
    let hidden = model.hidden_states(tokens, &mut BatchCaches::new(rows))?;
    let logits = if want_logits {
        // Only the last position's logits are needed: project that row alone.
        let s = hidden.shape();
        let last = if s[1] == 1 { hidden } else { hidden.slice(&[0, s[1] - 1, 0], &[s[0], s[1], s[2]], &[1, 1, 1])? };
        // Left [B, 1, vocab]: `to_vec` reads it whole, and a reshape here
        // would be an MLX node that keeps the step off `fast::eval`'s
        // inline path.
        let logits = model.logits(&last)?;
        Some(if logits.dtype() == Dtype::F32 { logits } else { logits.astype(Dtype::F32)? })
    } else {
        None
    };
    let mut outputs: Vec<&Array> = rows.iter().flat_map(|r| r.iter().flat_map(KvCache::arrays)).collect();
    if let Some(l) = &logits {
        outputs.push(l);
    }
    // Inline when the step is all mlxcel kernels (the CPU path): no MLX
    // stream task per node.
    fast::eval(&outputs)?;
    let Some(logits) = logits else { return Ok(None) };
    let values = logits.to_vec::<f32>()?;
    let vocab = model.vocab_size();
    if values.len() != rows.len() * vocab {
        return Err(Error::Config(format!(
            "the model produced {} logits for {} rows of {vocab}",
            values.len(),
            rows.len()
        )));
    }
    LogitRows::new(values, vocab).map(Some)
}

impl Backend for MlxBackend {
    fn new_sequence(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.sequences.insert(id, self.model.new_caches(self.max_kv));
        id
    }

    fn release_sequence(&mut self, seq: SeqId) {
        self.sequences.remove(&seq);
    }

    fn prefill(&mut self, seq: SeqId, tokens: &[u32], want_logits: bool) -> Result<Option<Logits>> {
        self.check_room(seq, tokens.len())?;
        let chunk = self.options.prefill_chunk;
        let n_chunks = tokens.len().div_ceil(chunk);
        let mut out = None;
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let input = Array::from_slice(part, &[1, part.len() as i32])?;
            out = self.step(&[seq], &input, want_logits && i + 1 == n_chunks)?;
        }
        Ok(out.and_then(LogitRows::into_first))
    }

    fn decode(&mut self, batch: &[(SeqId, u32)]) -> Result<LogitRows> {
        if batch.is_empty() {
            return LogitRows::new(Vec::new(), self.model.vocab_size());
        }
        for &(seq, _) in batch {
            self.check_room(seq, 1)?;
        }
        let seqs: Vec<SeqId> = batch.iter().map(|&(s, _)| s).collect();
        let tokens: Vec<u32> = batch.iter().map(|&(_, t)| t).collect();
        let input = Array::from_slice(&tokens, &[tokens.len() as i32, 1])?;
        self.step(&seqs, &input, true)?.ok_or_else(|| Error::Config("decode step produced no logits".into()))
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
    /// Whether `seq`'s caches can all be cut back to their first `len`
    /// positions ([`MlxBackend::truncate`]).
    pub fn can_truncate(&self, seq: SeqId, len: usize) -> Result<bool> {
        let caches = self.sequences.get(&seq).ok_or(Error::UnknownSequence(seq))?;
        Ok(caches.iter().all(|c| c.can_truncate(len)))
    }

    /// Cuts `seq` back to its first `len` positions, so that it continues
    /// from there (reusing a finished sequence's prefix for a new prompt).
    /// Refused, nothing changed, when a layer's cache cannot
    /// ([`KvCache::can_truncate`]: a sliding ring that has wrapped).
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
        if !self.can_truncate(seq, len)? {
            return Err(Error::InvalidParameter {
                name: "truncate",
                message: format!("sequence {seq} cannot be cut back to {len} positions"),
            });
        }
        for cache in self.sequences.get_mut(&seq).ok_or(Error::UnknownSequence(seq))? {
            cache.truncate(len);
        }
        Ok(())
    }

    /// Bytes held by a sequence's KV cache.
    pub fn cache_bytes(&self, seq: SeqId) -> Result<usize> {
        Ok(self.sequences.get(&seq).ok_or(Error::UnknownSequence(seq))?.iter().map(KvCache::nbytes).sum())
    }
}
