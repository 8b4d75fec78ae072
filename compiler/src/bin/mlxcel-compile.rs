//! `mlxcel-compile`: compile a model into a `.mlxb` bundle.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlxcel_compiler::compile::{
    CompileOptions, GraphEvent, IreeOptions, Progress, QuantizeTarget, TensorPlan, WeightLayoutChoice, compile,
};
use mlxcel_compiler::cuda::{CudaKernelOptions, CudaTarget, KernelEvent};
use mlxcel_compiler::hub;
use mlxcel_compiler::ingest::SourceModel;
use mlxcel_stablehlo::{IreeCompiler, Target as IreeTarget};
use mlxcel_surgery::{ModelTensor, ModelView, Surgery};

/// Compiles a large language model ahead of time into one verified,
/// memory-mappable `.mlxb` bundle that `mlxcel run` and `mlxcel-server` start
/// from in milliseconds.
///
/// MODEL is a GGUF file, a Hugging Face directory (config.json, safetensors,
/// tokenizer.json), an MLX-quantized directory as mlx-lm writes it, or a
/// Hugging Face repo id (`owner/name`, `owner/name@revision`,
/// `owner/name/file.gguf`) downloaded into the Hugging Face cache (HF_HOME,
/// HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are honoured).
#[derive(Parser)]
#[command(name = "mlxcel-compile", version = version(), max_term_width = 100)]
struct Args {
    /// The source model: a .gguf file, a Hugging Face or MLX directory, or a Hub repo id.
    model: String,
    /// The bundle to write (default: the model's name with .mlxb, in the current directory).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// How to store weight matrices: auto (float stays float, GGUF blocks
    /// transcode losslessly where MLX's affine format can hold them, other
    /// blocks requantize at the nearest width), none (float; quantized
    /// sources dequantized to f32), bf16, f16, or q8/q6/q5/q4/q3/q2 (affine
    /// quantization through MLX). Norms and biases always stay float.
    #[arg(short, long, default_value = "auto")]
    quantize: QuantizeTarget,
    /// Inputs per quantization group with --quantize qN: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    group_size: u32,
    /// With --quantize qN, still keep GGUF blocks that transcode without loss
    /// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) as they are.
    #[arg(long)]
    keep_source_quant: bool,
    /// Bits of the embedding table and output projection with --quantize qN
    /// (e.g. 8 to keep them more precise than the rest).
    #[arg(long)]
    embedding_bits: Option<u32>,
    /// How quantized weights are arranged: rows16 (4- and 8-bit matrices
    /// with a multiple of 16 rows stored in transposed blocks of 16 rows,
    /// which mlxcel's CPU kernels read fastest, for one sequence and for a
    /// decode batch), row-major (MLX's layout, what GPU ops and IREE read),
    /// or auto: row-major with --target cuda-* or iree-*, else rows16. See
    /// docs/compiler.md.
    #[arg(long, default_value = "auto", value_name = "auto|rows16|row-major")]
    weight_layout: WeightLayoutChoice,
    /// Print each tensor's stored form, size and quantization error (relative RMS against the source values).
    #[arg(long)]
    report: bool,
    /// The model name recorded in the bundle (default: the source's file or directory name).
    #[arg(long)]
    name: Option<String>,
    /// A chat template (Jinja file) to store instead of the source's. Sources
    /// without one get their family's published template when mlxcel knows it
    /// (Gemma 3).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Apply the weight edits of this YAML file before quantizing (see docs/surgery.md).
    #[arg(long, value_name = "CFG.yaml")]
    surgery: Option<PathBuf>,
    /// Print which tensors each surgery operation would touch, and the config
    /// it would change, then stop without writing anything.
    #[arg(long, requires = "surgery")]
    surgery_dry_run: bool,
    /// Also compile for this target (repeatable). cuda-sm80, cuda-sm86,
    /// cuda-sm89, cuda-sm90, cuda-sm100, cuda-sm120: MLX's CUDA kernels for
    /// that GPU architecture. MLX compiles a few kernel modules (the
    /// embedding lookup's gather, the quantized matmul of prompts of 8 or
    /// more tokens) on the GPU host the first time a process needs them,
    /// seconds to a minute each; these are compiled here with NVRTC (no GPU
    /// needed; 3 s to 50 s a module, ~2 GB each) and stored so that the
    /// runtime starts with them ready (f32 activations, MLX 0.32.4's CUDA
    /// wheel only). iree-llvm-cpu (this machine's CPU),
    /// iree-llvm-cpu:TRIPLE:CPU (e.g. iree-llvm-cpu:x86_64-unknown-linux-gnu:x86-64-v3)
    /// or iree-cuda-smNN: the model traced into StableHLO (stored once) and
    /// compiled by iree-compile into an IREE module for that target, with
    /// prefill over prompt chunks of 32, 128 and 512 tokens and decode
    /// steps of 1 and 4 sequences; the weights stay the bundle's tensors.
    /// See docs/compiler.md.
    #[arg(long = "target", value_name = "cuda-smXY|iree-...")]
    targets: Vec<BuildTarget>,
    /// With --target iree-*: positions the traced KV caches hold, the
    /// longest context the IREE backend serves (default: the model's
    /// context, at most 4096; each decode step attends over all of them).
    #[arg(long, value_name = "N")]
    iree_context: Option<usize>,
    /// With --target iree-*: the iree-compile program. Default:
    /// $MLXCEL_DEPS_DIR/iree/iree/compiler/_mlir_libs/iree-compile, from the
    /// iree-base-compiler package `make setup` installs.
    #[arg(long, env = "MLXCEL_IREE_COMPILE", value_name = "PATH")]
    iree_compile: Option<PathBuf>,
    /// With --target cuda-*: MLX's CUDA wheel, its mlx/ folder (version.h and
    /// libmlx.so, whose built-in kernel sources are compiled). Default:
    /// $MLXCEL_DEPS_DIR/mlx-cuda-13/mlx, which `make setup-cuda` installs.
    #[arg(long, env = "MLXCEL_MLX_CUDA", value_name = "DIR")]
    mlx_cuda: Option<PathBuf>,
    /// With --target cuda-*: the unpacked nvidia-cuda-nvrtc and nvidia-cuda-runtime
    /// (CUDA 13) wheels, the folder holding nvidia/cu13/{lib,include}.
    /// Default: $MLXCEL_DEPS_DIR/nvrtc-13, which `make setup-cuda` installs.
    #[arg(long, env = "MLXCEL_NVRTC", value_name = "DIR")]
    nvrtc: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn version() -> String {
    format!("{} (MLX {})", env!("CARGO_PKG_VERSION"), mlxcel_mlx::mlx_version())
}

fn default_output(model: &Path) -> PathBuf {
    let stem = if model.is_dir() { model.file_name() } else { model.file_stem() };
    let stem = stem.map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    PathBuf::from(format!("{stem}.mlxb"))
}

fn run(args: Args) -> Result<()> {
    // The process settings of the MLX layer (device, kernel ISA, threads:
    // README.md), read once from the environment; a bad value stops here.
    mlxcel_mlx::settings::Settings::from_env(|name| std::env::var(name).ok())?.apply()?;
    let model_path = match hub::parse_repo_ref(&args.model) {
        Some(repo) => hub::fetch(&repo, !args.quiet)?,
        None => PathBuf::from(&args.model),
    };
    let output = args.output.clone().unwrap_or_else(|| default_output(&model_path));
    let flag = if args.output.is_some() { "-o/--output" } else { "the default output" };
    // Before any work: an output that cannot be written, or that would
    // replace an input, fails now rather than at the final rename.
    if !args.surgery_dry_run {
        check_output(flag, &output)?;
        let inputs = [Some(&model_path), args.surgery.as_ref(), args.chat_template.as_ref()];
        check_not_an_input(flag, &output, inputs.into_iter().flatten())?;
    }
    // SourceModel's errors name the file.
    let source = SourceModel::open(&model_path)?;
    if !args.surgery_dry_run {
        check_not_an_input(flag, &output, source.source_files().iter())?;
    }
    let surgery = args.surgery.as_deref().map(Surgery::from_file).transpose()?;
    if args.surgery_dry_run {
        let surgery = surgery.as_ref().context("--surgery-dry-run needs --surgery")?;
        return dry_run(&source, surgery);
    }
    let cuda = cuda_options(&args)?;
    let iree = iree_options(&args)?;
    let options = CompileOptions {
        quantize: args.quantize,
        group_size: args.group_size,
        keep_source_quant: args.keep_source_quant,
        embedding_bits: args.embedding_bits,
        report: args.report,
        weight_layout: args.weight_layout.resolve(!args.targets.is_empty()),
        cuda,
        iree,
        name: args.name.clone(),
        chat_template: args
            .chat_template
            .as_ref()
            .map(|p| {
                let limit = mlxcel_runtime::chat::MAX_TEMPLATE_BYTES as u64;
                mlxcel_compiler::ingest::read_text(p, limit).context("--chat-template")
            })
            .transpose()?,
    };
    let total: u64 = source.tensors().iter().map(|t| t.nbytes).sum();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} {wide_msg}")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    let mut last = 0u64;
    let report = compile(&source, &output, &options, surgery.as_ref(), &mut |p| match p {
        Progress::Tensor { tensor, source_bytes } => {
            bar.inc(last);
            last = source_bytes;
            bar.set_message(tensor.to_string());
        }
        Progress::Kernels(KernelEvent::Started { jobs, workers }) => {
            bar.inc(last);
            last = 0;
            let line = format!("compiling {jobs} CUDA kernel modules with NVRTC, {workers} at a time");
            log_line(&bar, args.quiet, &line);
            bar.set_message(line);
        }
        Progress::Kernels(KernelEvent::Finished { module, target, seconds, bytes, done, jobs }) => {
            let mb = bytes as f64 / 1e6;
            log_line(
                &bar,
                args.quiet,
                &format!("kernel {module} for {target}: {mb:.2} MB in {seconds:.1} s ({done}/{jobs})"),
            );
            bar.set_message(format!("CUDA kernel modules: {done}/{jobs} compiled"));
        }
        Progress::Graphs(GraphEvent::Traced { functions, bytes }) => {
            bar.inc(last);
            last = 0;
            let line = format!("traced {} into StableHLO ({:.1} MB of MLIR)", functions.join(", "), bytes as f64 / 1e6);
            log_line(&bar, args.quiet, &line);
        }
        Progress::Graphs(GraphEvent::Compiling { target }) => {
            bar.set_message(format!("iree-compile for {target} (a minute or more for a real model)"));
        }
        Progress::Graphs(GraphEvent::Compiled { target, bytes, seconds }) => {
            let line = format!("IREE module for {target}: {:.2} MB in {seconds:.1} s", bytes as f64 / 1e6);
            log_line(&bar, args.quiet, &line);
        }
    })
    .with_context(|| format!("compiling into {}", output.display()))?;
    bar.inc(last);
    bar.finish_and_clear();

