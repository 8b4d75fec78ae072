//! Typed errors of opening, writing and verifying bundles.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Names a region of a bundle file in errors and progress reports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RegionName {
    /// The fixed header at offset 0.
    Header,
    /// The manifest region.
    Manifest,
    /// A tensor's data.
    Tensor(String),
    /// A non-tensor section's data.
    Section {
        /// The section kind.
        kind: String,
        /// The section key.
        key: String,
        /// The section target (empty when target-independent).
        target: String,
    },
}

impl fmt::Display for RegionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionName::Header => f.write_str("header"),
            RegionName::Manifest => f.write_str("manifest"),
            RegionName::Tensor(name) => write!(f, "tensor `{name}`"),
            RegionName::Section { kind, key, target } if target.is_empty() => write!(f, "section {kind}/{key}"),
            RegionName::Section { kind, key, target } => write!(f, "section {kind}/{key} (target {target})"),
        }
    }
}

/// One mismatch found by [`crate::Bundle::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerifyFailure {
    /// A region's bytes do not hash to what the manifest records.
    HashMismatch {
        /// Which region.
        region: RegionName,
        /// File offset of the region.
        offset: u64,
        /// Length of the region.
        length: u64,
        /// The hash the manifest records.
        stored: [u8; 32],
        /// The hash of the bytes found.
        computed: [u8; 32],
    },
    /// Padding between regions, which the format requires to be zero, is not.
    NonZeroPadding {
        /// File offset of the first non-zero padding byte.
        offset: u64,
    },
    /// The surgery YAML does not hash to the recorded surgery hash.
    SurgeryHashMismatch,
}

impl fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyFailure::HashMismatch { region, offset, length, stored, computed } => write!(
                f,
                "{region} at offset {offset} (length {length}): blake3 {} does not match the recorded {}",
                hex(computed),
                hex(stored)
            ),
            VerifyFailure::NonZeroPadding { offset } => write!(f, "non-zero padding byte at offset {offset}"),
            VerifyFailure::SurgeryHashMismatch => {
                f.write_str("provenance: the surgery YAML does not match its recorded blake3")
            }
        }
    }
}

/// Lower-case hex of a byte string (hashes in messages and `inspect`).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn list_failures(failures: &[VerifyFailure]) -> String {
    const SHOWN: usize = 5;
    let mut text: Vec<String> = failures.iter().take(SHOWN).map(ToString::to_string).collect();
    if failures.len() > SHOWN {
        text.push(format!("... and {} more", failures.len() - SHOWN));
    }
    text.join("; ")
}

