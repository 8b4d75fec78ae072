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
use mlxcel_stablehlo::layers::{self, Gate, Quantized, Rope, Weight};
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
/// MLX's layout (code `j` of a row in word `j / (32 / bits)`, at bit
/// `bits · (j mod 32 / bits)`).
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

    fn packed(&self) -> Vec<u32> {
        let per_word = (32 / self.bits) as usize;
        let mut words = vec![0u32; self.rows * self.cols / per_word];
        for (j, &c) in self.codes.iter().enumerate() {
            words[j / per_word] |= c << (self.bits as usize * (j % per_word));
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
        let [packed, groups] = self.shapes();
        Quantized {
            packed: f.parameter(&format!("{name}.weight"), TensorType::new(&packed, ElementType::I32)).unwrap(),
            scales: f.parameter(&format!("{name}.scales"), f32s(&groups)).unwrap(),
            biases: f.parameter(&format!("{name}.biases"), f32s(&groups)).unwrap(),
            bits: self.bits,
            group: self.group as i64,
        }
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
    let q4 = QuantizedHost::random(&mut rng, out as usize, d as usize, 4, 32);
    let q8 = QuantizedHost::random(&mut rng, out as usize, d as usize, 8, 64);
    let q2 = QuantizedHost::random(&mut rng, out as usize, d as usize, 2, 32);

    let mut m = Module::new("products");
    let mut f = m.function("norm_linear", &[("x", f32s(&[b, l, d]))]);
    let xv = f.arg(0);
    let g = f.parameter("norm.weight", f32s(&[d])).unwrap();
    let normed = layers::rms_norm(&mut f, &xv, &g, 1e-5).unwrap();
    let wv = Weight::Dense(f.parameter("proj.weight", f32s(&[out, d])).unwrap());
    let bv = f.parameter("proj.bias", f32s(&[out])).unwrap();
    let y = layers::linear(&mut f, &normed, &wv, Some(&bv)).unwrap();
    f.finish(&mut m, &[&normed, &y]).unwrap();
    for (name, q) in [("q4", &q4), ("q8", &q8), ("q2", &q2)] {
        let mut f = m.function(name, &[("x", f32s(&[b, l, d]))]);
        let xv = f.arg(0);
        let w = Weight::Quantized(q.declare(&mut f, name));
        let y = layers::linear(&mut f, &xv, &w, None).unwrap();
        f.finish(&mut m, &[&y]).unwrap();
    }
    let mlir = m.to_mlir();

    let packed = [Data::U32(q4.packed()), Data::U32(q8.packed()), Data::U32(q2.packed())];
    let groups = [
        (Data::F32(q4.scales.clone()), Data::F32(q4.biases.clone())),
        (Data::F32(q8.scales.clone()), Data::F32(q8.biases.clone())),
        (Data::F32(q2.scales.clone()), Data::F32(q2.biases.clone())),
    ];
    let shapes = [q4.shapes(), q8.shapes(), q2.shapes()];
    let (gain_d, w_d, bias_d) = (Data::F32(gain.clone()), Data::F32(w.clone()), Data::F32(bias.clone()));
    let names = [
        ["q4.weight", "q4.scales", "q4.biases"],
        ["q8.weight", "q8.scales", "q8.biases"],
        ["q2.weight", "q2.scales", "q2.biases"],
    ];
    let (gain_s, w_s, bias_s) = ([d], [out, d], [out]);
    let mut params: Vec<(&str, &Data, &[i64])> =
        vec![("norm.weight", &gain_d, &gain_s), ("proj.weight", &w_d, &w_s), ("proj.bias", &bias_d, &bias_s)];
    for i in 0..3 {
        params.push((names[i][0], &packed[i], &shapes[i][0]));
        params.push((names[i][1], &groups[i].0, &shapes[i][1]));
        params.push((names[i][2], &groups[i].1, &shapes[i][1]));
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
    for (name, q) in [("q4", &q4), ("q8", &q8), ("q2", &q2)] {
        let got = compiled.run(name, &input, 1);
        close(name, &got[0], &matmul_ref(&x, rows, d as usize, out as usize, |o, i| q.value(o, i)));
    }
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

#[test]
fn cached_attention_writes_the_cache_and_attends_causally_with_grouped_heads() {
    let mut rng = Rng(0xCAFE);
    let (b, heads, kv_heads, l, d, capacity, offset) = (1usize, 4usize, 2usize, 3usize, 8usize, 8usize, 4usize);
    let q = rng.floats(b * heads * l * d);
    let k = rng.floats(b * kv_heads * l * d);
    let v = rng.floats(b * kv_heads * l * d);
    let ck = rng.floats(b * kv_heads * capacity * d);
    let cv = rng.floats(b * kv_heads * capacity * d);
    let scale = 1.0 / (d as f32).sqrt();

    let [bi, hi, ki, li, di, ci] = [b, heads, kv_heads, l, d, capacity].map(|n| n as i64);
    let mut m = Module::new("attention");
    let mut f = m.function(
        "attend",
        &[
            ("q", f32s(&[bi, hi, li, di])),
            ("k", f32s(&[bi, ki, li, di])),
            ("v", f32s(&[bi, ki, li, di])),
            ("cache_k", f32s(&[bi, ki, ci, di])),
            ("cache_v", f32s(&[bi, ki, ci, di])),
            ("offset", TensorType::scalar(ElementType::I32)),
        ],
    );
    let a: Vec<Value> = f.args().to_vec();
    let r = layers::cached_attention(&mut f, &a[0], &a[1], &a[2], (&a[3], &a[4]), &a[5], scale).unwrap();
    f.finish(&mut m, &[&r.out, &r.keys, &r.values]).unwrap();
    let compiled = Compiled::new("attention", &m.to_mlir(), &[]);
    let data = [&q, &k, &v, &ck, &cv].map(|x| Data::F32(x.clone()));
    let shapes = [[bi, hi, li, di], [bi, ki, li, di], [bi, ki, li, di], [bi, ki, ci, di], [bi, ki, ci, di]];
    let mut inputs: Vec<Input<'_>> = data.iter().zip(&shapes).map(|(x, s)| Input::Array(x, s)).collect();
    inputs.push(Input::ScalarI32(offset as i32));
    let got = compiled.run("attend", &inputs, 3);

    // The caches with rows offset..offset+l replaced by this step's k, v.
    let write = |cache: &[f32], new: &[f32]| -> Vec<f64> {
        let mut c: Vec<f64> = cache.iter().map(|&x| f64::from(x)).collect();
        for kv in 0..kv_heads {
            for t in 0..l {
                for e in 0..d {
                    c[(kv * capacity + offset + t) * d + e] = f64::from(new[(kv * l + t) * d + e]);
                }
            }
        }
        c
    };
    let (keys, values) = (write(&ck, &k), write(&cv, &v));
    close("keys", &got[1], &keys);
    close("values", &got[2], &values);

    // out[0, t, h·d + e] = Σ_s softmax_s(q·k_s · scale) v_s over s ≤ offset + t.
    let mut want = vec![0.0; l * heads * d];
    for h in 0..heads {
        let kv = h / (heads / kv_heads);
        for t in 0..l {
            let seen = offset + t + 1;
            let scores: Vec<f64> = (0..seen)
                .map(|s| {
                    (0..d).map(|e| f64::from(q[(h * l + t) * d + e]) * keys[(kv * capacity + s) * d + e]).sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for e in 0..d {
                want[(t * heads + h) * d + e] =
                    (0..seen).map(|s| (scores[s] - max).exp() / total * values[(kv * capacity + s) * d + e]).sum();
            }
        }
    }
    close("attention", &got[0], &want);
}
