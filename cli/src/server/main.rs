//! `mlxcel-server`: serves a compiled `.mlxb` bundle over HTTP, speaking
//! OpenAI's API with llama-server's dialect (flag names, `LLAMA_ARG_*`
//! variables, `/health` 503 while loading, `/metrics`, `/tokenize`).
//!
//! # Start-up
//!
//! The server listens first, then loads the bundle on a blocking task:
//! `/health` answers 503 (code `loading`) until the model is ready, then
//! 200 `{"status":"ok"}`. The startup line on stderr names the address
//! (`listening on http://ADDR`, with the real port when `--port 0`), and a
//! second one the model once loaded. A bundle that fails to load ends the
//! process with status 1. Unless `--no-warmup`, the engine runs one short
//! prefill and a decode step before it reports ready
//! (`EngineOptions::warm_up`), so the first request does not pay the
//! process's one-time costs.
//!
//! # Routes
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/chat/completions`, `/chat/completions` | chat, whole or streamed (SSE) |
//! | `POST /v1/completions`, `/completions` | text completion, whole or streamed |
//! | `GET /v1/models`, `/models` | the model served |
//! | `GET /health`, `/v1/health` | 503 while loading or shutting down, else 200 (never needs a key) |
//! | `GET /metrics` | Prometheus text with `--metrics`, else 501 `not_supported_error` (as llama-server) |
//! | `POST /tokenize` | `{"content", "add_special"=false, "with_pieces"=false}` → `{"tokens": [...]}` |
//! | `POST /detokenize` | `{"tokens": [...]}` → `{"content": "..."}` |
//! | `POST /apply-template` | `{"messages": [...]}` → `{"prompt": "..."}` |
//!
//! Any other route is 404 in the error envelope.
//!
//! Request fields (`openai`): chat takes `model` (any name; responses carry
//! the bundle's), `messages` (roles system, developer (as system), user,
//! assistant; content a string or a list of `{"type": "text"}` parts),
//! `max_tokens`/`max_completion_tokens`, `temperature`, `top_p`, `top_k`,
//! `min_p`, `seed`, `stop` (a string or up to 16), `presence_penalty`,
//! `frequency_penalty`, `repetition_penalty`, `logprobs` + `top_logprobs`
//! (0..=20), `stream`, `stream_options.include_usage`, `n` (1 only),
//! `user`, `ignore_eos` (llama-server's), `response_format` (`text`,
//! `json_object`, `json_schema`: enforced token by token, or a 400
//! `unsupported_schema` naming what cannot be). Completions take `prompt` (a
//! string, a list of one string, or token ids, each in the model's
//! vocabulary), `echo` (false only), `logprobs` (0..=5), `suffix` (empty
//! only), `best_of` (1 only) and the same sampling fields. Everything else
//! (`tools`, llama-server's `grammar`, `logit_bias`, unknown names, `n` > 1, ...)
//! is a 400 naming the field. `max_tokens` defaults to, and is capped by,
//! the room the prompt leaves in the context.
//!
//! Streams are `data: {json}\n\n` events ending with `data: [DONE]`; a chat
//! stream opens with a `{"role": "assistant", "content": ""}` delta and
//! ends with an empty delta carrying `finish_reason`; with
//! `stream_options.include_usage` every chunk has `"usage": null` and one
//! last chunk has `"choices": []` and the usage.
//!
//! # Errors
//!
//! OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`:
//!
//! | status | type | code | when |
//! |---|---|---|---|
//! | 400 | `invalid_request_error` | — / `unsupported_parameter` | bad JSON, a wrong type, an unknown or unimplemented field, a value out of range (`param` names the field) |
//! | 400 | `invalid_request_error` | — | a prompt token id outside the model's vocabulary (`param`: `prompt`) |
//! | 400 | `invalid_request_error` | `context_length_exceeded` | the prompt fills the context (`param`: `messages` for chat, `prompt` for completions) |
//! | 400 | `invalid_request_error` | `kv_budget_exceeded` | the request's KV cache can never fit `--kv-budget` |
//! | 401 | `authentication_error` | `invalid_api_key` | a key is missing or wrong |
//! | 404 | `not_found_error` | — | no such route |
//! | 413 | `invalid_request_error` | `request_too_large` | the body exceeds `--max-body-size` |
//! | 429 | `rate_limit_error` | `queue_full` | `--max-queue` requests already wait (with `Retry-After: 1`) |
//! | 500 | `server_error` | — | a decode step failed |
//! | 501 | `not_supported_error` | — | `/metrics` without `--metrics` |
//! | 503 | `unavailable_error` | `loading`, `shutting_down`, `timeout`, `engine_stopped` | the bundle loads (`Retry-After: 1`), shutdown began, the request ran past `--timeout`, the engine stopped |
//!
//! A stream that fails after its 200 header sends `data: {"error": {...}}`
//! then `data: [DONE]`.
//!
//! # Flags and variables
//!
//! Each flag reads `MLXCEL_<NAME>` when not given, and where llama-server
//! has the option, its variable as a fallback (flag > `MLXCEL_*` >
//! `LLAMA_*` > default): `--bundle` (required; a path, or a Hub repo of
//! prebuilt bundles pulled on first use: docs/prebuilt.md), `--host` (127.0.0.1;
//! `LLAMA_ARG_HOST`), `--port` (8080; `LLAMA_ARG_PORT`), `--parallel`/`-np`
//! (4 sequences at once; `LLAMA_ARG_N_PARALLEL`), `--max-queue` (64),
//! `--ctx-size`/`-c` (0 = the model's; `LLAMA_ARG_CTX_SIZE`), `--api-key`
//! (repeatable, comma-separated in `MLXCEL_API_KEY`/`LLAMA_API_KEY`),
//! `--api-key-file` (`LLAMA_ARG_API_KEY_FILE`), `--metrics`
//! (`LLAMA_ARG_ENDPOINT_METRICS`), `--threads`/`-t` (`MLXCEL_THREADS`,
//! `LLAMA_ARG_THREADS`), `--device`, `--isa` (`MLXCEL_DEVICE`,
//! `MLXCEL_ISA`, as `mlxcel`), `--timeout` (600 s; `LLAMA_ARG_TIMEOUT`),
//! `--cors-origin` (repeatable; no CORS without it; preflights allow the
//! headers they ask for, `Authorization` included), `--shutdown-grace`
//! (30 s), `--cache-ram` (1024 MiB prefix cache; `LLAMA_ARG_CACHE_RAM`),
//! `--prefix-reuse` (`longest` or `exact`: what a hit may reuse),
//! `--kv-budget` (MiB, no limit), `--max-body-size` (10 MiB),
//! `--prefill-chunk` (512), `--no-warmup`, `--version`. `RUST_LOG` filters the log
//! (default `info`).
//!
//! # Operations
//!
//! - Each request's engine stream is drained on a blocking task; a client
//!   that disconnects, mid-stream or while waiting for a whole answer,
//!   cancels its request within a decode step (`bridge`).
//! - SIGTERM or Ctrl-C: stop accepting, refuse new requests (503), let
//!   those in flight finish within `--shutdown-grace`, cancel the rest, exit 0.
//! - One log line per request on stderr: id, method and path, status,
//!   prompt, cached and generated tokens, time to first token, tokens/s.
//! - Metrics: see the `metrics` module (`mlxcel_requests_running`,
//!   `mlxcel_requests_waiting`, `mlxcel_requests_total{route,status}`,
//!   `mlxcel_prompt_tokens_total`, `mlxcel_generation_tokens_total`,
//!   `mlxcel_time_to_first_token_seconds`,
//!   `mlxcel_inter_token_latency_seconds`, `mlxcel_kv_cache_bytes`,
//!   `mlxcel_kv_cache_tokens`, `mlxcel_prefix_cache_bytes`,
//!   `mlxcel_prefix_cache_hits_total`, `mlxcel_prefix_cache_tokens_total`,
//!   `mlxcel_decode_steps_total`).

