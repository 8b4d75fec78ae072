//! The YAML schema (version 1) and its parsing, with the line of every
//! operation so that errors can point at it.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Result, SurgeryError};

/// The schema version this crate reads.
pub const VERSION: u32 = 1;

/// One glob or several.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Targets {
    /// A single glob.
    One(String),
    /// Several globs (a tensor matching any of them is a target).
    Many(Vec<String>),
}

impl Targets {
    /// The globs.
    pub fn globs(&self) -> Vec<&str> {
        match self {
            Targets::One(g) => vec![g.as_str()],
            Targets::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// What `prune` removes or zeroes.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    /// Whole decoder layers (ids are layer indices).
    Layer,
    /// Query heads (ids are head indices, in every layer of `layers`).
    AttentionHead,
    /// MLP hidden channels (ids are channel indices, in every layer of `layers`).
    MlpChannel,
}

impl fmt::Display for Granularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Granularity::Layer => "layer",
            Granularity::AttentionHead => "attention_head",
            Granularity::MlpChannel => "mlp_channel",
        })
    }
}

/// How `prune` prunes.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PruneMode {
    /// Set the weights to zero; shapes stay.
    Zero,
    /// Remove the rows, columns or tensors, and shrink the config.
    Remove,
}

impl fmt::Display for PruneMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PruneMode::Zero => "zero",
            PruneMode::Remove => "remove",
        })
    }
}

/// The interpolation of `interpolate`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// `(1 - t) a + t b`.
    #[default]
    Lerp,
    /// Spherical interpolation of the flattened tensors.
    Slerp,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Lerp => "lerp",
            Method::Slerp => "slerp",
        })
    }
}

/// One operation, as written in the YAML.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Operation {
    /// Multiply the targets by `factor`.
    Scale {
        /// Tensor globs.
        targets: Targets,
        /// The factor.
        factor: f64,
    },
    /// Add `alpha` times a tensor of `source` (a safetensors file) to each target.
    Add {
        /// Tensor globs.
        targets: Targets,
        /// A safetensors file (relative to the YAML file's folder).
        source: PathBuf,
        /// The multiplier of the source tensor.
        #[serde(default = "one")]
        alpha: f64,
        /// The source's key for a target: a pattern whose `*`s take the
        /// target glob's `*` matches in order (default: the target's name).
        #[serde(default)]
        key: Option<String>,
    },
    /// Remove or zero layers, attention heads or MLP channels.
    Prune {
        /// What to prune.
        granularity: Granularity,
        /// Which ones (layer, head or channel indices).
        ids: Vec<usize>,
        /// For heads and channels: the layers to prune in (default: all).
        #[serde(default)]
        layers: Option<Vec<usize>>,
        /// Zero or remove.
        mode: PruneMode,
    },
    /// Take each target from a donor safetensors file.
    Replace {
        /// Tensor globs.
        targets: Targets,
        /// The donor file.
        source: PathBuf,
        /// The donor's key pattern (see `add`).
        #[serde(default)]
        key: Option<String>,
    },
    /// Interpolate between two sources: each is a safetensors file or `model`
    /// (the model being compiled); ratio 0 gives the first, 1 the second.
    Interpolate {
        /// Tensor globs.
        targets: Targets,
        /// The two endpoints.
        sources: [String; 2],
        /// Where between them, in [0, 1].
        ratio: f64,
        /// Linear or spherical.
        #[serde(default)]
        method: Method,
        /// The key pattern in the files (see `add`).
        #[serde(default)]
        key: Option<String>,
    },
}

fn one() -> f64 {
    1.0
}

