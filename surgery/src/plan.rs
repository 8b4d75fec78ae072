//! Validating a surgery against a model, before any weight is touched, into a
//! [`Plan`]: for every output tensor, the source tensor it comes from and the
//! edits to apply to it in order; the new config; what each operation matched.
//! Then [`Plan::apply`] runs one tensor's edits on MLX.
//!
//! Targets always name the model's original tensors (before any removal), and
//! operations apply in file order.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use globset::{Glob, GlobSetBuilder};
use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_mlx::{Array, Dtype};

use crate::donor::Donor;
use crate::error::{Result, SurgeryError};
use crate::schema::{Granularity, Method, Operation, PruneMode, Surgery, Targets};

/// The largest magnitude of a `scale` factor or an `add` alpha: 1,000.
/// Edits run in f32 and bundles store f16/bf16 weights; a weight of
/// magnitude 65 times 1,000 still fits f16 (65,504), while the factors
/// that made a model print nothing (1e39 is infinite in f32) do not pass.
pub const MAX_MULTIPLIER: f32 = 1_000.0;

/// A tensor of the model being compiled, as the surgery sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelTensor {
    /// Canonical (Hugging Face) name.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<usize>,
}

/// The model being compiled: its normalized config (which names the
/// architecture) and its tensors.
#[derive(Clone, Copy, Debug)]
pub struct ModelView<'a> {
    /// The normalized config.
    pub config: &'a ModelConfig,
    /// Every tensor, in source order.
    pub tensors: &'a [ModelTensor],
}

/// One endpoint of an interpolation.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// The model's own tensor (after the edits before this one).
    Model,
    /// A tensor of a safetensors file.
    File {
        /// The file.
        donor: Arc<Donor>,
        /// The key in it.
        key: String,
    },
}

/// One edit of one tensor.
#[derive(Clone, Debug)]
pub enum Edit {
    /// Multiply by a factor.
    Scale(f32),
    /// Add `alpha` times a donor tensor.
    Add {
        /// The file.
        donor: Arc<Donor>,
        /// The key in it.
        key: String,
        /// The multiplier.
        alpha: f32,
    },
    /// Replace with a donor tensor.
    Replace {
        /// The file.
        donor: Arc<Donor>,
        /// The key in it.
        key: String,
    },
    /// Interpolate between two endpoints.
    Interpolate {
        /// At ratio 0.
        from: Endpoint,
        /// At ratio 1.
        to: Endpoint,
        /// The ratio.
        ratio: f32,
        /// Linear or spherical.
        method: Method,
    },
    /// Set index ranges along an axis to zero.
    Zero {
        /// 0 for rows, 1 for columns.
        axis: usize,
        /// Index ranges.
        ranges: Vec<Range<usize>>,
    },
    /// Remove index ranges along an axis.
    Remove {
        /// 0 for rows, 1 for columns.
        axis: usize,
        /// Index ranges.
        ranges: Vec<Range<usize>>,
    },
}

/// One tensor of the output.
#[derive(Clone, Debug)]
pub struct OutputTensor {
    /// Its name in the bundle (layers are renumbered after a removal).
    pub name: String,
    /// The source tensor it is made from.
    pub source: String,
    /// Its final shape.
    pub shape: Vec<usize>,
    /// The edits, in order.
    pub edits: Vec<Edit>,
}

/// What one operation did, for provenance and dry runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRecord {
    /// A one-line description.
    pub description: String,
    /// The (original) tensors it touched or removed.
    pub matched: Vec<String>,
}

/// A validated surgery.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The output tensors, in source order.
    pub outputs: Vec<OutputTensor>,
    /// The config after removals (checked: every value still valid).
    pub config: ModelConfig,
    /// Per operation: its description and what it matched.
    pub operations: Vec<OperationRecord>,
    /// Source tensors that are not in the output.
    pub removed: Vec<String>,
}

struct Entry {
    name: String,
    shape: Vec<usize>,
    edits: Vec<Edit>,
    removed: bool,
}

/// The layer index of `model.layers.N.…`, and the rest of the name.
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (n, tail) = rest.split_once('.')?;
    Some((n.parse().ok()?, tail))
}

/// Sorted, merged ranges of `ids` scaled to blocks of `block` indices.
fn ranges(ids: &BTreeSet<usize>, block: usize) -> Vec<Range<usize>> {
    ids.iter().map(|&i| i * block..(i + 1) * block).collect()
}

