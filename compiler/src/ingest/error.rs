//! The errors of ingest. Each names the file, and where it applies the tensor
//! and the byte offset.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while reading a source model.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The file or directory could not be opened or read.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error (in the message, not `source()`:
        /// a chain states each cause once).
        cause: std::io::Error,
    },
    /// A file the source needs is not there.
    #[error("{}: missing {what}", path.display())]
    Missing {
        /// The file that is missing (or the directory it should be in).
        path: PathBuf,
        /// What it should hold.
        what: String,
    },
    /// The file's structure is broken (bad magic, a length past the end, a
    /// malformed header).
    #[error("{}: at byte {offset}: {message}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the problem was found.
        offset: u64,
        /// What was wrong.
        message: String,
    },
    /// One tensor cannot be read or converted.
    #[error("{}: tensor {tensor} (data at byte {offset}): {message}", path.display())]
    Tensor {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor's name (canonical where known, else the file's).
        tensor: String,
        /// Where its data starts in the file.
        offset: u64,
        /// What was wrong.
        message: String,
    },
    /// A tensor's dtype is not one ingest can read.
    #[error("{}: tensor {tensor}: unknown or unsupported dtype {dtype}", path.display())]
    UnknownDtype {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The dtype as the file spells it.
        dtype: String,
    },
    /// A tensor's shape contradicts the model's configuration.
    #[error("{}: tensor {tensor}: shape {found:?} contradicts the config ({expected})", path.display())]
    ShapeMismatch {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor's canonical name.
        tensor: String,
        /// The shape the file declares.
        found: Vec<usize>,
        /// The shape the config implies, and from which keys.
        expected: String,
    },
    /// The model's architecture is not one mlxcel supports.
    #[error("{}: unsupported architecture {found}; supported: {supported}", path.display())]
    UnsupportedArchitecture {
        /// The config (or GGUF) that names it.
        path: PathBuf,
        /// The architecture the source declares.
        found: String,
        /// The supported architectures.
        supported: String,
    },
    /// `model.safetensors.index.json` names a shard outside the model's
    /// directory (`..`, an absolute path, a symbolic link leading out).
    #[error("{}: weight_map names the shard {shard:?}, which {reason}", index.display())]
    ShardPath {
        /// The index file.
        index: PathBuf,
        /// The shard as the index spells it.
        shard: String,
        /// Why it is refused.
        reason: String,
    },
    /// The configuration is missing a key or has a bad value.
    #[error("{}: config: {message}", path.display())]
    Config {
        /// The config file (or GGUF).
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The configuration has a value the runtime cannot honour, or lacks one
    /// it needs: refused at compile time, naming the file, the key and the
    /// value (for GGUF also the metadata key it came from).
    #[error("{}: {cause}", path.display())]
    InvalidConfig {
        /// The config file (or GGUF).
        path: PathBuf,
        /// The key and what is wrong with it (in the message, not `source()`).
        cause: mlxcel_arch::ConfigError,
    },
    /// The tokenizer could not be read or converted.
    #[error("{}: tokenizer: {message}", path.display())]
    Tokenizer {
        /// The file the tokenizer comes from.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// No tensor of that name in the source.
    #[error("{}: no tensor named {name}", path.display())]
    NoSuchTensor {
        /// The source.
        path: PathBuf,
        /// The name asked for.
        name: String,
    },
    /// MLX refused an operation on a tensor.
    #[error("{}: tensor {tensor}: {cause}", path.display())]
    Mlx {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// MLX's error (in the message, not `source()`).
        cause: mlxcel_mlx::Error,
    },
}

/// The result of ingest operations.
pub type Result<T> = std::result::Result<T, IngestError>;

impl IngestError {
    pub(crate) fn io(path: &Path, cause: std::io::Error) -> Self {
        IngestError::Io { path: path.to_path_buf(), cause }
    }

    pub(crate) fn corrupt(path: &Path, offset: u64, message: impl Into<String>) -> Self {
        IngestError::Corrupt { path: path.to_path_buf(), offset, message: message.into() }
    }

    pub(crate) fn tensor(path: &Path, tensor: &str, offset: u64, message: impl Into<String>) -> Self {
        IngestError::Tensor { path: path.to_path_buf(), tensor: tensor.to_string(), offset, message: message.into() }
    }

    pub(crate) fn config(path: &Path, message: impl Into<String>) -> Self {
        IngestError::Config { path: path.to_path_buf(), message: message.into() }
    }

    pub(crate) fn invalid_config(path: &Path, cause: mlxcel_arch::ConfigError) -> Self {
        IngestError::InvalidConfig { path: path.to_path_buf(), cause }
    }

    pub(crate) fn tokenizer(path: &Path, message: impl Into<String>) -> Self {
        IngestError::Tokenizer { path: path.to_path_buf(), message: message.into() }
    }

    pub(crate) fn missing(path: &Path, what: impl Into<String>) -> Self {
        IngestError::Missing { path: path.to_path_buf(), what: what.into() }
    }
}
