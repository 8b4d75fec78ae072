//! Per-layer key/value caches.
//!
//! A global-attention layer keeps every past position in a buffer that grows in
//! chunks (so appending a token is a slice update, not a reallocation). A
//! sliding-window layer keeps only the last `window` positions in a ring: a
//! decode step overwrites the oldest slot, a prefill chunk attends over the
//! cached window plus the chunk with an explicit window mask and then keeps the
//! chunk's tail.
//!
//! Model code sees one call, [`LayerCaches::attend`]: the attention of a
//! step's queries over each sequence's cache after appending the step's keys
//! and values. How the step is written (in place by mlxcel's cached-attention
//! node, or through an explicit window mask) stays here.

use std::num::NonZeroUsize;

use mlxcel_mlx::fast::{CacheRow, CacheSlot, cached_attention, merge_heads, scaled_dot_product_attention};
use mlxcel_mlx::{Array, AttentionMask, Dtype};

use crate::error::{Error, Result};
use crate::nn::Rope;

/// Positions a growing cache adds at a time (as mlx-lm's `KVCache.step`).
pub const CACHE_CHUNK: usize = 256;

/// Keys and values of one layer for the attention call of the current step,
/// with the mask that goes with them.
pub struct AttentionInputs {
    /// `[batch, kv_heads, keys, head_dim]`.
    pub keys: Array,
    /// `[batch, kv_heads, keys, head_dim]`.
    pub values: Array,
    /// Which keys each query may see.
    pub mask: MaskKind,
}

/// Where one step's keys and values go when they are written into the cache
/// buffers in place, and which buffer positions the step's queries then see
/// (what [`mlxcel_mlx::fast::cached_attention`] takes).
pub struct CacheWrite {
    /// The key buffer, `[batch, kv_heads, capacity, head_dim]`.
    pub keys: Array,
    /// The value buffer, `[batch, kv_heads, capacity, head_dim]`.
    pub values: Array,
    /// First buffer position written.
    pub slot: usize,
    /// The queries attend over buffer positions `0..visible`.
    pub visible: usize,
    /// Whether query `i` of the step sees only positions up to its own.
    pub causal: bool,
}

/// The mask an attention call needs.
pub enum MaskKind {
    /// Every query sees every key (one query against a window or a full past).
    None,
    /// Causal, queries aligned to the end of the keys.
    Causal,
    /// An explicit boolean mask `[queries, keys]` (sliding windows in prefill).
    Explicit(Array),
}

impl MaskKind {
    /// The form `scaled_dot_product_attention` takes.
    pub fn as_attention_mask(&self) -> AttentionMask<'_> {
        match self {
            MaskKind::None => AttentionMask::None,
            MaskKind::Causal => AttentionMask::Causal,
            MaskKind::Explicit(a) => AttentionMask::Array(a),
        }
    }
}

/// The cache of one attention layer.
pub enum KvCache {
    /// Every past position (global attention).
    Full(FullCache),
    /// The last `window` positions (sliding-window attention).
    Sliding(SlidingCache),
}

impl KvCache {
    /// A cache for global attention.
    pub fn full() -> KvCache {
        KvCache::Full(FullCache { keys: None, values: None, offset: 0 })
    }

    /// A cache for attention over the last `window` positions (never zero:
    /// the ring's slot arithmetic needs at least one slot).
    pub fn sliding(window: NonZeroUsize) -> KvCache {
        KvCache::Sliding(SlidingCache { window: window.get(), keys: None, values: None, offset: 0, next: 0 })
    }

    /// The cache of a layer attending over `window` positions (or all of
    /// them), with the context capped at `max_kv` positions when given. Both
    /// are non-zero by type; [`check_window`] turns a user's or a config's
    /// number into one, refusing zero and absurd sizes.
    pub fn for_layer(window: Option<NonZeroUsize>, max_kv: Option<NonZeroUsize>) -> KvCache {
        match (window, max_kv) {
            (Some(w), Some(m)) => KvCache::sliding(w.min(m)),
            (Some(w), None) | (None, Some(w)) => KvCache::sliding(w),
            (None, None) => KvCache::full(),
        }
    }