struct Planner<'a> {
    model: ModelView<'a>,
    base_dir: &'a Path,
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    config: ModelConfig,
    donors: HashMap<PathBuf, Arc<Donor>>,
    heads_removed_by: Option<usize>,
    channels_removed_by: Option<usize>,
    /// Original layers removed by earlier operations.
    removed_layers: BTreeSet<usize>,
}

/// Errors of one operation, with its position, name and line.
struct OpCtx<'o> {
    index: usize,
    op: &'o str,
    line: Option<usize>,
}

impl OpCtx<'_> {
    fn err(&self, message: impl Into<String>) -> SurgeryError {
        SurgeryError::Operation { index: self.index, op: self.op.to_string(), line: self.line, message: message.into() }
    }
}

impl Planner<'_> {
    /// The original model's layer count (ids always refer to original layers).
    fn layers(&self) -> usize {
        self.model.config.num_hidden_layers
    }

    fn live(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied().filter(|&i| !self.entries[i].removed)
    }

    fn donor(&mut self, ctx: &OpCtx<'_>, path: &Path) -> Result<Arc<Donor>> {
        let full = if path.is_absolute() { path.to_path_buf() } else { self.base_dir.join(path) };
        if let Some(d) = self.donors.get(&full) {
            return Ok(d.clone());
        }
        let d = Arc::new(Donor::open(&full).map_err(|e| ctx.err(format!("source {e}")))?);
        self.donors.insert(full, d.clone());
        Ok(d)
    }

    /// The live tensors matching `targets`, with the glob each matched.
    fn targets(&self, ctx: &OpCtx<'_>, targets: &Targets) -> Result<Vec<(usize, String)>> {
        let globs = targets.globs();
        if globs.is_empty() {
            return Err(ctx.err("targets is empty"));
        }
        let mut compiled = Vec::new();
        for g in &globs {
            let glob = Glob::new(g).map_err(|e| ctx.err(format!("bad glob {g:?}: {e}")))?;
            compiled
                .push((g.to_string(), GlobSetBuilder::new().add(glob).build().map_err(|e| ctx.err(e.to_string()))?));
        }
        let mut out = Vec::new();
        for (i, e) in self.entries.iter().enumerate().filter(|(_, e)| !e.removed) {
            if let Some((g, _)) = compiled.iter().find(|(_, set)| set.is_match(&e.name)) {
                out.push((i, g.clone()));
            }
        }
        if out.is_empty() {
            return Err(ctx.err(format!("targets {} match no tensor of the model", globs.join(", "))));
        }
        Ok(out)
    }

    /// The donor key of a target: `pattern`'s `*`s filled with the glob's `*` matches.
    fn key(&self, ctx: &OpCtx<'_>, pattern: Option<&str>, glob: &str, name: &str) -> Result<String> {
        let Some(pattern) = pattern else { return Ok(name.to_string()) };
        if glob.contains(['[', '{']) {
            return Err(ctx.err(format!("a key pattern needs targets that use only * and ? (got {glob:?})")));
        }
        let mut re = String::from("^");
        for c in glob.chars() {
            match c {
                '*' => re.push_str("(.*?)"),
                '?' => re.push('.'),
                c => re.push_str(&regex::escape(&c.to_string())),
            }
        }
        re.push('$');
        let re = regex::Regex::new(&re).map_err(|e| ctx.err(format!("bad glob {glob:?}: {e}")))?;
        let caps = re.captures(name).ok_or_else(|| ctx.err(format!("{name} does not match {glob}")))?;
        let stars = pattern.matches('*').count();
        if stars != caps.len() - 1 {
            return Err(
                ctx.err(format!("key {pattern:?} has {stars} '*' but the target glob {glob:?} has {}", caps.len() - 1))
            );
        }
        let mut key = String::new();
        let mut parts = pattern.split('*');
        key.push_str(parts.next().unwrap_or(""));
        for (i, part) in parts.enumerate() {
            key.push_str(caps.get(i + 1).map_or("", |m| m.as_str()));
            key.push_str(part);
        }
        Ok(key)
    }

    /// Checks that `donor[key]` is a float tensor shaped like entry `i`.
    fn check_source(&self, ctx: &OpCtx<'_>, donor: &Donor, key: &str, i: usize) -> Result<()> {
        let e = &self.entries[i];
        match donor.float_shape(key) {
            None => Err(ctx.err(format!("source {} has no tensor {key} (for {})", donor.path().display(), e.name))),
            Some(Err(m)) => Err(ctx.err(m)),
            Some(Ok(shape)) if shape != e.shape => Err(ctx.err(format!(
                "{key} in {} has shape {shape:?} but {} has shape {:?}",
                donor.path().display(),
                e.name,
                e.shape
            ))),
            Some(Ok(_)) => Ok(()),
        }
    }

    /// `v` as the f32 the edit multiplies by, refused (naming `name`)
    /// unless it is finite there and within `range`: a factor that is
    /// finite as f64 can be infinite as f32 (1e39), and one that is finite
    /// can still overflow every weight.
    fn in_range(ctx: &OpCtx<'_>, name: &str, v: f64, range: std::ops::RangeInclusive<f32>) -> Result<f32> {
        let applied = v as f32;
        if applied.is_finite() && range.contains(&applied) {
            Ok(applied)
        } else {
            // Large values as written in YAML (1e39), not 40 digits.
            let got = if v.abs() >= 1e6 { format!("{v:e}") } else { v.to_string() };
            Err(ctx.err(format!("{name} must be a number in [{}, {}], got {got}", range.start(), range.end())))
        }
    }

    fn edit(&mut self, i: usize, edit: Edit) {
        let e = &mut self.entries[i];
        if let Edit::Remove { axis, ranges } = &edit {
            let n: usize = ranges.iter().map(|r| r.len()).sum();
            if let Some(d) = e.shape.get_mut(*axis) {
                *d -= n;
            }
        }
        e.edits.push(edit);
    }

    /// Applies `edit` to `layer.tail` if the model has that tensor; returns its name.
    fn edit_layer_tensor(&mut self, layer: usize, tail: &str, edit: Edit) -> Option<String> {
        let name = format!("model.layers.{layer}.{tail}");
        let i = self.live(&name)?;
        self.edit(i, edit);
        Some(name)
    }

    fn operation(&mut self, ctx: &OpCtx<'_>, op: &Operation) -> Result<Vec<String>> {
        let names =
            |p: &Planner<'_>, m: &[(usize, String)]| m.iter().map(|(i, _)| p.entries[*i].name.clone()).collect();
        match op {
            Operation::Scale { targets, factor } => {
                let f = Self::in_range(ctx, "factor", *factor, -MAX_MULTIPLIER..=MAX_MULTIPLIER)?;
                let m = self.targets(ctx, targets)?;
                for (i, _) in &m {
                    self.edit(*i, Edit::Scale(f));
                }
                Ok(names(self, &m))
            }
            Operation::Add { targets, source, alpha, key } => {
                let alpha = Self::in_range(ctx, "alpha", *alpha, -MAX_MULTIPLIER..=MAX_MULTIPLIER)?;
                let donor = self.donor(ctx, source)?;
                let m = self.targets(ctx, targets)?;
                for (i, glob) in &m {
                    let k = self.key(ctx, key.as_deref(), glob, &self.entries[*i].name)?;
                    self.check_source(ctx, &donor, &k, *i)?;
                    self.edit(*i, Edit::Add { donor: donor.clone(), key: k, alpha });
                }
                Ok(names(self, &m))
            }
            Operation::Replace { targets, source, key } => {
                let donor = self.donor(ctx, source)?;
                let m = self.targets(ctx, targets)?;
                for (i, glob) in &m {
                    let k = self.key(ctx, key.as_deref(), glob, &self.entries[*i].name)?;
                    self.check_source(ctx, &donor, &k, *i)?;
                    self.edit(*i, Edit::Replace { donor: donor.clone(), key: k });
                }
                Ok(names(self, &m))
            }
            Operation::Interpolate { targets, sources, ratio, method, key } => {
                let ratio = Self::in_range(ctx, "ratio", *ratio, 0.0..=1.0)?;
                let donors: Vec<Option<Arc<Donor>>> = sources
                    .iter()
                    .map(|s| if s == "model" { Ok(None) } else { self.donor(ctx, Path::new(s)).map(Some) })
                    .collect::<Result<_>>()?;
                let m = self.targets(ctx, targets)?;
                for (i, glob) in &m {
                    let mut ends = Vec::new();
                    for d in &donors {
                        ends.push(match d {
                            None => Endpoint::Model,
                            Some(d) => {
                                let k = self.key(ctx, key.as_deref(), glob, &self.entries[*i].name)?;
                                self.check_source(ctx, d, &k, *i)?;
                                Endpoint::File { donor: d.clone(), key: k }
                            }
                        });
                    }
                    let to = ends.pop().unwrap_or(Endpoint::Model);
                    let from = ends.pop().unwrap_or(Endpoint::Model);
                    self.edit(*i, Edit::Interpolate { from, to, ratio, method: *method });
                }
                Ok(names(self, &m))
            }
            Operation::Prune { granularity, ids, layers, mode } => {
                self.prune(ctx, *granularity, ids, layers.as_deref(), *mode)
            }
        }
    }

    fn prune(
        &mut self,
        ctx: &OpCtx<'_>,
        granularity: Granularity,
        ids: &[usize],
        layers: Option<&[usize]>,
        mode: PruneMode,
    ) -> Result<Vec<String>> {
        if ids.is_empty() {
            return Err(ctx.err("ids is empty"));
        }
        let ids: BTreeSet<usize> = ids.iter().copied().collect();
        let n_layers = self.layers();
        let all_layers: Vec<usize> = (0..n_layers)
            .filter(|l| self.live(&format!("model.layers.{l}.input_layernorm.weight")).is_some())
            .collect();
        let layers: Vec<usize> = match layers {
            None => all_layers.clone(),
            Some([]) => return Err(ctx.err("layers is empty")),
            Some(l) => {
                if let Some(bad) = l.iter().find(|&&x| !all_layers.contains(&x)) {
                    return Err(ctx.err(format!(
                        "layer {bad} is out of range (the model has layers 0..{n_layers}, less any removed)"
                    )));
                }
                l.to_vec()
            }
        };
        if mode == PruneMode::Remove && granularity != Granularity::Layer && layers.len() != all_layers.len() {
            return Err(ctx.err(format!(
                "removing {granularity}s needs every layer (the config holds one size for all); zero them instead, or drop `layers`"
            )));
        }
        let fused = self.model.config.architecture == Architecture::Phi3 && granularity != Granularity::Layer;
        if fused {
            return Err(
                ctx.err(format!("pruning {granularity}s is not supported for phi3 (fused qkv_proj and gate_up_proj)"))
            );
        }
        let mut touched = Vec::new();
        match granularity {
            Granularity::Layer => {
                if let Some(bad) = ids.iter().find(|&&x| !all_layers.contains(&x)) {
                    return Err(ctx.err(format!(
                        "layer {bad} is out of range (the model has layers 0..{n_layers}, less any removed)"
                    )));
                }
                if layers.len() != all_layers.len() {
                    return Err(ctx.err("`layers` does not apply to layer pruning: the ids are the layers"));
                }
                if mode == PruneMode::Remove && ids.len() >= all_layers.len() {
                    return Err(ctx.err("removing every layer leaves no model"));
                }
                for &l in &ids {
                    match mode {
                        // The layer's residual branches contribute nothing.
                        PruneMode::Zero => {
                            for tail in [
                                "self_attn.o_proj.weight",
                                "self_attn.o_proj.bias",
                                "mlp.down_proj.weight",
                                "mlp.down_proj.bias",
                                // A mixture-of-experts layer: every expert's output.
                                "mlp.switch_mlp.down_proj.weight",
                            ] {
                                let rows =
                                    self.live(&format!("model.layers.{l}.{tail}")).map(|i| self.entries[i].shape[0]);
                                if let Some(rows) = rows {
                                    touched.extend(self.edit_layer_tensor(
                                        l,
                                        tail,
                                        Edit::Zero { axis: 0, ranges: std::iter::once(0..rows).collect() },
                                    ));
                                }
                            }
                        }
                        PruneMode::Remove => {
                            let prefix = format!("model.layers.{l}.");
                            for e in self.entries.iter_mut().filter(|e| !e.removed && e.name.starts_with(&prefix)) {
                                e.removed = true;
                                touched.push(e.name.clone());
                            }
                        }
                    }
                }
                if mode == PruneMode::Remove {
                    self.remove_layers_from_config(&ids);
                }
            }
            Granularity::AttentionHead => {
                let (heads, kv, hd) =
                    (self.config.num_attention_heads, self.config.num_key_value_heads, self.config.head_dim);
                if let Some(bad) = ids.iter().find(|&&h| h >= heads) {
                    return Err(ctx.err(format!("head {bad} is out of range (the model has {heads} heads)")));
                }
                if mode == PruneMode::Remove {
                    if let Some(prev) = self.heads_removed_by {
                        return Err(ctx.err(format!("heads were already removed by operation #{prev}")));
                    }
                    if ids.len() >= heads {
                        return Err(ctx.err("removing every head leaves no attention"));
                    }
                }
                // Grouped-query attention: query head h reads kv head h / group.
                let group = heads / kv.max(1);
                let per_group: Vec<usize> = (0..kv).map(|g| ids.iter().filter(|&&h| h / group == g).count()).collect();
                let dropped_groups: BTreeSet<usize> = (0..kv).filter(|&g| per_group[g] == group).collect();
                let partial: BTreeSet<usize> = per_group.iter().copied().filter(|&n| n != 0 && n != group).collect();
                let mixed =
                    !partial.is_empty() && (!dropped_groups.is_empty() || per_group.iter().any(|&n| n != per_group[0]));
                if mode == PruneMode::Remove && mixed {
                    return Err(ctx.err(format!(
                        "removing heads {:?} leaves key/value groups of unequal sizes ({per_group:?} of {group} removed per group): remove the same number of heads from each group of {group}, or whole groups",
                        ids.iter().collect::<Vec<_>>()
                    )));
                }
                let rows = ranges(&ids, hd);
                let kv_rows = ranges(&dropped_groups, hd);
                for &l in &layers {
                    let zero_or_remove = |axis, ranges: Vec<Range<usize>>| match mode {
                        PruneMode::Zero => Edit::Zero { axis, ranges },
                        PruneMode::Remove => Edit::Remove { axis, ranges },
                    };
                    touched.extend(self.edit_layer_tensor(
                        l,
                        "self_attn.q_proj.weight",
                        zero_or_remove(0, rows.clone()),
                    ));
                    touched.extend(self.edit_layer_tensor(l, "self_attn.q_proj.bias", zero_or_remove(0, rows.clone())));
                    touched.extend(self.edit_layer_tensor(
                        l,
                        "self_attn.o_proj.weight",
                        zero_or_remove(1, rows.clone()),
                    ));
                    if mode == PruneMode::Remove && !kv_rows.is_empty() {
                        for tail in [
                            "self_attn.k_proj.weight",
                            "self_attn.k_proj.bias",
                            "self_attn.v_proj.weight",
                            "self_attn.v_proj.bias",
                        ] {
                            touched.extend(self.edit_layer_tensor(
                                l,
                                tail,
                                Edit::Remove { axis: 0, ranges: kv_rows.clone() },
                            ));
                        }
                    }
                }
                if mode == PruneMode::Remove {
                    self.heads_removed_by = Some(ctx.index);
                    self.config.num_attention_heads = heads - ids.len();
                    self.config.num_key_value_heads = kv - dropped_groups.len();
                }
            }
            Granularity::MlpChannel => {
                // Experts have their own width (moe_intermediate_size) and a
                // router that would keep sending tokens to pruned channels'
                // experts: channel ids of the dense MLP mean nothing there.
                if let (Some(l), Some(moe)) =
                    (layers.iter().find(|&&l| self.model.config.is_moe_layer(l)), &self.model.config.moe)
                {
                    return Err(ctx.err(format!(
                        "pruning mlp_channels is not supported for mixture-of-experts layers: layer {l} routes tokens to {} experts with {} channels each, not to one MLP of intermediate_size; zero the channels of dense layers only, naming them in `layers`",
                        moe.num_experts, moe.moe_intermediate_size
                    )));
                }
                let inter = self.config.intermediate_size;
                if let Some(bad) = ids.iter().find(|&&c| c >= inter) {
                    return Err(ctx.err(format!("channel {bad} is out of range (the MLP has {inter} channels)")));
                }
                if mode == PruneMode::Remove {
                    if let Some(prev) = self.channels_removed_by {
                        return Err(ctx.err(format!("MLP channels were already removed by operation #{prev}")));
                    }
                    if ids.len() >= inter {
                        return Err(ctx.err("removing every channel leaves no MLP"));
                    }
                }
                let rows = ranges(&ids, 1);
                for &l in &layers {
                    let zero_or_remove = |axis, ranges: Vec<Range<usize>>| match mode {
                        PruneMode::Zero => Edit::Zero { axis, ranges },
                        PruneMode::Remove => Edit::Remove { axis, ranges },
                    };
                    for tail in ["mlp.gate_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.weight", "mlp.up_proj.bias"]
                    {
                        touched.extend(self.edit_layer_tensor(l, tail, zero_or_remove(0, rows.clone())));
                    }
                    touched.extend(self.edit_layer_tensor(l, "mlp.down_proj.weight", zero_or_remove(1, rows.clone())));
                }
                if mode == PruneMode::Remove {
                    self.channels_removed_by = Some(ctx.index);
                    self.config.intermediate_size = inter - ids.len();
                }
            }
        }
        if touched.is_empty() {
            return Err(ctx.err(format!(
                "pruning {granularity}s {:?} matches no tensor of the model",
                ids.iter().collect::<Vec<_>>()
            )));
        }
        Ok(touched)
    }

    /// Shrinks the config after removing the original layers `ids`: every
    /// per-layer list (attention types, which layers are mixtures of
    /// experts) keeps the entries of the layers that remain, in order.
    fn remove_layers_from_config(&mut self, ids: &BTreeSet<usize>) {
        // Earlier removals already dropped their entries: map each remaining
        // entry back to its original layer.
        let original = &self.model.config;
        let remaining: Vec<usize> =
            (0..original.num_hidden_layers).filter(|l| !self.removed_layers.contains(l)).collect();
        let keep: Vec<bool> = remaining.iter().map(|l| !ids.contains(l)).collect();
        retain_flagged(&mut self.config.layer_types, &keep);
        if let Some(moe) = &mut self.config.moe {
            retain_flagged(&mut moe.sparse_layers, &keep);
        }
        self.config.num_hidden_layers = self.config.layer_types.len();
        self.removed_layers.extend(ids.iter().copied());
    }
}

