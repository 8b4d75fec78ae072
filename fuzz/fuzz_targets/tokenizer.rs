//! The compiled tokenizer section as the runtime loads it from a bundle
//! (`mlxcel_tokenizer::Tokenizer::load`), then encode and decode. The input's
//! first byte picks its form: even, the rest is a compiled section loaded
//! as is (the bytes a hostile bundle carries, behind a valid hash); odd, the
//! rest is a `tokenizer.json` that `compile` turns into a section first (what
//! the compiler does). A loaded tokenizer encodes a fixed text and the
//! input's own text, and decodes ids in and out of its vocabulary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_tokenizer::Tokenizer;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else { return };
    let section = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        match mlxcel_tokenizer::compile(rest) {
            Ok(section) => section,
            Err(_) => return,
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
