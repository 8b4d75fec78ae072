//! The prefix cache: KV state of finished sequences kept for later prompts
//! that start the same way (chat requests sharing a system prompt).
//!
//! An entry is a finished sequence kept alive in the backend under its
//! [`SeqId`] with the tokens its caches hold. A new prompt takes the entry
//! that lets it skip the most prefill, the backend cuts the entry's caches
//! back to the shared part, and the sequence continues from there under the
//! same id: the caches move, nothing is copied.
//!
//! Only whole prefill chunks are reused. The CPU kernels' results for a
//! position depend on how many rows its forward pass had (the quantized
//! product takes a matvec up to 8 rows and a GEMM past that; float matmuls
//! and a sliding window's masked attention change their accumulation with
//! the shape), so a position computed in a 3-token piece need not have the
//! bits it has in a 256-token one. The engine therefore prefills every
//! prompt in chunks that start at multiples of the chunk size, and reuses
//! only prefixes of whole chunks that the entry prefilled: then every
//! position a reusing sequence holds was computed exactly as it would have
//! been without the cache, and greedy output is the same, bit for bit.

use crate::backend::SeqId;

/// A finished sequence's KV state, held in the backend under `seq`.
pub(super) struct Entry {
    /// The backend sequence holding the caches.
    pub seq: SeqId,
    /// The tokens the caches hold, in order (prompt, then the generated
    /// tokens that went through a forward pass).
    pub tokens: Vec<u32>,
    /// How many leading positions were prefilled in whole chunks: the most
    /// that may be reused.
    pub reusable: usize,
    /// Bytes its caches hold.
    pub bytes: u64,
    /// When it was inserted (larger: more recent).
    used: u64,
}

/// A least-recently-used pool of [`Entry`]s bounded in bytes.
pub(super) struct PrefixCache {
    capacity: u64,
    entries: Vec<Entry>,
    bytes: u64,
    clock: u64,
}

/// The length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// A pool of at most `capacity` bytes (0: off).
    pub fn new(capacity: u64) -> PrefixCache {
        PrefixCache { capacity, entries: Vec::new(), bytes: 0, clock: 0 }
    }

    /// Whether the pool keeps anything.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Bytes its entries hold.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Adds a finished sequence, evicting least recently used entries to
    /// stay within the capacity (or, when it alone is larger, not keeping
    /// it). Returns the sequences the caller must release from the backend.
    pub fn insert(&mut self, seq: SeqId, tokens: Vec<u32>, reusable: usize, bytes: u64) -> Vec<SeqId> {
        if bytes > self.capacity || reusable == 0 {
            return vec![seq];
        }
        let mut evicted = Vec::new();
        while self.bytes + bytes > self.capacity {
            match self.evict_lru() {
                Some(s) => evicted.push(s),
                None => break,
            }
        }
        self.clock += 1;
        self.entries.push(Entry { seq, tokens, reusable, bytes, used: self.clock });
        self.bytes += bytes;
        evicted
    }

    /// The entry that lets `prompt` skip the most prefill, and how many of
    /// its positions it reuses: the common prefix, at most all of the prompt
    /// but its last token and what the entry prefilled in whole chunks,
    /// rounded down to whole chunks of `chunk`, and only where `can_cut`
    /// says the entry's caches can be cut back to that length. Most recent
    /// first among equals. `None` when no entry gives a whole chunk.
    pub fn best(
        &mut self,
        prompt: &[u32],
        chunk: usize,
        mut can_cut: impl FnMut(SeqId, usize) -> bool,
    ) -> Option<(SeqId, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let mut best: Option<(usize, usize, u64)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let shared = common_prefix(&e.tokens, prompt).min(limit).min(e.reusable);
            let len = shared / chunk * chunk;
            if len == 0 || !can_cut(e.seq, len) {
                continue;
            }
            if best.is_none_or(|(_, l, used)| len > l || (len == l && e.used > used)) {
                best = Some((i, len, e.used));
            }
        }
        best.map(|(i, len, _)| (self.entries[i].seq, len))
    }

    /// Bytes of the entry of `seq`, if held.
    pub fn bytes_of(&self, seq: SeqId) -> Option<u64> {
        self.entries.iter().find(|e| e.seq == seq).map(|e| e.bytes)
    }

    /// Takes the entry of `seq` out of the pool.
    pub fn take(&mut self, seq: SeqId) -> Option<Entry> {
        let i = self.entries.iter().position(|e| e.seq == seq)?;
        let e = self.entries.swap_remove(i);
        self.bytes -= e.bytes;
        Some(e)
    }

    /// Drops the least recently used entry other than `keep`; returns its
    /// sequence for the caller to release.
    pub fn evict_lru_except(&mut self, keep: Option<SeqId>) -> Option<SeqId> {
        let i = self.entries.iter().enumerate().filter(|(_, e)| Some(e.seq) != keep).min_by_key(|(_, e)| e.used)?.0;
        let e = self.entries.swap_remove(i);
        self.bytes -= e.bytes;
        Some(e.seq)
    }

    /// Drops the least recently used entry.
    pub fn evict_lru(&mut self) -> Option<SeqId> {
        self.evict_lru_except(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_whole_chunk_prefix_wins_and_lru_goes_first() {
        let mut pool = PrefixCache::new(100);
        assert!(pool.insert(1, vec![1, 2, 3, 4, 5, 6, 7, 8, 9], 8, 40).is_empty());
        assert!(pool.insert(2, vec![1, 2, 3, 4, 9, 9, 9, 9, 9], 8, 40).is_empty());
        // Shares 6 tokens with entry 1 and 4 with entry 2: in whole chunks
        // of 4 a tie, which the more recent entry wins.
        let prompt = [1, 2, 3, 4, 5, 6, 0, 0, 0, 0];
        assert_eq!(pool.best(&prompt, 4, |_, _| true), Some((2, 4)));
        // Chunks of 2: 6 from entry 1.
        assert_eq!(pool.best(&prompt, 2, |_, _| true), Some((1, 6)));
        // The prompt's last token is never reused, nor past what was prefilled.
        assert_eq!(pool.best(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 1, |_, _| true), Some((1, 8)));
        assert_eq!(pool.best(&[1, 2, 3], 1, |_, _| true), Some((2, 2)));
        // An entry that cannot be cut there is skipped.
        assert_eq!(pool.best(&prompt, 2, |s, _| s != 1), Some((2, 4)));
        assert_eq!(pool.best(&[7, 7, 7], 1, |_, _| true), None);
        // A third entry evicts the oldest.
        assert_eq!(pool.insert(3, vec![5; 9], 8, 40), vec![1]);
        assert_eq!((pool.len(), pool.bytes()), (2, 80));
        let e = pool.take(2).unwrap();
        assert_eq!((e.seq, pool.len(), pool.bytes()), (2, 1, 40));
        // Too big alone, or nothing reusable: not kept.
        assert_eq!(pool.insert(4, vec![1; 9], 8, 101), vec![4]);
        assert_eq!(pool.insert(5, vec![1; 9], 0, 1), vec![5]);
        assert_eq!(pool.evict_lru_except(Some(3)), None);
        assert_eq!(pool.evict_lru(), Some(3));
        assert_eq!((pool.len(), pool.bytes()), (0, 0));
    }
}