    /// Positions seen so far (the RoPE offset of the next token).
    pub fn offset(&self) -> usize {
        match self {
            KvCache::Full(c) => c.offset,
            KvCache::Sliding(c) => c.offset,
        }
    }

    /// Appends `keys, values: [batch, kv_heads, new, head_dim]` (already
    /// rotated) and returns what the attention over the new queries needs.
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<AttentionInputs> {
        match self {
            KvCache::Full(c) => c.update(keys, values),
            KvCache::Sliding(c) => c.update(keys, values),
        }
    }

    /// Whether a step of `new` positions is written into the buffers in
    /// place ([`KvCache::reserve`]); a sliding-window prefill chunk is not: it
    /// attends over the cached window and the chunk together
    /// ([`KvCache::update`]).
    pub fn writes_in_place(&self, new: usize) -> bool {
        match self {
            KvCache::Full(_) => true,
            KvCache::Sliding(_) => new == 1,
        }
    }

    /// Makes room for a step of `new` positions of `layout` written into the
    /// buffers in place (growing them as needed) and says where; only for
    /// steps that [`KvCache::writes_in_place`]. Follow with
    /// [`KvCache::commit`].
    pub fn reserve(&mut self, new: usize, layout: &KvLayout) -> Result<CacheWrite> {
        match self {
            KvCache::Full(c) => c.reserve(new, layout),
            KvCache::Sliding(c) if new == 1 => c.reserve(layout),
            KvCache::Sliding(_) => Err(Error::Config(format!(
                "a sliding-window cache writes one position in place, not {new} (prefill goes through update)"
            ))),
        }
    }

    /// Keeps the buffers a reserved step of `new` positions wrote, and moves
    /// the cache past them.
    pub fn commit(&mut self, keys: Array, values: Array, new: usize) {
        match self {
            KvCache::Full(c) => c.commit(keys, values, new),
            KvCache::Sliding(c) => c.commit(keys, values),
        }
    }

