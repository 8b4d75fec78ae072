//! Hashing every byte of a bundle against its own hashes, with a progress
//! bar: what `mlxcel verify` does first, and what `mlxcel pull` does to a
//! download before it trusts it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlxcel_bundle::{Bundle, BundleError, VerifyReport};

/// The style of mlxcel's byte-counting progress bars (verify, pull).
pub fn bytes_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A progress bar of `total` bytes on stderr (drawn only when stderr is a terminal).
pub fn bytes_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(bytes_style());
    bar
}

/// Hashes every tensor, section and padding byte of an opened bundle (its
/// header, manifest and root hash were checked on open) against the
/// bundle's own hashes ([`Bundle::verify`]), showing progress. A mismatch is
/// [`BundleError::VerifyFailed`] listing every region that differs.
pub fn verify_every_byte(bundle: &Bundle) -> Result<VerifyReport, BundleError> {
    let bar = bytes_bar(bundle.header().file_len);
    let mut current = String::new();
    let result = bundle.verify(|p| {
        bar.set_position(p.checked_bytes);
        let name = p.region.to_string();
        if name != current {
            bar.set_message(name.clone());
            current = name;
        }
    });
    bar.finish_and_clear();
    result
}
