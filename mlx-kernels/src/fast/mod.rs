//! mlxcel's own CPU kernels, as MLX operations that fall back to MLX's.
//!
//! MLX's CPU backend runs quantized matmul scalar and single-threaded and
//! builds RMS norm, RoPE and attention out of many small ops. The functions
//! here add one node to the graph that runs mlxcel's kernel (SIMD for the
//! CPU's best ISA, on a thread pool) when the default device is the CPU and the
//! inputs are ones the kernel covers, and MLX's own operation otherwise (the
//! GPU, other dtypes, other quantization modes). Results agree with MLX's ops
//! to f32 rounding: activations are never quantized or rounded to a lower
//! precision, and accumulation is in f32.
//!
//! What the kernels cover (everything else takes MLX's op):
//!
//! | operation | inputs |
//! |---|---|
//! | [`quantized_linear`] | f32 `x [.., K]`; affine 2-, 3-, 4-, 5-, 6- or 8-bit weights, group 32/64/128, f32, f16 or bf16 scales and biases |
//! | [`linear`], [`linear_heads`], [`gated_linear`] with float weights | f32 `x [.., K]`; 2-D f32, f16 or bf16 `W [N, K]` (read as f32, exactly), on the CPU; as the quantized forms (up to 8 weights in one node, heads, gate and up in one node) |
//! | [`quantized_linear_many`], [`quantized_linear_heads`] | the same, up to 8 weights sharing x in one node (q/k/v) |
//! | [`quantized_gated_linear`] | the same, `act(x Gᵀ) * (x Uᵀ)` in one node (a gated MLP's gate and up) |
//! | [`quantized_embedding`] | integer ids; the same weights |
//! | [`rms_norm`] | f32, optional f32 weight |
//! | [`add`] | a residual added to a pending [`quantized_linear`] or [`rms_norm`] (fused into it); MLX's `add` otherwise |
//! | [`rope`] | f32 `[.., L, D]`, even `dims ≤ D`, a base or explicit wavelengths, offset ≥ 0 |
//! | [`scaled_dot_product_attention`] | f32 `[B, H, L, D]`, grouped-query heads, causal, boolean or f32 additive masks |
//! | [`cached_attention`] | f32 q, k, v and each row's cache buffers; rope as [`rope`]; one step's rope, cache writes and attention for the whole batch in one node |
//! | [`gated_activation`] | f32 `silu(a) * b` and `gelu_tanh(a) * b`, equal shapes |
//!
//! Graphs built from these functions are also fused where our own nodes meet:
//! a projection of an RMS norm's output normalises its input itself (the norm
//! node is never computed), attention over the first positions of a cache
//! buffer reads the buffer (no slice node), and [`merge_heads`] of an
//! attention node makes it write the merged layout. Results are those of the
//! unfused nodes, bit for bit.
//!
//! A row's results never depend on the other rows of its batch (products of
//! `x [B, 1, K]`, cached attention; docs/kernels.md "Batch invariance").
//!
//! [`set_default_path`] turns them off for A/B comparisons, [`set_threads`]
//! sets the pool size (default: the physical cores the process may use),
//! [`set_isa`] picks another instruction set. Nothing here reads the
//! environment: the binaries parse `MLXCEL_KERNELS`, `MLXCEL_THREADS`,
//! `MLXCEL_ISA` and the rest once into [`crate::settings::Settings`] and apply
//! them through these setters.

use std::sync::atomic::{AtomicU8, Ordering};

use cxx::UniquePtr;

use crate::array::{Array, from_list, to_list, wrap};
use crate::device::{Device, default_device};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ffi::bridge;
use crate::layers::{Linear, Weight};
use crate::ops::{AttentionMask, QuantMode, Quantized};

mod cpu;
mod evaluation;
mod step_graph;

pub use cpu::{
    Isa, amx_active, amx_supported, bench_quantized_linear, default_threads, isa, read_bandwidth_gbs,
    retain_freed_memory, set_amx, set_default_threads, set_isa, set_spin, set_threads, threads,
};
pub use evaluation::{eval, eval_inline, inline_eval, pending_ops, set_inline_eval, set_step_graphs, step_graphs};
pub use step_graph::{Recorded, StepGraph};

