//! A bounds-checked GGUF reader over a memory map: header, metadata key/values
//! (every value type, nested arrays), tensor infos and the aligned data
//! section. Every read is checked against the file's length; a truncated or
//! corrupt file gives [`IngestError::Corrupt`] naming the file and the offset.
//!
//! Hand-written: the crates.io `gguf` crate (0.1) returns `String` errors
//! without offsets, ignores `general.alignment` and reads no tensor data, and
//! candle's reader would pull in all of candle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::quant::GgmlType;
use crate::ingest::error::{IngestError, Result};
use crate::ingest::mmap::map_file;

/// The magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The deepest nesting of arrays accepted in metadata.
const MAX_ARRAY_DEPTH: usize = 4;
/// The most dimensions a ggml tensor has.
const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of values of one type.
    Array(Vec<GgufValue>),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// The value as JSON (for provenance and the config's raw view).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            GgufValue::U8(v) => Value::from(*v),
            GgufValue::I8(v) => Value::from(*v),
            GgufValue::U16(v) => Value::from(*v),
            GgufValue::I16(v) => Value::from(*v),
            GgufValue::U32(v) => Value::from(*v),
            GgufValue::I32(v) => Value::from(*v),
            GgufValue::U64(v) => Value::from(*v),
            GgufValue::I64(v) => Value::from(*v),
            GgufValue::F32(v) => Value::from(f64::from(*v)),
            GgufValue::F64(v) => Value::from(*v),
            GgufValue::Bool(v) => Value::from(*v),
            GgufValue::String(s) => Value::from(s.as_str()),
            GgufValue::Array(a) => Value::Array(a.iter().map(GgufValue::to_json).collect()),
        }
    }
}

/// Where one tensor lives in a GGUF file and how it is stored.
#[derive(Clone, Debug)]
pub struct GgufTensorInfo {
    /// The name in the file (`blk.0.attn_q.weight`).
    pub name: String,
    /// The dimensions in ggml order (fastest-moving first: `[row_len, rows]`).
    pub dims: Vec<u64>,
    /// The storage type.
    pub ggml_type: GgmlType,
    /// The absolute byte offset of the data in the file.
    pub offset: u64,
    /// The byte length of the data.
    pub nbytes: u64,
}

impl GgufTensorInfo {
    /// The number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in row-major (PyTorch / MLX) order: the ggml dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file, kept memory-mapped.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    /// The format version (2 or 3).
    pub version: u32,
    metadata: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    /// The tensors, in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// The data section's alignment.
    pub alignment: u64,
    /// Where the data section starts.
    pub data_start: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A bounds-checked little-endian reader over the mapped bytes.
struct Cursor<'a> {
    path: &'a Path,
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, offset: usize, message: impl Into<String>) -> IngestError {
        IngestError::corrupt(self.path, offset as u64, message)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| {
            self.err(
                self.pos,
                format!("truncated file: {what} needs {n} bytes but only {} remain", self.data.len() - self.pos),
            )
        })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed UTF-8 string.
    fn string(&mut self, what: &str) -> Result<String> {
        let start = self.pos;
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| self.err(start, format!("{what}: length {len} is too large")))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| self.err(start, format!("{what}: invalid UTF-8 ({e})")))
    }

    /// One value of metadata type `ty`.
    fn value(&mut self, ty: u32, what: &str, depth: usize) -> Result<GgufValue> {
        let start = self.pos;
        Ok(match ty {
            0 => GgufValue::U8(self.u8(what)?),
            1 => GgufValue::I8(self.u8(what)? as i8),
            2 => GgufValue::U16(self.u16(what)?),
            3 => GgufValue::I16(self.u16(what)? as i16),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(self.u32(what)? as i32),
            6 => GgufValue::F32(f32::from_bits(self.u32(what)?)),
            7 => match self.u8(what)? {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.err(start, format!("{what}: bool byte {b} is neither 0 nor 1"))),
            },
            8 => GgufValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(start, format!("{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte (strings eight): a count
                // that cannot fit in the rest of the file is corrupt, and is
                // refused before allocating for it.
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    _ => return Err(self.err(start, format!("{what}: unknown array element type {elem}"))),
                };
                let remaining = (self.data.len() - self.pos) as u64;
                if count.checked_mul(min).is_none_or(|n| n > remaining) {
                    return Err(self.err(
                        start,
                        format!("truncated file: {what} declares {count} elements but only {remaining} bytes remain"),
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, what, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(self.u64(what)? as i64),
            12 => GgufValue::F64(f64::from_bits(self.u64(what)?)),
            _ => return Err(self.err(start, format!("{what}: unknown value type {ty}"))),
        })
    }
}

/// The metadata of a GGUF file, available to a check that runs before any
/// tensor info is read.
pub struct GgufMetadata<'a> {
    entries: &'a [(String, GgufValue)],
    index: &'a HashMap<String, usize>,
}

impl GgufMetadata<'_> {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).and_then(|&i| self.entries.get(i)).map(|(_, v)| v)
    }
}

