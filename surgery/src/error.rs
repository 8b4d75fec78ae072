//! Surgery errors: each names the operation (1-based, as in the file), its op
//! and its line.

/// A surgery file that cannot be parsed, validated or applied.
#[derive(Debug, thiserror::Error)]
pub enum SurgeryError {
    /// The file as a whole (syntax, version, top-level fields).
    #[error("surgery: {0}")]
    Parse(String),
    /// One operation.
    #[error("surgery operation #{index} ({op}{}): {message}", line.map_or(String::new(), |l| format!(", line {l}")))]
    Operation {
        /// 1-based position in `operations`.
        index: usize,
        /// The op name.
        op: String,
        /// The line the operation starts on.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The config the operations leave is one the runtime cannot use.
    #[error("surgery leaves an unusable model config: {0}")]
    Config(mlxcel_arch::ConfigError),
    /// Computing an edit failed in MLX. The error is in the message and not
    /// also a `source()`, so that a chain printer states it once.
    #[error("surgery on {tensor}: {error}")]
    Mlx {
        /// The tensor being edited.
        tensor: String,
        /// MLX's error.
        error: mlxcel_mlx::Error,
    },
}

/// The surgery result type.
pub type Result<T> = std::result::Result<T, SurgeryError>;
