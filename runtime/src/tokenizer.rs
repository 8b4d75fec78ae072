//! The bundle's tokenizer — the compiled one when the bundle has it, else
//! `tokenizer.json` through Hugging Face `tokenizers` — and streaming
//! detokenization that never splits a UTF-8 character.
//!
//! Errors say they come from the bundle. `tokenizers` panics inside onig
//! when a pre-tokenizer regex backtracks past its limit; on that path the
//! text is first searched with the same regexes under this project's
//! limits ([`mlxcel_tokenizer::regex`]), which refuses such an input with
//! an error, and a panic that still escapes (the regex sees normalized
//! pieces, not the raw text) is caught and reported as an error.

use mlxcel_bundle::kinds::TOKENIZER_TOKEN_BYTES_KEY;
use mlxcel_tokenizer::token_bytes::TokenBytes;

use crate::error::{Error, Result};

/// Which implementation tokenizes.
enum Inner {
    /// The bundle's compiled tokenizer (loads in milliseconds).
    Compiled(Box<mlxcel_tokenizer::Tokenizer>),
    /// `tokenizer.json` parsed by `tokenizers` (bundles without a compiled
    /// tokenizer, or one of a newer layout), with its bounded regexes.
    Json(Box<tokenizers::Tokenizer>, Box<mlxcel_tokenizer::JsonGuard>),
}

/// A tokenizer and the special tokens generation needs.
pub struct Tokenizer {
    inner: Inner,
    eos: Vec<u32>,
    bos_text: Option<String>,
    eos_text: Option<String>,
    /// The bundle's token-bytes section ([`mlxcel_tokenizer::token_bytes`]),
    /// read when a grammar first needs it: most runs never do.
    token_bytes: Option<Box<dyn AsRef<[u8]> + Send + Sync>>,
}

fn compiled_error(e: mlxcel_tokenizer::TokenizerError) -> Error {
    Error::BundleTokenizer { section: mlxcel_bundle::kinds::TOKENIZER_COMPILED_KEY, message: e.to_string() }
}

fn json_error(e: impl std::fmt::Display) -> Error {
    Error::BundleTokenizer { section: "tokenizer.json", message: e.to_string() }
}

/// A [`json_guard`](mlxcel_tokenizer::json_guard) error without its own
/// "tokenizer.json:" (the section already says it).
fn guard_error(e: mlxcel_tokenizer::TokenizerError) -> Error {
    match e {
        mlxcel_tokenizer::TokenizerError::InvalidJson(message) => json_error(message),
        other => json_error(other),
    }
}

