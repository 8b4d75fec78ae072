//! `mlxcel run`: generate from a bundle, once (`-p`) or as an interactive chat.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use mlxcel_runtime::backend::MlxOptions;
use mlxcel_runtime::chat::Message;
use mlxcel_runtime::constraint::Grammar;
use mlxcel_runtime::engine::{Canceller, Engine, EngineOptions, Event, Generating, ModelInfo, Request};
use mlxcel_runtime::generate::{FinishReason, Generation, GenerationOptions};
use mlxcel_runtime::loader::LoadOptions;
use mlxcel_runtime::sampler::{Param, SamplingParams};

use crate::check_bundle_path;
use crate::flags;
use crate::input::{self, Input};
use crate::output::{Interrupted, Stdout, note};
use mlxcel_cli::process::GpuKernelFlags;

/// Options of `mlxcel run`. Numeric flags are checked by flag name before
/// any work (`flags`); negative numbers are read as (refused) values.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The bundle to run (`mlxcel-compile` makes one). When no such file
    /// exists, a Hub repo of prebuilt bundles (owner/repo[/NAME][@REVISION])
    /// or a catalog name is pulled on first use, as `mlxcel pull` does.
    pub bundle: PathBuf,
    /// The prompt. Without it, `run` starts an interactive chat.
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// The most tokens to generate per answer.
    #[arg(value_name = "N", short = 'n', long = "max-tokens", default_value_t = 256, allow_negative_numbers = true,
          value_parser = flags::count(0, usize::MAX))]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy (default: 0).
    #[arg(value_name = "T", long = "temp", allow_hyphen_values = true, value_parser = flags::sampling(Param::Temperature))]
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens up to this mass (0, 1]
    /// (default with --temp: the bundle's, else 1).
    #[arg(value_name = "P", long, allow_hyphen_values = true, value_parser = flags::sampling(Param::TopP))]
    pub top_p: Option<f32>,
    /// Keep only the K most likely tokens (0: all; default with --temp: the
    /// bundle's, else 0).
    #[arg(value_name = "K", long, allow_negative_numbers = true, value_parser = flags::count(0, usize::MAX))]
    pub top_k: Option<usize>,
    /// Drop tokens less likely than this fraction of the most likely one [0, 1].
    #[arg(value_name = "P", long, default_value_t = 0.0, allow_hyphen_values = true, value_parser = flags::sampling(Param::MinP))]
    pub min_p: f32,
    /// Penalise recently generated tokens multiplicatively (1: off; > 0).
    #[arg(value_name = "R", long, default_value_t = 1.0, allow_hyphen_values = true,
          value_parser = flags::sampling(Param::RepetitionPenalty))]
    pub repetition_penalty: f32,
    /// Subtract from the logits of recently seen tokens (0: off; [-2, 2]).
    #[arg(value_name = "P", long, default_value_t = 0.0, allow_hyphen_values = true,
          value_parser = flags::sampling(Param::PresencePenalty))]
    pub presence_penalty: f32,
    /// Subtract per occurrence of recently seen tokens (0: off; [-2, 2]).
    #[arg(value_name = "F", long, default_value_t = 0.0, allow_hyphen_values = true,
          value_parser = flags::sampling(Param::FrequencyPenalty))]
    pub frequency_penalty: f32,
    /// Random seed (default: a fresh one each run).
    #[arg(value_name = "S", long, allow_negative_numbers = true, value_parser = flags::seed)]
    pub seed: Option<u64>,
    /// Cap the KV cache to this many positions per layer (older ones slide out; >= 1).
    #[arg(value_name = "N", long, allow_negative_numbers = true, value_parser = flags::count(1, usize::MAX))]
    pub max_kv_size: Option<usize>,
    /// Prompt tokens per forward pass while prefilling (>= 1).
    #[arg(value_name = "N", long, default_value_t = 512, allow_negative_numbers = true, value_parser = flags::count(1, usize::MAX))]
    pub prefill_chunk: usize,
    /// Activations' dtype: f32 (the default on every device: greedy output
    /// matches the reference), or bf16/f16, faster on a GPU at the cost of
    /// a little precision (a near tie between two tokens may break the
    /// other way). Weights keep the bundle's dtype either way.
    #[arg(value_name = "DTYPE", long, default_value = "f32", value_parser = flags::activation_dtype)]
    pub dtype: mlxcel_mlx::Dtype,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Send the prompt as raw text instead of through the model's chat template.
    #[arg(long)]
    pub no_chat_template: bool,
    /// A system message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Constrain the answer to JSON valid against this JSON Schema file
    /// (enforced token by token; a schema that cannot be enforced is an error).
    #[arg(value_name = "FILE", long, conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the answer to this grammar (llguidance's Lark syntax,
    /// `start: ...`; a `.lark` file).
    #[arg(value_name = "FILE", long)]
    pub grammar: Option<PathBuf>,
    /// Print load time, prompt and decode speed and peak memory (to stderr).
    #[arg(short, long)]
    pub verbose: bool,
    #[command(flatten)]
    pub gpu: GpuKernelFlags,
    #[command(flatten)]
    pub engine: mlxcel_cli::process::BackendFlags,
}

