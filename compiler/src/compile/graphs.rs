//! Graphs: with `--target iree-*`, the model traced into StableHLO from the
//! tensors as written (`mlxcel_stablehlo::graphs`), stored as a `stablehlo`
//! section, and compiled by `iree-compile` into one `iree-vmfb` section per
//! target (docs/bundle-format.md §4.2.3). The weights are not in either:
//! the functions name the bundle's tensors as IREE parameters.

use std::path::PathBuf;
use std::time::Instant;

use mlxcel_arch::ModelConfig;
use mlxcel_bundle::{BundleWriter, SectionSpec, kinds};
use mlxcel_stablehlo::model::{StoredQuantization, StoredTensor, StoredTensors};
use mlxcel_stablehlo::{ElementType, GraphPlan, IreeCompiler, Target, graphs};

use super::{CompileError, Progress, Result, TensorPlan, TensorReport};
use crate::ingest::FloatDtype;

/// The cache capacity when `--iree-context` is not given: the model's
/// context, at most this many positions (every decode step attends over
/// the whole capacity, and the caches are allocated at it).
pub const DEFAULT_IREE_CONTEXT: usize = 4096;

/// What `--target iree-*` asks for.
#[derive(Clone, Debug)]
pub struct IreeOptions {
    /// The IREE targets, each compiled into its own `iree-vmfb` section.
    pub targets: Vec<Target>,
    /// `iree-compile` (from the pinned `iree-base-compiler` package).
    pub compiler: PathBuf,
    /// Positions the traced KV caches hold (`--iree-context`); by default
    /// the model's context up to [`DEFAULT_IREE_CONTEXT`].
    pub context: Option<usize>,
}

/// One IREE module stored.
#[derive(Clone, Debug)]
pub struct GraphReport {
    /// The target it was compiled for.
    pub target: Target,
    /// Bytes of the vmfb.
    pub bytes: usize,
    /// Seconds `iree-compile` took.
    pub seconds: f64,
}

/// Progress of the graphs phase.
#[derive(Clone, Debug)]
pub enum GraphEvent<'a> {
    /// The functions were traced: their names and the MLIR's size.
    Traced {
        /// The functions, in module order.
        functions: &'a [String],
        /// Bytes of MLIR text.
        bytes: usize,
    },
    /// `iree-compile` is starting on a target.
    Compiling {
        /// The target.
        target: &'a Target,
    },
    /// It finished.
    Compiled {
        /// The target.
        target: &'a Target,
        /// Bytes of the vmfb.
        bytes: usize,
        /// Seconds it took.
        seconds: f64,
    },
}

/// Traces `config` over the written `tensors`, stores the StableHLO and one
/// vmfb per target.
pub(super) fn graphs(
    w: &mut BundleWriter,
    config: &ModelConfig,
    iree: &IreeOptions,
    tensors: &[TensorReport],
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Vec<GraphReport>> {
    let context = iree.context.unwrap_or(config.max_position_embeddings.min(DEFAULT_IREE_CONTEXT));
    let capacity = i64::try_from(context).map_err(|_| options(format!("--iree-context {context} is too large")))?;
    let plan = GraphPlan::with_capacity(capacity).map_err(graph_error)?;
    let module = graphs::trace(config, &stored_tensors(tensors)?, &plan).map_err(graph_error)?;
    let mlir = module.to_mlir();
    let mut functions: Vec<String> = plan.prefill().iter().map(|&l| GraphPlan::prefill_name(l)).collect();
    functions.extend(plan.decode().iter().map(|&b| GraphPlan::decode_name(b)));
    progress(Progress::Graphs(GraphEvent::Traced { functions: &functions, bytes: mlir.len() }));
    let list = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let describe = |spec: SectionSpec| {
        spec.with_property(kinds::CACHE_CAPACITY_KEY, capacity.to_string())
            .with_property(kinds::PREFILL_KEY, list(plan.prefill()))
            .with_property(kinds::DECODE_KEY, list(plan.decode()))
    };
    w.add_section_bytes(describe(SectionSpec::new(kinds::STABLEHLO, kinds::MODEL_GRAPH_KEY)), mlir.as_bytes())?;

    let compiler = IreeCompiler::new(&iree.compiler);
    let version = compiler.version().map_err(graph_error)?;
    let mut reports = Vec::with_capacity(iree.targets.len());
    for target in &iree.targets {
        progress(Progress::Graphs(GraphEvent::Compiling { target }));
        let start = Instant::now();
        let vmfb = compiler.compile(&mlir, target).map_err(graph_error)?;
        let seconds = start.elapsed().as_secs_f64();
        let mut spec = describe(SectionSpec::new(kinds::IREE_VMFB, kinds::MODEL_GRAPH_KEY))
            .with_target(target.artifact_key())
            .with_property(kinds::IREE_VERSION_KEY, version.clone());
        if matches!(target, Target::LlvmCpu { cpu, .. } if cpu == "host") {
            // `host` is this machine's CPU: record what the code may use.
            spec = spec.with_property(kinds::CPU_FEATURES_KEY, mlxcel_mlx::device::cpu_features().join(","));
        }
        w.add_section_bytes(spec, &vmfb)?;
        progress(Progress::Graphs(GraphEvent::Compiled { target, bytes: vmfb.len(), seconds }));
        reports.push(GraphReport { target: target.clone(), bytes: vmfb.len(), seconds });
    }
    Ok(reports)
}

/// The written tensors as the tracer sees them: quantized matrices as their
/// three parts (codes in 32-bit words, scales and biases per group), floats
/// in their stored dtype.
fn stored_tensors(tensors: &[TensorReport]) -> Result<StoredTensors> {
    let element = |d: FloatDtype| match d {
        FloatDtype::F32 => ElementType::F32,
        FloatDtype::F16 => ElementType::F16,
        FloatDtype::BF16 => ElementType::BF16,
    };
    let mut stored = StoredTensors::new();
    for t in tensors {
        if t.rows16 {
            // Refused earlier by the options (iree targets imply row-major).
            return Err(options(format!("{}: stored in the rows16 layout, which IREE graphs do not read", t.name)));
        }
        let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        match (&t.affine, &t.plan) {
            (Some(a), _) => {
                let prefix = t.name.strip_suffix(".weight").ok_or_else(|| {
                    options(format!("{}: a quantized tensor whose name does not end in .weight", t.name))
                })?;
                let (cols, lead) = shape.split_last().ok_or_else(|| options(format!("{}: no shape", t.name)))?;
                let part = |last: i64| [lead, &[last]].concat();
                let (bits, group) = (i64::from(a.bits), i64::from(a.group_size));
                stored
                    .insert(t.name.clone(), StoredTensor { shape: part(cols * bits / 32), element: ElementType::I32 });
                for suffix in ["scales", "biases"] {
                    stored.insert(
                        format!("{prefix}.{suffix}"),
                        StoredTensor { shape: part(cols / group), element: element(a.scales) },
                    );
                }
                stored.mark_quantized(prefix, StoredQuantization { bits: a.bits, group });
            }
            (None, TensorPlan::Float(d)) => {
                stored.insert(t.name.clone(), StoredTensor { shape, element: element(*d) });
            }
            (None, plan) => {
                return Err(options(format!("{}: stored as {plan} without its affine form", t.name)));
            }
        }
    }
    Ok(stored)
}

fn options(message: String) -> CompileError {
    CompileError::Options(message)
}

fn graph_error(e: mlxcel_stablehlo::Error) -> CompileError {
    CompileError::Graphs(e)
}
