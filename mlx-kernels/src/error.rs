//! Errors of the MLX layer.

/// An error from MLX or from the checks this crate makes before calling it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MLX refused the operation (bad shape, dtype or argument); the message is MLX's own.
    #[error("MLX {op}: {message}")]
    Mlx {
        /// The operation that failed.
        op: &'static str,
        /// MLX's explanation.
        message: String,
    },
    /// An argument was rejected before reaching MLX.
    #[error("{op}: {message}")]
    Invalid {
        /// The operation that was called.
        op: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The requested device cannot be used.
    #[error("{0}")]
    Device(String),
}

/// The result of fallible MLX operations.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn mlx(op: &'static str, e: cxx::Exception) -> Error {
        Error::Mlx { op, message: e.what().to_string() }
    }

    pub(crate) fn invalid(op: &'static str, message: impl Into<String>) -> Error {
        Error::Invalid { op, message: message.into() }
    }
}
