//! Writes fuzz input into a fresh temporary model source, because the
//! compiler's ingest readers open paths (they memory-map what they read),
//! not byte slices. Shared by the GGUF and safetensors targets.

use std::path::Path;

use mlxcel_compiler::ingest::SourceModel;

/// Opens `path` the way `mlxcel-compile` does and, if it opened, reads
/// everything a compile would read before converting: tokenizer, generation
/// defaults and every tensor. Nothing here may panic.
pub fn open_and_read(path: &Path) {
    let Ok(model) = SourceModel::open(path) else { return };
    let _ = model.tokenizer();
    let _ = model.generation();
    let _ = model.source_files();
    for info in model.tensors() {
        // Bounded: a tiny fuzz input cannot hold a large tensor, and a
        // reader that claims one anyway must refuse it, not allocate it.
        let _ = model.load(info);
    }
}