    if args.report {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{:<56} {:>10} {:>10} {:>11} {:>10}", "tensor", "source", "stored", "bytes", "rel. RMS")
            .context(STDOUT)?;
        for t in &report.tensors {
            let err = t.rel_rms_error.map_or("-".to_string(), |e| format!("{e:.2e}"));
            writeln!(out, "{:<56} {:>10} {:>10} {:>11} {:>10}", t.name, t.source, t.plan.to_string(), t.bytes, err)
                .context(STDOUT)?;
        }
        out.flush().context(STDOUT)?;
    }
    let count = |f: fn(&TensorPlan) -> bool| report.tensors.iter().filter(|t| f(&t.plan)).count();
    // A closed stderr is no reason to fail a compile that succeeded.
    let _ = writeln!(
        std::io::stderr(),
        "wrote {} ({:.1} MB, {} tensors: {} kept, {} quantized, {} float) in {:.2} s; root hash {}",
        report.written.path.display(),
        report.written.file_len as f64 / 1e6,
        report.tensors.len(),
        count(|p| matches!(p, TensorPlan::KeepAffine)),
        count(|p| matches!(p, TensorPlan::Quantize { .. })),
        count(|p| matches!(p, TensorPlan::Float(_))),
        report.elapsed.as_secs_f64(),
        mlxcel_bundle::hex(&report.written.root_hash),
    );
    let _ = writeln!(std::io::stderr(), "tokenizer: {}", report.tokenizer);
    if !report.kernels.is_empty() {
        let bytes: usize = report.kernels.iter().map(|k| k.bytes).sum();
        let seconds: f64 = report.kernels.iter().map(|k| k.seconds).sum();
        let _ = writeln!(
            std::io::stderr(),
            "CUDA kernels: {} modules ({:.1} MB of cubins, {seconds:.1} s of NVRTC)",
            report.kernels.len(),
            bytes as f64 / 1e6
        );
    }
    for g in &report.graphs {
        let _ = writeln!(
            std::io::stderr(),
            "IREE module for {}: {:.1} MB ({:.1} s of iree-compile)",
            g.target,
            g.bytes as f64 / 1e6,
            g.seconds
        );
    }
    Ok(())
}

