//! Seeded random numbers. MLX's generator is functional: every draw takes an
//! explicit key, so the same seed always gives the same numbers.

use crate::array::{Array, wrap};
use crate::dtype::Dtype;
use crate::error::Result;
use crate::ffi::bridge;

/// A PRNG key (MLX's threefry key, a `[2]` u32 array).
#[derive(Clone, Debug)]
pub struct Key {
    array: Array,
}

impl Key {
    /// The key for `seed`.
    pub fn new(seed: u64) -> Result<Key> {
        Ok(Key { array: wrap("random_key", bridge::random_key(seed))? })
    }

    /// Two fresh keys derived from this one (use one, keep splitting the other).
    pub fn split(&self) -> Result<(Key, Key)> {
        let both = wrap("random_split", bridge::random_split(&self.array.inner, 2))?;
        let first = both.slice(&[0, 0], &[1, 2], &[1, 1])?.reshape(&[2])?;
        let second = both.slice(&[1, 0], &[2, 2], &[1, 1])?.reshape(&[2])?;
        Ok((Key { array: first }, Key { array: second }))
    }

    /// The key as an array.
    pub fn as_array(&self) -> &Array {
        &self.array
    }
}

/// Uniform samples in `[low, high)`.
pub fn uniform(low: f32, high: f32, shape: &[i32], dtype: Dtype, key: &Key) -> Result<Array> {
    wrap("random_uniform", bridge::random_uniform(low, high, shape, dtype.ffi(), &key.array.inner))
}

/// Normal samples with mean `loc` and standard deviation `scale`.
pub fn normal(shape: &[i32], dtype: Dtype, loc: f32, scale: f32, key: &Key) -> Result<Array> {
    wrap("random_normal", bridge::random_normal(shape, dtype.ffi(), loc, scale, &key.array.inner))
}

/// One index per row drawn from `softmax(logits)` along `axis`.
pub fn categorical(logits: &Array, axis: i32, key: &Key) -> Result<Array> {
    wrap("random_categorical", bridge::random_categorical(&logits.inner, axis, &key.array.inner))
}