mod args;
mod auth;
mod bridge;
mod errors;
mod generate;
mod metrics;
mod openai;
mod responses;
mod routes;
mod shutdown;
mod state;
mod tool_calls;
mod tools;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mlxcel_cli::prebuilt::pull::HubSettings;
use mlxcel_cli::prebuilt::{BundleArg, resolve_bundle_arg};
use mlxcel_cli::process::{apply_settings, check_bundle_path};
use mlxcel_runtime::backend::MlxOptions;
use mlxcel_runtime::engine::{Engine, EngineOptions};
use mlxcel_runtime::loader::LoadOptions;

use crate::args::ServerArgs;
use crate::state::AppState;

const MIB: u64 = 1 << 20;

/// The API keys of `--api-key` and `--api-key-file`.
fn api_keys(args: &ServerArgs) -> Result<Vec<Vec<u8>>> {
    let mut keys: Vec<Vec<u8>> =
        args.api_keys.iter().map(|k| k.trim()).filter(|k| !k.is_empty()).map(|k| k.as_bytes().to_vec()).collect();
    if let Some(path) = &args.api_key_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading --api-key-file {}", path.display()))?;
        let before = keys.len();
        keys.extend(
            text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(|l| l.as_bytes().to_vec()),
        );
        if keys.len() == before {
            bail!("--api-key-file {} holds no key", path.display());
        }
    }
    Ok(keys)
}

