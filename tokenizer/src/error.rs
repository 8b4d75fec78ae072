//! Errors of compiling and loading a tokenizer.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.json` uses something the compiled tokenizer does not
    /// implement; the bundle keeps only `tokenizer.json` and the runtime uses
    /// the `tokenizers` library.
    #[error("tokenizer.json: {0} is not supported by the compiled tokenizer")]
    Unsupported(String),
    /// `tokenizer.json` is not valid.
    #[error("tokenizer.json: {0}")]
    InvalidJson(String),
    /// The compiled section is malformed.
    #[error("compiled tokenizer section: {what} (at byte offset {offset})")]
    Malformed {
        /// What is wrong.
        what: String,
        /// Where in the section.
        offset: usize,
    },
    /// A `token-bytes` section ([`crate::token_bytes`]) is malformed.
    #[error("token-bytes section: {what} (at byte offset {offset})")]
    MalformedTokenBytes {
        /// What is wrong.
        what: String,
        /// Where in the section.
        offset: usize,
    },
    /// The section was written in a layout this build does not read (a newer
    /// compiler); the runtime falls back to `tokenizer.json`.
    #[error("compiled tokenizer section: layout version {found}, this build reads version {supported}")]
    UnsupportedVersion {
        /// The section's version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The compiled tokenizer and `tokenizers` disagree on a text.
    #[error("the compiled tokenizer differs from the tokenizers library: {0}")]
    Mismatch(String),
    /// A pre-tokenizer regex backtracked past its limits on this input
    /// ([`crate::regex::RETRY_LIMIT_IN_SEARCH`]): the pattern is unfit for
    /// the input, and `tokenizers` would panic or run for hours on it.
    #[error(
        "regex {pattern:?} gave up searching from byte {offset} of a piece: {message} (backtracking is limited to {} steps)",
        crate::regex::RETRY_LIMIT_IN_SEARCH
    )]
    RegexLimit {
        /// The pattern.
        pattern: String,
        /// Where the search started, in the piece being split.
        offset: usize,
        /// Oniguruma's message.
        message: String,
    },
    /// A regex of the pipeline does not compile.
    #[error("regex {pattern:?}: {message}")]
    Regex {
        /// The pattern.
        pattern: String,
        /// Onig's message.
        message: String,
    },
}

/// A result with [`TokenizerError`].
pub type Result<T> = std::result::Result<T, TokenizerError>;
