//! Golden file of an emitted attention block (a tiny Llama layer's first
//! half: norm, 4-bit q/k/v projections, RoPE, cached attention, output
//! projection, residual), and proof that `iree-compile` accepts it.
//!
//! A change to what the emitter prints shows up as a diff of
//! `tests/golden/attention_block.mlir`; after checking the diff, rewrite
//! the file with `MLXCEL_UPDATE_GOLDEN=1 cargo test -p mlxcel-stablehlo --test golden`.

mod iree_tools;

use std::path::Path;

use mlxcel_stablehlo::layers::{self, Attend, Quantized, Rope, Weight};
use mlxcel_stablehlo::{ElementType, Function, Module, Target, TensorType};

const HIDDEN: i64 = 64;
const HEADS: i64 = 4;
const KV_HEADS: i64 = 2;
const HEAD_DIM: i64 = 16;
const CAPACITY: i64 = 32;

fn quantized(f: &mut Function, name: &str, out: i64, inputs: i64) -> Weight {
    Weight::Quantized(Quantized::parameters(f, name, [out, inputs], 4, 32, ElementType::BF16).unwrap())
}

fn attention_block() -> Module {
    let f32s = |shape: &[i64]| TensorType::new(shape, ElementType::F32);
    let cache = f32s(&[1, KV_HEADS, CAPACITY, HEAD_DIM]);
    let mut m = Module::new("attention_block");
    let mut f = m.function(
        "decode",
        &[
            ("x", f32s(&[1, 1, HIDDEN])),
            ("offset", TensorType::scalar(ElementType::I32)),
            ("cache_k", cache.clone()),
            ("cache_v", cache),
        ],
    );
    let (x, offset, ck, cv) = (f.arg(0), f.arg(1), f.arg(2), f.arg(3));
    let p = "model.layers.0";
    let gain =
        f.parameter(&format!("{p}.input_layernorm.weight"), TensorType::new(&[HIDDEN], ElementType::BF16)).unwrap();
    let h = layers::rms_norm(&mut f, &x, &gain, 1e-5).unwrap();
    let heads = |f: &mut Function, name: &str, n: i64| {
        let w = quantized(f, &format!("{p}.self_attn.{name}"), n * HEAD_DIM, HIDDEN);
        let y = layers::linear(f, &h, &w, None).unwrap();
        let y = f.reshape(&y, &[1, 1, n, HEAD_DIM]).unwrap();
        f.transpose(&y, &[0, 2, 1, 3]).unwrap()
    };
    let q = heads(&mut f, "q_proj", HEADS);
    let k = heads(&mut f, "k_proj", KV_HEADS);
    let v = heads(&mut f, "v_proj", KV_HEADS);
    let rope = Rope::with_base(HEAD_DIM, false, 10000.0, 1.0);
    let q = layers::rope(&mut f, &q, &offset, &rope).unwrap();
    let k = layers::rope(&mut f, &k, &offset, &rope).unwrap();
    let how = Attend { scale: 0.25, window: None };
    let a = layers::cached_attention(&mut f, &q, &k, &v, (&ck, &cv), &offset, how).unwrap();
    let o = quantized(&mut f, &format!("{p}.self_attn.o_proj"), HIDDEN, HEADS * HEAD_DIM);
    let y = layers::linear(&mut f, &a.out, &o, None).unwrap();
    let out = f.add(&x, &y).unwrap();
    f.finish(&mut m, &[&out, &a.keys, &a.values]).unwrap();
    m
}

#[test]
fn the_attention_block_prints_as_its_golden_file_and_compiles() {
    let text = attention_block().to_mlir();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/attention_block.mlir");
    if std::env::var_os("MLXCEL_UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &text).unwrap();
    }
    let want = std::fs::read_to_string(&golden)
        .unwrap_or_else(|e| panic!("{}: {e} (MLXCEL_UPDATE_GOLDEN=1 writes it)", golden.display()));
    if text != want {
        let line = text.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "the emitted module differs from {} from line {}:\n  emitted: {}\n  golden:  {}",
            golden.display(),
            line + 1,
            text.lines().nth(line).unwrap_or("(end)"),
            want.lines().nth(line).unwrap_or("(end)")
        );
    }
    let module = attention_block();
    // Every weight is a parameter named as the bundle's tensor; none is a constant.
    assert_eq!(module.parameters().len(), 1 + 4 * 3);
    assert!(module.parameters().iter().all(|(name, _)| name.starts_with("model.layers.0.")));
    let vmfb = iree_tools::compiler().compile(&text, &Target::host_cpu()).unwrap_or_else(|e| panic!("{e}"));
    assert!(vmfb.len() > 1000, "a {}-byte vmfb", vmfb.len());
}
