//! Constrained decoding: a grammar (a JSON schema, any JSON object, or a
//! Lark grammar) that every generated token must keep the output inside,
//! enforced with llguidance — the library vLLM, SGLang and llama.cpp use.
//!
//! A [`Grammar`] is data (it travels in [`GenerationOptions`]); a
//! [`ConstraintCompiler`], built once per model from its tokenizer's
//! vocabulary, turns one into a [`Constraint`]: a matcher that gives the
//! tokens allowed at the next step ([`Constraint::mask`]) and follows the
//! tokens chosen ([`Constraint::commit`]). A grammar that cannot be compiled,
//! or uses a construct llguidance does not support, is refused with the
//! reason ([`Error::InvalidParameter`] naming `grammar`), never silently
//! dropped: the caller gets enforced output or an error.
//!
//! [`GenerationOptions`]: crate::generate::GenerationOptions

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this JSON Schema.
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark syntax (`start: ...`).
    Lark(String),
}

impl Grammar {
    /// What `Error::InvalidParameter` names when this grammar is refused.
    fn describe(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "the JSON object grammar",
            Grammar::JsonSchema(_) => "the JSON schema",
            Grammar::Lark(_) => "the Lark grammar",
        }
    }

    fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema.clone())),
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        }
    }
}

/// A Lark rule body (`%json {...}`) that matches JSON valid against
/// `schema`, laid out as [`Grammar::JsonSchema`] lays it out: what a Lark
/// grammar embeds for a JSON part (tool-call arguments).
pub fn lark_json(schema: &serde_json::Value) -> String {
    format!("%json {}", compact(schema.clone()))
}