    /// Where a replayed decode step's one position goes (a recorded step
    /// graph, `fast::StepGraph`): the write [`KvCache::reserve`] would make
    /// in the current buffers, with the cache's position; `None` when the
    /// step needs the buffers to grow (the recorded graph writes the old
    /// ones) or there are none yet. Follow a replay with
    /// [`KvCache::advance_replayed`].
    pub fn replay_row(&self) -> Option<CacheRow<'_>> {
        let (keys, values, slot, visible) = match self {
            KvCache::Full(c) => {
                let (k, v) = (c.keys.as_ref()?, c.values.as_ref()?);
                if c.offset + 1 > positions(k).ok()? {
                    return None;
                }
                (k, v, c.offset, c.offset + 1)
            }
            KvCache::Sliding(c) => {
                let (k, v) = (c.keys.as_ref()?, c.values.as_ref()?);
                let cap = positions(k).ok()?;
                if c.next >= cap {
                    return None;
                }
                (k, v, c.next, (c.offset + 1).min(cap))
            }
        };
        Some(CacheRow { offset: self.offset(), cache: CacheSlot { keys, values, slot, visible, causal: false } })
    }

    /// Moves the cache past the position a replayed step wrote in place
    /// (the buffers stay the same arrays).
    pub fn advance_replayed(&mut self) {
        match self {
            KvCache::Full(c) => c.offset += 1,
            KvCache::Sliding(c) => c.advance(),
        }
    }

    /// Whether the cache can be cut back to its first `len` positions
    /// ([`KvCache::truncate`]). A growing cache always can; a sliding ring
    /// only while it has not wrapped (it still holds every position, in
    /// order) or when nothing is cut: once wrapped, the positions before the
    /// window are gone and those in it are out of order. (mlx-lm's
    /// `can_trim_prompt_cache` refuses a wrapped rotating cache likewise.)
    pub fn can_truncate(&self, len: usize) -> bool {
        match self {
            KvCache::Full(c) => len <= c.offset,
            KvCache::Sliding(c) => len == c.offset || (len < c.offset && c.offset <= c.window),
        }
    }

    /// Cuts the cache back to its first `len` positions, keeping its
    /// buffers (the next step overwrites what was past `len`); false, and
    /// nothing changed, when it cannot ([`KvCache::can_truncate`]).
    pub fn truncate(&mut self, len: usize) -> bool {
        if !self.can_truncate(len) {
            return false;
        }
        match self {
            KvCache::Full(c) => c.offset = len,
            KvCache::Sliding(c) => {
                if len < c.offset {
                    // Not wrapped: position p is in slot p, and the next goes to slot `len`
                    // (slot 0 once the ring is full, as `update` and `commit` leave it).
                    c.offset = len;
                    c.next = if len == c.window { 0 } else { len };
                }
            }
        }
        true
    }

    /// Bytes held by the cache buffers.
    pub fn nbytes(&self) -> usize {
        let (k, v) = match self {
            KvCache::Full(c) => (&c.keys, &c.values),
            KvCache::Sliding(c) => (&c.keys, &c.values),
        };
        k.as_ref().map_or(0, Array::nbytes) + v.as_ref().map_or(0, Array::nbytes)
    }

    /// The cache buffers, to evaluate them together with a step's output.
    pub fn arrays(&self) -> Vec<&Array> {
        let (k, v) = match self {
            KvCache::Full(c) => (&c.keys, &c.values),
            KvCache::Sliding(c) => (&c.keys, &c.values),
        };
        k.iter().chain(v.iter()).collect()
    }
}

/// The layout of one sequence's `keys, values: [1, kv_heads, new, dim]`.
fn layout_of(keys: &Array, values: &Array) -> Result<KvLayout> {
    let (k, v) = (keys.shape(), values.shape());
    if k.len() != 4 || v.len() != 4 || k[0] != 1 || v[0] != 1 {
        return Err(Error::Config(format!(
            "one sequence's keys {k:?} and values {v:?} must be [1, heads, positions, dim]"
        )));
    }
    Ok(KvLayout { kv_heads: k[1], key_dim: k[3], value_dim: v[3], dtype: keys.dtype() })
}

/// Shape helpers over `[batch, heads, positions, dim]` arrays.
fn positions(a: &Array) -> Result<usize> {
    a.dim(2)
        .map(|d| d as usize)
        .ok_or_else(|| Error::Config(format!("KV tensor of shape {:?} has no position axis", a.shape())))
}

/// `a[:, :, start..stop, :]`.
fn slice_positions(a: &Array, start: usize, stop: usize) -> Result<Array> {
    let s = a.shape();
    Ok(a.slice(&[0, 0, start as i32, 0], &[s[0], s[1], stop as i32, s[3]], &[1, 1, 1, 1])?)
}

/// Writes `update` at positions `at..` of `buffer`.
fn write_positions(buffer: &Array, update: &Array, at: usize) -> Result<Array> {
    let s = update.shape();
    let n = positions(update)?;
    Ok(buffer.slice_update(update, &[0, 0, at as i32, 0], &[s[0], s[1], (at + n) as i32, s[3]], &[1, 1, 1, 1])?)
}

/// The shape of one sequence's keys and values in a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Key/value heads.
    pub kv_heads: i32,
    /// Features per key.
    pub key_dim: i32,
    /// Features per value.
    pub value_dim: i32,
    /// Their dtype.
    pub dtype: Dtype,
}

