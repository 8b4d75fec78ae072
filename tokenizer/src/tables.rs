//! The compiled section's layout: a small JSON pipeline, then the vocabulary
//! and merges as hash tables that are probed in place, so loading is a header
//! check rather than building maps of hundreds of thousands of entries.
//!
//! All integers are little-endian `u32`:
//!
//! ```text
//! magic "MXTK" | version (1) | pipeline_len | pipeline JSON (padded to 4)
//! blob_len | blob (UTF-8 token texts, padded to 4)
//! id_count | id_count × (offset, len)            id → text (len u32::MAX: no token)
//! vocab_capacity | capacity × (offset, len, id)   text → id, open addressing (id u32::MAX: empty)
//! merge_capacity | capacity × (left, right, rank, merged)  (left u32::MAX: empty)
//! ```
//!
//! Capacities are powers of two; both tables probe linearly from a hash
//! (FNV-1a of the text, then MurmurHash3's 64-bit finalizer; the finalizer
//! of the pair) that is part of
//! the format, so it never changes with the Rust version.

use crate::error::{Result, TokenizerError};
use crate::pipeline::Pipeline;

/// The section's first four bytes.
pub const MAGIC: &[u8; 4] = b"MXTK";
/// The layout version this crate reads and writes.
pub const VERSION: u32 = 1;
const EMPTY: u32 = u32::MAX;

pub(crate) fn hash_text(text: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in text {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // FNV's low bits (the ones a power-of-two table uses) depend only on the
    // inputs' low bits: finish with MurmurHash3's 64-bit mix.
    fmix(h)
}

fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

pub(crate) fn hash_pair(left: u32, right: u32) -> u64 {
    fmix((u64::from(left) << 32) | u64::from(right))
}

fn capacity_for(n: usize) -> usize {
    // At most ~57% full: short probe runs.
    (n * 7 / 4 + 1).next_power_of_two().max(8)
}

fn push_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn too_big(what: &str) -> TokenizerError {
    TokenizerError::Unsupported(format!("{what} larger than 4 GiB"))
}

fn u32_of(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).ok().filter(|&v| v != EMPTY).ok_or_else(|| too_big(what))
}

/// Writes the section: `vocab` as (text, id), `merges` as (left id, right id,
/// merged id) in rank order.
pub(crate) fn write(pipeline: &Pipeline, vocab: &[(String, u32)], merges: &[(u32, u32, u32)]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    push_u32(&mut out, VERSION);
    let json = serde_json::to_vec(pipeline).map_err(|e| TokenizerError::InvalidJson(e.to_string()))?;
    push_u32(&mut out, u32_of(json.len(), "the pipeline")?);
    out.extend_from_slice(&json);
    pad4(&mut out);

    let mut blob = Vec::new();
    let mut refs = Vec::with_capacity(vocab.len());
    for (text, _) in vocab {
        refs.push((u32_of(blob.len(), "the vocabulary")?, u32_of(text.len(), "a token")?));
        blob.extend_from_slice(text.as_bytes());
    }
    push_u32(&mut out, u32_of(blob.len(), "the vocabulary")?);
    out.extend_from_slice(&blob);
    pad4(&mut out);

    // id → text: the first text in file order for an id that several share.
    let id_count = vocab.iter().map(|&(_, id)| id as usize + 1).max().unwrap_or(0);
    let mut by_id = vec![(0u32, EMPTY); id_count];
    for (&(offset, len), (_, id)) in refs.iter().zip(vocab).rev() {
        by_id[*id as usize] = (offset, len);
    }
    push_u32(&mut out, u32_of(id_count, "the id table")?);
    for (offset, len) in by_id {
        push_u32(&mut out, offset);
        push_u32(&mut out, len);
    }

    let cap = capacity_for(vocab.len());
    let mut slots = vec![(0u32, 0u32, EMPTY); cap];
    for (&(offset, len), (text, id)) in refs.iter().zip(vocab) {
        let mut i = hash_text(text.as_bytes()) as usize & (cap - 1);
        loop {
            let slot = &mut slots[i];
            if slot.2 == EMPTY {
                *slot = (offset, len, *id);
                break;
            }
            // A text listed twice keeps its last id, as a JSON object does.
            if &blob[slot.0 as usize..(slot.0 + slot.1) as usize] == text.as_bytes() {
                slot.2 = *id;
                break;
            }
            i = (i + 1) & (cap - 1);
        }
    }
    push_u32(&mut out, u32_of(cap, "the vocabulary table")?);
    for (offset, len, id) in slots {
        push_u32(&mut out, offset);
        push_u32(&mut out, len);
        push_u32(&mut out, id);
    }

    let cap = capacity_for(merges.len());
    let mut slots = vec![(EMPTY, 0u32, 0u32, 0u32); cap];
    for (rank, &(left, right, merged)) in merges.iter().enumerate() {
        let rank = u32_of(rank, "the merges")?;
        let mut i = hash_pair(left, right) as usize & (cap - 1);
        loop {
            let slot = &mut slots[i];
            if slot.0 == EMPTY {
                *slot = (left, right, rank, merged);
                break;
            }
            // A pair listed twice keeps its last rank (tokenizers collects
            // the merges into a map in file order).
            if slot.0 == left && slot.1 == right {
                *slot = (left, right, rank, merged);
                break;
            }
            i = (i + 1) & (cap - 1);
        }
    }
    push_u32(&mut out, u32_of(cap, "the merge table")?);
    for (left, right, rank, merged) in slots {
        for v in [left, right, rank, merged] {
            push_u32(&mut out, v);
        }
    }
    Ok(out)
}