/// Whose implementation an operation uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// mlxcel's kernel when it covers the inputs and the device, else MLX's op.
    Auto,
    /// mlxcel's kernel; inputs it does not cover are an error naming why.
    Kernel,
    /// MLX's own operation.
    Mlx,
}

impl Path {
    fn ffi(self) -> bridge::Path {
        match self {
            Path::Auto => bridge::Path::Auto,
            Path::Kernel => bridge::Path::Kernel,
            Path::Mlx => bridge::Path::Mlx,
        }
    }
}

// The index of the default path in PATHS.
static DEFAULT_PATH: AtomicU8 = AtomicU8::new(0);
const PATHS: [Path; 3] = [Path::Auto, Path::Kernel, Path::Mlx];

/// The path the free functions of this module take: [`set_default_path`]'s,
/// else [`Path::Auto`].
pub fn default_path() -> Path {
    PATHS.get(usize::from(DEFAULT_PATH.load(Ordering::Relaxed))).copied().unwrap_or(Path::Auto)
}

/// Sets the path of the free functions, process-wide, for graphs built from now on.
pub fn set_default_path(path: Path) {
    let index = PATHS.iter().position(|&p| p == path).unwrap_or(0);
    DEFAULT_PATH.store(index as u8, Ordering::Relaxed);
}

/// The operations of this module with an explicit [`Path`] (tests and
/// benchmarks compare [`Path::Kernel`] with [`Path::Mlx`]).
#[derive(Clone, Copy, Debug)]
pub struct Fast {
    path: Path,
}

/// The operations of this module on `path`.
pub fn on(path: Path) -> Fast {
    Fast { path }
}

/// The activation of a gated MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateActivation {
    /// `silu(a) * b` (SwiGLU).
    Silu,
    /// `gelu_tanh(a) * b` (GeGLU; the tanh approximation of GELU).
    GeluApprox,
}

impl GateActivation {
    fn ffi(self) -> bridge::Activation {
        match self {
            GateActivation::Silu => bridge::Activation::Silu,
            GateActivation::GeluApprox => bridge::Activation::GeluTanh,
        }
    }
}

fn opt(a: Option<&Array>) -> UniquePtr<bridge::Array> {
    match a {
        Some(a) => bridge::clone_array(&a.inner),
        None => UniquePtr::null(),
    }
}

