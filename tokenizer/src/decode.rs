//! Ids to text: the decoder chain, as `tokenizers` 0.23 runs it.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::Tokenizer;
use crate::encode::bytes_to_unicode;
use crate::error::Result;
use crate::pipeline::{Decoder, PrependScheme};

fn byte_of_stand_in() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| bytes_to_unicode().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect())
}

/// The byte a `<0xXX>` token stands for.
fn fallback_byte(token: &str) -> Option<u8> {
    if token.len() == 6 && token.starts_with("<0x") && token.ends_with('>') {
        u8::from_str_radix(&token[3..5], 16).ok()
    } else {
        None
    }
}

fn flush_bytes(bytes: &mut Vec<u8>, out: &mut Vec<String>) {
    if bytes.is_empty() {
        return;
    }
    match String::from_utf8(std::mem::take(bytes)) {
        Ok(s) => out.push(s),
        Err(e) => out.extend(std::iter::repeat_n("\u{FFFD}".to_string(), e.as_bytes().len())),
    }
}

fn apply(decoder: &Decoder, tokens: Vec<String>) -> Vec<String> {
    match decoder {
        Decoder::ByteLevel => {
            let table = byte_of_stand_in();
            let mut bytes = Vec::new();
            for t in &tokens {
                let mapped: Option<Vec<u8>> = t.chars().map(|c| table.get(&c).copied()).collect();
                match mapped {
                    Some(b) => bytes.extend(b),
                    None => bytes.extend_from_slice(t.as_bytes()),
                }
            }
            vec![String::from_utf8_lossy(&bytes).into_owned()]
        }
        Decoder::Replace { pattern, content } => {
            tokens.into_iter().map(|t| t.replace(pattern.as_str(), content)).collect()
        }
        Decoder::ByteFallback => {
            let mut out = Vec::with_capacity(tokens.len());
            let mut pending = Vec::new();
            for t in tokens {
                match fallback_byte(&t) {
                    Some(b) => pending.push(b),
                    None => {
                        flush_bytes(&mut pending, &mut out);
                        out.push(t);
                    }
                }
            }
            flush_bytes(&mut pending, &mut out);
            out
        }
        Decoder::Fuse => vec![tokens.concat()],
        Decoder::Strip { content, start, stop } => tokens
            .into_iter()
            .map(|t| {
                let chars: Vec<char> = t.chars().collect();
                let mut from = 0;
                for (i, &c) in chars.iter().enumerate().take(*start) {
                    if c != *content {
                        break;
                    }
                    from = i + 1;
                }
                let mut to = chars.len();
                for i in 0..*stop {
                    // tokenizers indexes from the end without a bound check;
                    // stopping at the start is the same for every real token.
                    let Some(index) = chars.len().checked_sub(i + 1) else { break };
                    if chars[index] != *content {
                        break;
                    }
                    to = index;
                }
                chars[from..to.max(from)].iter().collect()
            })
            .collect(),
        Decoder::Metaspace { replacement, prepend } => tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                t.chars()
                    .filter_map(|c| {
                        if c == *replacement {
                            (i != 0 || *prepend == PrependScheme::Never).then_some(' ')
                        } else {
                            Some(c)
                        }
                    })
                    .collect()
            })
            .collect(),
    }
}

impl Tokenizer {
    /// The text of `ids`; `skip_special` drops special added tokens (by text,
    /// as `tokenizers` does). Ids that are no token are skipped.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut tokens: Vec<String> = Vec::with_capacity(ids.len());
        for &id in ids {
            if let Some(t) = self.id_to_token(id)?
                && (!skip_special || !self.special_texts.contains(t))
            {
                tokens.push(t.to_string());
            }
        }
        Ok(match &self.layout.pipeline.decoders {
            Some(chain) => chain.iter().fold(tokens, |tokens, d| apply(d, tokens)).concat(),
            None => tokens.join(" "),
        })
    }
}
