//! The StableHLO layers, compiled by `iree-compile` and run by
//! `iree-run-module` on this CPU, against references computed here in f64
//! from the definitions (not from the emitter's own code).
//!
//! Tolerance: the graphs compute in f32; each output is within
//! `1e-4 · max(1, max |reference|)` of the f64 reference. f32 rounding over
//! the ≤ 64-term sums and the transcendental functions here stays near
//! 1e-6 relative; a wrong index, packing, mask or head grouping is off by
//! the size of the values themselves, 10⁴ times the tolerance.

mod iree_tools;

use iree_tools::{Compiled, Data, Input};
use mlxcel_stablehlo::layers::{self, Attend, Gate, Quantized, Rope, Weight};
use mlxcel_stablehlo::{ElementType, Function, Module, TensorType, Value};

const F32: ElementType = ElementType::F32;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

fn close(name: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}: {} values, expected {}", got.len(), want.len());
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(*g) - w).abs();
        assert!(err <= 1e-4 * scale, "{name}[{i}]: {g} against {w} (error {err:e}, tolerance {:e})", 1e-4 * scale);
    }
}

fn f32s(shape: &[i64]) -> TensorType {
    TensorType::new(shape, F32)
}

/// A quantized matrix's codes, scales and biases, and its packed words in
/// MLX's layout (each row one little-endian bit stream of its codes).
struct QuantizedHost {
    rows: usize,
    cols: usize,
    bits: u32,
    group: usize,
    codes: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

impl QuantizedHost {
    fn random(rng: &mut Rng, rows: usize, cols: usize, bits: u32, group: usize) -> QuantizedHost {
        let groups = rows * cols / group;
        QuantizedHost {
            rows,
            cols,
            bits,
            group,
            codes: (0..rows * cols).map(|_| rng.below(1 << bits)).collect(),
            scales: (0..groups).map(|_| 0.1 * rng.unit()).collect(),
            biases: (0..groups).map(|_| 0.5 * rng.unit()).collect(),
        }
    }

    /// Each row one little-endian bit stream of its codes, in 32-bit words.
    fn packed(&self) -> Vec<u32> {
        let bits = self.bits as usize;
        let row_words = self.cols * bits / 32;
        let mut words = vec![0u32; self.rows * row_words];
        for (j, &c) in self.codes.iter().enumerate() {
            let (r, k) = (j / self.cols, j % self.cols);
            for b in 0..bits {
                let bit = k * bits + b;
                words[r * row_words + bit / 32] |= ((c >> b) & 1) << (bit % 32);
            }
        }
        words
    }

    fn value(&self, r: usize, c: usize) -> f64 {
        let g = (r * self.cols + c) / self.group;
        f64::from(self.scales[g]) * f64::from(self.codes[r * self.cols + c]) + f64::from(self.biases[g])
    }

    fn shapes(&self) -> [Vec<i64>; 2] {
        let (r, c) = (self.rows as i64, self.cols as i64);
        [vec![r, c * i64::from(self.bits) / 32], vec![r, c / self.group as i64]]
    }

    fn declare(&self, f: &mut Function, name: &str) -> Quantized {
        let shape = [self.rows as i64, self.cols as i64];
        Quantized::parameters(f, name, shape, self.bits, self.group as i64, F32).unwrap()
    }
}

/// `y[r, o] = Σ_i x[r, i] · w(o, i)`.
fn matmul_ref(x: &[f32], rows: usize, inputs: usize, outputs: usize, w: impl Fn(usize, usize) -> f64) -> Vec<f64> {
    let mut y = vec![0.0; rows * outputs];
    for r in 0..rows {
        for o in 0..outputs {
            y[r * outputs + o] = (0..inputs).map(|i| f64::from(x[r * inputs + i]) * w(o, i)).sum();
        }
    }
    y
}

fn rms_ref(x: &[f32], dim: usize, w: &[f32], eps: f64) -> Vec<f64> {
    x.chunks(dim)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(w).map(move |(&v, &g)| f64::from(v) * inv * f64::from(g)).collect::<Vec<_>>()
        })
        .collect()
}