fn engine_options(args: &ServerArgs) -> EngineOptions {
    EngineOptions {
        load: LoadOptions {
            compute_dtype: Some(args.dtype),
            backend: MlxOptions { prefill_chunk: args.prefill_chunk, max_kv: None },
            gpu_kernels: args.gpu.options(),
            backend_kind: args.engine.backend,
            iree: args.engine.iree_options(),
        },
        max_batch: args.parallel,
        max_waiting: args.max_queue,
        prefill_chunk: args.prefill_chunk,
        context: (args.ctx_size > 0).then_some(args.ctx_size),
        kv_budget: args.kv_budget.map(|m| m as u64 * MIB),
        prefix_cache: args.cache_ram.saturating_mul(MIB),
        prefix_reuse: args.prefix_reuse,
        mask_timing: args.mask_timing,
        warm_up: !args.no_warmup,
    }
}

async fn serve(args: ServerArgs) -> Result<()> {
    check_bundle_path(&args.bundle)?;
    // A missing file is said at once; anything else is the load's to refuse.
    if !args.bundle.exists() {
        bail!("--bundle {}: no such file", args.bundle.display());
    }
    let fallback_name = args.bundle.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
    let timeout = (args.timeout > 0).then(|| Duration::from_secs(args.timeout as u64));
    let state = Arc::new(AppState::new(fallback_name, api_keys(&args)?, timeout, args.metrics));
    let app = routes::router(state.clone(), args.max_body_size, &args.cors_origins)?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.host, args.port))
        .await
        .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
    let address = listener.local_addr().context("reading the bound address")?;
    tracing::info!("listening on http://{address} (loading {})", args.bundle.display());

    // Load after listening, so that /health answers 503 meanwhile.
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel::<Result<()>>();
    {
        let (state, path, options) = (state.clone(), args.bundle.clone(), engine_options(&args));
        // Labelled after the load: a bundle without kernels for the GPU may
        // have moved the model to the CPU (`--gpu-kernels cpu`).
        let backend = args.engine.clone();
        tokio::task::spawn_blocking(move || {
            let result = Engine::load(&path, options).with_context(|| format!("loading {}", path.display()));
            let result = result.map(|engine| {
                let m = engine.model();
                tracing::info!(
                    model = %if m.name.is_empty() { &state.fallback_name } else { &m.name },
                    architecture = %m.architecture,
                    context = m.context_length(),
                    load_ms = format_args!("{:.1}", m.load_time.as_secs_f64() * 1e3),
                    warm_up_ms = format_args!("{:.1}", m.warm_up_time.unwrap_or_default().as_secs_f64() * 1e3),
                    device = %backend.device_label(),
                    "model loaded: ready"
                );
                if let Some(kernels) = &m.gpu_kernels {
                    tracing::info!("GPU kernels: {kernels}");
                }
                let engine = Arc::new(engine);
                let _ = state.engine.set(engine.clone());
                engine
            });
            let engine = result.as_ref().ok().cloned();
            let _ = loaded_tx.send(result.map(drop));
            // Built now rather than at the first constrained request (from
            // the bundle's token-bytes section: milliseconds to a few
            // hundred; one arriving meanwhile waits for it).
            if let Some(engine) = engine {
                let start = std::time::Instant::now();
                match engine.prepare_grammars() {
                    Ok(()) => tracing::info!(
                        ms = format_args!("{:.1}", start.elapsed().as_secs_f64() * 1e3),
                        "grammar compiler ready"
                    ),
                    Err(e) => tracing::warn!("constrained requests will be refused: {e}"),
                }
            }
        });
    }
    let grace = Duration::from_secs(args.shutdown_grace as u64);
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<anyhow::Error>();
    // A bundle that cannot load ends the server; a loaded one leaves the
    // signal to end it.
    let load_failed = async move {
        match loaded_rx.await {
            Ok(Ok(())) => std::future::pending().await,
            Ok(Err(e)) => e,
            Err(_) => anyhow::anyhow!("the loading task panicked"),
        }
    };
    let stop = {
        let state = state.clone();
        async move {
            tokio::select! {
                () = shutdown::on_signal(state, grace) => {}
                e = load_failed => { let _ = failed_tx.send(e); }
            }
        }
    };
    let serving = axum::serve(listener, app).with_graceful_shutdown(stop).into_future();
    // Once the grace is over and the requests are cancelled, their
    // connections close; one whose client stopped reading would hold the
    // server forever: give them a few seconds more, then stop anyway.
    let last_call = {
        let cancelled = state.shutdown.cancelled();
        async move {
            cancelled.await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    };
    tokio::select! {
        result = serving => result.context("serving")?,
        () = last_call => tracing::warn!("connections still open after the grace period: closing them"),
    }
    if let Ok(e) = failed_rx.await {
        return Err(e);
    }
    tracing::info!("stopped");
    Ok(())
}