/// Runs a `tokenizers` call, turning a panic inside it (onig's
/// "retry-limit-in-match over") into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> tokenizers::Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(json_error),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            Err(json_error(format!("the tokenizers library failed {what}: {message}")))
        }
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` bytes; `eos` are the ids that end a generation,
    /// `bos`/`eos` texts are what chat templates call `bos_token`/`eos_token`.
    pub fn from_json(json: &[u8], eos: Vec<u32>, bos: Option<u32>) -> Result<Tokenizer> {
        let guard = mlxcel_tokenizer::json_guard(json).map_err(guard_error)?;
        let inner = tokenizers::Tokenizer::from_bytes(json).map_err(json_error)?;
        Tokenizer::with_specials(Inner::Json(Box::new(inner), Box::new(guard)), eos, bos)
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
        let mut t = Tokenizer { inner, eos, bos_text: None, eos_text: None, token_bytes: None };
        t.bos_text = bos.map(|id| t.id_to_token(id)).transpose()?.flatten();
        t.eos_text = t.eos.first().map(|&id| t.id_to_token(id)).transpose()?.flatten();
        Ok(t)
    }

    /// Gives it the bundle's token-bytes section, which
    /// [`Tokenizer::vocabulary_bytes`] then reads instead of decoding every
    /// token.
    pub fn set_token_bytes_section(&mut self, section: impl AsRef<[u8]> + Send + Sync + 'static) {
        self.token_bytes = Some(Box::new(section));
    }

    /// Every token's [`Tokenizer::output_bytes`] for ids `0..vocab_size`
    /// (the model's logits; ids the tokenizer lacks have no bytes): from
    /// the bundle's token-bytes section when it has one this build reads,
    /// else computed ([`Tokenizer::compute_vocabulary_bytes`]). A section
    /// that is malformed, or not of `vocab_size` tokens, is an error naming it.
    pub fn vocabulary_bytes(&self, vocab_size: usize) -> Result<TokenBytes> {
        let section_error = |message: String| Error::BundleTokenizer { section: TOKENIZER_TOKEN_BYTES_KEY, message };
        if let Some(section) = &self.token_bytes {
            match TokenBytes::parse((**section).as_ref()) {
                Ok(table) if table.len() == vocab_size => return Ok(table),
                Ok(table) => {
                    return Err(section_error(format!(
                        "{} tokens, but the model's vocabulary has {vocab_size}",
                        table.len()
                    )));
                }
                // A newer compiler's layout: the tokenizer still says the same.
                Err(mlxcel_tokenizer::TokenizerError::UnsupportedVersion { .. }) => {}
                Err(mlxcel_tokenizer::TokenizerError::MalformedTokenBytes { what, offset }) => {
                    return Err(section_error(format!("{what} (at byte offset {offset})")));
                }
                Err(e) => return Err(section_error(e.to_string())),
            }
        }
        self.compute_vocabulary_bytes(vocab_size)
    }

    /// Every token's [`Tokenizer::output_bytes`] for ids `0..vocab_size`,
    /// decoded one by one (what the compiler stores in the bundle).
    pub fn compute_vocabulary_bytes(&self, vocab_size: usize) -> Result<TokenBytes> {
        let mut table = TokenBytes::new();
        for id in 0..vocab_size {
            let id = u32::try_from(id).map_err(|_| Error::Tokenizer(format!("{vocab_size} tokens")))?;
            let (bytes, special) = self.output_bytes(id)?;
            table.push(&bytes, special).map_err(|e| Error::Tokenizer(e.to_string()))?;
        }
        Ok(table)
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
            Inner::Json(t, guard) => {
                for regex in &guard.split_regexes {
                    regex.find_all(text).map_err(json_error)?;
                }
                let enc = guarded("encoding", || t.encode(text, add_special))?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }

    /// The text of `ids`, without special tokens when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        match &self.inner {
            Inner::Compiled(t) => t.decode(ids, skip_special).map_err(compiled_error),
            Inner::Json(t, _) => guarded("decoding", || t.decode(ids, skip_special)),
        }
    }

    /// The text of a token id (an added token's content, else the vocabulary's spelling).
    pub fn id_to_token(&self, id: u32) -> Result<Option<String>> {
        match &self.inner {
            Inner::Compiled(t) => Ok(t.id_to_token(id).map_err(compiled_error)?.map(str::to_string)),
            Inner::Json(t, _) => Ok(t.id_to_token(id)),
        }
    }

    /// The bytes token `id` stands for (OpenAI's logprobs `bytes`). A token
    /// that is not whole UTF-8 on its own (part of a character) decodes to
    /// U+FFFD; its bytes then come from its spelling: a byte-fallback token
    /// (`<0xAB>`) or GPT-2's byte-level alphabet.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>> {
        let text = self.decode(&[id], false)?;
        if !text.contains('\u{FFFD}') {
            return Ok(text.into_bytes());
        }
        let Some(spelling) = self.id_to_token(id)? else { return Ok(text.into_bytes()) };
        if let Some(hex) = spelling.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'))
            && hex.len() == 2
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            return Ok(vec![byte]);
        }
        Ok(spelling.chars().map(byte_level_byte).collect::<Option<Vec<u8>>>().unwrap_or_else(|| text.into_bytes()))
    }

    /// The bytes token `id` adds when it follows other tokens (decoding it
    /// alone may drop a leading space: SentencePiece's `Strip`/`Metaspace`
    /// decoders), and whether it is a special token (one decoding with
    /// `skip_special` drops). Grammars ([`crate::constraint`]) match these.
    pub fn output_bytes(&self, id: u32) -> Result<(Vec<u8>, bool)> {
        let alone = self.token_bytes(id)?;
        let special = !alone.is_empty() && self.decode(&[id], true)?.is_empty();
        if special {
            return Ok((alone, true));
        }
        // Twice in a row, the second copy is decoded mid-stream.
        let twice = self.decode(&[id, id], false)?;
        if let Ok(first) = std::str::from_utf8(&alone)
            && !twice.contains('\u{FFFD}')
            && let Some(rest) = twice.strip_prefix(first)
            && !rest.is_empty()
        {
            return Ok((rest.as_bytes().to_vec(), false));
        }
        Ok((alone, false))
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
            Inner::Json(t, _) => Ok(t.token_to_id(text)),
        }
    }

    /// One more than the largest token id, added tokens included.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Compiled(t) => t.vocab_size(),
            Inner::Json(t, _) => {
                let added = t.get_added_tokens_decoder().keys().map(|&id| id as usize + 1).max().unwrap_or(0);
                t.get_vocab_size(false).max(added)
            }
        }
    }

    /// The largest id encoding can produce or a token can name: the
    /// vocabulary, added tokens and what the post-processor adds. The model's
    /// embedding must have more rows (the loader checks); `None` when the
    /// tokenizer has no ids at all.
    pub fn max_token_id(&self) -> Option<u32> {
        match &self.inner {
            Inner::Compiled(t) => t.max_token_id(),
            Inner::Json(t, guard) => t.get_vocab(true).into_values().chain(guard.declared_max_id).max(),
        }
    }
}

/// The byte a character of GPT-2's byte-level alphabet stands for: printable
/// bytes are themselves, the other 68 (controls, space, 127..=160, 173)
/// are U+0100.. in byte order.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
    let code = c as u32;
    if code < 256 {
        return printable(code as u8).then_some(code as u8);
    }
    (0..=255u8).filter(|&b| !printable(b)).nth((code - 256) as usize)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `tokenizers`-only tokenizer.json whose pre-tokenizer regex
    /// backtracks exponentially on a long word not followed by its end.
    fn backtracking_json() -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"(\w+\s?)*$"}, "behavior": "Isolated", "invert": false},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "a", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"a": {"id": "a", "ids": [7], "tokens": ["a"]}}},
            "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "vocab": {"a": 0, "!": 1, "aa": 2}, "merges": [["a", "a"]]}
        }))
        .unwrap()
    }

    /// `tokenizers` panicked inside onig ("retry-limit-in-match over", exit
    /// 101); now the input is refused with an error naming the bundle and
    /// the pattern.
    #[test]
    fn a_backtracking_regex_in_tokenizer_json_is_an_error() {
        let t = Tokenizer::from_json(&backtracking_json(), vec![1], None).unwrap();
        assert!(!t.is_compiled());
        assert_eq!(t.encode("aaaa", false).unwrap(), vec![2, 2]);
        let err = t.encode(&format!("{}!", "a".repeat(5000)), false).unwrap_err().to_string();
        assert!(
            err.starts_with(
                r#"the bundle's tokenizer.json section: regex "(\\w+\\s?)*$" gave up searching from byte 0"#
            ),
            "{err}"
        );
        // The post-processor's id counts as one the tokenizer can produce.
        assert_eq!(t.max_token_id(), Some(7));
    }

    /// The bundle's token-bytes section is what `vocabulary_bytes` gives;
    /// one of another layout version falls back to decoding; a malformed
    /// one, or one of another vocabulary size, is an error naming it.
    #[test]
    fn vocabulary_bytes_come_from_the_section_when_there_is_one() {
        let json = backtracking_json();
        let computed = Tokenizer::from_json(&json, vec![1], None).unwrap().compute_vocabulary_bytes(5).unwrap();
        // No decoder: `tokenizers` joins tokens with spaces, so mid-output
        // a token adds one.
        assert_eq!(computed.get(2), Some((b" aa".as_slice(), false)));
        assert_eq!(computed.get(4), Some((b"".as_slice(), false)), "past the tokenizer's vocabulary");
        let with = |section: Vec<u8>| {
            let mut t = Tokenizer::from_json(&json, vec![1], None).unwrap();
            t.set_token_bytes_section(section);
            t.vocabulary_bytes(5)
        };
        // A section that differs from what decoding gives shows which was read.
        let mut stored = TokenBytes::new();
        for word in [&b"x"[..], b"!", b"xx", b"", b""] {
            stored.push(word, false).unwrap();
        }
        assert_eq!(with(stored.to_section()).unwrap(), stored);
        let mut newer = stored.to_section();
        newer[4] = 9;
        assert_eq!(with(newer).unwrap(), computed);
        let err = with(stored.to_section()[..20].to_vec()).unwrap_err().to_string();
        assert!(err.starts_with("the bundle's token-bytes section: 5 tokens need 41 bytes"), "{err}");
        let mut short = TokenBytes::new();
        short.push(b"a", false).unwrap();
        let err = with(short.to_section()).unwrap_err().to_string();
        assert!(err.contains("1 tokens, but the model's vocabulary has 5"), "{err}");
    }

    #[test]
    fn byte_level_characters_map_back_to_their_bytes() {
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        assert_eq!(byte_level_byte('\u{0100}'), Some(0));
        // GPT-2's "Ġ" is the space.
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('\u{0143}'), Some(173));
        assert_eq!(byte_level_byte('\u{0144}'), None);
        assert_eq!(byte_level_byte(' '), None);
    }
}
