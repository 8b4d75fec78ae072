//! The IREE runtime (feature `iree`): a safe handle on a session that runs a
//! bundle's compiled module with the bundle's own tensors as its parameters.
//!
//! The runtime library is IREE's own C runtime, built from source by
//! eerie-sys; `iree/session.c` is the glue, written against IREE's C API,
//! and this module its only caller. The parameters are imported straight from
//! the bundle's memory map: IREE's parameter provider wraps host memory as a
//! HAL buffer when the device can read it (the CPU devices can), so the
//! weights are never copied.
//!
//! Why not eerie's safe API: it builds its VM context from a fixed list of
//! modules and has no way to add the `io_parameters` module the bundle's
//! parameters need, and it copies every buffer it is given.

use std::ffi::{c_char, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;

use bytes::Bytes;

// Links IREE's runtime library (eerie-sys's build emits the link lines).
use eerie_sys as _;

/// An error from the IREE runtime, with IREE's own message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct IreeError(String);

/// The result of IREE calls.
pub type Result<T> = std::result::Result<T, IreeError>;

mod ffi {
    use std::ffi::{c_char, c_void};

    #[repr(C)]
    pub struct Session {
        _private: [u8; 0],
    }

    #[repr(C)]
    pub struct Parameter {
        pub name: *const c_char,
        pub name_len: usize,
        pub offset: u64,
        pub length: u64,
    }

    pub const I32: i32 = 0;
    pub const F32: i32 = 1;
    pub const ARG_HOST: i32 = 0;
    pub const ARG_BUFFER: i32 = 1;
    pub const MAX_RANK: usize = 4;

    #[repr(C)]
    pub struct Arg {
        pub kind: i32,
        pub element: i32,
        pub host: *const c_void,
        pub buffer: *mut c_void,
        pub offset: u64,
        pub rank: usize,
        pub dims: [i64; MAX_RANK],
    }

    unsafe extern "C" {
        pub fn mlxcel_iree_free_error(message: *mut c_char);
        pub fn mlxcel_iree_session_create(
            driver: *const c_char,
            driver_len: usize,
            threads: i32,
            module: *const u8,
            module_len: usize,
            scope: *const c_char,
            scope_len: usize,
            mapping: *const u8,
            mapping_len: usize,
            params: *const Parameter,
            param_count: usize,
            out: *mut *mut Session,
        ) -> *mut c_char;
        pub fn mlxcel_iree_session_destroy(session: *mut Session);
        pub fn mlxcel_iree_buffer_zeros(session: *mut Session, bytes: u64, out: *mut *mut c_void) -> *mut c_char;
        pub fn mlxcel_iree_buffer_release(buffer: *mut c_void);
        pub fn mlxcel_iree_call(
            session: *mut Session,
            function: *const c_char,
            function_len: usize,
            args: *const Arg,
            arg_count: usize,
            out: *mut f32,
            out_len: usize,
        ) -> *mut c_char;
    }
}

/// Turns the glue's error convention (null, or a message to free) into a Result.
fn check(message: *mut c_char) -> Result<()> {
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null result is a NUL-terminated string from malloc, which
    // mlxcel_iree_free_error frees; it is read once, then freed once.
    let text = unsafe { std::ffi::CStr::from_ptr(message) }.to_string_lossy().into_owned();
    unsafe { ffi::mlxcel_iree_free_error(message) };
    Err(IreeError(text))
}

/// One parameter of a module: `length` bytes at `offset` of the mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    /// The name the module's `#flow.parameter.named` refers to it by.
    pub name: String,
    /// Byte offset in the mapping.
    pub offset: u64,
    /// Byte length.
    pub length: u64,
}

/// The IREE device a session runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpec<'a> {
    /// The HAL driver: `local-task` (IREE's multi-threaded CPU device) or
    /// `local-sync` (the calling thread alone).
    pub driver: &'a str,
    /// Worker threads of `local-task` (0: IREE's default, one per physical
    /// core); other drivers ignore it.
    pub threads: usize,
}

/// A session: an IREE device, the parameters, and one compiled module.
///
/// Not `Send`: IREE's VM context is used from the thread that made it (the
/// runtime's engine thread owns its backend).
pub struct Session {
    raw: NonNull<ffi::Session>,
    // The session reads these bytes until it is destroyed.
    _module: Bytes,
    _mapping: Bytes,
    _not_send: PhantomData<*const ()>,
}

