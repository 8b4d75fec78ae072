//! Per-layer key/value caches.
//!
//! A global-attention layer keeps every past position in a buffer that grows in
//! chunks (so appending a token is a slice update, not a reallocation). A
//! sliding-window layer keeps only the last `window` positions in a ring: a
//! decode step overwrites the oldest slot, a prefill chunk attends over the
//! cached window plus the chunk with an explicit window mask and then keeps the
//! chunk's tail.

use mlxcel_mlx::{Array, AttentionMask};

use crate::error::{Error, Result};

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

    /// A cache for attention over the last `window` positions.
    pub fn sliding(window: usize) -> KvCache {
        KvCache::Sliding(SlidingCache { window, keys: None, values: None, offset: 0, next: 0 })
    }

    /// The cache of a layer attending over `window` positions (or all of
    /// them), with the context capped at `max_kv` positions when given.
    pub fn for_layer(window: Option<usize>, max_kv: Option<usize>) -> KvCache {
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

    /// Makes room for a step of `keys, values: [batch, kv_heads, new,
    /// head_dim]` written into the buffers in place (growing them as needed)
    /// and says where. `None` when the step is not written in place: a
    /// sliding-window prefill chunk, which attends over the cached window
    /// and the chunk together ([`KvCache::update`]). Follow with
    /// [`KvCache::commit`].
    pub fn reserve(&mut self, keys: &Array, values: &Array) -> Result<Option<CacheWrite>> {
        match self {
            KvCache::Full(c) => c.reserve(keys, values).map(Some),
            KvCache::Sliding(c) if positions(keys)? == 1 => c.reserve(keys, values).map(Some),
            KvCache::Sliding(_) => Ok(None),
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

/// A buffer of `n` zero positions shaped like `like` otherwise.
fn zero_positions(like: &Array, n: usize) -> Result<Array> {
    let s = like.shape();
    Ok(Array::zeros(&[s[0], s[1], n as i32, s[3]], like.dtype())?)
}

/// The growing cache of a global-attention layer.
pub struct FullCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

impl FullCache {
    fn reserve(&mut self, keys: &Array, values: &Array) -> Result<CacheWrite> {
        let new = positions(keys)?;
        let capacity = self.keys.as_ref().map_or(Ok(0), positions)?;
        if self.offset + new > capacity {
            // Grow by whole chunks, keeping what is used.
            let grow = (new.div_ceil(CACHE_CHUNK)) * CACHE_CHUNK;
            let (k0, v0) = (zero_positions(keys, grow)?, zero_positions(values, grow)?);
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
        let w = self.reserve(keys, values)?;
        let k = write_positions(&w.keys, keys, w.slot)?;
        let v = write_positions(&w.values, values, w.slot)?;
        let (ks, vs) = (slice_positions(&k, 0, w.visible)?, slice_positions(&v, 0, w.visible)?);
        self.commit(k, v, positions(keys)?);
        let mask = if w.causal { MaskKind::Causal } else { MaskKind::None };
        Ok(AttentionInputs { keys: ks, values: vs, mask })
    }
}

/// The ring buffer of a sliding-window layer. Slots hold positions in ring
/// order; attention does not depend on the order of keys, only on which ones
/// are visible, so decode steps never reorder it.
pub struct SlidingCache {
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
        self.next = keep % self.window;
        Ok(AttentionInputs { keys: all_k, values: all_v, mask: MaskKind::Explicit(mask) })
    }

    /// One decode position: it goes to the ring slot `next`.
    fn reserve(&mut self, keys: &Array, values: &Array) -> Result<CacheWrite> {
        let cap = self.keys.as_ref().map_or(Ok(0), positions)?;
        if self.next >= cap && cap < self.window {
            // Grow the ring towards `window` in chunks.
            let grow = CACHE_CHUNK.min(self.window - cap);
            let (k0, v0) = (zero_positions(keys, grow)?, zero_positions(values, grow)?);
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
        self.offset += 1;
        self.next = if self.next + 1 >= self.window { 0 } else { self.next + 1 };
    }

    fn update_one(&mut self, keys: &Array, values: &Array) -> Result<AttentionInputs> {
        let w = self.reserve(keys, values)?;
        let k = write_positions(&w.keys, keys, w.slot)?;
        let v = write_positions(&w.values, values, w.slot)?;
        let (ks, vs) = (slice_positions(&k, 0, w.visible)?, slice_positions(&v, 0, w.visible)?);
        self.commit(k, v);
        Ok(AttentionInputs { keys: ks, values: vs, mask: MaskKind::None })
    }
}
