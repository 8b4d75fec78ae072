//! The surgery YAML parser (`Surgery::parse`), as `mlxcel-compile --surgery`
//! reads a file: any text must parse or give an error, never panic, and an
//! alias bomb must not expand without bound (libFuzzer's `-rss_limit_mb`
//! and `-timeout` turn that into a reported crash).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_surgery::Surgery;

fuzz_target!(|input: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(input) else { return };
    if let Ok(surgery) = Surgery::parse(yaml, std::path::Path::new("/nonexistent")) {
        for (op, _line) in &surgery.operations {
            let _ = (op.name(), op.describe());
        }
    }
});
