//! Safetensors files that operations take tensors from, memory-mapped and
//! read lazily (only the tensors an edit needs, when it needs them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlxcel_mlx::{Array, Dtype};
use safetensors::tensor::Metadata;

/// A tensor's dtype, shape and byte range in the data area.
type TensorIndex = (safetensors::Dtype, Vec<usize>, (usize, usize));

/// One donor file.
pub struct Donor {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Byte offset of the data area.
    data_start: usize,
    tensors: HashMap<String, TensorIndex>,
}

impl std::fmt::Debug for Donor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Donor").field("path", &self.path).field("tensors", &self.tensors.len()).finish()
    }
}

/// Maps `path` read-only. The map's bytes are only read through bounds
/// checked slices; a file truncated by another process meanwhile would fault
/// (SIGBUS), which no read API of a memory map can rule out.
#[allow(unsafe_code)]
fn map(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: read-only map; see the function's documentation.
    unsafe { memmap2::Mmap::map(file) }
}

impl Donor {
    /// Opens and indexes a safetensors file (its header only).
    pub fn open(path: &Path) -> Result<Donor, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let map = map(&file).map_err(|e| format!("cannot map {}: {e}", path.display()))?;
        let (header_len, meta): (usize, Metadata) = safetensors::SafeTensors::read_metadata(&map[..])
            .map_err(|e| format!("{} is not a valid safetensors file: {e}", path.display()))?;
        let tensors = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, (info.dtype, info.shape.clone(), info.data_offsets)))
            .collect();
        Ok(Donor { path: path.to_path_buf(), map, data_start: 8 + header_len, tensors })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The shape of `key`, if the file has it and it is float.
    pub fn float_shape(&self, key: &str) -> Option<Result<Vec<usize>, String>> {
        let (dtype, shape, _) = self.tensors.get(key)?;
        Some(match dtype {
            safetensors::Dtype::F32 | safetensors::Dtype::F16 | safetensors::Dtype::BF16 => Ok(shape.clone()),
            other => Err(format!("{key} in {} is {other:?}, not a float tensor", self.path.display())),
        })
    }

    /// `key` as an f32 MLX array.
    pub fn array(&self, key: &str) -> Result<Array, String> {
        let (dtype, shape, (start, end)) =
            self.tensors.get(key).ok_or_else(|| format!("{} has no tensor {key}", self.path.display()))?;
        let bytes = self
            .map
            .get(self.data_start + start..self.data_start + end)
            .ok_or_else(|| format!("{key} lies outside {}", self.path.display()))?;
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let dt = match dtype {
            safetensors::Dtype::F32 => Dtype::F32,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::BF16 => Dtype::BF16,
            other => return Err(format!("{key} in {} is {other:?}, not a float tensor", self.path.display())),
        };
        let a = Array::from_bytes(bytes, &dims, dt).map_err(|e| e.to_string())?;
        if dt == Dtype::F32 { Ok(a) } else { a.astype(Dtype::F32).map_err(|e| e.to_string()) }
    }
}
