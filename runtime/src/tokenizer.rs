//! The bundle's Hugging Face tokenizer, and streaming detokenization that
//! never splits a UTF-8 character.

use crate::error::{Error, Result};

/// A tokenizer and the special tokens generation needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: Vec<u32>,
    bos_text: Option<String>,
    eos_text: Option<String>,
}

impl Tokenizer {
    /// Loads `tokenizer.json` bytes; `eos` are the ids that end a generation,
    /// `bos`/`eos` texts are what chat templates call `bos_token`/`eos_token`.
    pub fn from_json(json: &[u8], eos: Vec<u32>, bos: Option<u32>) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_bytes(json).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let text = |id: u32| inner.id_to_token(id);
        let bos_text = bos.and_then(text);
        let eos_text = eos.first().copied().and_then(text);
        Ok(Tokenizer { inner, eos, bos_text, eos_text })
    }

    /// Token ids of `text`; `add_special` adds what the tokenizer's post-processor
    /// adds (typically BOS) — off for text rendered by a chat template, which
    /// already contains it.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, add_special).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, without special tokens when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Ids that end generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The BOS token's text, for chat templates.
    pub fn bos_text(&self) -> Option<&str> {
        self.bos_text.as_deref()
    }

    /// The (first) EOS token's text, for chat templates.
    pub fn eos_text(&self) -> Option<&str> {
        self.eos_text.as_deref()
    }

    /// The id of a token's exact text, if it is in the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Turns a stream of token ids into a stream of text pieces.
///
/// Each step decodes a short window of recent tokens twice — with and without
/// the new ones — and emits the difference, so tokenizers that only produce
/// whole characters across several byte tokens (byte-level BPE, byte fallback)
/// never emit half a character (a trailing U+FFFD means "wait").
#[derive(Default)]
pub struct Detokenizer {
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl Detokenizer {
    /// A detokenizer with no tokens yet.
    pub fn new() -> Detokenizer {
        Detokenizer::default()
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.tokens.push(id);
        let prefix = tokenizer.decode(&self.tokens[self.prefix_offset..self.read_offset], true)?;
        let full = tokenizer.decode(&self.tokens[self.prefix_offset..], true)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let piece = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    /// The text still held back (an incomplete character at the very end).
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<Option<String>> {
        let prefix = tokenizer.decode(&self.tokens[self.prefix_offset..self.read_offset], true)?;
        let full = tokenizer.decode(&self.tokens[self.prefix_offset..], true)?;
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        Ok((full.len() > prefix.len() && full.is_char_boundary(prefix.len())).then(|| full[prefix.len()..].to_string()))
    }
}