impl Surgery {
    /// Validates every operation against `model` and plans the edits.
    pub fn plan(&self, model: ModelView<'_>) -> Result<Plan> {
        let entries: Vec<Entry> = model
            .tensors
            .iter()
            .map(|t| Entry { name: t.name.clone(), shape: t.shape.clone(), edits: Vec::new(), removed: false })
            .collect();
        let index = entries.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();
        let mut p = Planner {
            model,
            base_dir: &self.base_dir,
            entries,
            index,
            config: model.config.clone(),
            donors: HashMap::new(),
            heads_removed_by: None,
            removed_layers: BTreeSet::new(),
            channels_removed_by: None,
        };
        let mut operations = Vec::new();
        for (i, (op, line)) in self.operations.iter().enumerate() {
            let ctx = OpCtx { index: i + 1, op: op.name(), line: *line };
            let matched = p.operation(&ctx, op)?;
            operations.push(OperationRecord { description: op.describe(), matched });
        }
        // Surviving layers are renumbered densely, in order.
        let mut survivors: BTreeSet<usize> = BTreeSet::new();
        for e in p.entries.iter().filter(|e| !e.removed) {
            if let Some((l, _)) = layer_of(&e.name) {
                survivors.insert(l);
            }
        }
        let renumber: HashMap<usize, usize> = survivors.iter().enumerate().map(|(new, &old)| (old, new)).collect();
        let mut outputs = Vec::new();
        let mut removed = Vec::new();
        for e in p.entries {
            if e.removed {
                removed.push(e.name);
                continue;
            }
            let name = match layer_of(&e.name) {
                Some((l, tail)) => format!("model.layers.{}.{tail}", renumber[&l]),
                None => e.name.clone(),
            };
            outputs.push(OutputTensor { name, source: e.name, shape: e.shape, edits: e.edits });
        }
        p.config.validate().map_err(SurgeryError::Config)?;
        Ok(Plan { outputs, config: p.config, operations, removed })
    }
}

