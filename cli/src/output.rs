//! Where `mlxcel` writes, and how it ends.
//!
//! Every byte of output goes through [`Stdout`], which returns write errors
//! instead of panicking as `println!` does: a closed pipe (`mlxcel run ... |
//! head -c 10`) ends the command quietly with [`EXIT_BROKEN_PIPE`], a full
//! disk (`> /dev/full`) is an error naming stdout. Diagnostics go through
//! [`note!`], which never panics: a message that cannot reach stderr has
//! nowhere else to go, and the exit status still tells the outcome.

use std::fmt;
use std::io::{self, Write};

use anyhow::{Context, Result};

/// Success.
pub const EXIT_OK: u8 = 0;
/// An error, printed on stderr.
pub const EXIT_ERROR: u8 = 1;
/// The command line was wrong (clap's usage errors).
pub const EXIT_USAGE: u8 = 2;
/// Stopped by Ctrl-C (128 + SIGINT), as shells report an interrupted command.
pub const EXIT_INTERRUPTED: u8 = 130;
/// The reader of stdout went away (128 + SIGPIPE), as a command killed by
/// SIGPIPE reports; Rust ignores SIGPIPE, so the write fails instead.
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// The exit codes, for `mlxcel --help`.
pub const EXIT_CODES_HELP: &str = "Exit codes: 0 success, 1 error, 2 usage error (a bad flag or value), \
130 interrupted (Ctrl-C), 141 stdout closed (broken pipe).";

/// Writes a line on stderr, ignoring a failure (see the module's comment).
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::output::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use note;

/// Writes `args` on stderr, ignoring a failure (see the module's comment).
pub fn stderr(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args);
    let _ = err.flush();
}

/// The command was interrupted (Ctrl-C); ends the process with
/// [`EXIT_INTERRUPTED`] after the normal clean-up.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// Standard output, written and flushed piece by piece; every failure is an
/// error whose chain holds the `io::Error` (see [`exit_code`]).
pub struct Stdout(io::Stdout);

impl Stdout {
    /// The process's stdout.
    pub fn new() -> Stdout {
        Stdout(io::stdout())
    }

    /// Writes `text` and flushes it, so that streamed text shows as it comes
    /// and a closed reader is noticed at once.
    pub fn write(&self, text: &str) -> Result<()> {
        let mut out = self.0.lock();
        out.write_all(text.as_bytes()).and_then(|()| out.flush()).context("writing to stdout")
    }

    /// Writes `text` and a newline.
    pub fn line(&self, text: &str) -> Result<()> {
        let mut out = self.0.lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush())
            .context("writing to stdout")
    }
}

/// The exit code an error ends the process with: [`EXIT_BROKEN_PIPE`] when
/// stdout's reader went away, [`EXIT_INTERRUPTED`] after Ctrl-C, else
/// [`EXIT_ERROR`].
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if is_broken_pipe(error) {
        EXIT_BROKEN_PIPE
    } else if error.chain().any(|e| e.is::<Interrupted>()) {
        EXIT_INTERRUPTED
    } else {
        EXIT_ERROR
    }
}

/// Whether the error is a write to a pipe whose reader has gone.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|e| e.downcast_ref::<io::Error>().is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe))
}

/// The error's causes joined by ": ", each stated once. Libraries often
/// write their source into their own message and also return it as
/// `source()`, so `{:#}` would print it twice ("opening X: No such file
/// (os error 2): No such file (os error 2)"), and a context repeating a
/// library message that already names the file adds nothing: a cause whose
/// text the message before it already contains is dropped, and a context
/// that the next cause starts with gives way to it.
pub fn describe(error: &anyhow::Error) -> String {
    let mut kept: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || kept.iter().any(|k| k.contains(&text)) {
            continue;
        }
        if kept.last().is_some_and(|last| text.starts_with(last.as_str())) {
            kept.pop();
        }
        kept.push(text);
    }
    kept.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("opening model.mlxb: {0}")]
    struct Opening(#[source] io::Error);

    #[test]
    fn each_cause_is_stated_once() {
        let missing = || io::Error::new(io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let e = anyhow::Error::new(Opening(missing())).context("opening model.mlxb");
        assert_eq!(describe(&e), "opening model.mlxb: No such file or directory (os error 2)");
        let e = anyhow::Error::new(Opening(missing())).context("loading model.mlxb");
        assert_eq!(describe(&e), "loading model.mlxb: opening model.mlxb: No such file or directory (os error 2)");
        let e = anyhow::anyhow!("disk").context("writing to stdout");
        assert_eq!(describe(&e), "writing to stdout: disk");
    }

    #[test]
    fn exit_codes_follow_the_cause() {
        let pipe = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe)).context("writing to stdout");
        assert_eq!(exit_code(&pipe), EXIT_BROKEN_PIPE);
        assert_eq!(exit_code(&anyhow::Error::new(Interrupted)), EXIT_INTERRUPTED);
        let full = anyhow::Error::new(io::Error::from(io::ErrorKind::StorageFull)).context("writing to stdout");
        assert_eq!(exit_code(&full), EXIT_ERROR);
    }
}