impl KvLayout {
    /// Zero key and value buffers of `n` positions.
    fn zeros(&self, n: usize) -> Result<(Array, Array)> {
        let n = n as i32;
        Ok((
            Array::zeros(&[1, self.kv_heads, n, self.key_dim], self.dtype)?,
            Array::zeros(&[1, self.kv_heads, n, self.value_dim], self.dtype)?,
        ))
    }
}

/// The growing cache of a global-attention layer.
pub struct FullCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

impl FullCache {
    fn reserve(&mut self, new: usize, layout: &KvLayout) -> Result<CacheWrite> {
        let capacity = self.keys.as_ref().map_or(Ok(0), positions)?;
        if self.offset + new > capacity {
            // Grow by whole chunks, keeping what is used.
            let grow = (new.div_ceil(CACHE_CHUNK)) * CACHE_CHUNK;
            let (k0, v0) = layout.zeros(grow)?;
            let (k, v) = match (&self.keys, &self.values) {
                (Some(k), Some(v)) => (
                    Array::concatenate(&[&slice_positions(k, 0, self.offset)?, &k0], 2)?,
                    Array::concatenate(&[&slice_positions(v, 0, self.offset)?, &v0], 2)?,
                ),
                _ => (k0, v0),
            };
            self.keys = Some(k);
            self.values = Some(v);
        }
        // `commit` replaces the cache's references before the step is
        // evaluated, so the step then holds the buffers' only references and
        // writes them in place.
        let (Some(keys), Some(values)) = (self.keys.clone(), self.values.clone()) else {
            return Err(Error::Config("KV cache buffers missing after growth".into()));
        };
        Ok(CacheWrite { keys, values, slot: self.offset, visible: self.offset + new, causal: new > 1 })
    }

    fn commit(&mut self, keys: Array, values: Array, new: usize) {
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset += new;
    }

    fn update(&mut self, keys: &Array, values: &Array) -> Result<AttentionInputs> {
        let w = self.reserve(positions(keys)?, &layout_of(keys, values)?)?;
        let k = write_positions(&w.keys, keys, w.slot)?;
        let v = write_positions(&w.values, values, w.slot)?;
        let (ks, vs) = (slice_positions(&k, 0, w.visible)?, slice_positions(&v, 0, w.visible)?);
        self.commit(k, v, positions(keys)?);
        let mask = if w.causal { MaskKind::Causal } else { MaskKind::None };
        Ok(AttentionInputs { keys: ks, values: vs, mask })
    }
}

/// The most positions a KV cache window may hold (the model code's
/// [`mlxcel_models::MAX_WINDOW`]: 2^24, 64 times the longest context of the
/// architectures the runtime knows). A larger `--max-kv-size` or
/// `sliding_window` is a typo or an attack, and the window mask of a
/// prefill chunk is sized by it.
pub const MAX_KV_POSITIONS: usize = mlxcel_models::MAX_WINDOW;

/// Checks a cache window (`--max-kv-size`, a layer's `sliding_window`): at
/// least one position and at most [`MAX_KV_POSITIONS`].
pub use mlxcel_models::check_window;

/// The ring buffer of a sliding-window layer. Slots hold positions in ring
/// order; attention does not depend on the order of keys, only on which ones
/// are visible, so decode steps never reorder it.
pub struct SlidingCache {
    /// At least 1 ([`KvCache::sliding`] takes a `NonZeroUsize`).
    window: usize,
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions seen so far.
    offset: usize,
    /// The ring slot the next position goes to.
    next: usize,
}

impl SlidingCache {
    /// The cached positions in temporal order (at most `window`).
    fn ordered(&self, a: &Array) -> Result<Array> {
        let len = self.offset.min(self.window);
        let cap = positions(a)?;
        if self.offset <= cap && self.next == self.offset.min(cap) && self.offset <= self.window {
            // Not wrapped yet.
            return slice_positions(a, 0, len);
        }
        // Wrapped: oldest is at `next`.
        let tail = slice_positions(a, self.next, cap)?;
        let head = slice_positions(a, 0, self.next)?;
        Ok(Array::concatenate(&[&tail, &head], 2)?)
    }

