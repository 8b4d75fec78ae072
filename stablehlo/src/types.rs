//! Tensor types as StableHLO spells them (`tensor<4x3xf32>`).

use std::fmt;

/// The element types the emitted graphs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// 32-bit float: activations and accumulation.
    F32,
    /// 16-bit IEEE float (stored weights, scales).
    F16,
    /// bfloat16 (stored weights, scales).
    BF16,
    /// 32-bit integer: token ids, positions, indices, and the u32 words
    /// quantized codes are packed in (IREE's StableHLO input is signless:
    /// a global of `ui32` does not legalize; the unpacking shifts are
    /// logical, so the words' sign never matters).
    I32,
    /// A boolean (comparison results, masks).
    I1,
}

impl ElementType {
    /// The MLIR spelling (`f32`, `ui32`, ...).
    pub fn mlir(self) -> &'static str {
        match self {
            ElementType::F32 => "f32",
            ElementType::F16 => "f16",
            ElementType::BF16 => "bf16",
            ElementType::I32 => "i32",
            ElementType::I1 => "i1",
        }
    }

    /// A floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, ElementType::F32 | ElementType::F16 | ElementType::BF16)
    }

    /// `value` as an MLIR literal of this type (floats in a form MLIR parses
    /// back exactly: hexadecimal bits for anything not a short decimal).
    pub(crate) fn literal(self, value: f64) -> String {
        match self {
            ElementType::I1 => (if value != 0.0 { "true" } else { "false" }).to_string(),
            ElementType::I32 => format!("{}", value as i64),
            // The narrower floats are written through f32: exact for every
            // value they can hold.
            ElementType::F32 | ElementType::F16 | ElementType::BF16 => float_literal(value as f32),
        }
    }
}

/// An f32 as MLIR reads it back bit for bit: infinities and NaN as their
/// bits, everything else in Rust's shortest round-trip decimal, with an
/// exponent and always a `.` (MLIR's float literals need one).
fn float_literal(v: f32) -> String {
    if !v.is_finite() {
        return format!("0x{:08X}", v.to_bits());
    }
    let text = format!("{v:e}");
    match text.split_once('e') {
        Some((mantissa, exponent)) if !mantissa.contains('.') => format!("{mantissa}.0e{exponent}"),
        _ => text,
    }
}

/// A ranked tensor type: its shape (static sizes) and element type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// The size of each axis (a scalar has none).
    pub shape: Vec<i64>,
    /// The element type.
    pub element: ElementType,
}

impl TensorType {
    /// A tensor of `shape` holding `element`s.
    pub fn new(shape: &[i64], element: ElementType) -> TensorType {
        TensorType { shape: shape.to_vec(), element }
    }

    /// A scalar (rank-0 tensor).
    pub fn scalar(element: ElementType) -> TensorType {
        TensorType { shape: Vec::new(), element }
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn elements(&self) -> i64 {
        self.shape.iter().product()
    }

    /// The same shape with another element type.
    pub fn with_element(&self, element: ElementType) -> TensorType {
        TensorType { shape: self.shape.clone(), element }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.element.mlir())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_print_as_mlir_spells_them() {
        assert_eq!(TensorType::new(&[4, 3], ElementType::F32).to_string(), "tensor<4x3xf32>");
        assert_eq!(TensorType::scalar(ElementType::I32).to_string(), "tensor<i32>");
        assert_eq!(TensorType::new(&[2], ElementType::I1).to_string(), "tensor<2xi1>");
    }

    #[test]
    fn float_literals_read_back_exactly() {
        for v in [1.0f32, -0.5, 1e-6, 3.4028235e38, f32::MIN_POSITIVE, 0.1] {
            let text = ElementType::F32.literal(f64::from(v));
            assert!(text.contains('.') && text.contains('e'), "{text}");
            assert_eq!(text.parse::<f32>().unwrap(), v);
        }
        assert_eq!(ElementType::F32.literal(f64::NEG_INFINITY), "0xFF800000");
    }
}
