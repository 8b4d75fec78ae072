//! Opens a source model and walks it the way the compile pipeline will: one
//! tensor at a time, dropping each before the next. Prints a summary; run it
//! under `/usr/bin/time -v` to measure peak RSS.
//!
//! ```text
//! cargo run --release -p mlxcel-compiler --example ingest_walk -- MODEL [native|float|tokenizer]
//! ```

use std::time::Instant;

use mlxcel_compiler::ingest::{SourceModel, TensorData};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(src) = args.get(1) else {
        eprintln!("usage: ingest_walk MODEL [native|float|tokenizer]");
        std::process::exit(2);
    };
    let mode = args.get(2).map(String::as_str).unwrap_or("native");
    let t0 = Instant::now();
    let model = SourceModel::open(src)?;
    println!(
        "open: {:?}, {} tensors, {} ({:?})",
        t0.elapsed(),
        model.tensors().len(),
        model.config().architecture,
        model.format()
    );
    let t1 = Instant::now();
    match mode {
        "tokenizer" => {
            let tok = model.tokenizer()?;
            println!("tokenizer.json: {} bytes in {:?}", tok.tokenizer_json.len(), t1.elapsed());
        }
        "float" => {
            let mut bytes = 0usize;
            for t in model.tensors() {
                bytes += model.load_float(t)?.data.len();
            }
            println!("load_float: {bytes} bytes in {:?}", t1.elapsed());
        }
        _ => {
            let (mut affine, mut float, mut bytes) = (0, 0, 0usize);
            for t in model.tensors() {
                match model.load(t)? {
                    TensorData::Affine(q) => {
                        affine += 1;
                        bytes += q.weight.len() + q.scales.data.len() + q.biases.data.len();
                    }
                    TensorData::Float(f) => {
                        float += 1;
                        bytes += f.data.len();
                    }
                }
            }
            println!("load: {affine} affine, {float} float, {bytes} bytes in {:?}", t1.elapsed());
        }
    }
    Ok(())
}