/// One `--target`: a GPU architecture for MLX's CUDA kernels, or an IREE target.
#[derive(Clone, Debug)]
enum BuildTarget {
    Cuda(CudaTarget),
    Iree(IreeTarget),
}

impl std::str::FromStr for BuildTarget {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<BuildTarget, String> {
        if s.starts_with("iree-") {
            s.parse().map(BuildTarget::Iree).map_err(|e: mlxcel_stablehlo::iree::UnknownTarget| e.to_string())
        } else {
            s.parse()
                .map(BuildTarget::Cuda)
                .map_err(|e| format!("{e}; or an IREE target: iree-llvm-cpu, iree-cuda-sm90"))
        }
    }
}

/// What --target iree-*, --iree-context and --iree-compile ask for.
fn iree_options(args: &Args) -> Result<Option<IreeOptions>> {
    // Each target once, in the order given (a repeated one would be a
    // second section under the same kind, key and target).
    let mut targets: Vec<IreeTarget> = Vec::new();
    for t in &args.targets {
        if let BuildTarget::Iree(t) = t
            && !targets.contains(t)
        {
            targets.push(t.clone());
        }
    }
    if targets.is_empty() {
        if args.iree_context.is_some() {
            bail!("--iree-context needs a --target iree-*");
        }
        return Ok(None);
    }
    let compiler = match (&args.iree_compile, std::env::var_os("MLXCEL_DEPS_DIR")) {
        (Some(p), _) => p.clone(),
        (None, Some(deps)) => IreeCompiler::in_deps(Path::new(&deps)),
        (None, None) => bail!(
            "--target iree-* needs --iree-compile PATH (or MLXCEL_IREE_COMPILE, or MLXCEL_DEPS_DIR): \
             `make setup` installs iree-compile under .deps/"
        ),
    };
    if !compiler.is_file() {
        bail!("--iree-compile {}: no such file (`make setup` installs it under .deps/iree)", compiler.display());
    }
    Ok(Some(IreeOptions { targets, compiler, context: args.iree_context }))
}

