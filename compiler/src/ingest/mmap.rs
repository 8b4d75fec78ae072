//! Read-only memory maps of source files.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::error::{IngestError, Result};

/// Maps `path` read-only.
pub(crate) fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).map_err(|e| IngestError::io(path, e))?;
    // SAFETY: the one `unsafe` of this crate (memmap2's accepted exception).
    // `Mmap::map` is unsafe because another process could truncate or modify
    // the file while it is mapped. Source models are inputs we only read; every
    // access through the map is bounds-checked against the length it had when
    // mapped, and a concurrent truncation is outside what a compiler can guard
    // against (it would fault, as reading any mapped file would).
    #[allow(unsafe_code)]
    let map = unsafe { Mmap::map(&file) }.map_err(|e| IngestError::io(path, e))?;
    Ok(map)
}
