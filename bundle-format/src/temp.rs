//! The writer's temporary files, registered process-wide so that a signal
//! handler can remove them: a compile interrupted by SIGINT, SIGTERM or
//! SIGHUP must leave no `*.mlxb.tmp*` behind (docs/bundle-format.md), and
//! `Drop` does not run when a signal ends the process.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tempfile::NamedTempFile;

use crate::error::{BundleError, Result};

/// The paths of every live temporary bundle file of this process.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<PathBuf>> {
    // A panic elsewhere while holding the lock leaves the list intact.
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A temporary bundle file: removed on drop, and by
/// [`remove_temporary_files`] while it lives.
#[derive(Debug)]
pub(crate) struct TempBundleFile {
    /// `None` only once persisted.
    file: Option<NamedTempFile>,
    path: PathBuf,
}

impl TempBundleFile {
    /// Creates the file with `builder` in `dir` and registers it.
    pub(crate) fn create(builder: &tempfile::Builder<'_, '_>, dir: &Path) -> io::Result<TempBundleFile> {
        let mut live = live();
        let file = builder.tempfile_in(dir)?;
        let path = file.path().to_path_buf();
        live.push(path.clone());
        Ok(TempBundleFile { file: Some(file), path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn inner(&mut self) -> io::Result<&mut NamedTempFile> {
        self.file.as_mut().ok_or_else(|| io::Error::other("the temporary bundle was already renamed"))
    }

    pub(crate) fn as_file_mut(&mut self) -> io::Result<&mut std::fs::File> {
        Ok(self.inner()?.as_file_mut())
    }

    /// Renames the file to `target`. The registry's lock is held across the
    /// rename, so a signal handler removes either the temporary file or
    /// nothing, never a file that is being renamed.
    pub(crate) fn persist(mut self, target: &Path) -> Result<()> {
        let mut live = live();
        if let Some(file) = self.file.take() {
            file.persist(target).map_err(|e| BundleError::Io {
                action: "renaming the finished bundle to",
                path: target.to_path_buf(),
                cause: e.error,
            })?;
        }
        live.retain(|p| p != &self.path);
        Ok(())
    }
}

impl Write for TempBundleFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner()?.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner()?.flush()
    }
}

impl Drop for TempBundleFile {
    fn drop(&mut self) {
        live().retain(|p| p != &self.path);
    }
}

/// Removes every temporary bundle file this process is writing, and returns
/// how many were removed. For a signal-handling thread just before the
/// process exits. A rename in progress finishes first (it holds the same
/// lock), so the result is either a complete bundle under its final name or
/// no file at all; a writer that goes on after this call fails at its next
/// write or at the rename.
pub fn remove_temporary_files() -> usize {
    let mut live = live();
    let removed = live.iter().filter(|p| std::fs::remove_file(p).is_ok()).count();
    live.clear();
    removed
}