impl Fast {
    /// `x Wᵀ (+ b)` over the last axis of `x`: one of mlxcel's product
    /// kernels for a quantized matrix or, on the CPU, a 2-D f32, f16 or bf16
    /// one (a residual [`Fast::add`]ed to the result later joins it; a bias
    /// is MLX's add after it), MLX's matmul otherwise (and always on
    /// [`Path::Mlx`]).
    pub fn linear(&self, x: &Array, linear: &Linear) -> Result<Array> {
        let y = match (&linear.weight, &linear.bias) {
            (Weight::Dense(w), _) if self.dense_kernel(w) => self.dense_linear_heads(x, &[(w, 0)])?.remove(0),
            (Weight::Dense(w), None) => return x.matmul(&w.transpose(&[])?),
            (Weight::Dense(w), Some(b)) => return Array::addmm(b, x, &w.transpose(&[])?, 1.0, 1.0),
            (Weight::Quantized(q), _) => self.quantized_linear(x, q)?,
        };
        match &linear.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// Whether a float matrix goes to mlxcel's float product kernels: not on
    /// [`Path::Mlx`], 2-D f32, f16 or bf16, and on [`Path::Auto`] only when
    /// the default device is the CPU (elsewhere MLX's matmul, as before).
    fn dense_kernel(&self, w: &Array) -> bool {
        let covered = w.ndim() == 2 && matches!(w.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16);
        match self.path {
            Path::Mlx => false,
            Path::Kernel => covered,
            Path::Auto => covered && default_device() == Device::Cpu,
        }
    }

    /// `x @ W_iᵀ` for float matrices in one node, outputs split into heads
    /// as [`Fast::quantized_linear_heads`]'s.
    fn dense_linear_heads(&self, x: &Array, ws: &[(&Array, i32)]) -> Result<Vec<Array>> {
        let list: Vec<&Array> = ws.iter().map(|&(w, _)| w).collect();
        let heads: Vec<i32> = ws.iter().map(|&(_, h)| h).collect();
        from_list("linear", bridge::fast_linear_multi(&x.inner, &to_list(&list), &heads, self.path.ffi()))
    }

    /// Several projections of the same `x [batch, seq, in]`, each split into
    /// heads: `(linear, heads)` gives `[batch, heads, seq, out / heads]`
    /// (attention's q, k and v). Quantized projections without biases share
    /// one node per bit width and group size (x is read once).
    pub fn linear_heads(&self, x: &Array, projections: &[(&Linear, i32)]) -> Result<Vec<Array>> {
        if projections.iter().any(|&(_, heads)| heads <= 0) {
            return Err(Error::invalid("linear_heads", "every projection needs a positive head count"));
        }
        let bare: Option<Vec<(&Quantized, i32)>> =
            projections.iter().map(|&(l, heads)| l.bare_quantized().map(|q| (q, heads))).collect();
        if let Some(ws) = bare {
            return self.quantized_linear_heads(x, &ws);
        }
        let dense: Option<Vec<(&Array, i32)>> = projections
            .iter()
            .map(|&(l, heads)| l.bare_dense().filter(|w| self.dense_kernel(w)).map(|w| (w, heads)))
            .collect();
        if let Some(ws) = dense.filter(|ws| ws.len() <= 8) {
            return self.dense_linear_heads(x, &ws);
        }
        let s = x.shape();
        if s.len() != 3 {
            return Err(Error::invalid("linear_heads", format!("x must be [batch, seq, features], not {s:?}")));
        }
        projections
            .iter()
            .map(|&(l, heads)| {
                let y = self.linear(x, l)?;
                y.reshape(&[s[0], s[1], heads, l.out_features() / heads])?.transpose(&[0, 2, 1, 3])
            })
            .collect()
    }

    /// `act(x Gᵀ) * (x Uᵀ)`: a gated feed-forward's gate and up projections
    /// with its activation; one node when both are quantized without biases
    /// and share a bit width and group size, or both float without biases
    /// and taken by the float kernels.
    pub fn gated_linear(&self, x: &Array, gate: &Linear, up: &Linear, act: GateActivation) -> Result<Array> {
        if let (Some(g), Some(u)) = (gate.bare_quantized(), up.bare_quantized()) {
            return self.quantized_gated_linear(x, g, u, act);
        }
        if let (Some(g), Some(u)) = (gate.bare_dense(), up.bare_dense())
            && self.dense_kernel(g)
            && self.dense_kernel(u)
        {
            return wrap(
                "gated_linear",
                bridge::fast_gated_linear(act.ffi(), &x.inner, &to_list(&[g, u]), self.path.ffi()),
            );
        }
        self.gated_activation(act, &self.linear(x, gate)?, &self.linear(x, up)?)
    }

    /// Rows `ids` (any shape of integer ids) of an embedding table, times
    /// `scale` (Gemma's `sqrt(hidden)`; 1 for none): `[..ids, dim]`. A
    /// quantized table is gathered and dequantized by one kernel that also
    /// scales; so is a float one where the float kernels take it (its rows
    /// as f32, exactly, then multiplied in f32), MLX's `take` otherwise.
    pub fn embedding(&self, ids: &Array, table: &Weight, scale: f32) -> Result<Array> {
        match table {
            Weight::Dense(t) if self.dense_kernel(t) => {
                wrap("embedding", bridge::fast_gather_rows(&ids.inner, &t.inner, scale, self.path.ffi()))
            }
            Weight::Dense(t) => {
                let rows = t.take(ids, 0)?;
                if scale == 1.0 { Ok(rows) } else { rows.multiply_scalar(scale) }
            }
            Weight::Quantized(q) => self.quantized_embedding_scaled(ids, q, scale),
        }
    }

    /// `x @ Wᵀ` for a quantized `W [out, in]` and `x [.., in]`.
    pub fn quantized_linear(&self, x: &Array, w: &Quantized) -> Result<Array> {
        if w.mode != QuantMode::Affine {
            return match self.path {
                Path::Kernel => Err(Error::invalid(
                    "quantized_linear",
                    format!("mlxcel's kernel covers affine quantization, not {}", w.mode.name()),
                )),
                _ => w.matmul(x, true),
            };
        }
        wrap(
            "quantized_linear",
            bridge::fast_quantized_linear(
                &x.inner,
                &w.weight.inner,
                &w.scales.inner,
                opt(w.biases.as_ref()),
                w.group_size,
                w.bits,
                w.layout.ffi(),
                self.path.ffi(),
            ),
        )
    }

    /// `x @ W_iᵀ` for several weights in one node (q, k and v; gate and up):
    /// x is read once and all rows share one dispatch.
    pub fn quantized_linear_many(&self, x: &Array, ws: &[&Quantized]) -> Result<Vec<Array>> {
        let with_heads: Vec<(&Quantized, i32)> = ws.iter().map(|&w| (w, 0)).collect();
        self.quantized_linear_heads(x, &with_heads)
    }

    /// [`Fast::quantized_linear_many`] with outputs split into heads: for
    /// `x [B, L, K]` and `(W_i, heads_i)` with `heads_i > 0`, output i is
    /// `[B, heads_i, L, N_i / heads_i]` (attention's layout); with 0 it is
    /// `[B, L, N_i]`.
    ///
    /// Weights of different bit widths or group sizes (a Q4_K_M model's 4-bit
    /// q and k with a 6-bit v) become one node per width and group size.
    pub fn quantized_linear_heads(&self, x: &Array, ws: &[(&Quantized, i32)]) -> Result<Vec<Array>> {
        if ws.is_empty() {
            return Err(Error::invalid("quantized_linear_heads", "no weights"));
        }
        let fusable = ws.len() <= 8 && ws.iter().all(|(w, _)| w.mode == QuantMode::Affine && w.biases.is_some());
        if fusable {
            let same_layout =
                |a: &Quantized, b: &Quantized| a.bits == b.bits && a.group_size == b.group_size && a.layout == b.layout;
            let mut outputs: Vec<Option<Array>> = ws.iter().map(|_| None).collect();
            for i in 0..ws.len() {
                if outputs[i].is_some() {
                    continue;
                }
                let members: Vec<usize> =
                    (i..ws.len()).filter(|&j| outputs[j].is_none() && same_layout(ws[i].0, ws[j].0)).collect();
                let group: Vec<(&Quantized, i32)> = members.iter().map(|&j| ws[j]).collect();
                for (j, y) in members.into_iter().zip(self.fused_linear_heads(x, &group)?) {
                    outputs[j] = Some(y);
                }
            }
            return Ok(outputs.into_iter().flatten().collect());
        }
        if self.path == Path::Kernel {
            return Err(Error::invalid(
                "quantized_linear_heads",
                "mlxcel's kernel fuses at most 8 affine weights with biases",
            ));
        }
        ws.iter()
            .map(|&(w, heads)| {
                let y = self.quantized_linear(x, w)?;
                if heads <= 0 {
                    return Ok(y);
                }
                let s = x.shape();
                let n = w.weight.shape()[0];
                y.reshape(&[s[0], s[1], heads, n / heads])?.transpose(&[0, 2, 1, 3])
            })
            .collect()
    }

    /// One fused node for affine weights with biases, of one bit width and
    /// group size.
    fn fused_linear_heads(&self, x: &Array, ws: &[(&Quantized, i32)]) -> Result<Vec<Array>> {
        let first = ws.first().ok_or_else(|| Error::invalid("quantized_linear_heads", "no weights"))?.0;
        let mut list = Vec::with_capacity(ws.len() * 3);
        for (w, _) in ws {
            list.extend([&w.weight, &w.scales, w.biases.as_ref().expect("callers pass weights with biases")]);
        }
        let heads: Vec<i32> = ws.iter().map(|&(_, h)| h).collect();
        from_list(
            "quantized_linear_heads",
            bridge::fast_quantized_linear_multi(
                &x.inner,
                &to_list(&list),
                &heads,
                first.group_size,
                first.bits,
                first.layout.ffi(),
                self.path.ffi(),
            ),
        )
    }

    /// `act(x @ Gᵀ) * (x @ Uᵀ)` in one node: a gated MLP's gate and up
    /// projections with its activation.
    pub fn quantized_gated_linear(
        &self,
        x: &Array,
        gate: &Quantized,
        up: &Quantized,
        act: GateActivation,
    ) -> Result<Array> {
        let fusable = [gate, up].iter().all(|w| w.mode == QuantMode::Affine && w.biases.is_some())
            && gate.bits == up.bits
            && gate.group_size == up.group_size
            && gate.layout == up.layout;
        if !fusable {
            if self.path == Path::Kernel {
                return Err(Error::invalid(
                    "quantized_gated_linear",
                    "mlxcel's kernel fuses affine weights of one bit width and group size",
                ));
            }
            let g = self.quantized_linear(x, gate)?;
            let u = self.quantized_linear(x, up)?;
            return self.gated_activation(act, &g, &u);
        }
        let list = [
            &gate.weight,
            &gate.scales,
            gate.biases.as_ref().expect("checked above"),
            &up.weight,
            &up.scales,
            up.biases.as_ref().expect("checked above"),
        ];
        wrap(
            "quantized_gated_linear",
            bridge::fast_quantized_gated_linear(
                act.ffi(),
                &x.inner,
                &to_list(&list),
                gate.group_size,
                gate.bits,
                gate.layout.ffi(),
                self.path.ffi(),
            ),
        )
    }

    /// The rows `ids` (any shape of integer ids) of a quantized table,
    /// dequantized: `[..ids, in]`.
    pub fn quantized_embedding(&self, ids: &Array, w: &Quantized) -> Result<Array> {
        self.quantized_embedding_scaled(ids, w, 1.0)
    }

    /// [`Fast::quantized_embedding`] times `scale` (Gemma's `sqrt(hidden)`),
    /// multiplied in f32 after dequantization as `embedding(ids) * scale`
    /// would be, but without a node of its own.
    pub fn quantized_embedding_scaled(&self, ids: &Array, w: &Quantized, scale: f32) -> Result<Array> {
        if w.mode != QuantMode::Affine {
            if self.path == Path::Kernel {
                return Err(Error::invalid(
                    "quantized_embedding",
                    format!("mlxcel's kernel covers affine quantization, not {}", w.mode.name()),
                ));
            }
            let rows = Quantized {
                weight: w.weight.take(ids, 0)?,
                scales: w.scales.take(ids, 0)?,
                biases: w.biases.as_ref().map(|b| b.take(ids, 0)).transpose()?,
                ..w.clone()
            };
            let rows = rows.dequantize(None)?;
            return if scale == 1.0 { Ok(rows) } else { rows.multiply_scalar(scale) };
        }
        wrap(
            "quantized_embedding",
            bridge::fast_quantized_gather(
                &ids.inner,
                &w.weight.inner,
                &w.scales.inner,
                opt(w.biases.as_ref()),
                w.group_size,
                w.bits,
                w.layout.ffi(),
                scale,
                self.path.ffi(),
            ),
        )
    }

    /// RMS normalisation over the last axis: `x / sqrt(mean(x²) + eps) * weight`.
    pub fn rms_norm(&self, x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
        wrap("rms_norm", bridge::fast_rms_norm(&x.inner, opt(weight), eps, self.path.ffi()))
    }

    /// `a + b` (broadcasting as MLX's `add`). A residual connection onto one
    /// of our quantized products or RMS norms not yet computed
    /// (`h + o_proj(..)`, Gemma's `h + post_norm(..)`) becomes one node that
    /// adds as it writes; the result is bit-identical.
    pub fn add(&self, a: &Array, b: &Array) -> Result<Array> {
        wrap("add", bridge::fast_add(&a.inner, &b.inner, self.path.ffi()))
    }

    /// Rotary position embedding of the first `dims` features of the last
    /// axis for positions `offset..` along the second-to-last axis, as MLX's
    /// `fast::rope`: with `freqs` (wavelengths, `dims / 2` of them) instead of
    /// `base`, positions multiplied by `scale`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &Array,
        dims: i32,
        traditional: bool,
        base: f32,
        scale: f32,
        offset: i32,
        freqs: Option<&Array>,
    ) -> Result<Array> {
        let params = bridge::RopeParams { dims, traditional, base, scale };
        wrap("rope", bridge::fast_rope(&x.inner, &params, opt(freqs), offset, self.path.ffi()))
    }

