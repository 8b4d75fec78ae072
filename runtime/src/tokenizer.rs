//! The bundle's tokenizer — the compiled one when the bundle has it, else
//! `tokenizer.json` through Hugging Face `tokenizers` — and streaming
//! detokenization that never splits a UTF-8 character.

use crate::error::{Error, Result};

/// Which implementation tokenizes.
enum Inner {
    /// The bundle's compiled tokenizer (loads in milliseconds).
    Compiled(Box<mlxcel_tokenizer::Tokenizer>),
    /// `tokenizer.json` parsed by `tokenizers` (bundles without a compiled
    /// tokenizer, or one of a newer layout).
    Json(Box<tokenizers::Tokenizer>),
}

/// A tokenizer and the special tokens generation needs.
pub struct Tokenizer {
    inner: Inner,
    eos: Vec<u32>,
    bos_text: Option<String>,
    eos_text: Option<String>,
}

fn compiled_error(e: mlxcel_tokenizer::TokenizerError) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Loads `tokenizer.json` bytes; `eos` are the ids that end a generation,
    /// `bos`/`eos` texts are what chat templates call `bos_token`/`eos_token`.
    pub fn from_json(json: &[u8], eos: Vec<u32>, bos: Option<u32>) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_bytes(json).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Tokenizer::with_specials(Inner::Json(Box::new(inner)), eos, bos)
    }

    /// Loads a compiled tokenizer section (see [`Tokenizer::from_json`] for
    /// `eos` and `bos`). A section of a layout this build does not read is
    /// [`mlxcel_tokenizer::TokenizerError::UnsupportedVersion`], so that the
    /// caller can fall back to `tokenizer.json`.
    pub fn from_compiled(
        section: impl AsRef<[u8]> + Send + Sync + 'static,
        eos: Vec<u32>,
        bos: Option<u32>,
    ) -> std::result::Result<Tokenizer, mlxcel_tokenizer::TokenizerError> {
        let inner = mlxcel_tokenizer::Tokenizer::load(section)?;
        Tokenizer::with_specials(Inner::Compiled(Box::new(inner)), eos, bos)
            .map_err(|e| mlxcel_tokenizer::TokenizerError::Malformed { what: e.to_string(), offset: 0 })
    }

    fn with_specials(inner: Inner, eos: Vec<u32>, bos: Option<u32>) -> Result<Tokenizer> {
        let mut t = Tokenizer { inner, eos, bos_text: None, eos_text: None };
        t.bos_text = bos.map(|id| t.id_to_token(id)).transpose()?.flatten();
        t.eos_text = t.eos.first().map(|&id| t.id_to_token(id)).transpose()?.flatten();
        Ok(t)
    }

    /// Whether this is the bundle's compiled tokenizer (else `tokenizer.json`).
    pub fn is_compiled(&self) -> bool {
        matches!(self.inner, Inner::Compiled(_))
    }

    /// Token ids of `text`; `add_special` adds what the tokenizer's post-processor
    /// adds (typically BOS) — off for text rendered by a chat template, which
    /// already contains it.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Compiled(t) => t.encode(text, add_special).map_err(compiled_error),
            Inner::Json(t) => {
                let enc = t.encode(text, add_special).map_err(|e| Error::Tokenizer(e.to_string()))?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }

    /// The text of `ids`, without special tokens when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        match &self.inner {
            Inner::Compiled(t) => t.decode(ids, skip_special).map_err(compiled_error),
            Inner::Json(t) => t.decode(ids, skip_special).map_err(|e| Error::Tokenizer(e.to_string())),
        }
    }

    /// The text of a token id (an added token's content, else the vocabulary's spelling).
    pub fn id_to_token(&self, id: u32) -> Result<Option<String>> {
        match &self.inner {
            Inner::Compiled(t) => Ok(t.id_to_token(id).map_err(compiled_error)?.map(str::to_string)),
            Inner::Json(t) => Ok(t.id_to_token(id)),
        }
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
    pub fn token_id(&self, text: &str) -> Result<Option<u32>> {
        match &self.inner {
            Inner::Compiled(t) => t.token_to_id(text).map_err(compiled_error),
            Inner::Json(t) => Ok(t.token_to_id(text)),
        }
    }

    /// One more than the largest token id, added tokens included.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Compiled(t) => t.vocab_size(),
            Inner::Json(t) => {
                let added = t.get_added_tokens_decoder().keys().map(|&id| id as usize + 1).max().unwrap_or(0);
                t.get_vocab_size(false).max(added)
            }
        }
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