/// A Lark string literal matching exactly `text` (Lark strings are JSON strings).
pub fn lark_literal(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// JSON laid out as `{"a": 1, "b": [2, 3]}`, one space after `:` and `,`
/// and nowhere else, unless the schema sets llguidance's own `x-guidance`
/// options. llguidance's default allows any whitespace between tokens,
/// which lets a model pad without end (a known way constrained JSON never
/// finishes); a fixed layout ends every value.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(object) = schema.as_object_mut()
        && !object.contains_key("x-guidance")
    {
        object.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// Token byte strings longer than this are left out of the trie (never
/// allowed under a grammar): the trie is walked recursively, one level per
/// byte, and no real vocabulary comes near it.
const MAX_TOKEN_BYTES: usize = 1024;

/// The vocabulary as llguidance sees it: each token's bytes (special tokens
/// as 0xFF + their text, so that no output text can spell them) and the end
/// tokens. Every token is sampled under a mask (none is forced), so
/// llguidance's own tokenization of grammar strings only has to spell the
/// right bytes: the trie's greedy tokenization, declared non-canonical.
struct Vocabulary {
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Compiles grammars for one model: holds the vocabulary trie and
/// llguidance's parser factory (building them walks the whole vocabulary,
/// tens of milliseconds; compiling a grammar is then cheap).
pub struct ConstraintCompiler {
    factory: ParserFactory,
}

impl ConstraintCompiler {
    /// The compiler for a model whose logits have `vocab_size` entries and
    /// whose tokenizer is `tokenizer` (end tokens: its EOS ids; the tokens'
    /// bytes: [`Tokenizer::vocabulary_bytes`], the bundle's when it stores them).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<ConstraintCompiler> {
        let refuse = |message: String| Error::Config(format!("building the grammar vocabulary: {message}"));
        let vocab = u32::try_from(vocab_size).map_err(|_| refuse(format!("{vocab_size} tokens")))?;
        let eos: Vec<u32> = tokenizer.eos_ids().iter().copied().filter(|&t| t < vocab).collect();
        let Some(&first_eos) = eos.first() else {
            return Err(refuse("the tokenizer has no end token inside the vocabulary".into()));
        };
        let table = tokenizer.vocabulary_bytes(vocab_size)?;
        let words: Vec<Vec<u8>> = (0..vocab).map(|id| grammar_bytes(table.get(id))).collect();
        // TokTrie asserts its invariants; the words are checked above (count,
        // lengths), so a panic here is a bug, reported as an error.
        let trie =
            std::panic::catch_unwind(|| TokTrie::from(&TokRxInfo::new(vocab, first_eos), &words).with_eos_tokens(&eos))
                .map_err(|_| refuse("the token trie could not be built".into()))?;
        let env: TokEnv = Arc::new(Vocabulary { trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| refuse(e.to_string()))?;
        factory.quiet();
        Ok(ConstraintCompiler { factory })
    }

    /// Compiles `grammar`; refused with the reason when llguidance cannot
    /// (a syntax error, an unsupported keyword or construct).
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        let refused = |e: &dyn std::fmt::Display| Error::InvalidParameter {
            name: "grammar",
            message: format!("{} cannot be enforced: {e}", grammar.describe()),
        };
        let parser = self.factory.create_parser(grammar.to_llguidance()).map_err(|e| refused(&e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(refused(&e));
        }
        Ok(Constraint { matcher, prepared: None })
    }
}

/// A token's bytes as they appear in the middle of an output
/// ([`Tokenizer::vocabulary_bytes`]), for the trie: special tokens marked,
/// over-long ones left out.
fn grammar_bytes(token: Option<(&[u8], bool)>) -> Vec<u8> {
    match token {
        Some((bytes, special)) if !bytes.is_empty() && bytes.len() <= MAX_TOKEN_BYTES => {
            let marker = special.then_some(TokTrie::SPECIAL_TOKEN_MARKER);
            marker.into_iter().chain(bytes.iter().copied()).collect()
        }
        _ => Vec::new(),
    }
}

/// One sequence's grammar state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// The next step's allowed tokens, computed ahead
    /// ([`Constraint::prepare`]) while the forward pass runs.
    prepared: Option<std::result::Result<SimpleVob, String>>,
}

impl Constraint {
    /// Computes the tokens allowed next, for the following
    /// [`Constraint::mask`]: the engine calls it on a worker thread while
    /// the decode step that produces the logits runs, or after it
    /// ([`crate::engine::MaskTiming`]).
    pub fn prepare(&mut self) {
        if self.prepared.is_none() {
            self.prepared = Some(self.matcher.compute_mask_or_eos().map_err(|e| e.to_string()));
        }
    }

    /// Sets the logits of every token the grammar does not allow next to
    /// −∞ (when the grammar is complete only end tokens remain). An error
    /// when no token is allowed at all (the matcher failed).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let prepared = match self.prepared.take() {
            Some(prepared) => prepared,
            None => self.matcher.compute_mask_or_eos().map_err(|e| e.to_string()),
        };
        let allowed = prepared.map_err(Error::Grammar)?;
        let mut any = false;
        for (id, l) in logits.iter_mut().enumerate() {
            if id < allowed.len() && allowed.is_allowed(id as TokenId) {
                any = true;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if !any {
            return Err(Error::Grammar("the grammar allows no token at this point".into()));
        }
        Ok(())
    }

    /// Follows the chosen token (one the last [`Constraint::mask`] allowed).
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.prepared = None;
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| Error::Grammar(e.to_string()))
    }

    /// Whether the grammar is complete (only end tokens are allowed now).
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte-level vocabulary: token i < 256 is byte i, then an end token.
    pub(crate) fn compiler() -> ConstraintCompiler {
        let mut vocab = serde_json::Map::new();
        let alphabet: Vec<char> = (0u8..=255).map(byte_level_char).collect();
        for (i, c) in alphabet.iter().enumerate() {
            vocab.insert(c.to_string(), i.into());
        }
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 256, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false,
                              "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}
        });
        let tokenizer = Tokenizer::from_json(json.to_string().as_bytes(), vec![256], None).unwrap();
        ConstraintCompiler::new(&tokenizer, 260).unwrap()
    }

    fn byte_level_char(b: u8) -> char {
        let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
        if printable(b) {
            return b as char;
        }
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + rank).unwrap()
    }

    /// Follows `text` byte by byte through the constraint; each byte must
    /// be allowed when it comes.
    pub(crate) fn walk(c: &mut Constraint, text: &str) -> Result<()> {
        for b in text.bytes() {
            let mut logits = vec![0.0f32; 260];
            c.mask(&mut logits)?;
            if logits[b as usize] == f32::NEG_INFINITY {
                return Err(Error::Grammar(format!("byte {:?} refused", b as char)));
            }
            c.commit(u32::from(b))?;
        }
        Ok(())
    }

    #[test]
    fn a_schema_allows_exactly_its_documents() {
        let compiler = compiler();
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2]}},
            "required": ["ok", "n"],
            "additionalProperties": false
        });
        let grammar = Grammar::JsonSchema(schema);
        let mut c = compiler.compile(&grammar).unwrap();
        walk(&mut c, r#"{"ok": true, "n": 2}"#).unwrap();
        assert!(c.is_complete());
        // After the document only the end token is left.
        let mut logits = vec![0.0f32; 260];
        c.mask(&mut logits).unwrap();
        let allowed: Vec<usize> = (0..260).filter(|&i| logits[i] > f32::NEG_INFINITY).collect();
        assert_eq!(allowed, vec![256]);

        for bad in [r#"{"ok": 1"#, r#"{"n": 2"#, r#"{"ok":true"#, r#"{"ok": true, "n": 3"#, r#"[1]"#] {
            let mut c = compiler.compile(&grammar).unwrap();
            assert!(walk(&mut c, bad).is_err(), "{bad} was allowed");
        }
    }

    #[test]
    fn json_object_and_lark() {
        let compiler = compiler();
        let mut c = compiler.compile(&Grammar::JsonObject).unwrap();
        walk(&mut c, r#"{"a": [1, {"b": null}], "c": "d"}"#).unwrap();
        assert!(c.is_complete());
        let mut c = compiler.compile(&Grammar::JsonObject).unwrap();
        assert!(walk(&mut c, "[]").is_err());

        let lark = Grammar::Lark(r#"start: "yes" | "no""#.into());
        let mut c = compiler.compile(&lark).unwrap();
        walk(&mut c, "no").unwrap();
        assert!(c.is_complete());
        let mut c = compiler.compile(&lark).unwrap();
        assert!(walk(&mut c, "maybe").is_err());
    }

    #[test]
    fn what_cannot_be_enforced_is_refused_with_the_reason() {
        let compiler = compiler();
        let refused = |g: Grammar| compiler.compile(&g).err().map(|e| e.to_string()).expect("refused");
        let e = refused(Grammar::Lark("start: (".into()));
        assert!(e.starts_with("invalid parameter grammar: the Lark grammar cannot be enforced:"), "{e}");
        // A validation keyword llguidance does not implement is named (an
        // unknown keyword is an annotation, ignored as JSON Schema says).
        let e = refused(Grammar::JsonSchema(serde_json::json!({"type": "array", "uniqueItems": true})));
        assert!(e.contains("uniqueItems"), "{e}");
        let e = refused(Grammar::JsonSchema(serde_json::json!({"type": "string", "format": "bogus"})));
        assert!(e.contains("bogus"), "{e}");
        let e = refused(Grammar::JsonSchema(serde_json::json!({"$ref": "https://example.com/s.json"})));
        assert!(e.contains("the JSON schema cannot be enforced"), "{e}");
    }
}