    /// `softmax(q kᵀ * scale + mask) v` with `q: [batch, heads, queries, dim]`
    /// and `k, v: [batch, kv_heads, keys, dim]` (grouped-query heads).
    pub fn scaled_dot_product_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        scale: f32,
        mask: AttentionMask<'_>,
    ) -> Result<Array> {
        let (mode, arr) = mask.mode_and_array();
        wrap(
            "scaled_dot_product_attention",
            bridge::fast_sdpa(&q.inner, &k.inner, &v.inner, scale, mode, opt(arr), self.path.ffi()),
        )
    }

    /// One attention step over the KV caches of a batch of sequences, one
    /// [`CacheRow`] per row of `q [B, H, L, D]`, `k [B, KVH, L, D]` and `v`:
    /// rotates row b's queries and keys for positions `rows[b].offset..`,
    /// writes its rotated keys and values into its own cache buffers at
    /// `rows[b].cache.slot`, and attends its queries over the first
    /// `rows[b].cache.visible` positions of those buffers. Returns the
    /// attention with heads merged, `[B, L, H·Dv]`, and each row's updated
    /// buffers.
    ///
    /// A row's result does not depend on the other rows (the same bits as the
    /// row alone). On the CPU the whole batch is one node (so a batched
    /// decode step stays all-kernel and runs inline with [`eval`]) that
    /// writes each buffer in place when nothing else holds it, as MLX's
    /// `slice_update` does; otherwise, per row, it is [`Fast::rope`],
    /// `slice_update` and [`Fast::scaled_dot_product_attention`].
    pub fn cached_attention(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        rope: &RopeSpec<'_>,
        rows: &[CacheRow<'_>],
        scale: f32,
    ) -> Result<CachedAttention> {
        let (buffers, steps) = cache_steps("cached_attention", rows)?;
        let mut arrays = vec![q, k, v];
        arrays.extend(buffers);
        let parts = from_list(
            "cached_attention",
            bridge::fast_cached_attention(
                &to_list(&arrays),
                &rope.ffi(),
                opt(rope.freqs),
                &steps,
                scale,
                self.path.ffi(),
            ),
        )?;
        let mut parts = parts.into_iter();
        let out = parts.next().ok_or_else(|| Error::invalid("cached_attention", "MLX returned no output"))?;
        let mut caches = Vec::with_capacity(rows.len());
        while let (Some(keys), Some(values)) = (parts.next(), parts.next()) {
            caches.push((keys, values));
        }
        if caches.len() != rows.len() {
            return Err(Error::invalid("cached_attention", "MLX returned fewer buffers than rows"));
        }
        Ok(CachedAttention { out, caches })
    }

    /// `[B, H, L, D]` → `[B, L, H·D]`: attention's heads merged for the output
    /// projection. Free when `x` is mlxcel's attention node not yet computed
    /// (it then writes that layout itself); MLX's transpose and reshape otherwise.
    pub fn merge_heads(&self, x: &Array) -> Result<Array> {
        wrap("merge_heads", bridge::fast_merge_heads(&x.inner, self.path.ffi()))
    }

    /// `act(a) * b`, elementwise (the gate of a gated MLP).
    pub fn gated_activation(&self, act: GateActivation, a: &Array, b: &Array) -> Result<Array> {
        let name = match act {
            GateActivation::Silu => "silu_mul",
            GateActivation::GeluApprox => "gelu_approx_mul",
        };
        wrap(name, bridge::fast_gated_activation(act.ffi(), &a.inner, &b.inner, self.path.ffi()))
    }
}

