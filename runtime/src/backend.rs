//! The token-level seam every backend implements, and its MLX implementation.
//!
//! A backend owns a model and the KV caches of its sequences. The generation
//! loop (and later the server's scheduler) talks to it only in tokens and
//! logits: prefill a sequence's prompt, then decode one token per sequence per
//! step, for as many sequences as are running.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use mlxcel_mlx::device::{Device, default_device};
use mlxcel_mlx::fast::{Recorded, StepGraph};
use mlxcel_mlx::{Array, Dtype, cuda_kernels, fast};

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
    /// Whether `seq` can be cut back to its first `len` positions
    /// ([`Backend::truncate`]).
    fn can_truncate(&self, seq: SeqId, len: usize) -> Result<bool>;
    /// Cuts `seq` back to its first `len` positions, so that it continues
    /// from there (reusing a finished sequence's prefix for a new prompt);
    /// refused, nothing changed, when it cannot be.
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()>;
    /// Bytes held by a sequence's KV cache.
    fn cache_bytes(&self, seq: SeqId) -> Result<usize>;
    /// Bytes every sequence's caches take whatever its length, for a
    /// backend that allocates a sequence's whole capacity with its first
    /// tokens (IREE's modules take caches of a fixed shape); `None` (the
    /// default) when caches grow with the sequence. The engine's KV budget
    /// reserves this much per request.
    fn fixed_cache_bytes(&self) -> Option<u64> {
        None
    }
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
    /// The last GPU decode step, recorded for replay while the same
    /// sequences keep decoding.
    recorded: Option<RecordedStep>,
    /// Batch sizes whose decode steps were refused recording: how many
    /// times in a row, and why the last time.
    unrecordable: HashMap<usize, (u32, String)>,
}

/// Refusals in a row after which decode steps of a batch size are not
/// tried again: the first decode step may still compute weights converted
/// lazily at load (a head only decode steps use), which are MLX's nodes
/// that the next step no longer has.
const REFUSALS_TO_STOP: u32 = 2;

/// A decode step recorded as one CUDA graph ([`StepGraph`]) and the
/// sequences it steps, in row order. It holds their cache buffers: it is
/// dropped before anything else evaluates them.
struct RecordedStep {
    seqs: Vec<SeqId>,
    graph: StepGraph,
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
        Ok(MlxBackend {
            model,
            options,
            max_kv,
            sequences: HashMap::new(),
            next_id: 0,
            recorded: None,
            unrecordable: HashMap::new(),
        })
    }

    /// Why decode steps of each batch size that was tried could not be
    /// recorded as a step graph, the last time (GPU only; empty on the CPU,
    /// where steps are never recorded).
    pub fn unrecordable_steps(&self) -> impl Iterator<Item = (usize, &str)> {
        self.unrecordable.iter().map(|(&n, (_, why))| (n, why.as_str()))
    }

    /// Forgets the recorded step if it steps any of `seqs`.
    fn forget_recorded(&mut self, seqs: &[SeqId]) {
        if self.recorded.as_ref().is_some_and(|r| r.seqs.iter().any(|s| seqs.contains(s))) {
            self.recorded = None;
        }
    }

    /// Whether a decode step of `batch` sequences is to be recorded: on the
    /// GPU with mlxcel's kernels loaded and step graphs on, unless steps of
    /// that size were refused [`REFUSALS_TO_STOP`] times in a row.
    fn records(&self, batch: usize) -> bool {
        fast::step_graphs()
            && default_device() == Device::Gpu
            && cuda_kernels::loaded()
            && self.unrecordable.get(&batch).is_none_or(|(n, _)| *n < REFUSALS_TO_STOP)
    }

    /// Replays the recorded step for `seqs` (the same sequences in the same
    /// order) with `tokens`, when their caches still are its buffers;
    /// `None` (and the recording forgotten) otherwise.
    fn replay(&mut self, seqs: &[SeqId], tokens: &[u32]) -> Result<Option<LogitRows>> {
        let Some(recorded) = self.recorded.as_mut() else { return Ok(None) };
        if recorded.seqs != seqs {
            self.recorded = None;
            return Ok(None);
        }
        let vocab = self.model.vocab_size();
        let mut logits = vec![0.0f32; seqs.len() * vocab];
        let mut rows = Vec::new();
        for s in seqs {
            let caches = self.sequences.get(s).ok_or(Error::UnknownSequence(*s))?;
            rows.extend(caches.iter().map(KvCache::replay_row));
        }
        let replayed = match rows.into_iter().collect::<Option<Vec<_>>>() {
            Some(rows) => recorded.graph.replay(tokens, &rows, &mut logits),
            None => Ok(false), // a cache must grow: its new buffers need a new recording
        };
        if !matches!(replayed, Ok(true)) {
            self.recorded = None;
            return replayed.map(|_| None).map_err(Error::from);
        }
        for s in seqs {
            for cache in self.sequences.get_mut(s).ok_or(Error::UnknownSequence(*s))? {
                cache.advance_replayed();
            }
        }
        LogitRows::new(logits, vocab).map(Some)
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
        // A recorded step holds its caches' buffers, which this step's
        // cached attention must be free to write in place.
        self.forget_recorded(seqs);
        // Only a step whose caches all write in place without growing is
        // like the next ones (a growing cache's new buffers come from MLX's
        // nodes, and the next step writes elsewhere).
        let record = want_logits
            && tokens.shape().get(1) == Some(&1)
            && self.records(seqs.len())
            && seqs.iter().all(|s| self.sequences.get(s).is_some_and(|c| c.iter().all(|c| c.replay_row().is_some())));
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
            forward(self.model.as_ref(), tokens, &mut rows, want_logits, record)
        };
        self.sequences.extend(taken);
        let (logits, recorded) = result?;
        match recorded {
            Some(Recorded::Graph(graph)) => {
                self.unrecordable.remove(&seqs.len());
                self.recorded = Some(RecordedStep { seqs: seqs.to_vec(), graph });
            }
            Some(Recorded::Refused(why)) => {
                let refusals = self.unrecordable.get(&seqs.len()).map_or(0, |(n, _)| *n);
                self.unrecordable.insert(seqs.len(), (refusals + 1, why));
            }
            Some(Recorded::NotThisStep) | None => {}
        }
        Ok(logits)
    }
}