impl Session {
    /// Loads `module` (a vmfb, typically a section of `mapping`) on the
    /// device `device`, its parameters of scope `scope` being `params` of
    /// `mapping`.
    pub fn new(
        device: DeviceSpec<'_>,
        module: Bytes,
        scope: &str,
        mapping: Bytes,
        params: &[Parameter],
    ) -> Result<Session> {
        let driver = device.driver;
        let threads = i32::try_from(device.threads)
            .map_err(|_| IreeError(format!("{} threads are more than IREE can start", device.threads)))?;
        let map_len = mapping.len() as u64;
        if let Some(p) = params.iter().find(|p| p.offset.checked_add(p.length).is_none_or(|end| end > map_len)) {
            return Err(IreeError(format!(
                "parameter {}: {} bytes at offset {} lie outside the {map_len}-byte mapping",
                p.name, p.length, p.offset
            )));
        }
        let raw_params: Vec<ffi::Parameter> = params
            .iter()
            .map(|p| ffi::Parameter {
                name: p.name.as_ptr().cast(),
                name_len: p.name.len(),
                offset: p.offset,
                length: p.length,
            })
            .collect();
        let mut raw = std::ptr::null_mut();
        // SAFETY: every pointer/length pair describes a live Rust slice; the
        // glue copies the names and the driver and scope strings, and reads
        // `module` and `mapping` for as long as the session lives, which the
        // Bytes fields of Session guarantee.
        check(unsafe {
            ffi::mlxcel_iree_session_create(
                driver.as_ptr().cast(),
                driver.len(),
                threads,
                module.as_ptr(),
                module.len(),
                scope.as_ptr().cast(),
                scope.len(),
                mapping.as_ptr(),
                mapping.len(),
                raw_params.as_ptr(),
                raw_params.len(),
                &mut raw,
            )
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| IreeError("the IREE session was not created".into()))?;
        Ok(Session { raw, _module: module, _mapping: mapping, _not_send: PhantomData })
    }

    /// A device buffer of `bytes` zero bytes (for state a function writes in place).
    pub fn zeros(&self, bytes: u64) -> Result<Buffer> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the session is live; the glue writes one retained buffer.
        check(unsafe { ffi::mlxcel_iree_buffer_zeros(self.raw.as_ptr(), bytes, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| IreeError("the IREE buffer was not allocated".into()))?;
        Ok(Buffer { raw, bytes, _not_send: PhantomData })
    }

    /// Calls the module's `function` (its full name, `module.function`) with
    /// `args`; its first result, `out.len()` f32 values, is written to `out`.
    /// Buffer arguments the function writes are updated in place.
    pub fn call(&self, function: &str, args: &[Arg<'_>], out: &mut [f32]) -> Result<()> {
        let mut raw_args = Vec::with_capacity(args.len());
        for (i, arg) in args.iter().enumerate() {
            let (kind, element, host, buffer, offset, dims) = match arg {
                Arg::I32 { data, dims } => {
                    let elements = element_count(dims)?;
                    if elements != data.len() as u64 {
                        return Err(IreeError(format!(
                            "{function}: argument {i} has {} values for dimensions {dims:?}",
                            data.len()
                        )));
                    }
                    (ffi::ARG_HOST, ffi::I32, data.as_ptr().cast::<c_void>(), std::ptr::null_mut(), 0, *dims)
                }
                Arg::F32Buffer { buffer, offset, dims } => {
                    let bytes = element_count(dims)?.checked_mul(4);
                    if bytes.is_none_or(|b| offset.checked_add(b).is_none_or(|end| end > buffer.bytes)) {
                        return Err(IreeError(format!(
                            "{function}: argument {i} ({dims:?} f32 at byte {offset}) overruns its {}-byte buffer",
                            buffer.bytes
                        )));
                    }
                    (ffi::ARG_BUFFER, ffi::F32, std::ptr::null(), buffer.raw.as_ptr(), *offset, *dims)
                }
            };
            if dims.len() > ffi::MAX_RANK {
                return Err(IreeError(format!("{function}: argument {i} has rank {}", dims.len())));
            }
            let mut fixed = [0i64; ffi::MAX_RANK];
            for (f, &d) in fixed.iter_mut().zip(dims) {
                *f = i64::try_from(d).map_err(|_| IreeError(format!("{function}: dimension {d} is too large")))?;
            }
            raw_args.push(ffi::Arg { kind, element, host, buffer, offset, rank: dims.len(), dims: fixed });
        }
        // SAFETY: host arguments point at live slices whose lengths were
        // checked against their dimensions (the glue copies them); buffer
        // arguments are live buffers of this session's device, the ranges
        // checked against their sizes; `out` is a live slice of out.len().
        check(unsafe {
            ffi::mlxcel_iree_call(
                self.raw.as_ptr(),
                function.as_ptr().cast(),
                function.len(),
                raw_args.as_ptr(),
                raw_args.len(),
                out.as_mut_ptr(),
                out.len(),
            )
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: created by mlxcel_iree_session_create, destroyed once.
        unsafe { ffi::mlxcel_iree_session_destroy(self.raw.as_ptr()) }
    }
}

fn element_count(dims: &[usize]) -> Result<u64> {
    dims.iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .ok_or_else(|| IreeError(format!("dimensions {dims:?} overflow")))
}

/// A device buffer of a session (it holds its own reference to the device's
/// memory; release it before or after the session, in any order).
pub struct Buffer {
    raw: NonNull<c_void>,
    bytes: u64,
    _not_send: PhantomData<*const ()>,
}

impl Buffer {
    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: a retained iree_hal_buffer_t, released once.
        unsafe { ffi::mlxcel_iree_buffer_release(self.raw.as_ptr()) }
    }
}

/// One argument of [`Session::call`].
pub enum Arg<'a> {
    /// i32 values of the given dimensions, copied to the device.
    I32 {
        /// The values, row-major.
        data: &'a [i32],
        /// The dimensions (empty for a scalar).
        dims: &'a [usize],
    },
    /// An f32 array of the given dimensions `offset` bytes into `buffer`,
    /// passed as it is (the function may write it in place).
    F32Buffer {
        /// The buffer.
        buffer: &'a Buffer,
        /// Byte offset of the array in it.
        offset: u64,
        /// The dimensions.
        dims: &'a [usize],
    },
}