/// A rotary embedding's parameters, as [`Fast::rope`] takes them.
#[derive(Clone, Copy)]
pub struct RopeSpec<'a> {
    /// Rotated features (the first `dims` of each head).
    pub dims: i32,
    /// Rotates adjacent pairs instead of the two halves.
    pub traditional: bool,
    /// Wavelengths `base^(2i/dims)` (ignored with `freqs`).
    pub base: f32,
    /// Multiplies positions.
    pub scale: f32,
    /// Explicit wavelengths, `dims / 2` of them.
    pub freqs: Option<&'a Array>,
}

impl RopeSpec<'_> {
    fn ffi(&self) -> bridge::RopeParams {
        bridge::RopeParams { dims: self.dims, traditional: self.traditional, base: self.base, scale: self.scale }
    }
}

/// Where one attention step's keys and values go in a layer's KV cache
/// buffers, and which buffer positions its queries see.
pub struct CacheSlot<'a> {
    /// Key buffer of one sequence, `[1, kv_heads, capacity, head_dim]`.
    pub keys: &'a Array,
    /// Value buffer of one sequence, `[1, kv_heads, capacity, value_dim]`.
    pub values: &'a Array,
    /// First position the step's keys and values are written to.
    pub slot: usize,
    /// The queries attend over buffer positions `0..visible`.
    pub visible: usize,
    /// Query `i` of `L` sees positions up to `visible - L + i` (needs
    /// `slot + L == visible`); otherwise every query sees all visible ones.
    pub causal: bool,
}

