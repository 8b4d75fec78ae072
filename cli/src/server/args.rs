//! `mlxcel-server`'s flags. Each reads an `MLXCEL_*` environment variable
//! when not given, and where llama-server has the same option, its variable
//! (`LLAMA_ARG_*`) as a fallback ([`LLAMA_ENV`]), so that a deployment made
//! for llama-server configures this one unchanged. Precedence: flag, then
//! `MLXCEL_*`, then `LLAMA_*`, then the default.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};
use mlxcel_cli::flags;
use mlxcel_cli::process::parse_device;
use mlxcel_mlx::device::DeviceRequest;
use mlxcel_mlx::fast::Isa;
use mlxcel_runtime::engine::{MaskTiming, PrefixReuse};

/// Serves a compiled `.mlxb` bundle over HTTP with OpenAI's API
/// (/v1/chat/completions, /v1/completions, /v1/models) and llama-server's
/// extras (/health, /metrics, /tokenize, /detokenize, /apply-template).
#[derive(Parser, Debug)]
#[command(name = "mlxcel-server", version, long_version = long_version())]
pub struct ServerArgs {
    /// The bundle to serve (`mlxcel-compile` makes one). When no such file
    /// exists, a Hub repo of prebuilt bundles (owner/repo[/NAME][@REVISION])
    /// or a catalog name is pulled into the Hugging Face cache on first use.
    #[arg(long, value_name = "PATH", env = "MLXCEL_BUNDLE")]
    pub bundle: PathBuf,

    /// The address to listen on [fallback: LLAMA_ARG_HOST].
    #[arg(long, value_name = "ADDR", env = "MLXCEL_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// The port to listen on (0: any free port; the startup line names it)
    /// [fallback: LLAMA_ARG_PORT].
    #[arg(long, value_name = "PORT", env = "MLXCEL_PORT", default_value_t = 8080)]
    pub port: u16,

