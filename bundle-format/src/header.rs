//! The fixed 128-byte header at offset 0.

use crate::error::BundleError;
use crate::{ALIGNMENT, FORMAT_MAJOR, FORMAT_MINOR, HEADER_LEN, MAGIC};

/// Flags bits 0–31 are "required": a reader refuses a bundle with a required bit it does not know.
/// Bits 32–63 are optional and ignored when unknown. Version 1.0 defines no flags.
pub const REQUIRED_FLAGS_MASK: u64 = 0x0000_0000_ffff_ffff;
/// The required flag bits this reader understands (none in version 1.0).
pub const KNOWN_REQUIRED_FLAGS: u64 = 0;

/// Byte offsets of the header fields (normative; see `docs/bundle-format.md`).
pub mod offsets {
    /// `magic`, 8 bytes.
    pub const MAGIC: usize = 0;
    /// `format_major`, u16.
    pub const MAJOR: usize = 8;
    /// `format_minor`, u16.
    pub const MINOR: usize = 10;
    /// `header_len`, u32.
    pub const HEADER_LEN: usize = 12;
    /// `flags`, u64.
    pub const FLAGS: usize = 16;
    /// `alignment`, u64.
    pub const ALIGNMENT: usize = 24;
    /// `file_len`, u64.
    pub const FILE_LEN: usize = 32;
    /// `manifest_offset`, u64.
    pub const MANIFEST_OFFSET: usize = 40;
    /// `manifest_len`, u64.
    pub const MANIFEST_LEN: usize = 48;
    /// `manifest_blake3`, 32 bytes.
    pub const MANIFEST_BLAKE3: usize = 56;
    /// `root_hash`, 32 bytes: blake3 of bytes `0..ROOT_HASH`.
    pub const ROOT_HASH: usize = 88;
    /// `reserved`, 8 zero bytes.
    pub const RESERVED: usize = 120;
}

/// The decoded fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format major version; readers refuse majors they do not support.
    pub format_major: u16,
    /// Format minor version; minors only add optional content.
    pub format_minor: u16,
    /// Feature flags (see [`REQUIRED_FLAGS_MASK`]).
    pub flags: u64,
    /// Alignment of every region after the header; 16384 in version 1.
    pub alignment: u64,
    /// Total file length in bytes.
    pub file_len: u64,
    /// Offset of the manifest region.
    pub manifest_offset: u64,
    /// Length of the manifest region.
    pub manifest_len: u64,
    /// blake3 of the manifest region.
    pub manifest_blake3: [u8; 32],
    /// blake3 of header bytes 0..88: the root of the bundle's hash tree, its identity.
    pub root_hash: [u8; 32],
}