impl RunArgs {
    /// The grammar of `--json-schema` or `--grammar`, read from its file.
    fn output_grammar(&self) -> Result<Option<Grammar>> {
        if let Some(path) = &self.json_schema {
            let text = std::fs::read(path).with_context(|| format!("--json-schema: reading {}", path.display()))?;
            let schema: serde_json::Value = serde_json::from_slice(&text)
                .with_context(|| format!("--json-schema: {} is not JSON", path.display()))?;
            return Ok(Some(Grammar::JsonSchema(schema)));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--grammar: reading {} (UTF-8 text)", path.display()))?;
            return Ok(Some(Grammar::Lark(text)));
        }
        Ok(None)
    }
}

impl RunArgs {
    /// The sampling parameters: the flags, and with `--temp` the bundle's
    /// top-k and top-p defaults where no flag gives them. The flags were
    /// checked when parsed, the bundle's defaults when it was loaded.
    fn sampling(&self, model: &ModelInfo) -> Result<SamplingParams> {
        let d = &model.defaults;
        let sampled = self.temperature.is_some();
        let top_p = match (self.top_p, d.top_p) {
            (Some(flag), _) => flag,
            // Load refused a bundle whose defaults are out of range, naming
            // the bundle (never a flag the user did not pass).
            (None, Some(default)) if sampled => default,
            _ => 1.0,
        };
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(0.0),
            top_k: self.top_k.unwrap_or(if sampled { d.top_k.unwrap_or(0) } else { 0 }),
            top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        };
        params.validate()?;
        Ok(params)
    }
}

/// Runs `mlxcel run`. Ctrl-C stops the answer being written: a one-shot run
/// then ends with [`Interrupted`] (exit 130); the chat returns to its prompt,
/// and Ctrl-C at the prompt ends the chat with [`Interrupted`].
pub fn run(args: RunArgs) -> Result<()> {
    check_bundle_path(&args.bundle)?;
    let out = Stdout::new();
    // The request being generated, for Ctrl-C to stop; `None` at the chat prompt.
    let current: Arc<Mutex<Option<Canceller>>> = Arc::new(Mutex::new(None));
    let interrupted = Arc::new(AtomicBool::new(false));
    let (input_tx, inputs) = mpsc::channel();
    {
        let (current, interrupted, input_tx) = (current.clone(), interrupted.clone(), input_tx.clone());
        ctrlc::set_handler(move || {
            interrupted.store(true, Ordering::SeqCst);
            match current.lock().ok().as_deref().and_then(Option::as_ref) {
                Some(canceller) => canceller.cancel(),
                None => {
                    let _ = input_tx.send(Input::Interrupted);
                }
            }
        })
        .context("installing the Ctrl-C handler")?;
    }
    let options = EngineOptions {
        load: LoadOptions {
            compute_dtype: Some(args.dtype),
            backend: MlxOptions { prefill_chunk: args.prefill_chunk, max_kv: args.max_kv_size },
            gpu_kernels: args.gpu.options(),
            backend_kind: args.engine.backend,
            iree: args.engine.iree_options(),
        },
        // One conversation: one sequence at a time.
        max_batch: 1,
        prefill_chunk: args.prefill_chunk,
        ..EngineOptions::default()
    };
    let engine = Engine::load(&args.bundle, options).with_context(|| format!("loading {}", args.bundle.display()))?;
    if interrupted.load(Ordering::SeqCst) {
        return Err(Interrupted.into());
    }
    let model = engine.model().clone();
    if args.verbose {
        note!(
            "[mlxcel] {} ({}), {:.1} MB of weights, ready in {:.1} ms on {}",
            if model.name.is_empty() { "model" } else { &model.name },
            model.architecture,
            model.weight_bytes as f64 / 1e6,
            model.load_time.as_secs_f64() * 1e3,
            args.engine.device_label()
        );
        if let Some(kernels) = &model.gpu_kernels {
            note!("[mlxcel] GPU kernels: {kernels}");
        }
    }
    let gen_options = GenerationOptions {
        max_tokens: args.max_tokens,
        sampling: args.sampling(&model)?,
        stop_strings: args.stop.clone(),
        grammar: args.output_grammar()?,
        ..GenerationOptions::default()
    };
    let use_template = model.chat_template.is_some() && !args.no_chat_template;
    if args.system.is_some() && !use_template {
        bail!("--system needs a chat template, and this run uses none (the bundle has none, or --no-chat-template)");
    }
    let mut history: Vec<Message> = args.system.iter().map(|s| Message::new("system", s.as_str())).collect();
    let answer = |prompt: Vec<u32>| -> Result<Generation> {
        let generating = engine.submit(Request { prompt, options: gen_options.clone() })?;
        *current.lock().map_err(|_| anyhow!("the Ctrl-C handler panicked"))? = Some(generating.canceller());
        let result = print_events(&out, generating);
        if let Ok(mut slot) = current.lock() {
            *slot = None;
        }
        let generation = result?;
        out.line("")?;
        if generation.finish_reason == FinishReason::Cancelled {
            note!("[stopped]");
        }
        if args.verbose {
            report(&generation);
        }
        Ok(generation)
    };

    if let Some(prompt) = &args.prompt {
        history.push(Message::new("user", prompt.as_str()));
        let tokens = if use_template { model.encode_chat(&history) } else { model.encode_text(prompt) };
        // The tokenizer and the template are the bundle's: say so.
        let tokens = tokens.with_context(|| format!("bundle {}", args.bundle.display()))?;
        if tokens.is_empty() {
            bail!("-p: the prompt gives no tokens (it is empty, and the tokenizer adds none to raw text)");
        }
        answer(tokens)?;
        if interrupted.load(Ordering::SeqCst) {
            return Err(Interrupted.into());
        }
        return Ok(());
    }
    if !use_template {
        bail!("interactive chat needs a chat template; pass a prompt with -p to complete raw text");
    }
    note!(
        "Chatting with {} — /reset clears the conversation, /exit (or Ctrl-D) quits, Ctrl-C stops an answer.",
        model.name
    );
    input::read_lines(input_tx);
    loop {
        crate::output::stderr(format_args!("> "));
        let line = match inputs.recv() {
            Ok(Input::Line { text, .. }) => text,
            Ok(Input::Skipped { number, reason }) => {
                note!("line {number} {reason}");
                continue;
            }
            Ok(Input::End) | Err(_) => {
                note!("");
                return Ok(());
            }
            Ok(Input::Failed(message)) => bail!(message),
            Ok(Input::Interrupted) => {
                note!("");
                return Err(Interrupted.into());
            }
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                history.retain(|m| m.role == "system");
                note!("[conversation cleared]");
                continue;
            }
            _ => {}
        }
        history.push(Message::new("user", line));
        // A message the conversation cannot take is refused, keeping the
        // conversation as it was; only what breaks the session ends it.
        let prompt = match chat_prompt(&model, &args.bundle, &history) {
            Ok(prompt) => prompt,
            Err(reason) => {
                history.pop();
                note!("{reason}; message ignored (/reset clears the conversation)");
                continue;
            }
        };
        let generation = answer(prompt)?;
        interrupted.store(false, Ordering::SeqCst);
        history.push(Message::new("assistant", generation.text));
    }
}

