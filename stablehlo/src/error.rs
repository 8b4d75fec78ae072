//! Errors of emission and of driving `iree-compile`.

use std::path::PathBuf;

/// What can go wrong building a graph or compiling it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op's operands do not fit together (shapes, ranks, element types).
    #[error("{op}: {message}")]
    Shape {
        /// The op being built.
        op: &'static str,
        /// What does not fit.
        message: String,
    },
    /// A parameter was declared twice with different types.
    #[error("parameter {name:?} is {first} in one place and {second} in another")]
    ParameterType {
        /// The parameter's name (the bundle tensor's).
        name: String,
        /// Its first declared type.
        first: String,
        /// The conflicting type.
        second: String,
    },
    /// The model code cannot be traced as asked (a config it cannot build
    /// from, an operation this emitter does not trace yet).
    #[error("model: {0}")]
    Model(String),
    /// A weight the model code asks for is missing from the stored tensors
    /// or has another shape.
    #[error("weight {name}: {message}")]
    Weight {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A file or process could not be used.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or program.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// `iree-compile` refused the module.
    #[error("iree-compile ({target}) failed with {status}:\n{stderr}")]
    Compile {
        /// The target it compiled for.
        target: String,
        /// Its exit status.
        status: String,
        /// What it printed (its diagnostics name the op and line).
        stderr: String,
    },
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn shape(op: &'static str, message: impl Into<String>) -> Error {
    Error::Shape { op, message: message.into() }
}
