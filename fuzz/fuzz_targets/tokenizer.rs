//! The tokenizer sections as the runtime loads them from a bundle, then
//! used. The input's first byte picks its form, modulo 3: 0, the rest is a
//! compiled tokenizer section loaded as is (the bytes a hostile bundle
//! carries, behind a valid hash) by `mlxcel_tokenizer::Tokenizer::load`; 1,
//! the rest is a `tokenizer.json` that `compile` turns into a section first
//! (what the compiler does); 2, the rest is a `token-bytes` section
//! (`mlxcel_tokenizer::token_bytes`), which must write back byte for byte
//! when it reads. A loaded tokenizer encodes a fixed text and the input's
//! own text, and decodes ids in and out of its vocabulary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_tokenizer::Tokenizer;
use mlxcel_tokenizer::token_bytes::TokenBytes;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else { return };
    let section = match mode % 3 {
        0 => rest.to_vec(),
        1 => match mlxcel_tokenizer::compile(rest) {
            Ok(section) => section,
            Err(_) => return,
        },
        _ => {
            if let Ok(table) = TokenBytes::parse(rest) {
                assert_eq!(table.to_section(), rest, "a token-bytes section that reads must write back the same");
                for id in [0, table.len() as u32 / 2, table.len() as u32, u32::MAX] {
                    let _ = table.get(id);
                }
            }
            return;
        }
    };
    let Ok(tok) = Tokenizer::load(section) else { return };
    let text = String::from_utf8_lossy(rest);
    for t in ["Hello, world! 123 <|im_start|> \u{00e9}\u{4e2d}", &text[..text.len().min(256)]] {
        if let Ok(ids) = tok.encode(t, true) {
            let _ = tok.decode(&ids, false);
        }
    }
    let n = tok.vocab_size() as u32;
    let _ = tok.decode(&[0, n.saturating_sub(1), n, n.saturating_add(1), u32::MAX, 1 << 31], true);
    let _ = tok.id_to_token(n);
    let _ = tok.token_to_id("a");
});