/// `--bundle`: the file itself, or (when no such file exists) a Hub repo of
/// prebuilt bundles or a catalog name, pulled into the Hugging Face cache on
/// first use (HF_HOME, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE; docs/prebuilt.md).
fn resolve_bundle(args: ServerArgs) -> Result<ServerArgs> {
    let hub = HubSettings::from_vars(|name| std::env::var(name).ok())?;
    let bundle = match resolve_bundle_arg(&args.bundle, &hub, std::io::stderr().is_terminal())
        .with_context(|| format!("--bundle {}", args.bundle.display()))?
    {
        BundleArg::Path(path) => path,
        BundleArg::Pulled(pulled) => {
            tracing::info!(
                "--bundle {}: {} ({}), root hash {} as index.json says, at {}",
                args.bundle.display(),
                pulled.entry.file,
                if pulled.downloaded { "downloaded and verified" } else { "from the cache" },
                pulled.entry.blake3_root,
                pulled.path.display()
            );
            pulled.path
        }
    };
    Ok(ServerArgs { bundle, ..args })
}

fn main() -> ExitCode {
    let args = match ServerArgs::parse_with(|name| std::env::var(name).ok()) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result =
        apply_settings(args.device, args.isa, args.threads).and_then(|_| resolve_bundle(args)).and_then(|args| {
            // Each request in the engine holds a blocking thread (its bridge);
            // tokenizing and rendering take a few more.
            let blocking = (args.parallel + args.max_queue + 64).min(1 << 16);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .max_blocking_threads(blocking)
                .thread_name("mlxcel-server")
                .build()
                .context("starting the async runtime")?;
            let result = runtime.block_on(serve(args));
            // Bridge tasks end with their requests; do not wait on a stuck one.
            runtime.shutdown_timeout(Duration::from_secs(5));
            result
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