    /// The most sequences generated at once (continuous batching); more
    /// requests wait in the queue. Also `-np N` [fallback: LLAMA_ARG_N_PARALLEL].
    #[arg(long = "parallel", value_name = "N", env = "MLXCEL_PARALLEL",
          default_value_t = 4, value_parser = flags::count(1, 4096))]
    pub parallel: usize,

    /// The most requests waiting for a slot (a request counts from its
    /// arrival until the engine admits it, so at least 1); more are refused
    /// with 429 and a Retry-After header.
    #[arg(long, value_name = "N", env = "MLXCEL_MAX_QUEUE", default_value_t = 64, value_parser = flags::count(1, 1 << 20))]
    pub max_queue: usize,

    /// The most tokens one request may hold, prompt and generation (0: the
    /// model's context; more than the model's is capped to it)
    /// [fallback: LLAMA_ARG_CTX_SIZE].
    #[arg(short = 'c', long = "ctx-size", value_name = "N", env = "MLXCEL_CTX_SIZE", default_value_t = 0,
          value_parser = flags::count(0, usize::MAX))]
    pub ctx_size: usize,

    /// An API key clients must send (`Authorization: Bearer KEY` or
    /// `x-api-key: KEY`); repeatable, or comma-separated in the variable.
    /// Without any key the API is open. /health is always open
    /// [fallback: LLAMA_API_KEY].
    #[arg(long = "api-key", value_name = "KEY", env = "MLXCEL_API_KEY", value_delimiter = ',', hide_env_values = true)]
    pub api_keys: Vec<String>,

    /// A file of API keys, one per line (blank lines and lines starting
    /// with `#` are skipped); adds to --api-key [fallback: LLAMA_ARG_API_KEY_FILE].
    #[arg(long, value_name = "PATH", env = "MLXCEL_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,

    /// Serve Prometheus metrics at GET /metrics (without it /metrics answers
    /// 501) [fallback: LLAMA_ARG_ENDPOINT_METRICS].
    #[arg(long, env = "MLXCEL_METRICS", action = ArgAction::SetTrue)]
    pub metrics: bool,

    /// Threads of mlxcel's CPU kernels [default: MLXCEL_THREADS, else the
    /// physical cores this process may use] [fallback: LLAMA_ARG_THREADS].
    #[arg(short = 't', long, value_name = "N", value_parser = flags::count(1, 4096))]
    pub threads: Option<usize>,

    /// The device to compute on: cpu, gpu or auto [default: MLXCEL_DEVICE,
    /// else auto: the GPU when the linked MLX has one].
    #[arg(long, value_parser = parse_device)]
    pub device: Option<DeviceRequest>,

    /// The instruction set of mlxcel's CPU kernels: scalar, avx2, avx2i16,
    /// avx512, avx512vnni or neon [default: MLXCEL_ISA, else the best this CPU
    /// has]. avx2i16 and avx512vnni round activations to int16 steps in the
    /// quantized products (faster); avx2 and avx512 keep them f32.
    #[arg(long)]
    pub isa: Option<Isa>,

    /// Seconds a request may run (waiting, prefill and generation) before
    /// it is cancelled and answered 503 with code "timeout" (0: no limit)
    /// [fallback: LLAMA_ARG_TIMEOUT].
    #[arg(long, value_name = "SECONDS", env = "MLXCEL_TIMEOUT", default_value_t = 600,
          value_parser = flags::count(0, 365 * 24 * 3600))]
    pub timeout: usize,

    /// Allow browsers on this origin to call the API (CORS); repeatable,
    /// or comma-separated in the variable; `*` allows any origin. Without
    /// it no CORS headers are sent.
    #[arg(long = "cors-origin", value_name = "ORIGIN", env = "MLXCEL_CORS_ORIGIN", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Seconds that requests in flight may take to finish after SIGTERM or
    /// Ctrl-C; the rest are then cancelled.
    #[arg(long, value_name = "SECONDS", env = "MLXCEL_SHUTDOWN_GRACE", default_value_t = 30,
          value_parser = flags::count(0, 24 * 3600))]
    pub shutdown_grace: usize,

    /// MiB of KV state kept from finished requests for later requests that
    /// share their prefix (the prompt cache; 0: off, -1: no limit)
    /// [fallback: LLAMA_ARG_CACHE_RAM].
    #[arg(long = "cache-ram", value_name = "MiB", env = "MLXCEL_CACHE_RAM", default_value_t = 1024,
          allow_negative_numbers = true, value_parser = mib_or_unlimited)]
    pub cache_ram: u64,

    /// What a request may reuse from the prompt cache: `longest`, the
    /// whole prefix it shares with an earlier request, that request's
    /// answer included (a conversation's next turn skips its history; the
    /// continuation may differ from a cold prefill in the last bits of its
    /// logits, as with llama-server's prompt cache), or `exact`, only whole
    /// --prefill-chunk pieces of earlier prompts (output has exactly the
    /// bits it has without the cache, but prompts shorter than a chunk
    /// reuse nothing).
    #[arg(long, value_name = "POLICY", env = "MLXCEL_PREFIX_REUSE", default_value = "longest",
          value_parser = parse_prefix_reuse)]
    pub prefix_reuse: PrefixReuse,

    /// MiB of KV cache the running sequences may hold together; a request
    /// waits until its KV fits, and one that never could is refused (400
    /// "kv_budget_exceeded") [default: no limit].
    #[arg(long, value_name = "MiB", env = "MLXCEL_KV_BUDGET", value_parser = flags::count(1, usize::MAX >> 20))]
    pub kv_budget: Option<usize>,

    /// The largest request body, in bytes; larger ones are refused with 413.
    #[arg(long, value_name = "BYTES", env = "MLXCEL_MAX_BODY_SIZE", default_value_t = 10 << 20,
          value_parser = flags::count(1, usize::MAX))]
    pub max_body_size: usize,

    /// Skip the warm-up: by default, once the bundle is loaded and before
    /// /health answers 200, the server prefills a short prompt (64 tokens
    /// on a GPU, 2 on the CPU) and runs one decode step, so that the first
    /// request does not pay the process's one-time costs (the weights'
    /// first touch; on a CUDA GPU about 0.3 s in the first launches of
    /// MLX's operations).
    #[arg(long = "no-warmup", env = "MLXCEL_NO_WARMUP", action = ArgAction::SetTrue)]
    pub no_warmup: bool,

    /// Prompt tokens prefilled between two decode steps, so that running
    /// streams keep flowing while a long prompt is read.
    #[arg(long, value_name = "N", env = "MLXCEL_PREFILL_CHUNK", default_value_t = 512,
          value_parser = flags::count(1, usize::MAX))]
    pub prefill_chunk: usize,

    /// Activations' dtype: f32 (the default on every device: greedy output
    /// matches the reference), or bf16/f16, faster on a GPU at the cost of
    /// a little precision. Weights keep the bundle's dtype either way.
    #[arg(long, value_name = "DTYPE", env = "MLXCEL_DTYPE", default_value = "f32",
          value_parser = flags::activation_dtype)]
    pub dtype: mlxcel_mlx::Dtype,

    /// When a constrained request's token mask is computed: `overlapped`,
    /// on a worker thread while the decode step runs; `after-step`, on the
    /// engine thread once the step is done; `auto`, overlapped only when
    /// the kernels leave a core free (--threads below the cores, or the
    /// GPU), since a worker preempting a busy kernel thread stalls the step
    /// far longer than the mask takes.
    #[arg(long, value_name = "WHEN", env = "MLXCEL_MASK_TIMING", default_value = "auto",
          value_parser = parse_mask_timing)]
    pub mask_timing: MaskTiming,

    #[command(flatten)]
    pub gpu: mlxcel_cli::process::GpuKernelFlags,
    #[command(flatten)]
    pub engine: mlxcel_cli::process::BackendFlags,
}