impl Operation {
    /// The operation's name as written (`scale`, `add`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Scale { .. } => "scale",
            Operation::Add { .. } => "add",
            Operation::Prune { .. } => "prune",
            Operation::Replace { .. } => "replace",
            Operation::Interpolate { .. } => "interpolate",
        }
    }

    /// A one-line description for provenance and dry runs.
    pub fn describe(&self) -> String {
        let t = |targets: &Targets| targets.globs().join(", ");
        match self {
            Operation::Scale { targets, factor } => format!("scale {} by {factor}", t(targets)),
            Operation::Add { targets, source, alpha, .. } => {
                format!("add {alpha} x {} to {}", source.display(), t(targets))
            }
            Operation::Prune { granularity, ids, layers, mode } => format!(
                "prune ({mode}) {granularity} {ids:?}{}",
                layers.as_ref().map_or(String::new(), |l| format!(" in layers {l:?}"))
            ),
            Operation::Replace { targets, source, .. } => format!("replace {} from {}", t(targets), source.display()),
            Operation::Interpolate { targets, sources, ratio, method, .. } => {
                format!("interpolate ({method}) {} between {} and {} at {ratio}", t(targets), sources[0], sources[1])
            }
        }
    }
}

/// A parsed surgery file.
#[derive(Clone, Debug)]
pub struct Surgery {
    /// The YAML text, verbatim.
    pub yaml: String,
    /// The folder relative source paths resolve against.
    pub base_dir: PathBuf,
    /// The operations in order, with the 1-based line each starts on.
    pub operations: Vec<(Operation, Option<usize>)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    version: u32,
    /// Kept as generic values first, so that an operation's error can name
    /// its index, op and line.
    operations: Vec<serde_value::Value>,
}

/// The largest surgery file read: 1 MiB (the examples are under 1 KB; a
/// file listing every tensor of a large model stays under 100 KB).
pub const MAX_YAML_BYTES: usize = 1 << 20;

/// What a surgery document may cost the YAML parser beyond its size: the
/// limits of `serde-saphyr`'s budget and alias replay, so that a file of
/// nested aliases (an "alias bomb": 100 KB once expanded to gigabytes) is an
/// error. A surgery file needs few events and almost no aliases; these
/// leave a hundred times the room a real one uses.
pub mod limits {
    /// Parser events (scalars, collection starts and ends) in the file.
    pub const EVENTS: usize = 200_000;
    /// Nodes (scalars and collections).
    pub const NODES: usize = 100_000;
    /// Nesting of sequences and mappings.
    pub const DEPTH: usize = 32;
    /// Alias uses (`*name`) and anchor definitions (`&name`), each.
    pub const ALIASES: usize = 1_000;
    /// Events that alias expansion may add to the document, in total.
    pub const REPLAYED_EVENTS: usize = 20_000;
    /// Aliases expanded inside aliases.
    pub const ALIAS_NESTING: usize = 8;
}

fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = limits::EVENTS;
    budget.max_nodes = limits::NODES;
    budget.max_depth = limits::DEPTH;
    budget.max_aliases = limits::ALIASES;
    budget.max_anchors = limits::ALIASES;
    budget.max_documents = 1;
    budget.max_total_scalar_bytes = MAX_YAML_BYTES;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    // One line per error: the message and its line and column.
    options.with_snippet = false;
    options.alias_limits.max_total_replayed_events = limits::REPLAYED_EVENTS;
    options.alias_limits.max_replay_stack_depth = limits::ALIAS_NESTING;
    options
}