impl GgufFile {
    /// Opens and parses `path` (header, metadata, tensor infos), checking every
    /// bound. Tensor data is not read.
    pub fn open(path: &Path) -> Result<GgufFile> {
        GgufFile::open_checked(path, |_| Ok(()))
    }

    /// Like [`GgufFile::open`], but runs `check` on the metadata before reading
    /// the tensor infos (ingest refuses an unsupported architecture there).
    pub fn open_checked(path: &Path, check: impl FnOnce(&GgufMetadata<'_>) -> Result<()>) -> Result<GgufFile> {
        let map = map_file(path)?;
        let (version, metadata, index, tensors, alignment, data_start) = {
            let mut c = Cursor { path, data: &map, pos: 0 };
            let magic = c.array::<4>("the magic")?;
            if magic != GGUF_MAGIC {
                return Err(IngestError::corrupt(path, 0, format!("not a GGUF file (magic {magic:02x?})")));
            }
            let version = c.u32("the version")?;
            if version.swap_bytes() <= 3 && version > 3 {
                return Err(IngestError::corrupt(path, 4, "big-endian GGUF files are not supported"));
            }
            if !(2..=3).contains(&version) {
                return Err(IngestError::corrupt(
                    path,
                    4,
                    format!("GGUF version {version} is not supported (2 and 3 are)"),
                ));
            }
            let tensor_count = c.u64("the tensor count")?;
            let kv_count = c.u64("the metadata count")?;
            let remaining = (map.len() - c.pos) as u64;
            // A key/value pair takes at least 13 bytes, a tensor info at least 24.
            if kv_count.checked_mul(13).is_none_or(|n| n > remaining) {
                return Err(IngestError::corrupt(
                    path,
                    16,
                    format!("metadata count {kv_count} cannot fit in the file"),
                ));
            }
            if tensor_count.checked_mul(24).is_none_or(|n| n > remaining) {
                return Err(IngestError::corrupt(
                    path,
                    8,
                    format!("tensor count {tensor_count} cannot fit in the file"),
                ));
            }

            let mut metadata = Vec::with_capacity(kv_count as usize);
            let mut index = HashMap::with_capacity(kv_count as usize);
            for i in 0..kv_count {
                let at = c.pos;
                let key = c.string(&format!("metadata key #{i}"))?;
                let ty = c.u32(&format!("the type of metadata {key}"))?;
                let value = c.value(ty, &format!("metadata {key}"), 0)?;
                if index.insert(key.clone(), metadata.len()).is_some() {
                    return Err(IngestError::corrupt(path, at as u64, format!("duplicate metadata key {key}")));
                }
                metadata.push((key, value));
            }
            check(&GgufMetadata { entries: &metadata, index: &index })?;

            let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
                None => DEFAULT_ALIGNMENT,
                Some(GgufValue::U32(a)) if *a > 0 && a.is_power_of_two() => u64::from(*a),
                Some(v) => {
                    return Err(IngestError::corrupt(
                        path,
                        0,
                        format!("general.alignment must be a power-of-two u32, found {v:?}"),
                    ));
                }
            };

            let mut raw = Vec::with_capacity(tensor_count as usize);
            for i in 0..tensor_count {
                let at = c.pos;
                let name = c.string(&format!("the name of tensor #{i}"))?;
                let what = format!("tensor info {name}");
                let n_dims = c.u32(&what)?;
                if n_dims == 0 || n_dims > MAX_DIMS {
                    return Err(IngestError::corrupt(
                        path,
                        at as u64,
                        format!("{what}: {n_dims} dimensions (1..=4 allowed)"),
                    ));
                }
                let mut dims = Vec::with_capacity(n_dims as usize);
                for _ in 0..n_dims {
                    dims.push(c.u64(&what)?);
                }
                let ty = c.u32(&what)?;
                let rel = c.u64(&what)?;
                raw.push((at, name, dims, ty, rel));
            }
            let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
            let file_len = map.len() as u64;

            let mut tensors = Vec::with_capacity(raw.len());
            let mut names = HashMap::with_capacity(raw.len());
            for (at, name, dims, ty, rel) in raw {
                let bad = |m: String| IngestError::corrupt(path, at as u64, format!("tensor info {name}: {m}"));
                let ggml_type = GgmlType::from_id(ty).ok_or_else(|| IngestError::UnknownDtype {
                    path: path.to_path_buf(),
                    tensor: name.clone(),
                    dtype: format!("ggml type {ty}"),
                })?;
                if dims.contains(&0) {
                    return Err(bad(format!("a zero dimension in {dims:?}")));
                }
                let n = dims
                    .iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                    .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
                let (block, block_bytes) = ggml_type.block();
                if dims[0] % block != 0 {
                    return Err(bad(format!(
                        "row length {} is not a multiple of the {ggml_type} block size {block}",
                        dims[0]
                    )));
                }
                let nbytes = (n / block).checked_mul(block_bytes).ok_or_else(|| bad("size overflows".into()))?;
                if rel % alignment != 0 {
                    return Err(bad(format!("data offset {rel} is not aligned to {alignment}")));
                }
                let offset = data_start.checked_add(rel).ok_or_else(|| bad(format!("data offset {rel} overflows")))?;
                match offset.checked_add(nbytes) {
                    Some(end) if end <= file_len => {}
                    _ => {
                        return Err(IngestError::Tensor {
                            path: path.to_path_buf(),
                            tensor: name,
                            offset,
                            message: format!(
                                "truncated file: the data needs {nbytes} bytes from byte {offset} but the file has {file_len} bytes"
                            ),
                        });
                    }
                }
                if names.insert(name.clone(), ()).is_some() {
                    return Err(bad("duplicate tensor name".into()));
                }
                tensors.push(GgufTensorInfo { name, dims, ggml_type, offset, nbytes });
            }
            (version, metadata, index, tensors, alignment, data_start)
        };
        Ok(GgufFile { path: path.to_path_buf(), map, version, metadata, index, tensors, alignment, data_start })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The value of metadata `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).and_then(|&i| self.metadata.get(i)).map(|(_, v)| v)
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The tensor named `name` (as the file names it).
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor's data (bounds were checked at open).
    pub fn data(&self, info: &GgufTensorInfo) -> Result<&[u8]> {
        let start = usize::try_from(info.offset).ok();
        let end = start.and_then(|s| s.checked_add(usize::try_from(info.nbytes).ok()?));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.map.len() => Ok(&self.map[s..e]),
            _ => Err(IngestError::tensor(&self.path, &info.name, info.offset, "data lies outside the file")),
        }
    }
}
