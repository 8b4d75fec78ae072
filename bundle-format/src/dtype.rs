//! Element types of tensors, as spelled in the manifest.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor's stored bytes.
///
/// The manifest stores the lower-case name ([`Dtype::as_str`]); the set of
/// names is fixed for format major version 1 (see `docs/bundle-format.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// One byte per element, 0 or 1.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer, little-endian.
    U16,
    /// Unsigned 32-bit integer, little-endian (also the container of packed quantized weights).
    U32,
    /// Unsigned 64-bit integer, little-endian.
    U64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer, little-endian.
    I16,
    /// Signed 32-bit integer, little-endian.
    I32,
    /// Signed 64-bit integer, little-endian.
    I64,
    /// IEEE 754 binary16, little-endian.
    F16,
    /// bfloat16 (the upper half of an f32), little-endian.
    Bf16,
    /// IEEE 754 binary32, little-endian.
    F32,
    /// IEEE 754 binary64, little-endian.
    F64,
    /// Complex number of two f32 (real, then imaginary), as MLX's complex64.
    C64,
}

impl Dtype {
    /// Every dtype of format version 1, in the order of the spec's table.
    pub const ALL: [Dtype; 14] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F32,
        Dtype::F64,
        Dtype::C64,
    ];

    /// The name stored in the manifest, e.g. `"bf16"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::U8 => "u8",
            Dtype::U16 => "u16",
            Dtype::U32 => "u32",
            Dtype::U64 => "u64",
            Dtype::I8 => "i8",
            Dtype::I16 => "i16",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::C64 => "c64",
        }
    }

    /// Bytes per element.
    pub const fn size_bytes(self) -> u64 {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::C64 => 8,
        }
    }

    /// The number of bytes a row-major tensor of this dtype and `shape` takes,
    /// or `None` when that overflows a u64.
    pub fn byte_len(self, shape: impl IntoIterator<Item = u64>) -> Option<u64> {
        shape.into_iter().try_fold(self.size_bytes(), |acc, dim| acc.checked_mul(dim))
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing a dtype name that format version 1 does not define.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?} (known: bool, u8, u16, u32, u64, i8, i16, i32, i64, f16, bf16, f32, f64, c64)")]
pub struct UnknownDtype(pub String);

impl FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dtype::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| UnknownDtype(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Dtype::ALL {
            assert_eq!(d.as_str().parse::<Dtype>(), Ok(d));
        }
        assert!("float32".parse::<Dtype>().is_err());
    }

    #[test]
    fn byte_len_checks_overflow() {
        assert_eq!(Dtype::Bf16.byte_len([3, 4]), Some(24));
        assert_eq!(Dtype::F32.byte_len([]), Some(4));
        assert_eq!(Dtype::U8.byte_len([0, 7]), Some(0));
        assert_eq!(Dtype::F64.byte_len([u64::MAX / 4, 2]), None);
    }
}