/// One sequence of a [`Fast::cached_attention`] step.
pub struct CacheRow<'a> {
    /// The position of the row's first query and key (RoPE).
    pub offset: usize,
    /// Where its keys and values go and what its queries see.
    pub cache: CacheSlot<'a>,
}

/// What [`Fast::cached_attention`] returns.
pub struct CachedAttention {
    /// The attention output with heads merged, `[batch, queries, heads · value_dim]`.
    pub out: Array,
    /// Per row: the key and value buffers with the step's keys and values written.
    pub caches: Vec<(Array, Array)>,
}

/// Each row's key and value buffers, in row order, and its step as the
/// bridge takes it (`op` names the caller in errors: positions past i32).
pub(crate) fn cache_steps<'a>(
    op: &'static str,
    rows: &[CacheRow<'a>],
) -> Result<(Vec<&'a Array>, Vec<bridge::CacheStep>)> {
    let int =
        |name: &str, n: usize| i32::try_from(n).map_err(|_| Error::invalid(op, format!("{name} {n} is too large")));
    let mut buffers = Vec::with_capacity(2 * rows.len());
    let mut steps = Vec::with_capacity(rows.len());
    for row in rows {
        let cache = &row.cache;
        buffers.extend([cache.keys, cache.values]);
        steps.push(bridge::CacheStep {
            offset: int("offset", row.offset)?,
            slot: int("slot", cache.slot)?,
            visible: int("visible", cache.visible)?,
            causal: cache.causal,
        });
    }
    Ok((buffers, steps))
}