fn u16_at(b: &[u8; HEADER_LEN], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn hash_at(b: &[u8; HEADER_LEN], at: usize) -> [u8; 32] {
    let mut v = [0u8; 32];
    v.copy_from_slice(&b[at..at + 32]);
    v
}

impl Header {
    /// A version-1.0 header for a manifest at `manifest_offset` with the given length and hash.
    /// The file ends right after the manifest; the root hash is computed here.
    pub fn new(manifest_offset: u64, manifest_len: u64, manifest_blake3: [u8; 32]) -> Header {
        let mut header = Header {
            format_major: FORMAT_MAJOR,
            format_minor: FORMAT_MINOR,
            flags: 0,
            alignment: ALIGNMENT,
            file_len: manifest_offset + manifest_len,
            manifest_offset,
            manifest_len,
            manifest_blake3,
            root_hash: [0; 32],
        };
        header.root_hash = header.compute_root_hash();
        header
    }

    /// The 128 header bytes, with the stored `root_hash` (call [`Header::compute_root_hash`] to refresh it).
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[offsets::MAGIC..offsets::MAGIC + 8].copy_from_slice(&MAGIC);
        b[offsets::MAJOR..offsets::MAJOR + 2].copy_from_slice(&self.format_major.to_le_bytes());
        b[offsets::MINOR..offsets::MINOR + 2].copy_from_slice(&self.format_minor.to_le_bytes());
        b[offsets::HEADER_LEN..offsets::HEADER_LEN + 4].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[offsets::FLAGS..offsets::FLAGS + 8].copy_from_slice(&self.flags.to_le_bytes());
        b[offsets::ALIGNMENT..offsets::ALIGNMENT + 8].copy_from_slice(&self.alignment.to_le_bytes());
        b[offsets::FILE_LEN..offsets::FILE_LEN + 8].copy_from_slice(&self.file_len.to_le_bytes());
        b[offsets::MANIFEST_OFFSET..offsets::MANIFEST_OFFSET + 8].copy_from_slice(&self.manifest_offset.to_le_bytes());
        b[offsets::MANIFEST_LEN..offsets::MANIFEST_LEN + 8].copy_from_slice(&self.manifest_len.to_le_bytes());
        b[offsets::MANIFEST_BLAKE3..offsets::MANIFEST_BLAKE3 + 32].copy_from_slice(&self.manifest_blake3);
        b[offsets::ROOT_HASH..offsets::ROOT_HASH + 32].copy_from_slice(&self.root_hash);
        b
    }

    /// blake3 of the first 88 header bytes (everything before `root_hash`).
    /// Since those bytes hold the manifest's hash, and the manifest holds the
    /// hash of every tensor and section, this one hash covers the whole file
    /// except zero padding (which verify checks separately).
    pub fn compute_root_hash(&self) -> [u8; 32] {
        let bytes = self.to_bytes();
        *blake3::hash(&bytes[..offsets::ROOT_HASH]).as_bytes()
    }

    /// Decodes and checks the header at the start of `file`. `file` is the
    /// whole file, so its length can be checked against `file_len`.
    ///
    /// Checks, in this order: length ≥ 128, magic, major version, header
    /// length, root hash, reserved bytes, required flags, alignment, file
    /// length. The order matters: a future major version may change every
    /// byte after offset 12.
    pub fn parse(file: &[u8]) -> Result<Header, BundleError> {
        let actual_len = file.len() as u64;
        let Some(prefix) = file.get(..HEADER_LEN) else {
            return Err(BundleError::FileTooSmall { len: actual_len, min: HEADER_LEN as u64 });
        };
        let mut b = [0u8; HEADER_LEN];
        b.copy_from_slice(prefix);
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&b[..8]);
        if magic != MAGIC {
            return Err(BundleError::BadMagic { found: magic });
        }
        let format_major = u16_at(&b, offsets::MAJOR);
        let format_minor = u16_at(&b, offsets::MINOR);
        if format_major != FORMAT_MAJOR {
            return Err(BundleError::UnsupportedVersion {
                major: format_major,
                minor: format_minor,
                supported_major: FORMAT_MAJOR,
            });
        }
        let header_len = u32_at(&b, offsets::HEADER_LEN);
        if header_len as usize != HEADER_LEN {
            return Err(BundleError::BadHeaderLength { found: header_len, expected: HEADER_LEN as u32 });
        }
        let header = Header {
            format_major,
            format_minor,
            flags: u64_at(&b, offsets::FLAGS),
            alignment: u64_at(&b, offsets::ALIGNMENT),
            file_len: u64_at(&b, offsets::FILE_LEN),
            manifest_offset: u64_at(&b, offsets::MANIFEST_OFFSET),
            manifest_len: u64_at(&b, offsets::MANIFEST_LEN),
            manifest_blake3: hash_at(&b, offsets::MANIFEST_BLAKE3),
            root_hash: hash_at(&b, offsets::ROOT_HASH),
        };
        let computed = *blake3::hash(&b[..offsets::ROOT_HASH]).as_bytes();
        if computed != header.root_hash {
            return Err(BundleError::HeaderHashMismatch { stored: header.root_hash, computed });
        }
        if b[offsets::RESERVED..].iter().any(|&x| x != 0) {
            return Err(BundleError::ReservedNotZero { offset: offsets::RESERVED as u64 });
        }
        let unknown_required = header.flags & REQUIRED_FLAGS_MASK & !KNOWN_REQUIRED_FLAGS;
        if unknown_required != 0 {
            return Err(BundleError::UnsupportedFlags { flags: unknown_required });
        }
        if header.alignment != ALIGNMENT {
            return Err(BundleError::BadAlignment { found: header.alignment, expected: ALIGNMENT });
        }
        if actual_len < header.file_len {
            return Err(BundleError::Truncated { expected: header.file_len, actual: actual_len });
        }
        if actual_len > header.file_len {
            return Err(BundleError::TrailingData { expected: header.file_len, actual: actual_len });
        }
        Ok(header)
    }
}