impl Surgery {
    /// Reads and parses a surgery file (at most [`MAX_YAML_BYTES`]); errors
    /// name the file.
    pub fn from_file(path: &Path) -> Result<Surgery> {
        let in_file = |message: String| SurgeryError::Parse(format!("{}: {message}", path.display()));
        // The size first: reading a multi-gigabyte file to refuse it is the
        // exhaustion this limit is for.
        let len = std::fs::metadata(path).map_err(|e| in_file(e.to_string()))?.len();
        if len > MAX_YAML_BYTES as u64 {
            return Err(in_file(format!("{len} bytes is more than the limit of {MAX_YAML_BYTES}")));
        }
        let yaml = std::fs::read_to_string(path).map_err(|e| in_file(e.to_string()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Surgery::parse(&yaml, &base).map_err(|e| match e {
            SurgeryError::Parse(message) => in_file(message),
            other => other,
        })
    }

    /// Parses YAML text (at most [`MAX_YAML_BYTES`], within [`limits`]);
    /// relative paths resolve against `base_dir`.
    pub fn parse(yaml: &str, base_dir: &Path) -> Result<Surgery> {
        if yaml.len() > MAX_YAML_BYTES {
            return Err(SurgeryError::Parse(format!(
                "{} bytes is more than the limit of {MAX_YAML_BYTES}",
                yaml.len()
            )));
        }
        let doc: Document = serde_saphyr::from_str_with_options(yaml, yaml_options())
            .map_err(|e| SurgeryError::Parse(e.to_string()))?;
        if doc.version != VERSION {
            return Err(SurgeryError::Parse(format!(
                "version {} is not supported: this mlxcel reads surgery version {VERSION}",
                doc.version
            )));
        }
        if doc.operations.is_empty() {
            return Err(SurgeryError::Parse("operations is empty".into()));
        }
        let lines = operation_lines(yaml);
        let mut operations = Vec::with_capacity(doc.operations.len());
        for (i, value) in doc.operations.into_iter().enumerate() {
            let line = lines.get(i).copied();
            let op_name = match &value {
                serde_value::Value::Map(m) => match m.get(&serde_value::Value::String("op".into())) {
                    Some(serde_value::Value::String(s)) => s.clone(),
                    _ => "?".into(),
                },
                _ => "?".into(),
            };
            let error = |message: String| SurgeryError::Operation { index: i + 1, op: op_name.clone(), line, message };
            if let Some(message) = non_numeric_multiplier(&value) {
                return Err(error(message));
            }
            let op: Operation = value.deserialize_into().map_err(|e| error(e.to_string()))?;
            operations.push((op, line));
        }
        Ok(Surgery { yaml: yaml.to_string(), base_dir: base_dir.to_path_buf(), operations })
    }
}

/// The numeric fields of operations. An internally tagged enum's type
/// errors do not say which field they are in ("Invalid type sequence.
/// Expected f64"), so these are checked first, by name.
const NUMERIC_FIELDS: [&str; 3] = ["factor", "alpha", "ratio"];

/// Names a numeric field of `op` whose value is not a number.
fn non_numeric_multiplier(op: &serde_value::Value) -> Option<String> {
    use serde_value::Value as V;
    let serde_value::Value::Map(map) = op else { return None };
    NUMERIC_FIELDS.iter().find_map(|&key| {
        let value = map.get(&V::String(key.into()))?;
        let kind = match value {
            V::U8(_) | V::U16(_) | V::U32(_) | V::U64(_) | V::I8(_) | V::I16(_) | V::I32(_) | V::I64(_) => return None,
            V::F32(_) | V::F64(_) => return None,
            V::String(s) => format!("the string {s:?}"),
            V::Unit | V::Option(None) => "nothing (null)".to_string(),
            V::Seq(_) => "a list".to_string(),
            V::Map(_) => "a mapping".to_string(),
            V::Bool(b) => format!("the boolean {b}"),
            other => format!("{other:?}"),
        };
        Some(format!("{key}: must be a number, found {kind}"))
    })
}

/// The 1-based line where each item of the top-level `operations:` block
/// sequence starts (block style only; flow style yields none).
fn operation_lines(yaml: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let mut in_ops = false;
    let mut item_indent = None;
    for (n, line) in yaml.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 && !trimmed.starts_with('-') {
            in_ops = trimmed.starts_with("operations:");
            continue;
        }
        if in_ops && (trimmed.starts_with("- ") || trimmed == "-") {
            let expected = *item_indent.get_or_insert(indent);
            if indent == expected {
                lines.push(n + 1);
            }
        }
    }
    lines
}