/// [`Fast::cached_attention`] on the [`default_path`].
pub fn cached_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    rope: &RopeSpec<'_>,
    rows: &[CacheRow<'_>],
    scale: f32,
) -> Result<CachedAttention> {
    on(default_path()).cached_attention(q, k, v, rope, rows, scale)
}

/// [`Fast::linear`] on the [`default_path`].
pub fn linear(x: &Array, linear: &Linear) -> Result<Array> {
    on(default_path()).linear(x, linear)
}

/// [`Fast::linear_heads`] on the [`default_path`].
pub fn linear_heads(x: &Array, projections: &[(&Linear, i32)]) -> Result<Vec<Array>> {
    on(default_path()).linear_heads(x, projections)
}

/// [`Fast::gated_linear`] on the [`default_path`].
pub fn gated_linear(x: &Array, gate: &Linear, up: &Linear, act: GateActivation) -> Result<Array> {
    on(default_path()).gated_linear(x, gate, up, act)
}

/// [`Fast::embedding`] on the [`default_path`].
pub fn embedding(ids: &Array, table: &Weight, scale: f32) -> Result<Array> {
    on(default_path()).embedding(ids, table, scale)
}

/// [`Fast::quantized_linear`] on the [`default_path`].
pub fn quantized_linear(x: &Array, w: &Quantized) -> Result<Array> {
    on(default_path()).quantized_linear(x, w)
}

