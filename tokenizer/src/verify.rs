//! Checks a compiled tokenizer against Hugging Face `tokenizers` on the same
//! `tokenizer.json`: encode (with and without special tokens), decode (with
//! and without skipping them) and every id's text, on a corpus of prose,
//! code, whitespace runs, numbers, many scripts, emoji, every added token in
//! context and pseudo-random strings.

use crate::Tokenizer;
use crate::error::{Result, TokenizerError};

/// Texts every tokenizer is checked on (plus the generated ones).
const CORPUS: &[&str] = &[
    "",
    " ",
    "\n",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they've done it, haven't they? We'll see; you'd know. She's here. It'S LOUD.",
    "1234567890 3.14159 1,000,000 2026-11-30 12:30:59 +44 (0)20 7946 0958 0x1F 1e-9",
    "  leading spaces",
    "trailing spaces   ",
    "a\n\nb\n\n\nc",
    "\t\ttabs\tand\ttext",
    "   \n  \n ",
    "multiple     spaces    between",
    "Ünïcödé façade naïve résumé coöperate",
    "日本語のテキストです。東京は大きい。",
    "中文测试，标点符号！",
    "한국어 문장입니다.",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "Ελληνικά γράμματα",
    "emoji 🎉🚀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "combining e\u{301} and n\u{303}, zero\u{200b}width, nbsp\u{a0}here",
    "fn main() {\n    println!(\"hi {}\", 42);\n}\n",
    "<div class=\"x\">&amp; <b>bold</b></div>",
    "def f(x):\n\treturn x**2  # comment\n",
    "!!!??? ... --- ___ *** ((())) [[]] {{}}",
    "HELLO World hElLo wORLD",
    "\u{2581}metaspace\u{2581}chars\u{2581} and <0x41> literal byte text",
    "a",
    "  ",
    "\r\n\r\nwindows\r\nlines",
    "tab\t \t mixed \u{3000}ideographic space",
];

/// Characters the generated strings are drawn from.
const POOL: &[char] = &[
    'a', 'b', 'e', 'z', 'A', 'Q', '0', '7', '9', ' ', ' ', ' ', '\n', '\t', '.', ',', '\'', '"', '-', '_', '<', '>',
    '|', '/', 'é', 'ß', 'ñ', '日', '本', '語', '한', 'ж', 'λ', '🎉', '👍', '\u{2581}', '\u{301}', '\u{a0}', '\r', '$',
];

/// Pseudo-random strings, the same on every run.
fn generated(count: usize) -> Vec<String> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count)
        .map(|_| {
            let len = (next() % 48) as usize + 1;
            (0..len).map(|_| POOL[(next() % POOL.len() as u64) as usize]).collect()
        })
        .collect()
}

fn mismatch(what: String) -> TokenizerError {
    TokenizerError::Mismatch(what)
}

/// Compares `compiled` with `reference` (loaded from the same
/// `tokenizer.json`); the first difference is the error.
pub fn against_reference(compiled: &Tokenizer, reference: &tokenizers::Tokenizer) -> Result<()> {
    let mut texts: Vec<String> = CORPUS.iter().map(|s| s.to_string()).collect();
    // Every added token in context (a sample of at most 256, spread over the list).
    let added = &compiled.pipeline().added;
    let step = added.len().div_ceil(256).max(1);
    for t in added.iter().step_by(step) {
        let c = &t.content;
        texts.push(format!("Hi {c} there{c}\n{c}{c} end"));
        texts.push(c.clone());
    }
    texts.extend(generated(400));

    let reference_encode = |text: &str, special: bool| -> Result<Vec<u32>> {
        reference
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| mismatch(format!("tokenizers cannot encode {text:?}: {e}")))
    };
    for text in &texts {
        for special in [false, true] {
            let ours = compiled.encode(text, special)?;
            let theirs = reference_encode(text, special)?;
            if ours != theirs {
                return Err(mismatch(format!(
                    "encoding {text:?} (special tokens {special}): {ours:?} instead of {theirs:?}"
                )));
            }
            for skip in [false, true] {
                let ours = compiled.decode(&theirs, skip)?;
                let theirs = reference
                    .decode(&theirs, skip)
                    .map_err(|e| mismatch(format!("tokenizers cannot decode {theirs:?}: {e}")))?;
                if ours != theirs {
                    return Err(mismatch(format!(
                        "decoding the ids of {text:?} (skip {skip}): {ours:?} instead of {theirs:?}"
                    )));
                }
            }
        }
    }
    let size = reference.get_vocab_size(true).max(compiled.vocab_size());
    for id in 0..size as u32 {
        let ours = compiled.id_to_token(id)?;
        let theirs = reference.id_to_token(id);
        if ours != theirs.as_deref() {
            return Err(mismatch(format!("the text of id {id}: {ours:?} instead of {theirs:?}")));
        }
        if let Some(text) = ours
            && compiled.token_to_id(text)? != reference.token_to_id(text)
        {
            return Err(mismatch(format!("the id of {text:?}")));
        }
    }
    // Decoding id sequences no text encodes to (bytes split mid-character,
    // special tokens anywhere).
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..300 {
        let len = 1 + (state % 12) as usize;
        let ids: Vec<u32> = (0..len)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((state >> 33) % size as u64) as u32
            })
            .collect();
        for skip in [false, true] {
            let ours = compiled.decode(&ids, skip)?;
            let theirs =
                reference.decode(&ids, skip).map_err(|e| mismatch(format!("tokenizers decoding {ids:?}: {e}")))?;
            if ours != theirs {
                return Err(mismatch(format!("decoding {ids:?} (skip {skip}): {ours:?} instead of {theirs:?}")));
            }
        }
    }
    Ok(())
}

/// Compiles `tokenizer_json` and checks the result against `tokenizers`;
/// returns the section bytes only when they agree.
pub fn compile_checked(tokenizer_json: &[u8]) -> Result<Vec<u8>> {
    let section = crate::compile(tokenizer_json)?;
    let compiled = Tokenizer::load(section.clone())?;
    let reference =
        tokenizers::Tokenizer::from_bytes(tokenizer_json).map_err(|e| TokenizerError::InvalidJson(e.to_string()))?;
    against_reference(&compiled, &reference)?;
    Ok(section)
}
