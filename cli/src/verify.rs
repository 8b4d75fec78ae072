//! `mlxcel verify`: hash every byte with a progress bar, then run the
//! runtime's whole-bundle check (what `run` would refuse, without computing).

use std::path::Path;

use anyhow::{Context, Result, bail};
use mlxcel_bundle::{Bundle, BundleError, hex};
use mlxcel_cli::integrity::verify_every_byte;

use crate::output::{Stdout, note};

/// Verifies the bundle at `path`, drawing a progress bar on stderr (only when
/// it is a terminal). Prints one line per mismatch on stderr and fails when
/// there is any.
pub fn run(out: &Stdout, path: &Path) -> Result<()> {
    crate::check_bundle_path(path)?;
    let bundle = Bundle::open(path).with_context(|| format!("opening {}", path.display()))?;
    match verify_every_byte(&bundle) {
        Ok(report) => {
            // The bytes are the ones hashed; now what `run` builds from them
            // (config, tensors, tokenizer, chat template under its fuel,
            // generation defaults, token ids against the embedding).
            mlxcel_runtime::check::check_bundle(path).map_err(|e| {
                anyhow::anyhow!(
                    "{}: every byte matches its hash, but `run` would refuse the bundle: {e}",
                    path.display()
                )
            })?;
            out.line(&format!(
                "OK {}: {} bytes verified ({} tensors, {} sections), root hash {}",
                path.display(),
                report.checked_bytes,
                report.tensors,
                report.sections,
                hex(&bundle.root_hash())
            ))
        }
        Err(BundleError::VerifyFailed { failures }) => {
            for failure in &failures {
                note!("MISMATCH {failure}");
            }
            bail!("{}: verification failed: {} problem(s)", path.display(), failures.len())
        }
        Err(e) => Err(e).with_context(|| format!("verifying {}", path.display())),
    }
}
