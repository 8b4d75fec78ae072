//! Writing tensors into the bundle: float conversion, MLX affine triples
//! (kept from the source or quantized row block by row block, in the layout
//! `--weight-layout` asks for), and the quantization error measured on the way.

use mlxcel_bundle::{BundleWriter, Dtype as BundleDtype, LAYOUT_ROWS16, Quantization, TensorSpec, rows16};
use mlxcel_mlx::{Array, Dtype, QuantMode};

use super::options::{TensorPlan, WeightLayout};
use super::{CompileError, Result};
use crate::ingest::{AffineTensor, FloatDtype, FloatTensor};

fn bundle_dtype(d: FloatDtype) -> BundleDtype {
    match d {
        FloatDtype::F32 => BundleDtype::F32,
        FloatDtype::F16 => BundleDtype::F16,
        FloatDtype::BF16 => BundleDtype::Bf16,
    }
}

fn shape_u64(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| d as u64).collect()
}

/// Converts float bytes between dtypes (one output allocation).
fn convert_float(t: &FloatTensor<'_>, to: FloatDtype) -> Vec<u8> {
    if t.dtype == to {
        return t.data.to_vec();
    }
    let values = t.data.chunks_exact(t.dtype.size()).map(|c| match t.dtype {
        FloatDtype::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        FloatDtype::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
        FloatDtype::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f32(),
    });
    let mut out = Vec::with_capacity(t.data.len() / t.dtype.size() * to.size());
    match to {
        FloatDtype::F32 => values.for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        FloatDtype::F16 => values.for_each(|v| out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())),
        FloatDtype::BF16 => values.for_each(|v| out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
    }
    out
}

/// What every tensor write takes besides the tensor.
#[derive(Clone, Copy, Debug)]
pub(super) struct WriteOptions {
    /// Measure the quantization error.
    pub report: bool,
    /// How affine triples are arranged.
    pub layout: WeightLayout,
}

/// Whether an affine triple of logical `shape` and `bits` is stored in the
/// `rows16` layout under `layout`: 4- or 8-bit codes of a 2-D matrix with a
/// multiple of 16 rows (what the CPU kernels read in that layout).
pub(super) fn stores_rows16(layout: WeightLayout, shape: &[usize], bits: u32) -> bool {
    layout == WeightLayout::Rows16
        && matches!(bits, 4 | 8)
        && matches!(shape, [rows, cols] if rows % rows16::BLOCK_ROWS == 0 && *rows > 0 && *cols > 0)
}

/// Rearranges row-major packed codes, arriving in row blocks of any size,
/// into `rows16` blocks as soon as 16 whole rows are in (a tensor's rows are
/// a multiple of 16, so nothing is left over).
fn rows16_stream(chunks: impl Iterator<Item = Vec<u8>>, row_bytes: usize) -> impl Iterator<Item = Vec<u8>> {
    let block = rows16::BLOCK_ROWS * row_bytes;
    let mut pending = Vec::new();
    chunks.filter_map(move |bytes| {
        pending.extend_from_slice(&bytes);
        let whole = pending.len() / block * block;
        if whole == 0 {
            return None;
        }
        let rest = pending.split_off(whole);
        let ready = std::mem::replace(&mut pending, rest);
        // Whole blocks of a positive row length: the rearrangement cannot fail.
        rows16::from_row_major(&ready, row_bytes, 1).ok()
    })
}