impl Plan {
    /// Runs `out`'s edits on `values` (the source tensor as f32).
    pub fn apply(&self, out: &OutputTensor, values: &Array) -> Result<Array> {
        let mlx = |e: mlxcel_mlx::Error| SurgeryError::Mlx { tensor: out.source.clone(), error: e };
        let file = |donor: &Donor, key: &str| {
            donor.array(key).map_err(|m| SurgeryError::Mlx {
                tensor: out.source.clone(),
                error: mlxcel_mlx::Error::Invalid { op: "read", message: m },
            })
        };
        let mut v = values.clone();
        for edit in &out.edits {
            v = match edit {
                Edit::Scale(f) => v.multiply_scalar(*f).map_err(mlx)?,
                Edit::Add { donor, key, alpha } => {
                    v.add(&file(donor, key)?.multiply_scalar(*alpha).map_err(mlx)?).map_err(mlx)?
                }
                Edit::Replace { donor, key } => file(donor, key)?,
                Edit::Interpolate { from, to, ratio, method } => {
                    let end = |e: &Endpoint| match e {
                        Endpoint::Model => Ok(v.clone()),
                        Endpoint::File { donor, key } => file(donor, key),
                    };
                    let (a, b) = (end(from)?, end(to)?);
                    interpolate(&a, &b, *ratio, *method).map_err(mlx)?
                }
                Edit::Zero { axis, ranges } => {
                    let keep = keep_mask(v.shape()[*axis] as usize, ranges);
                    let keep = Array::from_bools(&keep, &broadcast_shape(&v, *axis)).map_err(mlx)?;
                    Array::where_(&keep, &v, &v.scalar_like(0.0).map_err(mlx)?).map_err(mlx)?
                }
                Edit::Remove { axis, ranges } => {
                    let keep = keep_mask(v.shape()[*axis] as usize, ranges);
                    let idx: Vec<u32> = keep.iter().enumerate().filter(|(_, k)| **k).map(|(i, _)| i as u32).collect();
                    let idx = Array::from_slice(&idx, &[idx.len() as i32]).map_err(mlx)?;
                    v.take(&idx, *axis as i32).map_err(mlx)?
                }
            };
        }
        if v.dtype() != Dtype::F32 {
            v = v.astype(Dtype::F32).map_err(mlx)?;
        }
        Ok(v)
    }

