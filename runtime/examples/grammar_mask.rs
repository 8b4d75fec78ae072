//! Times constrained decoding's per-token work on a bundle's vocabulary:
//! building the grammar compiler, compiling a schema, and each step's mask
//! and commit while following a document the schema allows (the output of
//! an answer, token by token, as the engine would see it).
//!
//! ```text
//! cargo run --release -p mlxcel-runtime --example grammar_mask -- BUNDLE [SCHEMA.json DOCUMENT.json]
//! ```
//!
//! Without a schema: a JSON array of 40 integers in 0..=999 and a document
//! of it. Prints the median and worst mask time per token (bench/structured.sh
//! measures the same end to end in the server).

use std::time::Instant;

use mlxcel_runtime::constraint::{ConstraintCompiler, Grammar};
use mlxcel_runtime::loader::{LoadOptions, load};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(bundle) = args.first() else {
        eprintln!("usage: grammar_mask BUNDLE [SCHEMA.json DOCUMENT.json]");
        std::process::exit(2);
    };
    let (schema, document) = match (args.get(1), args.get(2)) {
        (Some(s), Some(d)) => (serde_json::from_slice(&std::fs::read(s)?)?, std::fs::read_to_string(d)?),
        _ => {
            let numbers: Vec<String> = (0..40).map(|i| ((i * 37) % 1000).to_string()).collect();
            (
                serde_json::json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
                                   "minItems": 40, "maxItems": 40}),
                format!("[{}]", numbers.join(", ")),
            )
        }
    };
    let model = load(std::path::Path::new(bundle), &LoadOptions::default())?;
    let vocab = model.config.vocab_size;
    // What the bundle's token-bytes section saves: decoding every token.
    let t = Instant::now();
    model.tokenizer.vocabulary_bytes(vocab)?;
    let read = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    model.tokenizer.compute_vocabulary_bytes(vocab)?;
    println!(
        "token bytes: {read:.1} ms as the engine gets them, {:.1} ms decoding every token",
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    let compiler = ConstraintCompiler::new(&model.tokenizer, vocab)?;
    println!("grammar compiler for {vocab} tokens: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let t = Instant::now();
    let mut constraint = compiler.compile(&Grammar::JsonSchema(schema))?;
    println!("schema compiled: {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
    let tokens = model.tokenizer.encode(&document, false)?;
    let mut times = Vec::with_capacity(tokens.len());
    let mut logits = vec![0f32; vocab];
    for &token in &tokens {
        logits.fill(0.0);
        let t = Instant::now();
        constraint.mask(&mut logits)?;
        constraint.commit(token)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if logits[token as usize] == f32::NEG_INFINITY {
            return Err(format!("token {token} of the document was masked out").into());
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{} tokens: mask + commit median {:.3} ms, p90 {:.3} ms, worst {:.3} ms, total {:.1} ms",
        times.len(),
        times[times.len() / 2],
        times[times.len() * 9 / 10],
        times[times.len() - 1],
        times.iter().sum::<f64>()
    );
    Ok(())
}
