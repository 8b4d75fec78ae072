//! `mlxcel run`: generate from a bundle, once (`-p`) or as an interactive chat.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use clap::Args;
use mlxcel_runtime::backend::MlxOptions;
use mlxcel_runtime::chat::Message;
use mlxcel_runtime::engine::{Canceller, Engine, EngineOptions, Event, Generating, ModelInfo, Request};
use mlxcel_runtime::generate::{FinishReason, Generation, GenerationOptions};
use mlxcel_runtime::loader::LoadOptions;
use mlxcel_runtime::sampler::SamplingParams;

/// Options of `mlxcel run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The bundle to run (`mlxcel-compile` makes one).
    pub bundle: PathBuf,
    /// The prompt. Without it, `run` starts an interactive chat.
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// The most tokens to generate per answer.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy (default: the model's, else 0).
    #[arg(long = "temp")]
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens up to this mass (0, 1].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Drop tokens less likely than this fraction of the most likely one.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalise recently generated tokens multiplicatively (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtract from the logits of recently seen tokens (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract per occurrence of recently seen tokens (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: a fresh one each run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Cap the KV cache to this many positions per layer (older ones slide out).
    #[arg(long)]
    pub max_kv_size: Option<usize>,
    /// Prompt tokens per forward pass while prefilling.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Send the prompt as raw text instead of through the model's chat template.
    #[arg(long)]
    pub no_chat_template: bool,
    /// A system message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Print load time, prompt and decode speed and peak memory (to stderr).
    #[arg(short, long)]
    pub verbose: bool,
}

impl RunArgs {
    fn sampling(&self, model: &ModelInfo) -> SamplingParams {
        let d = &model.defaults;
        SamplingParams {
            temperature: self.temperature.unwrap_or(0.0),
            top_k: self.top_k.unwrap_or(if self.temperature.is_some() { d.top_k.unwrap_or(0) } else { 0 }),
            top_p: self.top_p.unwrap_or(if self.temperature.is_some() { d.top_p.unwrap_or(1.0) } else { 1.0 }),
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

/// Runs `mlxcel run`.
pub fn run(args: RunArgs) -> Result<()> {
    // The request being generated, for Ctrl-C to stop; `None` at the chat prompt.
    let current: Arc<Mutex<Option<Canceller>>> = Arc::new(Mutex::new(None));
    {
        let current = current.clone();
        // Ctrl-C stops the answer being generated; at the chat prompt it explains how to quit.
        ctrlc::set_handler(move || match current.lock().ok().as_deref().and_then(Option::as_ref) {
            Some(canceller) => canceller.cancel(),
            None => eprint!("\n(use /exit or Ctrl-D to quit)\n> "),
        })
        .context("installing the Ctrl-C handler")?;
    }
    let options = EngineOptions {
        load: LoadOptions {
            compute_dtype: None,
            backend: MlxOptions { prefill_chunk: args.prefill_chunk, max_kv: args.max_kv_size },
        },
        // One conversation: one sequence at a time.
        max_batch: 1,
    };
    let engine = Engine::load(&args.bundle, options).with_context(|| format!("loading {}", args.bundle.display()))?;
    let model = engine.model().clone();
    if args.verbose {
        eprintln!(
            "[mlxcel] {} ({}), {:.1} MB of weights, ready in {:.1} ms on {}",
            if model.name.is_empty() { "model" } else { &model.name },
            model.architecture,
            model.weight_bytes as f64 / 1e6,
            model.load_time.as_secs_f64() * 1e3,
            mlxcel_mlx::device::default_device()
        );
    }
    let gen_options = GenerationOptions {
        max_tokens: args.max_tokens,
        sampling: args.sampling(&model),
        stop_strings: args.stop.clone(),
        ..GenerationOptions::default()
    };
    gen_options.sampling.validate()?;
    let use_template = model.chat_template.is_some() && !args.no_chat_template;
    if args.system.is_some() && !use_template {
        bail!("--system needs a chat template, and this run uses none (the bundle has none, or --no-chat-template)");
    }
    let mut history: Vec<Message> = args.system.iter().map(|s| Message::new("system", s.as_str())).collect();
    let answer = |history: &[Message], raw: &str| -> Result<Generation> {
        let prompt = if use_template { model.encode_chat(history)? } else { model.encode_text(raw)? };
        let generating = engine.submit(Request { prompt, options: gen_options.clone() })?;
        *current.lock().map_err(|_| anyhow::anyhow!("the Ctrl-C handler panicked"))? = Some(generating.canceller());
        let result = print_events(generating);
        if let Ok(mut slot) = current.lock() {
            *slot = None;
        }
        let generation = result?;
        println!();
        if generation.finish_reason == FinishReason::Cancelled {
            eprintln!("[stopped]");
        }
        if args.verbose {
            report(&generation);
        }
        Ok(generation)
    };

    if let Some(prompt) = &args.prompt {
        history.push(Message::new("user", prompt.as_str()));
        answer(&history, prompt)?;
        return Ok(());
    }
    if !use_template {
        bail!("interactive chat needs a chat template; pass a prompt with -p to complete raw text");
    }
    eprintln!(
        "Chatting with {} — /reset clears the conversation, /exit (or Ctrl-D) quits, Ctrl-C stops an answer.",
        model.name
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                history.retain(|m| m.role == "system");
                eprintln!("[conversation cleared]");
                continue;
            }
            _ => {}
        }
        history.push(Message::new("user", line));
        let generation = answer(&history, line)?;
        history.push(Message::new("assistant", generation.text));
    }
}

/// Prints a request's text as it arrives; returns the whole generation.
fn print_events(generating: Generating) -> Result<Generation> {
    let stdout = std::io::stdout();
    let (mut text, mut tokens, mut logprobs) = (String::new(), Vec::new(), Vec::new());
    let show = |piece: &str, text: &mut String| {
        text.push_str(piece);
        let mut out = stdout.lock();
        let _ = out.write_all(piece.as_bytes());
        let _ = out.flush();
    };
    for event in generating {
        match event {
            Event::Token { token, logprob, text: piece } => {
                tokens.push(token);
                logprobs.push(logprob);
                show(&piece, &mut text);
            }
            Event::Text(piece) => show(&piece, &mut text),
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
    eprintln!(
        "[mlxcel] prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | first token after {:.1} ms | finish: {:?}",
        s.prompt_tokens,
        s.prefill_tokens_per_second(),
        s.generated_tokens,
        s.decode_tokens_per_second(),
        s.time_to_first_token.as_secs_f64() * 1e3,
        g.finish_reason
    );
    eprintln!(
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
