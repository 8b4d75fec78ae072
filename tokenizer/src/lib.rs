//! The compiled tokenizer: BPE tokenizers (byte-level like GPT-2, Llama 3,
//! Qwen and SmolLM; SentencePiece-style like Llama 2, Gemma and Phi-3) stored
//! as a bundle section that loads in about a millisecond.
//!
//! Hugging Face `tokenizers` builds hash maps of the whole vocabulary and
//! every merge from `tokenizer.json` at load: ~100 ms for SmolLM2's 49k
//! tokens and a second for Gemma 3's 262k on a laptop-class core. The
//! compiler ([`compile`]) writes the same tokenizer as hash tables that are
//! probed in place ([`tables`]), and [`Tokenizer`] encodes and decodes with
//! `tokenizers`' exact semantics for the components it accepts
//! ([`pipeline`]). [`verify`] checks a compiled tokenizer against
//! `tokenizers` on a corpus; the compiler only writes the section when they
//! agree, so a bundle never carries a tokenizer that differs from its
//! `tokenizer.json`.

pub mod error;
pub mod pipeline;
pub mod regex;
pub mod tables;
pub mod token_bytes;
pub mod validate;
pub mod verify;

mod decode;
mod encode;

use std::collections::HashMap;

pub use encode::bytes_to_unicode;
pub use error::{Result, TokenizerError};
use pipeline::{Pipeline, PreTokenizer, SplitPattern};
pub use regex::SplitRegex;
use tables::Layout;
pub use validate::{JsonGuard, MAX_TOKEN_ID, TokenizerFacts, json_guard, validate_json, validate_json_fields};

/// Compiles `tokenizer.json` into the section bytes, or says which part of
/// it the compiled tokenizer does not support.
pub fn compile(tokenizer_json: &[u8]) -> Result<Vec<u8>> {
    let (pipeline, bpe) = pipeline::read_tokenizer_json(tokenizer_json)?;
    // The byte-level step spells pieces in stand-in characters; a later
    // pre-tokenizer would see those, which the encoder does not model.
    if let Some(i) = pipeline.pre_tokenizers.iter().position(|p| matches!(p, PreTokenizer::ByteLevel { .. }))
        && i + 1 != pipeline.pre_tokenizers.len()
    {
        return Err(TokenizerError::Unsupported("a pre-tokenizer after ByteLevel".into()));
    }
    let ids: HashMap<&str, u32> = bpe.vocab.iter().map(|(t, id)| (t.as_str(), *id)).collect();
    let id = |t: &str| {
        ids.get(t)
            .copied()
            .ok_or_else(|| TokenizerError::InvalidJson(format!("merge token {t:?} is not in the vocabulary")))
    };
    let merges =
        bpe.merges.iter().map(|(a, b)| Ok((id(a)?, id(b)?, id(&format!("{a}{b}"))?))).collect::<Result<Vec<_>>>()?;
    if let Some(unk) = &bpe.unk_token {
        id(unk)?;
    }
    tables::write(&pipeline, &bpe.vocab, &merges)
}

/// The tokenizer of a compiled section.
pub struct Tokenizer {
    data: Box<dyn AsRef<[u8]> + Send + Sync>,
    layout: Layout,
    /// The regex of each pre-tokenizer (`None` where it has none).
    splitters: Vec<Option<SplitRegex>>,
    /// Added tokens by text, and the text lengths to try, longest first, by first byte.
    added_by_text: HashMap<String, u32>,
    added_lengths: HashMap<u8, Vec<usize>>,
    /// Added tokens by id: (text, special).
    added_by_id: HashMap<u32, (String, bool)>,
    /// Texts of special added tokens (decoding may skip them).
    special_texts: std::collections::HashSet<String>,
    /// The id of each byte's `<0xXX>` token (byte fallback).
    byte_tokens: [Option<u32>; 256],
    /// The id of each byte's byte-level stand-in character.
    byte_level_ids: [Option<u32>; 256],
    /// Each byte's byte-level stand-in character.
    stand_ins: [char; 256],
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("pipeline", &self.layout.pipeline).finish_non_exhaustive()
    }
}