/// The prompt of the conversation `history`, or why it cannot be answered:
/// the template refuses it, or it leaves no room in the context for an answer.
fn chat_prompt(model: &ModelInfo, bundle: &Path, history: &[Message]) -> std::result::Result<Vec<u32>, String> {
    let prompt = model.encode_chat(history).map_err(|e| format!("bundle {}: {e}", bundle.display()))?;
    let context = model.context_length();
    if prompt.len() >= context {
        return Err(format!(
            "the conversation with this message has {} tokens but the context holds {context}",
            prompt.len()
        ));
    }
    Ok(prompt)
}

/// Prints a request's text as it arrives; returns the whole generation. A
/// failed write ends the request (dropping the stream cancels it).
fn print_events(out: &Stdout, generating: Generating) -> Result<Generation> {
    let (mut text, mut tokens, mut logprobs) = (String::new(), Vec::new(), Vec::new());
    for event in generating {
        match event {
            Event::Token { token, logprob, text: piece, .. } => {
                tokens.push(token);
                logprobs.push(logprob);
                out.write(&piece)?;
                text.push_str(&piece);
            }
            Event::Text(piece) => {
                out.write(&piece)?;
                text.push_str(&piece);
            }
            Event::Done { finish_reason, stats } => {
                return Ok(Generation { text, tokens, logprobs, finish_reason, stats });
            }
            Event::Failed(e) => return Err(e.into()),
        }
    }
    bail!("the engine stopped before the answer ended")
}

fn report(g: &Generation) {
    let s = &g.stats;
    note!(
        "[mlxcel] prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | first token after {:.1} ms | finish: {:?}",
        s.prompt_tokens,
        s.prefill_tokens_per_second(),
        s.generated_tokens,
        s.decode_tokens_per_second(),
        s.time_to_first_token.as_secs_f64() * 1e3,
        g.finish_reason
    );
    note!(
        "[mlxcel] peak memory: MLX {:.1} MB, process {}",
        mlxcel_mlx::memory::peak() as f64 / 1e6,
        peak_rss().map_or("unknown".into(), |kb| format!("{:.1} MB", kb as f64 / 1e3))
    );
}

/// The process's peak resident set size in kB (Linux `VmHWM`).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
