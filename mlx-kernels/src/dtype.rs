//! Element types of MLX arrays and the Rust types that map onto them.

use std::fmt;

use crate::ffi::bridge;

/// The element type of an [`Array`](crate::Array).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// Boolean, one byte per element.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer (also the container of packed quantized weights).
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision (CPU only in MLX).
    F64,
    /// bfloat16.
    BF16,
    /// Complex of two f32.
    Complex64,
}

impl Dtype {
    /// Every dtype, in MLX's order.
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
        Dtype::F32,
        Dtype::F64,
        Dtype::BF16,
        Dtype::Complex64,
    ];

    /// The bridge's name for it.
    pub(crate) fn ffi(self) -> bridge::Dtype {
        match self {
            Dtype::Bool => bridge::Dtype::Bool,
            Dtype::U8 => bridge::Dtype::U8,
            Dtype::U16 => bridge::Dtype::U16,
            Dtype::U32 => bridge::Dtype::U32,
            Dtype::U64 => bridge::Dtype::U64,
            Dtype::I8 => bridge::Dtype::I8,
            Dtype::I16 => bridge::Dtype::I16,
            Dtype::I32 => bridge::Dtype::I32,
            Dtype::I64 => bridge::Dtype::I64,
            Dtype::F16 => bridge::Dtype::F16,
            Dtype::F32 => bridge::Dtype::F32,
            Dtype::F64 => bridge::Dtype::F64,
            Dtype::BF16 => bridge::Dtype::BF16,
            Dtype::Complex64 => bridge::Dtype::Complex64,
        }
    }

    /// The dtype the bridge names `d` (the inverse of [`Dtype::ffi`]).
    pub(crate) fn from_ffi(d: bridge::Dtype) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|t| t.ffi() == d)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::Complex64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64 | Dtype::BF16)
    }

    /// The lower-case name MLX and numpy use (`float32`, `bfloat16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::BF16 => "bfloat16",
            Dtype::Complex64 => "complex64",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type whose values can be copied in and out of an [`Array`](crate::Array) as is.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The MLX dtype with this representation.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )*};
}

element!(
    u8 => U8,
    u16 => U16,
    u32 => U32,
    u64 => U64,
    i8 => I8,
    i16 => I16,
    i32 => I32,
    i64 => I64,
    half::f16 => F16,
    f32 => F32,
    f64 => F64,
    half::bf16 => BF16,
);
