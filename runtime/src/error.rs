//! Errors of the runtime.

/// Everything that can go wrong between a bundle and generated text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlxcel_mlx::Error),
    /// The bundle names an architecture this runtime does not implement.
    #[error("architecture {found:?} is not supported by this runtime; supported: {}", supported.join(", "))]
    UnsupportedArchitecture {
        /// The architecture the bundle declares.
        found: String,
        /// The architectures the runtime implements.
        supported: Vec<&'static str>,
    },
    /// The bundle's model config cannot be used.
    #[error(transparent)]
    ModelConfig(#[from] mlxcel_arch::ConfigError),
    /// The model's structure and the step asked of it do not fit (a runtime
    /// invariant, not a config key).
    #[error("model: {0}")]
    Config(String),
    /// A weight the architecture needs is missing or has the wrong shape or dtype.
    #[error("weight {name}: {message}")]
    Weight {
        /// The tensor's canonical name.
        name: String,
        /// What was wrong.
        message: String,
    },
    /// The tokenizer or the chat template could not be loaded or applied.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A tokenizer section of the bundle cannot be loaded (the bundle, not
    /// the user's input, is at fault).
    #[error("the bundle's {section} section: {message}")]
    BundleTokenizer {
        /// The section's key (`tokenizer.json`, or the compiled tokenizer's).
        section: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A token id the bundle's tokenizer or generation defaults can produce
    /// has no row in the embedding: reading it would read past the table.
    #[error("{what} {id} is outside the model's vocabulary of {vocab_size} rows (model.embed_tokens)")]
    TokenIdOutOfRange {
        /// Which id (`token id`, `eos_token_id`, `bos_token_id`).
        what: &'static str,
        /// The id.
        id: u64,
        /// The embedding's rows (`vocab_size`).
        vocab_size: usize,
    },
    /// A float tensor holds NaN or infinities ([`crate::check::check_numerics`]).
    #[error("tensor {tensor}: {count} values are NaN or infinite")]
    NonFiniteWeights {
        /// The tensor (a quantized weight names the scales or biases too).
        tensor: String,
        /// How many values.
        count: usize,
    },
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The prompt and the requested generation do not fit the context.
    #[error("the prompt has {prompt} tokens but the context holds {context}{}", if *.requested > 0 { format!(" (with {} tokens to generate)", .requested) } else { String::new() })]
    ContextOverflow {
        /// Prompt tokens.
        prompt: usize,
        /// Tokens requested on top of the prompt.
        requested: usize,
        /// The context length.
        context: usize,
    },
    /// Constrained decoding failed mid-generation (the grammar's matcher
    /// refused a step); the request ends with this error.
    #[error("constrained decoding failed: {0}")]
    Grammar(String),
    /// A sampling or generation parameter is out of range.
    #[error("invalid parameter {name}: {message}")]
    InvalidParameter {
        /// The parameter's name.
        name: &'static str,
        /// Why it was refused.
        message: String,
    },
    /// The bundle could not be used.
    #[error("bundle: {0}")]
    Bundle(String),
    /// The bundle's GPU kernels are missing for this GPU or cannot be installed.
    #[error("GPU kernels: {0}")]
    GpuKernels(String),
    /// A batched decode step failed; every sequence in it fails with it.
    #[error("the decode step failed: {0}")]
    Step(String),
    /// The engine's queue is full: the request was not accepted (a server
    /// answers 429 and the client retries later).
    #[error("the server is busy: {waiting} requests are already waiting")]
    QueueFull {
        /// Requests waiting when this one arrived.
        waiting: usize,
    },
    /// A request's KV cache can never fit the engine's KV memory budget.
    #[error("the request needs {needed} bytes of KV cache ({tokens} tokens) but the KV budget is {budget} bytes")]
    KvBudget {
        /// Tokens the request may hold (prompt and generation).
        tokens: usize,
        /// Bytes their KV cache takes.
        needed: u64,
        /// The budget.
        budget: u64,
    },
    /// The engine thread is gone (its model failed to load, or it stopped).
    #[error("the engine has stopped")]
    EngineStopped,
    /// The IREE runtime failed (its own message).
    #[error("IREE: {0}")]
    Iree(String),
    /// A sequence id the backend does not know.
    #[error("unknown sequence {0}")]
    UnknownSequence(u64),
}

/// The runtime's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl From<mlxcel_models::Error> for Error {
    fn from(e: mlxcel_models::Error) -> Error {
        match e {
            mlxcel_models::Error::Config(message) => Error::Config(message),
            mlxcel_models::Error::InvalidParameter { name, message } => Error::InvalidParameter { name, message },
        }
    }
}