    fn update(&mut self, keys: &Array, values: &Array) -> Result<AttentionInputs> {
        let new = positions(keys)?;
        if new == 1 {
            return self.update_one(keys, values);
        }
        // Prefill chunk: attend over (cached window, chunk) with an explicit mask.
        let (all_k, all_v, cached) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.offset > 0 => {
                let (k, v) = (self.ordered(k)?, self.ordered(v)?);
                let cached = positions(&k)?;
                (Array::concatenate(&[&k, keys], 2)?, Array::concatenate(&[&v, values], 2)?, cached)
            }
            _ => (keys.clone(), values.clone(), 0),
        };
        let total = cached + new;
        // Absolute positions: keys start at offset - cached, queries at offset.
        let first_key = self.offset - cached;
        let mut allowed = Vec::with_capacity(new * total);
        for i in 0..new {
            let q = self.offset + i;
            for j in 0..total {
                let k = first_key + j;
                allowed.push(k <= q && q - k < self.window);
            }
        }
        let mask = Array::from_bools(&allowed, &[new as i32, total as i32])?;
        // Keep the last `window` positions, in temporal order, as a fresh ring.
        let keep = total.min(self.window);
        self.keys = Some(slice_positions(&all_k, total - keep, total)?);
        self.values = Some(slice_positions(&all_v, total - keep, total)?);
        self.offset += new;
        // `keep` is at most `window`: the ring is full exactly when they are
        // equal (no remainder, so no division anywhere in the ring).
        self.next = if keep == self.window { 0 } else { keep };
        Ok(AttentionInputs { keys: all_k, values: all_v, mask: MaskKind::Explicit(mask) })
    }

    /// One decode position: it goes to the ring slot `next`.
    fn reserve(&mut self, layout: &KvLayout) -> Result<CacheWrite> {
        let cap = self.keys.as_ref().map_or(Ok(0), positions)?;
        if self.next >= cap && cap < self.window {
            // Grow the ring towards `window` in chunks.
            let grow = CACHE_CHUNK.min(self.window - cap);
            let (k0, v0) = layout.zeros(grow)?;
            let (k, v) = match (&self.keys, &self.values) {
                (Some(k), Some(v)) => (Array::concatenate(&[k, &k0], 2)?, Array::concatenate(&[v, &v0], 2)?),
                _ => (k0, v0),
            };
            self.keys = Some(k);
            self.values = Some(v);
        }
        let (Some(k), Some(v)) = (self.keys.clone(), self.values.clone()) else {
            return Err(Error::Config("sliding KV cache buffers missing after growth".into()));
        };
        // Valid slots: all of them once wrapped or full, else the positions so far.
        let visible = (self.offset + 1).min(positions(&k)?);
        Ok(CacheWrite { keys: k, values: v, slot: self.next, visible, causal: false })
    }

    fn commit(&mut self, keys: Array, values: Array) {
        self.keys = Some(keys);
        self.values = Some(values);
        self.advance();
    }

    /// One position further: the next goes to the following ring slot.
    fn advance(&mut self) {
        self.offset += 1;
        self.next = if self.next + 1 >= self.window { 0 } else { self.next + 1 };
    }

    fn update_one(&mut self, keys: &Array, values: &Array) -> Result<AttentionInputs> {
        let w = self.reserve(&layout_of(keys, values)?)?;
        let k = write_positions(&w.keys, keys, w.slot)?;
        let v = write_positions(&w.values, values, w.slot)?;
        let (ks, vs) = (slice_positions(&k, 0, w.visible)?, slice_positions(&v, 0, w.visible)?);
        self.commit(k, v);
        Ok(AttentionInputs { keys: ks, values: vs, mask: MaskKind::None })
    }
}

/// One layer's caches of the sequences of a batch, one per row of the step.
pub struct LayerCaches<'a> {
    rows: Vec<&'a mut KvCache>,
}