/// RoPE of `x [b, h, l, d]` as MLX defines it.
fn rope_ref(x: &[f32], l: usize, d: usize, offset: usize, rope: &Rope) -> Vec<f64> {
    let dims = rope.dims as usize;
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (row, chunk) in out.chunks_mut(d).enumerate() {
        let p = (offset + row % l) as f64;
        for i in 0..dims / 2 {
            let theta = p * f64::from(rope.inv_freq[i]);
            let (a, b) = if rope.traditional { (2 * i, 2 * i + 1) } else { (i, i + dims / 2) };
            let (x1, x2) = (chunk[a], chunk[b]);
            chunk[a] = x1 * theta.cos() - x2 * theta.sin();
            chunk[b] = x1 * theta.sin() + x2 * theta.cos();
        }
    }
    out
}

#[test]
fn norms_products_and_quantized_products_match_their_definitions() {
    let mut rng = Rng(0x5EED);
    let (b, l, d, out) = (2i64, 3i64, 64i64, 16i64);
    let x = rng.floats((b * l * d) as usize);
    let gain = rng.floats(d as usize);
    let w = rng.floats((out * d) as usize);
    let bias = rng.floats(out as usize);
    // Every width MLX packs: 2, 4 and 8 bits divide a word; 3, 5 and 6 straddle words.
    let quantized: Vec<(String, QuantizedHost)> = [(4, 32), (8, 64), (2, 32), (3, 32), (5, 64), (6, 32)]
        .into_iter()
        .map(|(bits, group)| {
            (format!("q{bits}"), QuantizedHost::random(&mut rng, out as usize, d as usize, bits, group))
        })
        .collect();
    let mut m = Module::new("products");
    let mut f = m.function("norm_linear", &[("x", f32s(&[b, l, d]))]);
    let xv = f.arg(0);
    let g = f.parameter("norm.weight", f32s(&[d])).unwrap();
    let normed = layers::rms_norm(&mut f, &xv, &g, 1e-5).unwrap();
    let wv = Weight::Dense(f.parameter("proj.weight", f32s(&[out, d])).unwrap());
    let bv = f.parameter("proj.bias", f32s(&[out])).unwrap();
    let y = layers::linear(&mut f, &normed, &wv, Some(&bv)).unwrap();
    f.finish(&mut m, &[&normed, &y]).unwrap();
    for (name, q) in &quantized {
        let mut f = m.function(name, &[("x", f32s(&[b, l, d]))]);
        let xv = f.arg(0);
        let w = Weight::Quantized(q.declare(&mut f, name));
        let y = layers::linear(&mut f, &xv, &w, None).unwrap();
        f.finish(&mut m, &[&y]).unwrap();
    }
    // One row (a decode step of one sequence) takes the product's other path.
    let mut f = m.function("q4_one_row", &[("x", f32s(&[1, 1, d]))]);
    let xv = f.arg(0);
    let q4w = Weight::Quantized(quantized[0].1.declare(&mut f, "q4"));
    let y = layers::linear(&mut f, &xv, &q4w, None).unwrap();
    f.finish(&mut m, &[&y]).unwrap();
    let mlir = m.to_mlir();

    struct Host {
        names: [String; 3],
        data: [Data; 3],
        shapes: [Vec<i64>; 2],
    }
    let hosts: Vec<Host> = quantized
        .iter()
        .map(|(name, q)| Host {
            names: ["weight", "scales", "biases"].map(|part| format!("{name}.{part}")),
            data: [Data::U32(q.packed()), Data::F32(q.scales.clone()), Data::F32(q.biases.clone())],
            shapes: q.shapes(),
        })
        .collect();
    let (gain_d, w_d, bias_d) = (Data::F32(gain.clone()), Data::F32(w.clone()), Data::F32(bias.clone()));
    let (gain_s, w_s, bias_s) = ([d], [out, d], [out]);
    let mut params: Vec<(&str, &Data, &[i64])> =
        vec![("norm.weight", &gain_d, &gain_s), ("proj.weight", &w_d, &w_s), ("proj.bias", &bias_d, &bias_s)];
    for h in &hosts {
        params.push((&h.names[0], &h.data[0], &h.shapes[0]));
        params.push((&h.names[1], &h.data[1], &h.shapes[1]));
        params.push((&h.names[2], &h.data[2], &h.shapes[1]));
    }
    let compiled = Compiled::new("products", &mlir, &params);

    let xd = Data::F32(x.clone());
    let input = [Input::Array(&xd, &[b, l, d])];
    let outs = compiled.run("norm_linear", &input, 2);
    let rows = (b * l) as usize;
    let normed_ref = rms_ref(&x, d as usize, &gain, 1e-5);
    close("rms_norm", &outs[0], &normed_ref);
    let normed32: Vec<f32> = outs[0].clone();
    let mut y_ref = matmul_ref(&normed32, rows, d as usize, out as usize, |o, i| f64::from(w[o * d as usize + i]));
    for (i, v) in y_ref.iter_mut().enumerate() {
        *v += f64::from(bias[i % out as usize]);
    }
    close("linear", &outs[1], &y_ref);
    for (name, q) in &quantized {
        let got = compiled.run(name, &input, 1);
        close(name, &got[0], &matmul_ref(&x, rows, d as usize, out as usize, |o, i| q.value(o, i)));
    }
    let row = &x[..d as usize];
    let rd = Data::F32(row.to_vec());
    let got = compiled.run("q4_one_row", &[Input::Array(&rd, &[1, 1, d])], 1);
    let q4 = &quantized[0].1;
    close("q4_one_row", &got[0], &matmul_ref(row, 1, d as usize, out as usize, |o, i| q4.value(o, i)));
}