/// An affine triple's bytes, ready to write.
struct AffineParts<'a> {
    shape: &'a [usize],
    bits: u32,
    group_size: u32,
    weight: &'a [u8],
    scales: (&'a [u8], BundleDtype),
    biases: (&'a [u8], BundleDtype),
    layout: WeightLayout,
}

/// Bytes of f32 per row block when dequantizing or quantizing a large tensor.
pub(super) const CHUNK_BYTES: usize = 16 << 20;

impl AffineParts<'_> {
    /// Shapes of the packed codes and of the per-group scales.
    fn shapes(shape: &[usize], bits: u32, group_size: u32) -> (Vec<usize>, Vec<usize>) {
        let (mut packed, mut groups) = (shape.to_vec(), shape.to_vec());
        if let (Some(p), Some(g)) = (packed.last_mut(), groups.last_mut()) {
            *p = *p * bits as usize / 32;
            *g /= group_size as usize;
        }
        (packed, groups)
    }

    fn rows16(&self) -> bool {
        stores_rows16(self.layout, self.shape, self.bits)
    }

    fn weight_spec(prefix: &str, shape: &[usize], bits: u32, group_size: u32, rows16: bool) -> TensorSpec {
        let (packed, _) = Self::shapes(shape, bits, group_size);
        let quant = Quantization {
            mode: "affine".into(),
            bits,
            group_size,
            scales: format!("{prefix}.scales"),
            biases: Some(format!("{prefix}.biases")),
        };
        let spec = TensorSpec::new(format!("{prefix}.weight"), BundleDtype::U32, shape_u64(&packed)).quantized(quant);
        if rows16 { spec.with_layout(LAYOUT_ROWS16) } else { spec }
    }

    /// Bytes of packed codes per row.
    fn row_bytes(shape: &[usize], bits: u32) -> usize {
        shape.last().map_or(0, |&cols| cols * bits as usize / 8)
    }

    /// Writes `<prefix>.weight` from chunks of row-major packed codes (row
    /// blocks of any size); returns its bytes.
    fn write_streamed(&self, w: &mut BundleWriter, prefix: &str, chunks: impl Iterator<Item = Vec<u8>>) -> Result<u64> {
        let rows16 = self.rows16();
        let spec = Self::weight_spec(prefix, self.shape, self.bits, self.group_size, rows16);
        let bytes = spec.byte_len().unwrap_or(0);
        if rows16 {
            w.add_tensor_chunks(spec, rows16_stream(chunks, Self::row_bytes(self.shape, self.bits)))?;
        } else {
            w.add_tensor_chunks(spec, chunks)?;
        }
        Ok(bytes)
    }

    /// Writes `<prefix>.scales` and `.biases` (row-major bytes given).
    fn write_groups(&self, w: &mut BundleWriter, prefix: &str) -> Result<u64> {
        let (_, groups) = Self::shapes(self.shape, self.bits, self.group_size);
        let group_count = groups.last().copied().unwrap_or(0);
        for (part, (bytes, dtype)) in [("scales", self.scales), ("biases", self.biases)] {
            let spec = TensorSpec::new(format!("{prefix}.{part}"), dtype, shape_u64(&groups));
            if self.rows16() {
                let blocks = rows16::from_row_major(bytes, group_count, dtype.size_bytes() as usize)
                    .map_err(|e| CompileError::Options(format!("tensor {prefix}.{part}: {e}")))?;
                w.add_tensor_bytes(spec.with_layout(LAYOUT_ROWS16), &blocks)?;
            } else {
                w.add_tensor_bytes(spec, bytes)?;
            }
        }
        Ok((self.scales.0.len() + self.biases.0.len()) as u64)
    }

    /// Writes the whole triple (row-major bytes given).
    fn write(&self, w: &mut BundleWriter, prefix: &str) -> Result<u64> {
        let bytes = self.write_streamed(w, prefix, std::iter::once(self.weight.to_vec()))?;
        Ok(bytes + self.write_groups(w, prefix)?)
    }
}

/// `(Σ (approx - exact)², Σ exact²)` over f32 MLX arrays.
fn squared_error(approx: &Array, exact: &Array) -> mlxcel_mlx::Result<(f64, f64)> {
    let total =
        |a: Array| -> mlxcel_mlx::Result<f64> { Ok(f64::from(a.reshape(&[-1])?.sum(&[0], false)?.item::<f32>()?)) };
    let num = total(approx.subtract(exact)?.square()?)?;
    let den = total(exact.square()?)?;
    Ok((num, den))
}

