//! Whole files: open (header, manifest hash, bytecheck, every bound), then
//! read every view and verify. Seeded with valid bundles; mutations in the
//! data area exercise verify, those in the header its checks.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(bundle) = mlxcel_bundle::Bundle::from_bytes(data) {
        common::exercise(&bundle);
    }
});