#[test]
fn rope_gates_and_quantized_embeddings_match_their_definitions() {
    let mut rng = Rng(0xF00D);
    let (b, h, l, d) = (1i64, 2i64, 3i64, 8i64);
    let x = rng.floats((b * h * l * d) as usize);
    let ropes = [
        ("rope_halves", Rope::with_base(8, false, 10000.0, 1.0)),
        ("rope_pairs_partial", Rope::with_base(4, true, 500.0, 0.5)),
        ("rope_wavelengths", Rope::with_wavelengths(8, false, &[1.0, 3.0, 50.0, 900.0])),
    ];
    let table = QuantizedHost::random(&mut rng, 10, 64, 4, 32);
    let (gate, up) = (rng.floats(16), rng.floats(16));

    let mut m = Module::new("pointwise");
    for (name, rope) in &ropes {
        let mut f = m.function(name, &[("x", f32s(&[b, h, l, d])), ("offset", TensorType::scalar(ElementType::I32))]);
        let (xv, off) = (f.arg(0), f.arg(1));
        let y = layers::rope(&mut f, &xv, &off, rope).unwrap();
        f.finish(&mut m, &[&y]).unwrap();
    }
    // Two rows at their own positions (a decode batch): one offset per row.
    let rows_shape = [2, h, l, d];
    let mut f =
        m.function("rope_rows", &[("x", f32s(&rows_shape)), ("offsets", TensorType::new(&[2], ElementType::I32))]);
    let (xv, off) = (f.arg(0), f.arg(1));
    let y = layers::rope(&mut f, &xv, &off, &ropes[1].1).unwrap();
    f.finish(&mut m, &[&y]).unwrap();
    let mut f = m.function("gates", &[("gate", f32s(&[2, 8])), ("up", f32s(&[2, 8]))]);
    let (gv, uv) = (f.arg(0), f.arg(1));
    let silu = layers::gated(&mut f, &gv, &uv, Gate::Silu).unwrap();
    let gelu = layers::gated(&mut f, &gv, &uv, Gate::GeluTanh).unwrap();
    f.finish(&mut m, &[&silu, &gelu]).unwrap();
    let mut f = m.function("embed", &[("ids", TensorType::new(&[2, 3], ElementType::I32))]);
    let ids = f.arg(0);
    let w = Weight::Quantized(table.declare(&mut f, "embed"));
    let e = layers::embedding(&mut f, &ids, &w, 2.0).unwrap();
    f.finish(&mut m, &[&e]).unwrap();

    let [packed_shape, group_shape] = table.shapes();
    let (packed, scales, biases) =
        (Data::U32(table.packed()), Data::F32(table.scales.clone()), Data::F32(table.biases.clone()));
    let params: Vec<(&str, &Data, &[i64])> = vec![
        ("embed.weight", &packed, &packed_shape),
        ("embed.scales", &scales, &group_shape),
        ("embed.biases", &biases, &group_shape),
    ];
    let compiled = Compiled::new("pointwise", &m.to_mlir(), &params);

    let xd = Data::F32(x.clone());
    for (name, rope) in &ropes {
        let got = compiled.run(name, &[Input::Array(&xd, &[b, h, l, d]), Input::ScalarI32(5)], 1);
        close(name, &got[0], &rope_ref(&x, l as usize, d as usize, 5, rope));
    }

    let x2 = rng.floats((2 * h * l * d) as usize);
    let (x2d, offsets) = (Data::F32(x2.clone()), Data::I32(vec![5, 11]));
    let got = compiled.run("rope_rows", &[Input::Array(&x2d, &rows_shape), Input::Array(&offsets, &[2])], 1);
    let row = (h * l * d) as usize;
    let want: Vec<f64> = [5, 11]
        .iter()
        .enumerate()
        .flat_map(|(r, &o)| rope_ref(&x2[r * row..(r + 1) * row], l as usize, d as usize, o, &ropes[1].1))
        .collect();
    close("rope_rows", &got[0], &want);

    let (gd, ud) = (Data::F32(gate.clone()), Data::F32(up.clone()));
    let got = compiled.run("gates", &[Input::Array(&gd, &[2, 8]), Input::Array(&ud, &[2, 8])], 2);
    let pairs = || gate.iter().zip(&up).map(|(&g, &u)| (f64::from(g), f64::from(u)));
    let silu: Vec<f64> = pairs().map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let gelu: Vec<f64> = pairs().map(|(g, u)| 0.5 * g * (1.0 + (k * (g + 0.044715 * g.powi(3))).tanh()) * u).collect();
    close("silu", &got[0], &silu);
    close("gelu_tanh", &got[1], &gelu);

    let ids = [3i32, 0, 9, 9, 4, 1];
    let idd = Data::I32(ids.to_vec());
    let got = compiled.run("embed", &[Input::Array(&idd, &[2, 3])], 1);
    let want: Vec<f64> =
        ids.iter().flat_map(|&r| (0..64).map(|c| 2.0 * table.value(r as usize, c)).collect::<Vec<_>>()).collect();
    close("embedding", &got[0], &want);
}

