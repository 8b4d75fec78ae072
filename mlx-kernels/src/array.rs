//! The owning, safe handle to an MLX array.

use bytes::Bytes;
use cxx::UniquePtr;

use crate::dtype::{Dtype, Element};
use crate::error::{Error, Result};
use crate::ffi::{SharedBytes, bridge};

/// The size header MLX's CPU allocator keeps before each buffer's data (a
/// C `size_t`): a borrowed buffer's header is the word before its data.
const BUFFER_HEADER: usize = std::mem::size_of::<usize>();

/// An MLX array: a node of MLX's lazy computation graph with a dtype and a
/// shape. Operations build the graph; [`Array::eval`] (or reading the data)
/// computes it.
///
/// Cloning is cheap: clones share the same graph node. `Array` is neither
/// `Send` nor `Sync`: MLX evaluates graphs with per-thread streams, so a model
/// lives on the thread (the engine thread) that built it.
pub struct Array {
    pub(crate) inner: UniquePtr<bridge::Array>,
}

impl Clone for Array {
    fn clone(&self) -> Self {
        Array { inner: bridge::clone_array(&self.inner) }
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Array").field("dtype", &self.dtype()).field("shape", &self.shape()).finish()
    }
}

/// Maps a bridge result to an [`Array`], naming the operation on error.
pub(crate) fn wrap(
    op: &'static str,
    r: std::result::Result<UniquePtr<bridge::Array>, cxx::Exception>,
) -> Result<Array> {
    match r {
        Ok(inner) if !inner.is_null() => Ok(Array { inner }),
        Ok(_) => Err(Error::invalid(op, "MLX returned no array")),
        Err(e) => Err(Error::mlx(op, e)),
    }
}

/// A list of arrays as the bridge passes them.
pub(crate) fn to_list(arrays: &[&Array]) -> UniquePtr<bridge::ArrayList> {
    let mut list = bridge::new_list();
    for a in arrays {
        bridge::list_push(list.pin_mut(), &a.inner);
    }
    list
}

/// Unpacks a bridge list into arrays.
pub(crate) fn from_list(
    op: &'static str,
    r: std::result::Result<UniquePtr<bridge::ArrayList>, cxx::Exception>,
) -> Result<Vec<Array>> {
    let list = r.map_err(|e| Error::mlx(op, e))?;
    (0..bridge::list_len(&list)).map(|i| wrap(op, bridge::list_get(&list, i))).collect()
}