/// `--version`: ours and the linked MLX's.
fn long_version() -> String {
    format!("{}\nMLX {}", env!("CARGO_PKG_VERSION"), mlxcel_mlx::mlx_version())
}

/// llama-server's variables read as fallbacks: (argument id, variable).
/// `--threads` takes `LLAMA_ARG_THREADS` here (`MLXCEL_THREADS` is the
/// process setting the kernels read, README.md).
pub const LLAMA_ENV: &[(&str, &str)] = &[
    ("host", "LLAMA_ARG_HOST"),
    ("port", "LLAMA_ARG_PORT"),
    ("parallel", "LLAMA_ARG_N_PARALLEL"),
    ("ctx_size", "LLAMA_ARG_CTX_SIZE"),
    ("api_keys", "LLAMA_API_KEY"),
    ("api_key_file", "LLAMA_ARG_API_KEY_FILE"),
    ("metrics", "LLAMA_ARG_ENDPOINT_METRICS"),
    ("threads", "LLAMA_ARG_THREADS"),
    ("timeout", "LLAMA_ARG_TIMEOUT"),
    ("cache_ram", "LLAMA_ARG_CACHE_RAM"),
];

/// Parses `--prefix-reuse`.
fn parse_prefix_reuse(text: &str) -> Result<PrefixReuse, String> {
    match text.trim() {
        "longest" => Ok(PrefixReuse::Longest),
        "exact" => Ok(PrefixReuse::Exact),
        _ => Err("must be `longest` or `exact`".into()),
    }
}

/// Parses `--mask-timing`.
fn parse_mask_timing(text: &str) -> Result<MaskTiming, String> {
    match text.trim() {
        "auto" => Ok(MaskTiming::Auto),
        "overlapped" => Ok(MaskTiming::Overlapped),
        "after-step" => Ok(MaskTiming::AfterStep),
        _ => Err("must be `auto`, `overlapped` or `after-step`".into()),
    }
}