/// Writes `name` (shaped `shape`) from row blocks of floats, as `plan` says:
/// converted to a float dtype, or quantized block by block (groups run along
/// rows, so row blocks quantize independently; the packed codes stream into
/// the bundle and the 8x smaller scales and biases follow). Returns the bytes
/// written and, with `report`, the relative RMS error of quantization.
pub(super) fn write_floats<'a>(
    w: &mut BundleWriter,
    name: &str,
    shape: &[usize],
    plan: &TensorPlan,
    chunks: impl Iterator<Item = Result<FloatTensor<'a>>>,
    options: WriteOptions,
    mlx: &dyn Fn(mlxcel_mlx::Error) -> CompileError,
) -> Result<(u64, Option<f64>)> {
    let report = options.report;
    let mut failure = None;
    match plan {
        TensorPlan::Float(dtype) => {
            let mut written = 0u64;
            let converted = chunks.map_while(|chunk| match chunk {
                Ok(t) => {
                    let bytes = convert_float(&t, *dtype);
                    written += bytes.len() as u64;
                    Some(bytes)
                }
                Err(e) => {
                    failure = Some(e);
                    None
                }
            });
            let result = w.add_tensor_chunks(TensorSpec::new(name, bundle_dtype(*dtype), shape_u64(shape)), converted);
            if let Some(e) = failure {
                return Err(e);
            }
            result?;
            Ok((written, None))
        }
        TensorPlan::Quantize { bits, group_size } => {
            let (mut scales, mut biases) = (Vec::new(), Vec::new());
            let (mut err_num, mut err_den) = (0f64, 0f64);
            let packed = chunks.map_while(|chunk| {
                let step = || -> Result<Vec<u8>> {
                    let t = chunk?;
                    let exact = t.to_array().map_err(mlx)?;
                    let exact =
                        if exact.dtype() == Dtype::F32 { exact } else { exact.astype(Dtype::F32).map_err(mlx)? };
                    let q = exact.quantize(*group_size as i32, *bits as i32, QuantMode::Affine).map_err(mlx)?;
                    if report {
                        let (n, d) = squared_error(&q.dequantize(None).map_err(mlx)?, &exact).map_err(mlx)?;
                        err_num += n;
                        err_den += d;
                    }
                    scales.extend(q.scales.to_bytes().map_err(mlx)?);
                    biases.extend(q.biases.as_ref().map(Array::to_bytes).transpose().map_err(mlx)?.unwrap_or_default());
                    q.weight.to_bytes().map_err(mlx)
                };
                match step() {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        failure = Some(e);
                        None
                    }
                }
            });
            let prefix = name.strip_suffix(".weight").unwrap_or(name);
            let codes = AffineParts {
                shape,
                bits: *bits,
                group_size: *group_size,
                weight: &[],
                scales: (&[], BundleDtype::F32),
                biases: (&[], BundleDtype::F32),
                layout: options.layout,
            };
            let result = codes.write_streamed(w, prefix, packed);
            if let Some(e) = failure {
                return Err(e);
            }
            let weight_bytes = result?;
            let parts =
                AffineParts { scales: (&scales, BundleDtype::F32), biases: (&biases, BundleDtype::F32), ..codes };
            let error = report.then(|| (err_num / err_den.max(1e-30)).sqrt());
            Ok((weight_bytes + parts.write_groups(w, prefix)?, error))
        }
        TensorPlan::KeepAffine => {
            Err(CompileError::Options(format!("tensor {name}: affine blocks cannot be rebuilt from floats")))
        }
    }
}

/// Writes a loaded affine triple (kept from the source) as `<prefix>.weight`,
/// `.scales` and `.biases`; returns the bytes written.
pub(super) fn write_affine_tensor(
    w: &mut BundleWriter,
    prefix: &str,
    a: &AffineTensor<'_>,
    layout: WeightLayout,
) -> Result<u64> {
    let parts = AffineParts {
        shape: &a.shape,
        bits: a.bits,
        group_size: a.group_size as u32,
        weight: &a.weight,
        scales: (&a.scales.data, bundle_dtype(a.scales.dtype)),
        biases: (&a.biases.data, bundle_dtype(a.biases.dtype)),
        layout,
    };
    parts.write(w, prefix)
}