/// One attention case: the batch's positions (one for all rows, or one per
/// row) and the window.
struct AttentionCase {
    name: &'static str,
    batch: usize,
    offsets: Vec<usize>,
    per_row: bool,
    window: Option<usize>,
}

#[test]
fn cached_attention_writes_the_cache_and_attends_causally_with_grouped_heads() {
    let cases = [
        AttentionCase { name: "one_offset", batch: 1, offsets: vec![4], per_row: false, window: None },
        AttentionCase { name: "offset_per_row", batch: 2, offsets: vec![4, 1], per_row: true, window: None },
        AttentionCase { name: "sliding_window", batch: 2, offsets: vec![5, 2], per_row: true, window: Some(3) },
    ];
    let (heads, kv_heads, l, d, capacity) = (4usize, 2usize, 3usize, 8usize, 8usize);
    let scale = 1.0 / (d as f32).sqrt();
    let mut rng = Rng(0xCAFE);
    for case in &cases {
        let b = case.batch;
        let q = rng.floats(b * heads * l * d);
        let k = rng.floats(b * kv_heads * l * d);
        let v = rng.floats(b * kv_heads * l * d);
        let ck = rng.floats(b * kv_heads * capacity * d);
        let cv = rng.floats(b * kv_heads * capacity * d);

        let [bi, hi, ki, li, di, ci] = [b, heads, kv_heads, l, d, capacity].map(|n| n as i64);
        let offsets_ty =
            if case.per_row { TensorType::new(&[bi], ElementType::I32) } else { TensorType::scalar(ElementType::I32) };
        let mut m = Module::new("attention");
        let mut f = m.function(
            "attend",
            &[
                ("q", f32s(&[bi, hi, li, di])),
                ("k", f32s(&[bi, ki, li, di])),
                ("v", f32s(&[bi, ki, li, di])),
                ("cache_k", f32s(&[bi, ki, ci, di])),
                ("cache_v", f32s(&[bi, ki, ci, di])),
                ("offsets", offsets_ty),
            ],
        );
        let a: Vec<Value> = f.args().to_vec();
        let how = Attend { scale, window: case.window.map(|w| w as i64) };
        let r = layers::cached_attention(&mut f, &a[0], &a[1], &a[2], (&a[3], &a[4]), &a[5], how).unwrap();
        f.finish(&mut m, &[&r.out, &r.keys, &r.values]).unwrap();
        let compiled = Compiled::new(case.name, &m.to_mlir(), &[]);
        let data = [&q, &k, &v, &ck, &cv].map(|x| Data::F32(x.clone()));
        let shapes = [[bi, hi, li, di], [bi, ki, li, di], [bi, ki, li, di], [bi, ki, ci, di], [bi, ki, ci, di]];
        let mut inputs: Vec<Input<'_>> = data.iter().zip(&shapes).map(|(x, s)| Input::Array(x, s)).collect();
        let offsets_data = Data::I32(case.offsets.iter().map(|&o| o as i32).collect());
        let offsets_shape = [bi];
        inputs.push(if case.per_row {
            Input::Array(&offsets_data, &offsets_shape)
        } else {
            Input::ScalarI32(case.offsets[0] as i32)
        });
        let got = compiled.run("attend", &inputs, 3);

        let offset = |row: usize| case.offsets[if case.per_row { row } else { 0 }];
        // The caches with rows offset..offset+l of each row replaced by this step's k, v.
        let write = |cache: &[f32], new: &[f32]| -> Vec<f64> {
            let mut c: Vec<f64> = cache.iter().map(|&x| f64::from(x)).collect();
            for row in 0..b {
                for kv in 0..kv_heads {
                    for t in 0..l {
                        for e in 0..d {
                            c[((row * kv_heads + kv) * capacity + offset(row) + t) * d + e] =
                                f64::from(new[((row * kv_heads + kv) * l + t) * d + e]);
                        }
                    }
                }
            }
            c
        };
        let (keys, values) = (write(&ck, &k), write(&cv, &v));
        close(&format!("{} keys", case.name), &got[1], &keys);
        close(&format!("{} values", case.name), &got[2], &values);

        // out[row, t, h·d + e] = Σ_s softmax_s(q·k_s · scale) v_s over the
        // keys s the query at position p = offset + t sees: s ≤ p, and
        // s > p - window with a window.
        let mut want = vec![0.0; b * l * heads * d];
        for row in 0..b {
            for h in 0..heads {
                let kv = row * kv_heads + h / (heads / kv_heads);
                for t in 0..l {
                    let p = offset(row) + t;
                    let first = case.window.map_or(0, |w| (p + 1).saturating_sub(w));
                    let seen: Vec<usize> = (first..=p).collect();
                    let scores: Vec<f64> = seen
                        .iter()
                        .map(|&s| {
                            (0..d)
                                .map(|e| {
                                    f64::from(q[((row * heads + h) * l + t) * d + e])
                                        * keys[(kv * capacity + s) * d + e]
                                })
                                .sum::<f64>()
                                * f64::from(scale)
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for e in 0..d {
                        want[((row * l + t) * heads + h) * d + e] = seen
                            .iter()
                            .zip(&scores)
                            .map(|(&s, sc)| (sc - max).exp() / total * values[(kv * capacity + s) * d + e])
                            .sum();
                    }
                }
            }
        }
        close(case.name, &got[0], &want);
    }
}