/// What --target cuda-*, --mlx-cuda and --nvrtc ask for; the tools' folders
/// default to `make setup-cuda`'s under $MLXCEL_DEPS_DIR.
fn cuda_options(args: &Args) -> Result<Option<CudaKernelOptions>> {
    let cuda: Vec<CudaTarget> = args
        .targets
        .iter()
        .filter_map(|t| match t {
            BuildTarget::Cuda(t) => Some(*t),
            BuildTarget::Iree(_) => None,
        })
        .collect();
    // --mlx-cuda and --nvrtc alone (set through the environment) do nothing.
    if cuda.is_empty() {
        return Ok(None);
    }
    let deps = std::env::var_os("MLXCEL_DEPS_DIR").map(PathBuf::from);
    let pick = |given: &Option<PathBuf>, under_deps: &str, flag: &str, env: &str| -> Result<PathBuf> {
        match (given, &deps) {
            (Some(dir), _) => Ok(dir.clone()),
            (None, Some(deps)) => Ok(deps.join(under_deps)),
            (None, None) => bail!(
                "--target cuda-* needs {flag} DIR (or {env}, or MLXCEL_DEPS_DIR): install the CUDA tools \
                 with `make setup-cuda`, which puts them under .deps/"
            ),
        }
    };
    let mut targets = cuda;
    targets.sort();
    targets.dedup();
    Ok(Some(CudaKernelOptions {
        targets,
        mlx_cuda: pick(&args.mlx_cuda, "mlx-cuda-13/mlx", "--mlx-cuda", "MLXCEL_MLX_CUDA")?,
        nvrtc: pick(&args.nvrtc, "nvrtc-13", "--nvrtc", "MLXCEL_NVRTC")?,
    }))
}

/// A line of progress that stays: above the bar on a terminal, a plain
/// line on stderr otherwise (a log), nothing with --quiet.
fn log_line(bar: &ProgressBar, quiet: bool, line: &str) {
    if quiet {
        return;
    }
    if bar.is_hidden() {
        // A closed stderr is no reason to fail the compile.
        let _ = writeln!(std::io::stderr(), "{line}");
    } else {
        bar.println(line);
    }
}