/// [`Fast::quantized_linear_many`] on the [`default_path`].
pub fn quantized_linear_many(x: &Array, ws: &[&Quantized]) -> Result<Vec<Array>> {
    on(default_path()).quantized_linear_many(x, ws)
}

/// [`Fast::quantized_linear_heads`] on the [`default_path`].
pub fn quantized_linear_heads(x: &Array, ws: &[(&Quantized, i32)]) -> Result<Vec<Array>> {
    on(default_path()).quantized_linear_heads(x, ws)
}

/// [`Fast::quantized_gated_linear`] on the [`default_path`].
pub fn quantized_gated_linear(x: &Array, gate: &Quantized, up: &Quantized, act: GateActivation) -> Result<Array> {
    on(default_path()).quantized_gated_linear(x, gate, up, act)
}

/// [`Fast::quantized_embedding`] on the [`default_path`].
pub fn quantized_embedding(ids: &Array, w: &Quantized) -> Result<Array> {
    on(default_path()).quantized_embedding(ids, w)
}

/// [`Fast::quantized_embedding_scaled`] on the [`default_path`].
pub fn quantized_embedding_scaled(ids: &Array, w: &Quantized, scale: f32) -> Result<Array> {
    on(default_path()).quantized_embedding_scaled(ids, w, scale)
}

/// [`Fast::rms_norm`] on the [`default_path`].
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    on(default_path()).rms_norm(x, weight, eps)
}

/// [`Fast::add`] on the [`default_path`].
pub fn add(a: &Array, b: &Array) -> Result<Array> {
    on(default_path()).add(a, b)
}

/// [`Fast::rope`] on the [`default_path`].
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: f32,
    scale: f32,
    offset: i32,
    freqs: Option<&Array>,
) -> Result<Array> {
    on(default_path()).rope(x, dims, traditional, base, scale, offset, freqs)
}

/// [`Fast::scaled_dot_product_attention`] on the [`default_path`].
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array> {
    on(default_path()).scaled_dot_product_attention(q, k, v, scale, mask)
}

/// [`Fast::merge_heads`] on the [`default_path`].
pub fn merge_heads(x: &Array) -> Result<Array> {
    on(default_path()).merge_heads(x)
}

/// [`Fast::gated_activation`] on the [`default_path`].
pub fn gated_activation(act: GateActivation, a: &Array, b: &Array) -> Result<Array> {
    on(default_path()).gated_activation(act, a, b)
}

/// `silu(a) * b` on the [`default_path`].
pub fn silu_mul(a: &Array, b: &Array) -> Result<Array> {
    gated_activation(GateActivation::Silu, a, b)
}

/// `gelu_tanh(a) * b` on the [`default_path`].
pub fn gelu_approx_mul(a: &Array, b: &Array) -> Result<Array> {
    gated_activation(GateActivation::GeluApprox, a, b)
}
