//! The GGUF reader as `mlxcel-compile` uses it (`SourceModel::open` on a
//! `.gguf` file, then its tokenizer, generation defaults and tensors). The
//! input is the whole file. Seeded with tiny valid GGUF files written by the
//! adversarial corpus generator (`make fuzz` copies them in).
#![no_main]

mod source_file;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|file: &[u8]| {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, file).expect("write the input");
    source_file::open_and_read(&path);
});
