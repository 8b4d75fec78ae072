//! `mlxcel-mlx`: the only crate of mlxcel that talks C++.
//!
//! It wraps MLX 0.32 (linked from the pinned `mlx-cpu` wheel, or the CUDA
//! wheel at run time) in a safe Rust API: an owning [`Array`], the operations
//! an LLM needs (arithmetic, matmul, fused norms, RoPE and attention,
//! quantization, sorting and sampling), device selection and memory counters.
//! Every C++ exception becomes an [`Error`]; no bad shape or dtype aborts the
//! process.
//!
//! ```no_run
//! use mlxcel_mlx::Array;
//! let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let b = a.matmul(&a)?.add_scalar(1.0)?;
//! assert_eq!(b.to_vec::<f32>()?, vec![8.0, 11.0, 16.0, 23.0]);
//! # Ok::<(), mlxcel_mlx::Error>(())
//! ```

mod array;
pub mod cuda_kernels;
pub mod device;
mod dtype;
mod error;
pub mod fast;
mod ffi;
#[cfg(feature = "iree")]
pub mod iree;
pub mod layers;
pub mod memory;
pub mod nvrtc;
mod ops;
pub mod random;
pub mod settings;

pub use array::Array;
pub use device::{Device, DeviceRequest};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use layers::{Linear, Weight};
pub use ops::{AttentionMask, QuantMode, Quantized, WeightLayout, scaled_dot_product_attention};

/// The version of the linked MLX library (`major.minor.patch`).
pub fn mlx_version() -> String {
    ffi::bridge::mlx_version()
}
