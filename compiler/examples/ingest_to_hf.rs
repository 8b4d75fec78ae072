//! Writes any source model ingest reads (GGUF, Hugging Face or MLX directory)
//! back out as a plain Hugging Face directory of float safetensors
//! ([`mlxcel_compiler::ingest::export::write_hf_directory`]).
//!
//! ```text
//! cargo run --release -p mlxcel-compiler --example ingest_to_hf -- MODEL OUTDIR [f32|f16|bf16]
//! ```

use mlxcel_compiler::ingest::{FloatDtype, SourceModel, export};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(src), Some(out)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: ingest_to_hf MODEL OUTDIR [f32|f16|bf16]");
        std::process::exit(2);
    };
    let dtype = match args.get(3).map(String::as_str) {
        None | Some("bf16") => FloatDtype::BF16,
        Some("f16") => FloatDtype::F16,
        Some("f32") => FloatDtype::F32,
        Some(other) => return Err(format!("unknown dtype {other} (f32, f16 or bf16)").into()),
    };
    let model = SourceModel::open(src)?;
    export::write_hf_directory(&model, std::path::Path::new(out), dtype)?;
    println!("{out}: {} tensors, {}", model.tensors().len(), model.config().architecture);
    Ok(())
}