/// The context of a failed write to standard output.
const STDOUT: &str = "writing to standard output";

/// Refuses an output that is a directory or whose directory cannot take a
/// new file, naming `flag`: checked before any work, so a compile never
/// fails at its final rename.
fn check_output(flag: &str, output: &Path) -> Result<()> {
    if output.is_dir() {
        bail!("{flag} {}: is a directory; give the bundle's file name", output.display());
    }
    // The finished bundle is renamed over the output: a device, FIFO or
    // socket there (`-o /dev/full` as root) would be replaced by a file.
    if let Ok(meta) = std::fs::metadata(output)
        && !meta.is_file()
    {
        bail!("{flag} {}: exists and is not a regular file; give the bundle's file name", output.display());
    }
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!("{flag} {}: the directory {} does not exist", output.display(), dir.display());
    }
    // The bundle is written to a temporary file beside the output: make one.
    let probe = dir.join(format!(".mlxcel-compile-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| format!("{flag} {}: cannot create a file in {}", output.display(), dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Refuses an output that is one of `inputs` (the same file under any name:
/// same device and inode), naming `flag`.
fn check_not_an_input<'a>(flag: &str, output: &Path, inputs: impl Iterator<Item = &'a PathBuf>) -> Result<()> {
    let Ok(out) = std::fs::metadata(output) else { return Ok(()) };
    for input in inputs {
        if std::fs::metadata(input).is_ok_and(|m| same_file(&m, &out)) {
            bail!("{flag} {}: is the input {}; the bundle would replace it", output.display(), input.display());
        }
    }
    Ok(())
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    false
}

/// On SIGINT, SIGTERM or SIGHUP: remove the bundle being written (`Drop`
/// does not run when a signal ends the process) and exit with 128 + the
/// signal's number, as a shell reports a process the signal killed.
fn remove_partial_bundle_on_signals() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing the signal handlers")?;
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let removed = mlxcel_bundle::remove_temporary_files();
            let name = signal_hook::low_level::signal_name(signal).unwrap_or("a signal");
            let what = if removed > 0 { "; the partial bundle was removed" } else { "" };
            let _ = writeln!(std::io::stderr(), "\nmlxcel-compile: interrupted by {name}{what}");
            // `_exit`: no atexit handlers, so no C++ static destructor of
            // MLX runs while the main thread is still computing with it.
            signal_hook::low_level::exit(128 + signal);
        }
    });
    Ok(())
}

/// Prints what each operation of `surgery` would do to `source`.
fn dry_run(source: &SourceModel, surgery: &Surgery) -> Result<()> {
    let config = source.config();
    let tensors: Vec<ModelTensor> =
        source.tensors().iter().map(|t| ModelTensor { name: t.name.clone(), shape: t.shape.clone() }).collect();
    let plan = surgery.plan(ModelView { config, tensors: &tensors })?;
    let mut out = std::io::stdout().lock();
    for (i, op) in plan.operations.iter().enumerate() {
        writeln!(out, "#{} {} ({} tensors)", i + 1, op.description, op.matched.len()).context(STDOUT)?;
        for name in &op.matched {
            writeln!(out, "    {name}").context(STDOUT)?;
        }
    }
    let as_json = |c: &mlxcel_compiler::ingest::ModelConfig| serde_json::to_value(c).unwrap_or_default();
    if let (serde_json::Value::Object(old), serde_json::Value::Object(new)) = (as_json(config), as_json(&plan.config)) {
        for (k, v) in &new {
            if old.get(k) != Some(v) {
                let old = old.get(k).map_or("(unset)".to_string(), |o| o.to_string());
                writeln!(out, "config {k}: {old} -> {v}").context(STDOUT)?;
            }
        }
    }
    writeln!(out, "{} tensors out, {} removed; nothing written (dry run)", plan.outputs.len(), plan.removed.len())
        .context(STDOUT)?;
    out.flush().context(STDOUT)?;
    Ok(())
}

/// Whether `e` is a write to a closed pipe (`mlxcel-compile --report | head`).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = remove_partial_bundle_on_signals() {
        let _ = writeln!(std::io::stderr(), "error: {e:#}");
        return ExitCode::FAILURE;
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader has gone: nobody to tell; 141 is what a shell shows for
        // a process SIGPIPE ended.
        Err(e) if is_broken_pipe(&e) => ExitCode::from(141),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
