//! Builds the prebuilt bundles of `bundles/catalog.toml` into one folder with
//! their `index.json`: scripts/build-bundles.sh (`make bundles`) runs it with
//! the release binaries, `make bundles-repro` twice with the test build.
//!
//! For each entry: check the source (a package GGUF against its pinned
//! sha256, or a Hub repo at a commit), `mlxcel-compile` it, `mlxcel verify`
//! the bundle, run the smoke prompt greedily on the entry's targets and
//! check the answer, then describe the file (size, sha256, root hash) in the
//! index. Any failure stops the build naming the entry.
//!
//! ```text
//! cargo run -p mlxcel-cli --example build_bundles -- --bin target/release \
//!     --models .deps/models --out dist [--only NAME]... [--hub]
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use mlxcel_bundle::{Bundle, hex};
use mlxcel_cli::prebuilt::catalog::{Catalog, Entry};
use mlxcel_cli::prebuilt::index::{INDEX_FORMAT, Index, IndexEntry, SurgeryFile, file_sha256};

/// Builds the catalog's bundles and their index.
#[derive(Parser)]
struct Args {
    /// The catalog.
    #[arg(long, default_value = "bundles/catalog.toml")]
    catalog: PathBuf,
    /// The folder holding the mlxcel and mlxcel-compile binaries to build with.
    #[arg(long)]
    bin: PathBuf,
    /// The folder of the model packages' files (`make setup` fills .deps/models).
    #[arg(long)]
    models: PathBuf,
    /// The output folder: NAME.mlxb for each entry, and index.json.
    #[arg(long)]
    out: PathBuf,
    /// Build only these entries (repeatable; default: every one it can).
    #[arg(long)]
    only: Vec<String>,
    /// Also build the entries whose source is a Hub repo (needs the Hub).
    #[arg(long)]
    hub: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.catalog).with_context(|| format!("reading {}", args.catalog.display()))?;
    let catalog = Catalog::parse(&text).with_context(|| args.catalog.display().to_string())?;
    for name in &args.only {
        ensure!(catalog.entry(name).is_some(), "--only {name}: not in the catalog ({})", catalog.names().join(", "));
    }
    let catalog_dir = args.catalog.parent().unwrap_or(Path::new(".")).to_path_buf();
    let version = mlxcel_version(&args.bin)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let mut index = Index { format: INDEX_FORMAT, bundles: Vec::new() };
    for entry in &catalog.bundles {
        if !args.only.is_empty() && !args.only.contains(&entry.name) {
            continue;
        }
        if entry.source.hub.is_some() && !args.hub {
            eprintln!("build_bundles: {}: skipped (its source is a Hub repo: pass --hub)", entry.name);
            continue;
        }
        let built = build(&args, &catalog_dir, entry, &version).with_context(|| format!("entry {}", entry.name))?;
        eprintln!(
            "build_bundles: {}: {} bytes, sha256 {}, root hash {}",
            built.name, built.size, built.sha256, built.blake3_root
        );
        index.bundles.push(built);
    }
    ensure!(!index.bundles.is_empty(), "no entry was built");
    let path = args.out.join("index.json");
    std::fs::write(&path, index.to_json()).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("build_bundles: {} bundle(s) and {} written", index.bundles.len(), path.display());
    Ok(())
}

/// The version of the `mlxcel` in `bin` (`mlxcel --version`'s first line).
fn mlxcel_version(bin: &Path) -> Result<String> {
    let out = run(Command::new(bin.join("mlxcel")).arg("--version"))?;
    out.lines()
        .next()
        .and_then(|l| l.strip_prefix("mlxcel "))
        .map(str::to_string)
        .with_context(|| format!("unexpected `mlxcel --version` output: {out}"))
}

/// Runs a command; its stdout, or an error with its stderr.
fn run(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8(out.stdout).with_context(|| format!("{shown}: output is not UTF-8"))
}

fn build(args: &Args, catalog_dir: &Path, entry: &Entry, version: &str) -> Result<IndexEntry> {
    let source = match (&entry.source.package, &entry.source.hub) {
        (Some(_), _) => {
            // The catalog checked that a package source has file and sha256.
            let file = args.models.join(entry.source.file.as_deref().unwrap_or_default());
            let (_, sha256) = file_sha256(&file).with_context(|| format!("reading {}", file.display()))?;
            let pinned = entry.source.sha256.as_deref().unwrap_or_default();
            ensure!(sha256 == pinned, "{} has sha256 {sha256}, the catalog pins {pinned}", file.display());
            file.into_os_string()
        }
        (None, Some(hub)) => format!("{hub}@{}", entry.source.revision.as_deref().unwrap_or_default()).into(),
        (None, None) => unreachable!("the catalog checked every source"),
    };
    let out = args.out.join(entry.file_name());
    let mut compile = Command::new(args.bin.join("mlxcel-compile"));
    compile.arg(&source).arg("-o").arg(&out).args(["--name", &entry.model, "--quiet"]).args(&entry.options);
    let surgery = match &entry.surgery {
        Some(rel) => {
            let path = catalog_dir.join(rel);
            compile.arg("--surgery").arg(&path);
            let (_, sha256) = file_sha256(&path).with_context(|| format!("reading {}", path.display()))?;
            Some(SurgeryFile { file: rel.clone(), sha256 })
        }
        None => None,
    };
    run(&mut compile)?;
    run(Command::new(args.bin.join("mlxcel")).arg("verify").arg(&out))?;
    for target in &entry.targets {
        let answer = run(Command::new(args.bin.join("mlxcel"))
            .args(["run", "--device", target.as_str()])
            .arg(&out)
            .args(["-p", &entry.smoke.prompt, "-n", &entry.smoke.max_tokens.to_string()])
            .args(entry.smoke.raw.then_some("--no-chat-template")))?;
        ensure!(
            answer.contains(&entry.smoke.expect),
            "the smoke prompt {:?} on {target}: the greedy answer {:?} lacks {:?}",
            entry.smoke.prompt,
            answer.trim(),
            entry.smoke.expect
        );
        eprintln!("build_bundles: {} on {target}: {:?}", entry.name, answer.trim());
    }
    let (size, sha256) = file_sha256(&out).with_context(|| format!("reading {}", out.display()))?;
    let bundle = Bundle::open(&out).with_context(|| format!("opening {}", out.display()))?;
    Ok(IndexEntry {
        name: entry.name.clone(),
        file: entry.file_name(),
        model: bundle.model_name().to_string(),
        architecture: bundle.architecture().to_string(),
        description: entry.description.clone(),
        license: entry.license.clone(),
        source: entry.source.clone(),
        options: entry.options.clone(),
        surgery,
        mlxcel_version: version.to_string(),
        targets: entry.targets.clone(),
        size,
        blake3_root: hex(&bundle.root_hash()),
        sha256,
    })
}