    /// The output tensor made from source `name`, if any.
    pub fn output_of(&self, source: &str) -> Option<&OutputTensor> {
        self.outputs.iter().find(|o| o.source == source)
    }
}

/// Keeps the entries of `list` whose flag in `keep` is true.
fn retain_flagged<T>(list: &mut Vec<T>, keep: &[bool]) {
    let mut flags = keep.iter();
    list.retain(|_| flags.next().copied().unwrap_or(true));
}

/// `true` for the indices of `0..n` outside `ranges`.
fn keep_mask(n: usize, ranges: &[Range<usize>]) -> Vec<bool> {
    let mut m = vec![true; n];
    for r in ranges {
        for x in m.iter_mut().take(r.end.min(n)).skip(r.start) {
            *x = false;
        }
    }
    m
}

/// The shape that broadcasts a vector along `axis` of `v`.
fn broadcast_shape(v: &Array, axis: usize) -> Vec<i32> {
    let s = v.shape();
    (0..s.len()).map(|d| if d == axis { s[d] } else { 1 }).collect()
}

/// Linear or spherical interpolation; ratio 0 and 1 give `a` and `b` exactly.
fn interpolate(a: &Array, b: &Array, t: f32, method: Method) -> mlxcel_mlx::Result<Array> {
    let (wa, wb) = match method {
        Method::Lerp => (1.0 - t, t),
        Method::Slerp => {
            let dot = |x: &Array, y: &Array| -> mlxcel_mlx::Result<f64> {
                Ok(f64::from(x.multiply(y)?.reshape(&[-1])?.sum(&[0], false)?.item::<f32>()?))
            };
            let (na, nb) = (dot(a, a)?.sqrt(), dot(b, b)?.sqrt());
            let cos = if na > 0.0 && nb > 0.0 { (dot(a, b)? / (na * nb)).clamp(-1.0, 1.0) } else { 1.0 };
            let omega = cos.acos();
            // Nearly parallel tensors: slerp tends to lerp.
            if omega.sin().abs() < 1e-6 {
                (1.0 - t, t)
            } else {
                let s = omega.sin();
                ((((1.0 - f64::from(t)) * omega).sin() / s) as f32, ((f64::from(t) * omega).sin() / s) as f32)
            }
        }
    };
    if t == 0.0 {
        return Ok(a.clone());
    }
    if t == 1.0 {
        return Ok(b.clone());
    }
    a.multiply_scalar(wa)?.add(&b.multiply_scalar(wb)?)
}