/// One forward pass of `model` over `tokens: [B, L]` with each row's caches;
/// with `record`, the step evaluated through [`StepGraph::record`] (which
/// says what it made of it).
fn forward(
    model: &dyn LanguageModel,
    tokens: &Array,
    rows: &mut [&mut Vec<KvCache>],
    want_logits: bool,
    record: bool,
) -> Result<(Option<LogitRows>, Option<Recorded>)> {
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
    let recorded = match &logits {
        Some(l) if record => Some(StepGraph::record(&outputs, tokens, l)?),
        // Inline when the step is all mlxcel kernels (the CPU path): no MLX
        // stream task per node.
        _ => {
            fast::eval(&outputs)?;
            None
        }
    };
    let Some(logits) = logits else { return Ok((None, recorded)) };
    let values = logits.to_vec::<f32>()?;
    let vocab = model.vocab_size();
    if values.len() != rows.len() * vocab {
        return Err(Error::Config(format!(
            "the model produced {} logits for {} rows of {vocab}",
            values.len(),
            rows.len()
        )));
    }
    Ok((Some(LogitRows::new(values, vocab)?), recorded))
}

impl Backend for MlxBackend {
    fn new_sequence(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.sequences.insert(id, self.model.new_caches(self.max_kv));
        id
    }

    fn release_sequence(&mut self, seq: SeqId) {
        self.forget_recorded(&[seq]);
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
        if let Some(logits) = self.replay(&seqs, &tokens)? {
            return Ok(logits);
        }
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

    /// All of `seq`'s caches can be cut back ([`KvCache::can_truncate`]:
    /// not a sliding ring that has wrapped).
    fn can_truncate(&self, seq: SeqId, len: usize) -> Result<bool> {
        let caches = self.sequences.get(&seq).ok_or(Error::UnknownSequence(seq))?;
        Ok(caches.iter().all(|c| c.can_truncate(len)))
    }

    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
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

    fn cache_bytes(&self, seq: SeqId) -> Result<usize> {
        Ok(self.sequences.get(&seq).ok_or(Error::UnknownSequence(seq))?.iter().map(KvCache::nbytes).sum())
    }
}
