//! The vocabulary as bytes: for every token id, the bytes the token adds to
//! an output and whether it is a special token. Constrained decoding matches
//! grammars against these bytes (the runtime's `constraint` module builds
//! llguidance's token trie from them); computing them means decoding every
//! token through the tokenizer, two seconds for Gemma 3's 262k tokens, so
//! the compiler stores them in the bundle (section `tokenizer` /
//! `token-bytes`, docs/bundle-format.md §4.2.1) and a server reads them.
//!
//! Layout, little-endian, no padding:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `MXTB` |
//! | 4 | 4 | version, `u32` = [`VERSION`] |
//! | 8 | 4 | `n`, the number of tokens, `u32` |
//! | 12 | `n` | one flag byte per token: bit 0 set for a special token, the other bits 0 |
//! | 12 + `n` | 4 (`n` + 1) | `u32` offsets into the bytes: the first 0, never decreasing, the last the bytes' length |
//! | 16 + 5`n` | rest | every token's bytes, one after the other |
//!
//! Token `i`'s bytes are `bytes[offsets[i]..offsets[i + 1]]`; a token with
//! no bytes (unused ids, ids past the tokenizer's vocabulary) has two equal
//! offsets. The section's length is exactly what these fields add up to.

use crate::error::{Result, TokenizerError};
use crate::validate::MAX_TOKEN_ID;

/// The layout version this build writes and reads.
pub const VERSION: u32 = 1;
const MAGIC: &[u8; 4] = b"MXTB";
const HEADER: usize = 12;
/// Flag bit: a special token (one that decoding with `skip_special` drops).
const SPECIAL: u8 = 1;

/// Every token's output bytes and special flag, indexed by token id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenBytes {
    flags: Vec<u8>,
    offsets: Vec<u32>,
    bytes: Vec<u8>,
}

impl TokenBytes {
    /// An empty vocabulary, to [`TokenBytes::push`] tokens onto in id order.
    pub fn new() -> TokenBytes {
        TokenBytes { flags: Vec::new(), offsets: vec![0], bytes: Vec::new() }
    }

    /// Appends the next token id's bytes and flag. Refused when the bytes
    /// would pass 4 GiB in all or the tokens [`MAX_TOKEN_ID`].
    pub fn push(&mut self, bytes: &[u8], special: bool) -> Result<()> {
        let end = u32::try_from(self.bytes.len() + bytes.len())
            .map_err(|_| malformed("the tokens' bytes pass 4 GiB", self.bytes.len()))?;
        if self.flags.len() >= MAX_TOKEN_ID as usize {
            return Err(malformed(format!("more than {MAX_TOKEN_ID} tokens"), 8));
        }
        self.bytes.extend_from_slice(bytes);
        self.offsets.push(end);
        self.flags.push(if special { SPECIAL } else { 0 });
        Ok(())
    }

    /// The number of token ids.
    pub fn len(&self) -> usize {
        self.flags.len()
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.flags.is_empty()
    }

    /// Token `id`'s bytes and whether it is special; `None` past the end.
    pub fn get(&self, id: u32) -> Option<(&[u8], bool)> {
        let i = usize::try_from(id).ok()?;
        let flag = *self.flags.get(i)?;
        let range = self.offsets[i] as usize..self.offsets[i + 1] as usize;
        Some((&self.bytes[range], flag & SPECIAL != 0))
    }

    /// The section's bytes (the layout of the module docs).
    pub fn to_section(&self) -> Vec<u8> {
        let n = self.flags.len();
        let mut out = Vec::with_capacity(HEADER + n + 4 * (n + 1) + self.bytes.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&self.flags);
        for o in &self.offsets {
            out.extend_from_slice(&o.to_le_bytes());
        }
        out.extend_from_slice(&self.bytes);
        out
    }