/// Everything that can go wrong with a bundle. Every variant that concerns
/// file content names the file offset involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// An I/O operation on a bundle file failed.
    #[error("{action} {}: {cause}", path.display())]
    Io {
        /// What was being done, e.g. "opening".
        action: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error (printed by this error's message, so not
        /// also returned by `source()`: a chain states each cause once).
        cause: io::Error,
    },
    /// A path given as a bundle is a directory.
    #[error("{} is a directory, not a bundle", path.display())]
    IsADirectory {
        /// The directory.
        path: PathBuf,
    },
    /// Reading the data of a tensor or section from its source failed (writer).
    #[error("reading the data of {region}: {cause}")]
    Source {
        /// The region being written.
        region: RegionName,
        /// The underlying error (in the message, not `source()`).
        cause: io::Error,
    },
    /// The file is shorter than the fixed header.
    #[error("file is {len} bytes, shorter than the {min}-byte header: not a bundle, or truncated")]
    FileTooSmall {
        /// The file length.
        len: u64,
        /// The minimum length.
        min: u64,
    },
    /// The first 8 bytes are not the bundle magic.
    #[error("offset 0: bad magic {found:02x?}: not an .mlxb bundle")]
    BadMagic {
        /// The bytes found.
        found: [u8; 8],
    },
    /// The format major version is not the one this reader supports.
    #[error(
        "offset 8: bundle format version {major}.{minor} is not supported: this reader supports version {supported_major}.x{}",
        if *major > *supported_major { " (the bundle is newer: upgrade mlxcel)" } else { "" }
    )]
    UnsupportedVersion {
        /// The major version found.
        major: u16,
        /// The minor version found.
        minor: u16,
        /// The major version this reader supports.
        supported_major: u16,
    },
    /// The header length field is not 128.
    #[error("offset 12: header length {found}, expected {expected}")]
    BadHeaderLength {
        /// The length found.
        found: u32,
        /// The length version 1 defines.
        expected: u32,
    },
    /// Header bytes 0..88 do not hash to the stored root hash: the header is corrupt.
    #[error(
        "offset 88: header is corrupt: bytes 0..88 hash to {}, the stored root hash is {}",
        hex(computed),
        hex(stored)
    )]
    HeaderHashMismatch {
        /// The root hash stored at offset 88.
        stored: [u8; 32],
        /// The hash of bytes 0..88.
        computed: [u8; 32],
    },
    /// Reserved header bytes are not zero.
    #[error("offset {offset}: reserved header bytes are not zero")]
    ReservedNotZero {
        /// Offset of the reserved field.
        offset: u64,
    },
    /// The header sets required flags this reader does not know.
    #[error("offset 16: the bundle requires features this reader does not know (flags {flags:#x})")]
    UnsupportedFlags {
        /// The unknown required flag bits.
        flags: u64,
    },
    /// The header's alignment field is not 16384.
    #[error("offset 24: alignment {found}, expected {expected}")]
    BadAlignment {
        /// The alignment found.
        found: u64,
        /// The alignment version 1 defines.
        expected: u64,
    },
    /// The file is shorter than the header's `file_len`.
    #[error("file is truncated: the header says {expected} bytes, the file has {actual}")]
    Truncated {
        /// `file_len` from the header.
        expected: u64,
        /// The actual length.
        actual: u64,
    },
    /// The file is longer than the header's `file_len`.
    #[error("file has trailing data: the header says {expected} bytes, the file has {actual}")]
    TrailingData {
        /// `file_len` from the header.
        expected: u64,
        /// The actual length.
        actual: u64,
    },
    /// The manifest region is not where the format requires it.
    #[error("offset 40: manifest at offset {offset}, length {length} is misplaced: {reason}")]
    ManifestMisplaced {
        /// `manifest_offset` from the header.
        offset: u64,
        /// `manifest_len` from the header.
        length: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// The manifest bytes do not hash to the header's `manifest_blake3`.
    #[error(
        "offset {offset}: manifest is corrupt: its blake3 is {}, the header records {}",
        hex(computed),
        hex(stored)
    )]
    ManifestHashMismatch {
        /// File offset of the manifest.
        offset: u64,
        /// The hash stored in the header.
        stored: [u8; 32],
        /// The hash of the manifest bytes.
        computed: [u8; 32],
    },
    /// The manifest is not a valid archived manifest (rkyv/bytecheck validation failed).
    #[error("offset {offset}: manifest ({length} bytes) is malformed: {detail}")]
    ManifestInvalid {
        /// File offset of the manifest.
        offset: u64,
        /// Manifest length.
        length: u64,
        /// bytecheck's description of the problem.
        detail: String,
    },
    /// A region does not start at a multiple of the alignment.
    #[error("{region}: offset {offset} is not a multiple of {alignment}")]
    Misaligned {
        /// The region.
        region: RegionName,
        /// Its offset.
        offset: u64,
        /// The required alignment.
        alignment: u64,
    },
    /// A region extends outside the data area (past the manifest, past the end, or into the header page).
    #[error("{region}: bytes {offset}..{offset}+{length} lie outside the data area {start}..{end}")]
    OutOfBounds {
        /// The region.
        region: RegionName,
        /// Its offset.
        offset: u64,
        /// Its length.
        length: u64,
        /// Start of the data area.
        start: u64,
        /// End of the data area (the manifest offset).
        end: u64,
    },
    /// Two regions share bytes.
    #[error("{second} at offset {offset} overlaps {first}, which ends at {first_end}")]
    Overlap {
        /// The region that starts first.
        first: Box<RegionName>,
        /// Where it ends.
        first_end: u64,
        /// The region that overlaps it.
        second: Box<RegionName>,
        /// Where that one starts.
        offset: u64,
    },
    /// A tensor's length does not equal dtype size × product(shape).
    #[error(
        "tensor `{tensor}` at offset {offset}: {dtype} × {shape:?} is {expected} bytes, but its length is {length}"
    )]
    SizeMismatch {
        /// The tensor name.
        tensor: String,
        /// Its data offset.
        offset: u64,
        /// Its dtype name.
        dtype: String,
        /// Its shape.
        shape: Vec<u64>,
        /// dtype × shape in bytes.
        expected: u64,
        /// The recorded (or, in the writer, supplied) length.
        length: u64,
    },
    /// dtype size × product(shape) overflows a u64.
    #[error(
        "tensor `{tensor}` (manifest entry at offset {entry_offset}): shape {shape:?} is absurd: its byte size overflows"
    )]
    ShapeOverflow {
        /// The tensor name.
        tensor: String,
        /// File offset of the manifest entry.
        entry_offset: u64,
        /// The shape.
        shape: Vec<u64>,
    },
    /// A tensor has more dimensions than the format allows.
    #[error("tensor `{tensor}` (manifest entry at offset {entry_offset}): {ndim} dimensions, at most {max} allowed")]
    TooManyDims {
        /// The tensor name.
        tensor: String,
        /// File offset of the manifest entry.
        entry_offset: u64,
        /// Its number of dimensions.
        ndim: usize,
        /// The limit.
        max: usize,
    },
    /// A tensor's dtype is not one format version 1 defines.
    #[error("tensor `{tensor}` (manifest entry at offset {entry_offset}): unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The tensor name.
        tensor: String,
        /// File offset of the manifest entry.
        entry_offset: u64,
        /// The dtype name found.
        dtype: String,
    },
    /// Two tensors share a name.
    #[error("duplicate tensor name `{name}` (manifest entry at offset {entry_offset})")]
    DuplicateTensor {
        /// The name.
        name: String,
        /// File offset of the second entry (0 in the writer).
        entry_offset: u64,
    },
    /// Two sections share kind, key and target.
    #[error("duplicate section {kind}/{key} (target {target:?}) (manifest entry at offset {entry_offset})")]
    DuplicateSection {
        /// The kind.
        kind: String,
        /// The key.
        key: String,
        /// The target.
        target: String,
        /// File offset of the second entry (0 in the writer).
        entry_offset: u64,
    },
    /// A name or kind that must not be empty is empty.
    #[error("{what} is empty (manifest entry at offset {entry_offset})")]
    EmptyName {
        /// Which name, e.g. "tensor name".
        what: &'static str,
        /// File offset of the manifest entry (0 in the writer).
        entry_offset: u64,
    },
    /// A quantization descriptor names a scales or biases tensor that does not exist.
    #[error("tensor `{tensor}`: its quantization names {role} tensor `{missing}`, which is not in the bundle")]
    MissingQuantTensor {
        /// The quantized tensor.
        tensor: String,
        /// "scales" or "biases".
        role: &'static str,
        /// The missing name.
        missing: String,
    },
    /// The bundle carries a required extension this reader does not know.
    #[error("the bundle requires extension `{name}`, which this reader does not support (upgrade mlxcel)")]
    UnsupportedExtension {
        /// The extension name.
        name: String,
    },
    /// The data supplied for a tensor or section does not have the declared length (writer).
    #[error("{region}: expected {expected} bytes of data, got {actual}")]
    LengthMismatch {
        /// The region being written.
        region: RegionName,
        /// The declared length.
        expected: u64,
        /// The bytes supplied (reading stops one byte past the expected length).
        actual: u64,
    },
    /// The manifest could not be serialized (writer).
    #[error("serializing the manifest: {detail}")]
    Serialize {
        /// rkyv's description.
        detail: String,
    },
    /// Verification found mismatches.
    #[error("verification failed with {} problem(s): {}", failures.len(), list_failures(failures))]
    VerifyFailed {
        /// Every mismatch found.
        failures: Vec<VerifyFailure>,
    },
}

/// Results of this crate.
pub type Result<T, E = BundleError> = std::result::Result<T, E>;