/// The validated tables of a section (offsets into its bytes).
#[derive(Debug)]
pub(crate) struct Layout {
    pub pipeline: Pipeline,
    blob: (usize, usize),
    ids: (usize, usize),
    vocab: (usize, usize),
    merges: (usize, usize),
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn malformed(&self, what: impl Into<String>) -> TokenizerError {
        TokenizerError::Malformed { what: what.into(), offset: self.pos }
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self
            .bytes
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.malformed(format!("the section ends inside {what}")))?;
        self.pos += 4;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// `count` records of `width` u32s; returns (start, count).
    fn records(&mut self, count: usize, width: usize, what: &str) -> Result<(usize, usize)> {
        let len = count.checked_mul(width * 4).ok_or_else(|| self.malformed(format!("{what} is too large")))?;
        let start = self.pos;
        if self.bytes.len() - start < len {
            return Err(self.malformed(format!("{what} ({count} entries) runs past the end")));
        }
        self.pos += len;
        Ok((start, count))
    }

    fn bytes(&mut self, len: usize, what: &str) -> Result<usize> {
        let start = self.pos;
        if self.bytes.len() - start < len {
            return Err(self.malformed(format!("{what} ({len} bytes) runs past the end")));
        }
        self.pos += len.next_multiple_of(4).min(self.bytes.len() - start);
        Ok(start)
    }
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

impl Layout {
    /// Checks the header, the pipeline and that every table lies inside
    /// `bytes`, in time independent of the vocabulary's size. Entries are
    /// checked when they are read ([`Layout::id_of`] and friends return
    /// [`TokenizerError::Malformed`] for a reference outside the texts), so
    /// no lookup reads out of bounds and loading stays O(1).
    pub fn parse(bytes: &[u8]) -> Result<Layout> {
        let mut c = Cursor { bytes, pos: 0 };
        if bytes.get(..4) != Some(MAGIC.as_slice()) {
            return Err(c.malformed("the section does not start with \"MXTK\""));
        }
        c.pos = 4;
        let version = c.u32("the version")?;
        if version != VERSION {
            return Err(TokenizerError::UnsupportedVersion { found: version, supported: VERSION });
        }
        let json_len = c.u32("the pipeline length")? as usize;
        let json_at = c.bytes(json_len, "the pipeline")?;
        let pipeline: Pipeline = serde_json::from_slice(&bytes[json_at..json_at + json_len])
            .map_err(|e| TokenizerError::Malformed { what: format!("the pipeline: {e}"), offset: json_at })?;
        // Added tokens are matched by their first byte; `compile` never
        // writes an empty one, a crafted section may.
        if let Some(t) = pipeline.added.iter().find(|t| t.content.is_empty()) {
            return Err(TokenizerError::Malformed { what: format!("added token {} is empty", t.id), offset: json_at });
        }
        let blob_len = c.u32("the blob length")? as usize;
        let blob_at = c.bytes(blob_len, "the token texts")?;
        let id_count = c.u32("the id count")? as usize;
        let ids = c.records(id_count, 2, "the id table")?;
        let cap = c.u32("the vocabulary capacity")? as usize;
        if !cap.is_power_of_two() {
            return Err(c.malformed(format!("vocabulary capacity {cap} is not a power of two")));
        }
        let vocab = c.records(cap, 3, "the vocabulary table")?;
        let cap = c.u32("the merge capacity")? as usize;
        if !cap.is_power_of_two() {
            return Err(c.malformed(format!("merge capacity {cap} is not a power of two")));
        }
        let merges = c.records(cap, 4, "the merge table")?;
        if c.pos != bytes.len() {
            return Err(c.malformed(format!("{} bytes after the merge table", bytes.len() - c.pos)));
        }
        Ok(Layout { pipeline, blob: (blob_at, blob_len), ids, vocab, merges })
    }

