//! The model code's own errors: a config it cannot build a network from.
//! A backend's errors (a missing weight, a failed op) are the backend's
//! type, into which these convert ([`crate::Backend::Error`]).

use std::num::NonZeroUsize;

/// What can be wrong with a config, seen from the model code.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The config lacks something the architecture needs, or its parts do
    /// not fit together.
    #[error("model: {0}")]
    Config(String),
    /// A size or window is out of range.
    #[error("{name}: {message}")]
    InvalidParameter {
        /// The config key or option (`sliding_window`, `max_kv_size`).
        name: &'static str,
        /// What is wrong with its value.
        message: String,
    },
}

/// The model code's results.
pub type Result<T> = std::result::Result<T, Error>;

/// The most positions an attention window may span (`sliding_window`,
/// `--max-kv-size`): 2^24, 64 times the longest context of the
/// architectures mlxcel knows, so a larger value is a typo or an attack,
/// refused up front.
pub const MAX_WINDOW: usize = 1 << 24;

/// Checks an attention window: at least one position and at most
/// [`MAX_WINDOW`]. `name` is the parameter the error names.
pub fn check_window(name: &'static str, positions: usize) -> Result<NonZeroUsize> {
    match NonZeroUsize::new(positions) {
        None => Err(Error::InvalidParameter { name, message: "must be at least 1 position".into() }),
        Some(_) if positions > MAX_WINDOW => Err(Error::InvalidParameter {
            name,
            message: format!("{positions} positions is more than the limit of {MAX_WINDOW}"),
        }),
        Some(w) => Ok(w),
    }
}