    /// Reads a section, checking every field: an error names the field and
    /// its byte offset in the section.
    pub fn parse(section: &[u8]) -> Result<TokenBytes> {
        let u32_at = |at: usize, what: &str| -> Result<u32> {
            section
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| malformed(format!("the section ends inside {what}"), at))
        };
        if section.get(..4) != Some(MAGIC.as_slice()) {
            return Err(malformed("the magic is not MXTB", 0));
        }
        let version = u32_at(4, "the version")?;
        if version != VERSION {
            return Err(TokenizerError::UnsupportedVersion { found: version, supported: VERSION });
        }
        let n = u32_at(8, "the token count")?;
        if n > MAX_TOKEN_ID {
            return Err(malformed(format!("{n} tokens, more than {MAX_TOKEN_ID} allowed"), 8));
        }
        let n = n as usize;
        let offsets_at = HEADER + n;
        let bytes_at = offsets_at + 4 * (n + 1);
        if section.len() < bytes_at {
            return Err(malformed(
                format!("{n} tokens need {bytes_at} bytes of flags and offsets, the section has {}", section.len()),
                section.len(),
            ));
        }
        let flags = section[HEADER..offsets_at].to_vec();
        if let Some(i) = flags.iter().position(|&f| f & !SPECIAL != 0) {
            return Err(malformed(format!("token {i}'s flags {:#04x} set an undefined bit", flags[i]), HEADER + i));
        }
        let mut offsets = Vec::with_capacity(n + 1);
        let mut previous = 0u32;
        for i in 0..=n {
            let at = offsets_at + 4 * i;
            let o = u32_at(at, "the offsets")?;
            if i == 0 && o != 0 {
                return Err(malformed(format!("offset 0 is {o}, not 0"), at));
            }
            if o < previous {
                return Err(malformed(format!("offset {i} is {o}, before offset {} ({previous})", i - 1), at));
            }
            offsets.push(o);
            previous = o;
        }
        let bytes = &section[bytes_at..];
        if previous as usize != bytes.len() {
            return Err(malformed(
                format!("the last offset is {previous} but {} bytes of tokens follow", bytes.len()),
                offsets_at + 4 * n,
            ));
        }
        Ok(TokenBytes { flags, offsets, bytes: bytes.to_vec() })
    }
}

fn malformed(what: impl Into<String>, offset: usize) -> TokenizerError {
    TokenizerError::MalformedTokenBytes { what: what.into(), offset }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TokenBytes {
        let mut t = TokenBytes::new();
        t.push(b" the", false).unwrap();
        t.push(b"", false).unwrap();
        t.push(b"<|im_end|>", true).unwrap();
        t.push(&[0xE4, 0xB8], false).unwrap();
        t
    }

    #[test]
    fn a_section_reads_back_as_written() {
        let t = sample();
        let back = TokenBytes::parse(&t.to_section()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.len(), 4);
        assert_eq!(back.get(0), Some((b" the".as_slice(), false)));
        assert_eq!(back.get(1), Some((b"".as_slice(), false)));
        assert_eq!(back.get(2), Some((b"<|im_end|>".as_slice(), true)));
        assert_eq!(back.get(3), Some(([0xE4, 0xB8].as_slice(), false)));
        assert_eq!(back.get(4), None);
        assert_eq!(back.get(u32::MAX), None);
        assert_eq!(TokenBytes::parse(&TokenBytes::new().to_section()).unwrap().len(), 0);
    }

    #[test]
    fn every_malformed_field_is_named_with_its_offset() {
        let good = sample().to_section();
        let error = |bytes: &[u8]| TokenBytes::parse(bytes).unwrap_err().to_string();
        assert!(error(b"MXT").contains("magic"), "{}", error(b"MXT"));
        let mut bad = good.clone();
        bad[4] = 2;
        assert!(error(&bad).contains("layout version 2"), "{}", error(&bad));
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(error(&bad).contains("tokens, more than"), "{}", error(&bad));
        let mut bad = good.clone();
        bad[8] = 200;
        assert!(error(&bad).contains("need"), "{}", error(&bad));
        let mut bad = good.clone();
        bad[HEADER + 1] = 2;
        assert!(error(&bad).contains("token 1's flags 0x02") && error(&bad).contains("offset 13"), "{}", error(&bad));
        // Offsets: the first not 0, one going back, the last not the length.
        let offsets_at = HEADER + 4;
        let mut bad = good.clone();
        bad[offsets_at] = 1;
        assert!(error(&bad).contains("offset 0 is 1, not 0"), "{}", error(&bad));
        let mut bad = good.clone();
        bad[offsets_at + 8..offsets_at + 12].copy_from_slice(&1u32.to_le_bytes());
        assert!(error(&bad).contains("offset 2 is 1, before offset 1 (4)"), "{}", error(&bad));
        let mut bad = good.clone();
        bad.push(b'x');
        assert!(error(&bad).contains("but 17 bytes of tokens follow"), "{}", error(&bad));
        assert!(error(&good[..good.len() - 1]).contains("but 15 bytes"));
        // No truncation of a valid section reads.
        for end in 0..good.len() {
            assert!(TokenBytes::parse(&good[..end]).is_err(), "a section cut at {end} was read");
        }
    }
}