impl Array {
    /// An array holding a copy of `data`, with the given shape.
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        Array::from_bytes(bytemuck::cast_slice(data), shape, T::DTYPE)
    }

    /// An array holding a copy of `bytes` (little-endian elements of `dtype`).
    /// The byte count must equal the shape's element count times the dtype size.
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        wrap("array", bridge::array_from_bytes(bytes, shape, dtype.ffi()))
    }

    /// An array over `buffer[offset..offset + n]` (`n` = elements × dtype
    /// size, little-endian elements of `dtype`) that borrows those bytes
    /// instead of copying them when it can.
    ///
    /// A borrowed array's data *is* `buffer`'s memory, and a clone of
    /// `buffer` (a reference count, not a copy) stays with the MLX buffer
    /// until the last array using it is gone: this array, its clones, views
    /// that share its memory (reshapes, slices) and graph nodes not yet
    /// evaluated. So the memory outlives every reader even when the caller
    /// drops `buffer` at once; for a memory-mapped file, the mapping stays
    /// until the model's last weight is dropped. MLX never writes into a
    /// borrowed buffer: it writes only into buffers it allocated, or inputs it
    /// may donate, and it never donates memory it does not own.
    ///
    /// It borrows when MLX's allocator allows it ([`crate::memory::can_borrow`]:
    /// the CPU build), the range is non-empty, the data is aligned for
    /// `dtype`, and `offset >= 8`: MLX's CPU allocator reads a size word just
    /// before a buffer's data, and that word must lie inside `buffer` too (a
    /// bundle's tensors start at 16 KiB multiples, so they qualify). Otherwise
    /// it copies, like [`Array::from_bytes`]. [`Array::is_borrowed`] tells
    /// which happened.
    ///
    /// Errors when the range does not lie inside `buffer` or `shape` has a
    /// negative or too large dimension.
    pub fn from_shared_bytes(buffer: &Bytes, offset: usize, shape: &[i32], dtype: Dtype) -> Result<Array> {
        const OP: &str = "from_shared_bytes";
        let nbytes = shape
            .iter()
            .try_fold(dtype.size(), |n, &d| usize::try_from(d).ok().and_then(|d| n.checked_mul(d)))
            .ok_or_else(|| Error::invalid(OP, format!("shape {shape:?} has a negative or too large dimension")))?;
        let end = offset.checked_add(nbytes).filter(|&end| end <= buffer.len()).ok_or_else(|| {
            Error::invalid(OP, format!("{nbytes} bytes at offset {offset} overrun the {}-byte buffer", buffer.len()))
        })?;
        let data = &buffer[offset..end];
        let borrowable = nbytes > 0
            && offset >= BUFFER_HEADER
            && data.as_ptr().addr().is_multiple_of(dtype.size())
            && bridge::borrowing_supported();
        if !borrowable {
            return Array::from_bytes(data, shape, dtype);
        }
        // The size word MLX may read, then the data.
        let region = &buffer[offset - BUFFER_HEADER..end];
        let owner = Box::new(SharedBytes::new(buffer.clone()));
        // SAFETY: C++ keeps `region`'s address in the MLX buffer after this
        // call returns, and keeps `owner` in that buffer's deleter until MLX
        // releases the buffer. `owner` is a clone of `buffer`: `Bytes` clones
        // share one allocation (or mapping) that neither moves nor changes
        // while any clone lives, and `region` lies inside it (checked above).
        // So the address stays valid and the bytes unchanged for as long as
        // MLX can read them. MLX only reads them (see `array_from_shared` in
        // cpp/bridge.cc, and `borrowing_supported`, which checked that
        // non-owned buffers are never donated).
        let made = unsafe { bridge::array_from_shared(region, owner, shape, dtype.ffi()) };
        wrap(OP, made)
    }

    /// Whether the array's data lives in memory MLX did not allocate: an
    /// array that [`Array::from_shared_bytes`] made without copying, or an
    /// evaluated view sharing its memory. False for an unevaluated array.
    pub fn is_borrowed(&self) -> bool {
        bridge::is_borrowed(&self.inner)
    }

    /// Evaluates the array and returns the address of its first element.
    /// Arrays that share memory report the same address; a borrowed array
    /// reports the address of its bytes in the source buffer (compare with
    /// `Bytes::as_ptr`).
    pub fn data_address(&self) -> Result<usize> {
        bridge::data_address(&self.inner).map_err(|e| Error::mlx("data_address", e))
    }

    /// A zero-dimensional array.
    pub fn scalar<T: Element>(value: T) -> Array {
        // One element and an empty shape always agree.
        Array::from_slice(&[value], &[]).expect("a scalar always matches its empty shape")
    }

    /// A boolean array (MLX stores one byte per element).
    pub fn from_bools(data: &[bool], shape: &[i32]) -> Result<Array> {
        let bytes: Vec<u8> = data.iter().map(|&b| u8::from(b)).collect();
        Array::from_bytes(&bytes, shape, Dtype::Bool)
    }

    /// An array of `shape` filled with `value`, converted to `dtype`.
    pub fn full(shape: &[i32], value: f64, dtype: Dtype) -> Result<Array> {
        wrap("full", bridge::full(shape, value, dtype.ffi()))
    }

    /// Zeros of `shape` and `dtype`.
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::full(shape, 0.0, dtype)
    }

    /// Ones of `shape` and `dtype`.
    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::full(shape, 1.0, dtype)
    }

    /// `start, start + step, ...` below `stop`.
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
        wrap("arange", bridge::arange(start, stop, step, dtype.ffi()))
    }

    /// The shape (one entry per dimension).
    pub fn shape(&self) -> Vec<i32> {
        bridge::shape(&self.inner)
    }

    /// The size of dimension `axis` (negative counts from the end), if it exists.
    pub fn dim(&self, axis: i32) -> Option<i32> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        (0..n).contains(&a).then(|| shape[a as usize])
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// The number of elements.
    pub fn size(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        // The bridge reports one of MLX's dtypes, all of which Dtype has.
        Dtype::from_ffi(bridge::dtype(&self.inner)).unwrap_or(Dtype::U8)
    }

    /// Bytes the elements take when contiguous.
    pub fn nbytes(&self) -> usize {
        bridge::nbytes(&self.inner)
    }

    /// Computes the array (and whatever of the graph it depends on).
    pub fn eval(&self) -> Result<()> {
        bridge::eval(&self.inner).map_err(|e| Error::mlx("eval", e))
    }

    /// Computes several arrays in one pass over the graph.
    pub fn eval_all(arrays: &[&Array]) -> Result<()> {
        bridge::eval_list(&to_list(arrays)).map_err(|e| Error::mlx("eval", e))
    }

    /// Evaluates and returns the elements in row-major order as raw bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.nbytes()];
        bridge::copy_data(&self.inner, &mut out).map_err(|e| Error::mlx("to_bytes", e))?;
        Ok(out)
    }

    /// Evaluates and returns the elements in row-major order. `T` must match
    /// the array's dtype exactly (use [`Array::astype`] first otherwise).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(Error::invalid("to_vec", format!("array has dtype {}, asked for {}", self.dtype(), T::DTYPE)));
        }
        // Straight into the `Vec<T>` (one copy: a decode step's logits are
        // megabytes).
        let mut out = vec![T::zeroed(); self.size()];
        bridge::copy_data(&self.inner, bytemuck::cast_slice_mut(&mut out)).map_err(|e| Error::mlx("to_vec", e))?;
        Ok(out)
    }

    /// Evaluates a boolean array into Rust bools.
    pub fn to_bools(&self) -> Result<Vec<bool>> {
        if self.dtype() != Dtype::Bool {
            return Err(Error::invalid("to_bools", format!("array has dtype {}, not bool", self.dtype())));
        }
        Ok(self.to_bytes()?.into_iter().map(|b| b != 0).collect())
    }

    /// Evaluates a one-element array into its value.
    pub fn item<T: Element>(&self) -> Result<T> {
        let v = self.to_vec::<T>()?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(Error::invalid("item", format!("array has {} elements, not 1", v.len()))),
        }
    }
}