impl<'a> LayerCaches<'a> {
    /// The caches of a step's rows, in row order.
    pub fn new(rows: Vec<&'a mut KvCache>) -> LayerCaches<'a> {
        LayerCaches { rows }
    }

    /// Attends `q [B, H, L, D]` over each row's cache after appending that
    /// row's `k [B, KVH, L, D]` and `v [B, KVH, L, Dv]`: queries and keys are
    /// rotated by `rope` from each row's position, scores scaled by `scale`,
    /// query `i` sees its row's past and itself (within the layer's window).
    /// Returns `[B, L, H·Dv]`, heads merged for the output projection.
    ///
    /// Rows do not see each other, and a row's result does not depend on the
    /// others (the same bits as the row alone).
    pub fn attend(&mut self, q: &Array, k: &Array, v: &Array, rope: &Rope, scale: f32) -> Result<Array> {
        let (ks, vs) = (k.shape(), v.shape());
        if ks.len() != 4 || vs.len() != 4 || ks[0] as usize != self.rows.len() {
            return Err(Error::Config(format!(
                "attention step of keys {ks:?} and values {vs:?} over {} cached sequences",
                self.rows.len()
            )));
        }
        let new = ks[2] as usize;
        if let [row] = &mut self.rows[..]
            && !row.writes_in_place(new)
        {
            // A sliding-window prefill chunk attends over the cached window
            // and itself, with a window mask.
            let offset = row.offset();
            let q = rope.forward(q, offset)?;
            let k = rope.forward(k, offset)?;
            let step = row.update(&k, v)?;
            let out = scaled_dot_product_attention(&q, &step.keys, &step.values, scale, step.mask.as_attention_mask())?;
            return Ok(merge_heads(&out)?);
        }
        let layout = KvLayout { kv_heads: ks[1], key_dim: ks[3], value_dim: vs[3], dtype: k.dtype() };
        let mut writes = Vec::with_capacity(self.rows.len());
        for row in &mut self.rows {
            if !row.writes_in_place(new) {
                return Err(Error::Config(format!(
                    "a batch of {} sequences steps {new} positions at once over a sliding window; batched steps are one position each",
                    ks[0]
                )));
            }
            writes.push((row.offset(), row.reserve(new, &layout)?));
        }
        // Rotate, write the keys and values into the caches and attend: one
        // node on the CPU.
        let rows: Vec<CacheRow<'_>> = writes
            .iter()
            .map(|(offset, w)| CacheRow {
                offset: *offset,
                cache: CacheSlot {
                    keys: &w.keys,
                    values: &w.values,
                    slot: w.slot,
                    visible: w.visible,
                    causal: w.causal,
                },
            })
            .collect();
        let step = cached_attention(&rope.prescale(q)?, &rope.prescale(k)?, v, &rope.spec(), &rows, scale)?;
        drop(rows);
        drop(writes);
        for (row, (keys, values)) in self.rows.iter_mut().zip(step.caches) {
            row.commit(keys, values, new);
        }
        Ok(step.out)
    }
}

/// The caches of every sequence of a batch (one [`KvCache`] per layer each),
/// handed to a model's forward pass.
pub struct BatchCaches<'a, 'b> {
    rows: &'a mut [&'b mut Vec<KvCache>],
}

impl<'a, 'b> BatchCaches<'a, 'b> {
    /// The caches of a step's rows, in row order.
    pub fn new(rows: &'a mut [&'b mut Vec<KvCache>]) -> BatchCaches<'a, 'b> {
        BatchCaches { rows }
    }

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Layer `i`'s cache of every row.
    pub fn layer(&mut self, i: usize) -> Result<LayerCaches<'_>> {
        let rows = self
            .rows
            .iter_mut()
            .map(|r| r.get_mut(i).ok_or_else(|| Error::Config(format!("no KV cache for layer {i}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(LayerCaches::new(rows))
    }
}
