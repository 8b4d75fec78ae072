//! Prints a decode step's feed-forward half at SmolLM2-135M's sizes (RMS
//! norm, 4-bit gate and up products with groups of 32, SwiGLU, 4-bit down
//! product, residual; batch 1) as a StableHLO module, and writes the
//! `iree-create-parameters` declarations of its weights to the file named by
//! the first argument. bench/iree-mlp.sh compiles and times it.

use mlxcel_stablehlo::layers::{self, Gate, Quantized, Weight};
use mlxcel_stablehlo::{ElementType, Error, Function, Module, TensorType};

const HIDDEN: i64 = 576;
const INTERMEDIATE: i64 = 1536;
const BITS: i64 = 4;
const GROUP: i64 = 32;

fn quantized(f: &mut Function, decls: &mut Vec<String>, name: &str, out: i64, inputs: i64) -> Result<Weight, Error> {
    // Zeroed contents (iree-create-parameters' patterned fill fails in 3.13).
    decls.push(format!("{name}.weight={out}x{}xi32", inputs * BITS / 32));
    decls.push(format!("{name}.scales={out}x{}xbf16", inputs / GROUP));
    decls.push(format!("{name}.biases={out}x{}xbf16", inputs / GROUP));
    Ok(Weight::Quantized(Quantized::parameters(f, name, [out, inputs], BITS as u32, GROUP, ElementType::BF16)?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let decls_path = std::env::args().nth(1).ok_or("usage: decode_mlp DECLARATIONS_FILE > module.mlir")?;
    let mut decls = Vec::new();
    let mut m = Module::new("decode_mlp");
    let mut f = m.function("mlp", &[("x", TensorType::new(&[1, 1, HIDDEN], ElementType::F32))]);
    let x = f.arg(0);
    let p = "model.layers.0";
    let gain =
        f.parameter(&format!("{p}.post_attention_layernorm.weight"), TensorType::new(&[HIDDEN], ElementType::BF16))?;
    decls.push(format!("{p}.post_attention_layernorm.weight={HIDDEN}xbf16"));
    let h = layers::rms_norm(&mut f, &x, &gain, 1e-5)?;
    let gate = quantized(&mut f, &mut decls, &format!("{p}.mlp.gate_proj"), INTERMEDIATE, HIDDEN)?;
    let up = quantized(&mut f, &mut decls, &format!("{p}.mlp.up_proj"), INTERMEDIATE, HIDDEN)?;
    let down = quantized(&mut f, &mut decls, &format!("{p}.mlp.down_proj"), HIDDEN, INTERMEDIATE)?;
    let g = layers::linear(&mut f, &h, &gate, None)?;
    let u = layers::linear(&mut f, &h, &up, None)?;
    let a = layers::gated(&mut f, &g, &u, Gate::Silu)?;
    let y = layers::linear(&mut f, &a, &down, None)?;
    let out = f.add(&x, &y)?;
    f.finish(&mut m, &[&out])?;
    std::fs::write(&decls_path, decls.join("\n") + "\n")?;
    print!("{}", m.to_mlir());
    Ok(())
}