    /// The text at `offset`+`len` of the blob; `at` is the entry's offset, for the error.
    fn text<'a>(&self, bytes: &'a [u8], offset: u32, len: u32, at: usize) -> Result<&'a str> {
        let (offset, len) = (offset as usize, len as usize);
        let malformed = |what: String| TokenizerError::Malformed { what, offset: at };
        if offset.checked_add(len).is_none_or(|end| end > self.blob.1) {
            return Err(malformed(format!(
                "text reference {offset}+{len} is outside the {} bytes of texts",
                self.blob.1
            )));
        }
        let start = self.blob.0 + offset;
        std::str::from_utf8(&bytes[start..start + len]).map_err(|e| malformed(format!("token text is not UTF-8: {e}")))
    }

    /// The id of `text`, if it is in the vocabulary.
    pub fn id_of(&self, bytes: &[u8], text: &str) -> Result<Option<u32>> {
        let (start, cap) = self.vocab;
        if cap == 0 {
            return Ok(None);
        }
        let mut i = hash_text(text.as_bytes()) as usize & (cap - 1);
        for _ in 0..cap {
            let at = start + i * 12;
            let id = read_u32(bytes, at + 8);
            if id == EMPTY {
                return Ok(None);
            }
            // Texts differ in length far more often than in content.
            if read_u32(bytes, at + 4) as usize == text.len()
                && self.text(bytes, read_u32(bytes, at), read_u32(bytes, at + 4), at)? == text
            {
                return Ok(Some(id));
            }
            i = (i + 1) & (cap - 1);
        }
        Ok(None)
    }

    /// The vocabulary text of `id`.
    pub fn text_of<'a>(&self, bytes: &'a [u8], id: u32) -> Result<Option<&'a str>> {
        let (start, count) = self.ids;
        if id as usize >= count {
            return Ok(None);
        }
        let at = start + id as usize * 8;
        let len = read_u32(bytes, at + 4);
        if len == EMPTY {
            return Ok(None);
        }
        self.text(bytes, read_u32(bytes, at), len, at).map(Some)
    }

    /// One more than the largest vocabulary id.
    pub fn id_count(&self) -> usize {
        self.ids.1
    }

    /// The merge of `left` then `right`: (rank, merged id).
    pub fn merge(&self, bytes: &[u8], left: u32, right: u32) -> Option<(u32, u32)> {
        let (start, cap) = self.merges;
        if cap == 0 {
            return None;
        }
        let mut i = hash_pair(left, right) as usize & (cap - 1);
        for _ in 0..cap {
            let at = start + i * 16;
            let l = read_u32(bytes, at);
            if l == EMPTY {
                return None;
            }
            if l == left && read_u32(bytes, at + 4) == right {
                return Some((read_u32(bytes, at + 8), read_u32(bytes, at + 12)));
            }
            i = (i + 1) & (cap - 1);
        }
        None
    }
}