/// GPT-2's pre-tokenizer regex (what `ByteLevel { use_regex: true }` splits with).
pub const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

impl Tokenizer {
    /// Loads a compiled section (checked: a malformed one is an error naming
    /// the offset, never a panic or an out-of-bounds read).
    pub fn load(data: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<Tokenizer> {
        let layout = Layout::parse(data.as_ref())?;
        let bytes = data.as_ref();
        let splitters = layout
            .pipeline
            .pre_tokenizers
            .iter()
            .map(|p| match p {
                PreTokenizer::Split { pattern: SplitPattern::Regex(r), .. } => SplitRegex::new(r).map(Some),
                PreTokenizer::ByteLevel { use_regex: true, .. } => SplitRegex::new(GPT2_REGEX).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut added_by_text = HashMap::new();
        let mut added_lengths: HashMap<u8, Vec<usize>> = HashMap::new();
        let mut added_by_id = HashMap::new();
        let mut special_texts = std::collections::HashSet::new();
        for t in &layout.pipeline.added {
            added_by_text.insert(t.content.clone(), t.id);
            // Never empty (`Layout::parse` refuses that).
            if let Some(&first) = t.content.as_bytes().first() {
                let lengths = added_lengths.entry(first).or_default();
                if !lengths.contains(&t.content.len()) {
                    lengths.push(t.content.len());
                }
            }
            added_by_id.insert(t.id, (t.content.clone(), t.special));
            if t.special {
                special_texts.insert(t.content.clone());
            }
        }
        for lengths in added_lengths.values_mut() {
            lengths.sort_unstable_by(|a, b| b.cmp(a));
        }
        let mut byte_tokens = [None; 256];
        let mut byte_level_ids = [None; 256];
        let stand_ins = encode::bytes_to_unicode();
        for b in 0..256 {
            byte_tokens[b] = layout.id_of(bytes, &format!("<0x{b:02X}>"))?;
            byte_level_ids[b] = layout.id_of(bytes, stand_ins[b].encode_utf8(&mut [0; 4]))?;
        }
        Ok(Tokenizer {
            data: Box::new(data),
            layout,
            splitters,
            added_by_text,
            added_lengths,
            added_by_id,
            special_texts,
            byte_tokens,
            byte_level_ids,
            stand_ins,
        })
    }

    fn bytes(&self) -> &[u8] {
        (*self.data).as_ref()
    }

    /// The pipeline (for diagnostics).
    pub fn pipeline(&self) -> &Pipeline {
        &self.layout.pipeline
    }

    /// The id of a token's exact text (added tokens first, as `tokenizers` does).
    pub fn token_to_id(&self, text: &str) -> Result<Option<u32>> {
        match self.added_by_text.get(text) {
            Some(&id) => Ok(Some(id)),
            None => self.layout.id_of(self.bytes(), text),
        }
    }

    /// The text of a token id (an added token's content, else the vocabulary's spelling).
    pub fn id_to_token(&self, id: u32) -> Result<Option<&str>> {
        match self.added_by_id.get(&id) {
            Some((text, _)) => Ok(Some(text)),
            None => self.layout.text_of(self.bytes(), id),
        }
    }

    /// One more than the largest token id of the vocabulary and the added tokens.
    pub fn vocab_size(&self) -> usize {
        let added = self.added_by_id.keys().map(|&id| id as usize + 1).max().unwrap_or(0);
        self.layout.id_count().max(added)
    }

    /// The largest id [`Tokenizer::encode`] can produce or a caller can
    /// name: the vocabulary, the added tokens, the ids the post-processor
    /// adds and the unknown token. A model's embedding must have more rows
    /// than this (the loader checks it); `None` for a section with no ids.
    pub fn max_token_id(&self) -> Option<u32> {
        let p = &self.layout.pipeline;
        let vocab = self.layout.id_count().checked_sub(1).and_then(|i| u32::try_from(i).ok());
        vocab
            .into_iter()
            .chain(p.added.iter().map(|t| t.id))
            .chain(p.prefix.iter().copied())
            .chain(p.suffix.iter().copied())
            .chain(p.model.unk)
            .max()
    }
}