/// Parses `--cache-ram`: MiB, or -1 for no limit.
fn mib_or_unlimited(text: &str) -> Result<u64, String> {
    match text.trim().parse::<i64>() {
        Ok(-1) => Ok(u64::MAX >> 20),
        Ok(n) if n >= 0 => Ok(n as u64),
        _ => Err("must be a whole number of MiB >= 0, or -1 for no limit".into()),
    }
}

/// llama.cpp's reading of a boolean variable.
fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes" | "enabled")
}

impl ServerArgs {
    /// Parses the process's command line, with `env` looked up for the
    /// `LLAMA_*` fallbacks (the `MLXCEL_*` variables clap reads itself).
    pub fn parse_with(env: impl Fn(&str) -> Option<String>) -> Result<ServerArgs, clap::Error> {
        ServerArgs::parse_from_with(std::env::args_os(), env)
    }

    /// [`ServerArgs::parse_with`] of `argv` (its first item is the program).
    pub fn parse_from_with(
        argv: impl IntoIterator<Item = std::ffi::OsString>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ServerArgs, clap::Error> {
        let mut command = ServerArgs::command();
        for &(id, var) in LLAMA_ENV {
            let Some(value) = env(var) else { continue };
            command = command.mut_arg(id, |arg| match id {
                "metrics" => arg.default_value(if truthy(&value) { "true" } else { "false" }),
                "api_keys" => {
                    let keys: Vec<String> =
                        value.split(',').map(str::trim).filter(|k| !k.is_empty()).map(String::from).collect();
                    arg.default_values(keys)
                }
                _ => arg.default_value(value.clone()),
            });
        }
        // llama-server's two-letter short flag `-np`, which clap cannot declare.
        let argv = argv.into_iter().map(|a| if a == "-np" { "--parallel".into() } else { a });
        let matches = command.try_get_matches_from(argv)?;
        ServerArgs::from_arg_matches(&matches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str], env: &[(&str, &str)]) -> Result<ServerArgs, clap::Error> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let argv = std::iter::once("mlxcel-server").chain(argv.iter().copied()).map(std::ffi::OsString::from);
        ServerArgs::parse_from_with(argv, |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn llama_variables_are_fallbacks_under_the_flags() {
        let args = parse(&["--bundle", "m.mlxb"], &[]).unwrap();
        assert_eq!((args.port, args.parallel, args.ctx_size, args.timeout), (8080, 4, 0, 600));
        assert!(!args.metrics && args.api_keys.is_empty());
        let env = [
            ("LLAMA_ARG_PORT", "9000"),
            ("LLAMA_ARG_N_PARALLEL", "3"),
            ("LLAMA_API_KEY", "a, b"),
            ("LLAMA_ARG_ENDPOINT_METRICS", "true"),
            ("LLAMA_ARG_CACHE_RAM", "-1"),
            ("LLAMA_ARG_THREADS", "2"),
        ];
        let args = parse(&["--bundle", "m.mlxb"], &env).unwrap();
        assert_eq!((args.port, args.parallel, args.threads), (9000, 3, Some(2)));
        assert_eq!(args.api_keys, ["a", "b"]);
        assert!(args.metrics);
        assert_eq!(args.cache_ram, u64::MAX >> 20);
        let args = parse(&["--bundle", "m.mlxb", "--port", "1", "-np", "7", "--api-key", "c"], &env).unwrap();
        assert_eq!((args.port, args.parallel), (1, 7));
        assert_eq!(args.api_keys, ["c"]);
        // A bad fallback value is refused naming the flag.
        let err = parse(&["--bundle", "m.mlxb"], &[("LLAMA_ARG_N_PARALLEL", "0")]).unwrap_err().to_string();
        assert!(err.contains("--parallel") && err.contains("at least 1"), "{err}");
    }

    #[test]
    fn the_warm_up_is_on_unless_skipped() {
        assert!(!parse(&["--bundle", "m.mlxb"], &[]).unwrap().no_warmup);
        assert!(parse(&["--bundle", "m.mlxb", "--no-warmup"], &[]).unwrap().no_warmup);
    }
}
