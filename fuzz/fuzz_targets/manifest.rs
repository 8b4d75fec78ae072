//! Manifest bytes only: the input becomes the manifest of a file whose
//! header hashes are made valid, so that every input reaches rkyv/bytecheck
//! validation and the semantic checks (bounds, overlaps, dtype × shape,
//! names) instead of stopping at a hash mismatch. Seeded with the manifests
//! of valid bundles.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use mlxcel_bundle::{ALIGNMENT, Bundle, raw};

/// A data area as large as the seed bundles', so their offsets stay in bounds.
const DATA_PAGES: usize = 12;

fuzz_target!(|manifest: &[u8]| {
    let data_area = vec![0u8; DATA_PAGES * ALIGNMENT as usize];
    let file = raw::assemble(&data_area, manifest);
    if let Ok(bundle) = Bundle::from_bytes(&file) {
        common::exercise(&bundle);
    }
});
