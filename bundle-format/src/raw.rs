//! Building bundle bytes from parts, in memory: for tests, fuzzing and
//! tooling that rewrites a manifest without touching the data (the data
//! area, and with it every tensor hash, stays as it is).

use crate::header::Header;
use crate::manifest::Manifest;
use crate::writer::{align_up, encode_manifest};
use crate::{ALIGNMENT, HEADER_LEN, Result};

/// Builds a complete file from a data area and raw manifest bytes: the data
/// area (bytes before the manifest; its first 128 bytes are replaced by the
/// header) is zero-padded to a multiple of 16384, the manifest appended and
/// a header with correct hashes written. The manifest bytes are not checked,
/// so this also builds structurally broken bundles with valid hashes.
pub fn assemble(data_area: &[u8], manifest_bytes: &[u8]) -> Vec<u8> {
    let manifest_offset = align_up((data_area.len() as u64).max(ALIGNMENT));
    let mut file = Vec::with_capacity(manifest_offset as usize + manifest_bytes.len());
    file.extend_from_slice(data_area);
    file.resize(manifest_offset as usize, 0);
    file.extend_from_slice(manifest_bytes);
    let header = Header::new(manifest_offset, manifest_bytes.len() as u64, *blake3::hash(manifest_bytes).as_bytes());
    file[..HEADER_LEN].copy_from_slice(&header.to_bytes());
    file
}

/// Replaces the manifest of `file` (a bundle's bytes; only its header's
/// `manifest_offset` is trusted, and clamped to the file) with `manifest`.
pub fn replace_manifest(file: &[u8], manifest: &Manifest) -> Result<Vec<u8>> {
    let data_end = Header::parse(file).map(|h| h.manifest_offset).unwrap_or(file.len() as u64);
    let data_end = usize::try_from(data_end).unwrap_or(usize::MAX).min(file.len());
    let bytes = encode_manifest(manifest)?;
    Ok(assemble(&file[..data_end], &bytes))
}
