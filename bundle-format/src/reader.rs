//! The reader: map a bundle, validate everything but the data bytes, read in place.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use memmap2::Mmap;
use rkyv::util::AlignedVec;

use crate::error::{BundleError, RegionName, Result};
use crate::header::Header;
use crate::manifest::{
    ArchivedExtension, ArchivedKeyValue, ArchivedManifest, ArchivedProvenance, ArchivedSectionEntry,
    ArchivedTensorEntry, Manifest,
};
use crate::{ALIGNMENT, Dtype, KNOWN_EXTENSIONS, MAX_DIMS, kinds};

/// The bytes a bundle is read from: a read-only memory map, or an aligned copy.
struct Backing {
    /// The whole file. Clones share it (never copy it) and keep it alive, even
    /// after the [`Bundle`] is dropped: see [`Bundle::shared_bytes`].
    bytes: Bytes,
    /// The map behind `bytes`, for `madvise`; `None` for an in-memory bundle.
    map: Option<Arc<Mmap>>,
}

/// A memory map shared between [`Backing::map`] and the [`Bytes`] over it.
struct SharedMap(Arc<Mmap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Backing {
    fn mapped(map: Mmap) -> Backing {
        let map = Arc::new(map);
        Backing { bytes: Bytes::from_owner(SharedMap(Arc::clone(&map))), map: Some(map) }
    }

    fn owned(vec: AlignedVec<16>) -> Backing {
        Backing { bytes: Bytes::from_owner(vec), map: None }
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The validated view of the backing bytes: the archived manifest and a name index.
struct Validated<'a> {
    bytes: &'a [u8],
    manifest: &'a ArchivedManifest,
    /// Parsed dtype of each tensor, by tensor index.
    dtypes: Vec<Dtype>,
    by_name: HashMap<&'a str, usize>,
}

self_cell::self_cell!(
    struct BundleCell {
        owner: Backing,
        #[covariant]
        dependent: Validated,
    }
);

/// An open, validated bundle. Every offset, length, alignment, overlap and
/// dtype × shape of the manifest has been checked, so views never read out
/// of bounds; the data bytes themselves are only hashed by [`Bundle::verify`].
pub struct Bundle {
    cell: BundleCell,
    header: Header,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for Bundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle")
            .field("path", &self.path)
            .field("header", &self.header)
            .field("tensors", &self.tensor_count())
            .field("sections", &self.section_count())
            .finish()
    }
}

/// A zero-copy view of one tensor.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    entry: &'a ArchivedTensorEntry,
    dtype: Dtype,
    data: &'a [u8],
}

/// A quantization descriptor, borrowed from the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizationView<'a> {
    /// Mode, e.g. `affine`.
    pub mode: &'a str,
    /// Bits per element.
    pub bits: u32,
    /// Group size.
    pub group_size: u32,
    /// Name of the scales tensor.
    pub scales: &'a str,
    /// Name of the biases tensor, if any.
    pub biases: Option<&'a str>,
}

impl<'a> TensorView<'a> {
    /// The canonical name.
    pub fn name(&self) -> &'a str {
        self.entry.name.as_str()
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The shape of the stored bytes.
    pub fn shape(&self) -> Vec<u64> {
        self.entry.shape.iter().map(|d| d.to_native()).collect()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.entry.shape.len()
    }

    /// The data bytes, borrowed from the map. They start at a multiple of
    /// 16384 in the file, so they are aligned for any element type.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// File offset of the data.
    pub fn offset(&self) -> u64 {
        self.entry.offset.to_native()
    }

    /// Length of the data in bytes.
    pub fn byte_len(&self) -> u64 {
        self.entry.length.to_native()
    }

    /// The blake3 the manifest records for the data.
    pub fn blake3(&self) -> [u8; 32] {
        self.entry.blake3
    }

    /// The layout tag ([`crate::LAYOUT_ROW_MAJOR`] unless repacked).
    pub fn layout(&self) -> &'a str {
        self.entry.layout.as_str()
    }

    /// The data in row-major order: the bytes themselves for `row-major`, a
    /// rearranged copy for `rows16` (the bytes of each row of packed codes, or
    /// the elements of any other tensor, in blocks of 16 rows: [`crate::rows16`]).
    /// `None` for a layout this crate does not know, or a `rows16` tensor whose
    /// shape cannot be whole blocks.
    pub fn row_major_data(&self) -> Option<std::borrow::Cow<'a, [u8]>> {
        match self.layout() {
            crate::LAYOUT_ROW_MAJOR => Some(std::borrow::Cow::Borrowed(self.data)),
            crate::LAYOUT_ROWS16 => {
                let elem = usize::try_from(self.dtype.size_bytes()).ok()?;
                let cols = usize::try_from(*self.shape().last()?).ok()?;
                let rows = if self.entry.quantization.is_some() {
                    crate::rows16::to_row_major(self.data, cols.checked_mul(elem)?, 1)
                } else {
                    crate::rows16::to_row_major(self.data, cols, elem)
                };
                rows.ok().map(std::borrow::Cow::Owned)
            }
            _ => None,
        }
    }

    /// The quantization descriptor of a quantized weight.
    pub fn quantization(&self) -> Option<QuantizationView<'a>> {
        self.entry.quantization.as_ref().map(|q| QuantizationView {
            mode: q.mode.as_str(),
            bits: q.bits.to_native(),
            group_size: q.group_size.to_native(),
            scales: q.scales.as_str(),
            biases: q.biases.as_ref().map(|b| b.as_str()),
        })
    }

    /// A per-tensor property.
    pub fn property(&self, key: &str) -> Option<&'a str> {
        find_value(&self.entry.properties, key)
    }

    /// The archived manifest entry.
    pub fn entry(&self) -> &'a ArchivedTensorEntry {
        self.entry
    }
}

/// A zero-copy view of one non-tensor section.
#[derive(Clone, Copy, Debug)]
pub struct SectionView<'a> {
    entry: &'a ArchivedSectionEntry,
    data: &'a [u8],
}

impl<'a> SectionView<'a> {
    /// The kind (see [`crate::kinds`]).
    pub fn kind(&self) -> &'a str {
        self.entry.kind.as_str()
    }

    /// The key.
    pub fn key(&self) -> &'a str {
        self.entry.key.as_str()
    }

    /// The target; empty when target-independent.
    pub fn target(&self) -> &'a str {
        self.entry.target.as_str()
    }

    /// The data bytes, borrowed from the map (16384-aligned in the file).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// File offset of the data.
    pub fn offset(&self) -> u64 {
        self.entry.offset.to_native()
    }

    /// Length of the data in bytes.
    pub fn byte_len(&self) -> u64 {
        self.entry.length.to_native()
    }

    /// The blake3 the manifest records for the data.
    pub fn blake3(&self) -> [u8; 32] {
        self.entry.blake3
    }

    /// A property of the section.
    pub fn property(&self, key: &str) -> Option<&'a str> {
        find_value(&self.entry.properties, key)
    }

    /// The archived manifest entry.
    pub fn entry(&self) -> &'a ArchivedSectionEntry {
        self.entry
    }
}

/// The value of the first pair with this key.
fn find_value<'a>(pairs: &'a [ArchivedKeyValue], key: &str) -> Option<&'a str> {
    pairs.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str())
}

/// The file offset of an archived value inside `bytes` (for error messages).
fn offset_in<T>(bytes: &[u8], value: &T) -> u64 {
    std::ptr::from_ref(value).addr().wrapping_sub(bytes.as_ptr().addr()) as u64
}

/// `bytes[offset..offset + length]`, or empty when out of range.
pub(crate) fn slice(bytes: &[u8], offset: u64, length: u64) -> &[u8] {
    // Validation guarantees the range; `get` keeps a broken invariant from ever panicking.
    usize::try_from(offset)
        .ok()
        .zip(usize::try_from(length).ok())
        .and_then(|(o, l)| bytes.get(o..o.checked_add(l)?))
        .unwrap_or(&[])
}

/// A data region met during validation.
struct Region<'a> {
    offset: u64,
    length: u64,
    name: Name<'a>,
}

/// A region's name without allocating until an error needs it.
#[derive(Clone, Copy)]
enum Name<'a> {
    Tensor(&'a ArchivedTensorEntry),
    Section(&'a ArchivedSectionEntry),
}

impl Name<'_> {
    fn owned(self) -> RegionName {
        match self {
            Name::Tensor(t) => RegionName::Tensor(t.name.to_string()),
            Name::Section(s) => section_name(s),
        }
    }
}

fn section_name(s: &ArchivedSectionEntry) -> RegionName {
    RegionName::Section { kind: s.kind.to_string(), key: s.key.to_string(), target: s.target.to_string() }
}

/// Checks a region's alignment and that it lies inside the data area `ALIGNMENT..end`.
fn check_region(region: &Region<'_>, end: u64) -> Result<()> {
    if !region.offset.is_multiple_of(ALIGNMENT) {
        return Err(BundleError::Misaligned {
            region: region.name.owned(),
            offset: region.offset,
            alignment: ALIGNMENT,
        });
    }
    let inside = region.offset >= ALIGNMENT && region.offset.checked_add(region.length).is_some_and(|e| e <= end);
    if !inside {
        return Err(BundleError::OutOfBounds {
            region: region.name.owned(),
            offset: region.offset,
            length: region.length,
            start: ALIGNMENT,
            end,
        });
    }
    Ok(())
}

/// Checks the manifest's placement and hash, validates it with bytecheck and
/// checks every entry against the file.
fn validate<'a>(bytes: &'a [u8], header: &Header) -> Result<Validated<'a>> {
    let (offset, length) = (header.manifest_offset, header.manifest_len);
    let misplaced = |reason| BundleError::ManifestMisplaced { offset, length, reason };
    if !offset.is_multiple_of(ALIGNMENT) {
        return Err(misplaced("its offset is not a multiple of 16384"));
    }
    if offset < ALIGNMENT {
        return Err(misplaced("it overlaps the header page"));
    }
    if offset.checked_add(length) != Some(header.file_len) {
        return Err(misplaced("it does not end exactly at the end of the file"));
    }
    let manifest_bytes = slice(bytes, offset, length);
    let computed = *blake3::hash(manifest_bytes).as_bytes();
    if computed != header.manifest_blake3 {
        return Err(BundleError::ManifestHashMismatch { offset, stored: header.manifest_blake3, computed });
    }
    let manifest = rkyv::access::<ArchivedManifest, rkyv::rancor::BoxedError>(manifest_bytes)
        .map_err(|e| BundleError::ManifestInvalid { offset, length, detail: e.to_string() })?;

    for extension in manifest.extensions.iter() {
        if extension.required && !KNOWN_EXTENSIONS.contains(&extension.name.as_str()) {
            return Err(BundleError::UnsupportedExtension { name: extension.name.to_string() });
        }
    }

    let mut regions = Vec::with_capacity(manifest.tensors.len() + manifest.sections.len());
    let mut dtypes = Vec::with_capacity(manifest.tensors.len());
    let mut by_name = HashMap::with_capacity(manifest.tensors.len());
    for (index, tensor) in manifest.tensors.iter().enumerate() {
        let entry_offset = offset_in(bytes, tensor);
        let name = tensor.name.as_str();
        if name.is_empty() {
            return Err(BundleError::EmptyName { what: "tensor name", entry_offset });
        }
        if by_name.insert(name, index).is_some() {
            return Err(BundleError::DuplicateTensor { name: name.to_string(), entry_offset });
        }
        let dtype: Dtype = tensor.dtype.parse().map_err(|_| BundleError::UnknownDtype {
            tensor: name.to_string(),
            entry_offset,
            dtype: tensor.dtype.to_string(),
        })?;
        if tensor.shape.len() > MAX_DIMS {
            return Err(BundleError::TooManyDims {
                tensor: name.to_string(),
                entry_offset,
                ndim: tensor.shape.len(),
                max: MAX_DIMS,
            });
        }
        let shape = || tensor.shape.iter().map(|d| d.to_native());
        let Some(expected) = dtype.byte_len(shape()) else {
            return Err(BundleError::ShapeOverflow {
                tensor: name.to_string(),
                entry_offset,
                shape: shape().collect(),
            });
        };
        let length = tensor.length.to_native();
        if expected != length {
            return Err(BundleError::SizeMismatch {
                tensor: name.to_string(),
                offset: tensor.offset.to_native(),
                dtype: dtype.as_str().to_string(),
                shape: shape().collect(),
                expected,
                length,
            });
        }
        dtypes.push(dtype);
        regions.push(Region { offset: tensor.offset.to_native(), length, name: Name::Tensor(tensor) });
    }
    for tensor in manifest.tensors.iter() {
        let Some(q) = tensor.quantization.as_ref() else { continue };
        let references = std::iter::once(("scales", &q.scales)).chain(q.biases.as_ref().map(|b| ("biases", b)));
        for (role, name) in references {
            if !by_name.contains_key(name.as_str()) {
                return Err(BundleError::MissingQuantTensor {
                    tensor: tensor.name.to_string(),
                    role,
                    missing: name.to_string(),
                });
            }
        }
    }
    let mut section_ids = std::collections::HashSet::with_capacity(manifest.sections.len());
    for section in manifest.sections.iter() {
        let entry_offset = offset_in(bytes, section);
        if section.kind.is_empty() {
            return Err(BundleError::EmptyName { what: "section kind", entry_offset });
        }
        if !section_ids.insert((section.kind.as_str(), section.key.as_str(), section.target.as_str())) {
            return Err(BundleError::DuplicateSection {
                kind: section.kind.to_string(),
                key: section.key.to_string(),
                target: section.target.to_string(),
                entry_offset,
            });
        }
        regions.push(Region {
            offset: section.offset.to_native(),
            length: section.length.to_native(),
            name: Name::Section(section),
        });
    }

    for region in &regions {
        check_region(region, offset)?;
    }
    // Empty regions hold no bytes and cannot overlap anything.
    regions.retain(|r| r.length > 0);
    regions.sort_unstable_by_key(|r| r.offset);
    for pair in regions.windows(2) {
        let (first, second) = (&pair[0], &pair[1]);
        let first_end = first.offset + first.length;
        if second.offset < first_end {
            return Err(BundleError::Overlap {
                first: Box::new(first.name.owned()),
                first_end,
                second: Box::new(second.name.owned()),
                offset: second.offset,
            });
        }
    }
    Ok(Validated { bytes, manifest, dtypes, by_name })
}

impl Bundle {
    /// Maps the file read-only and validates it: header, manifest hash,
    /// manifest structure (rkyv + bytecheck) and every offset, length,
    /// alignment, overlap and dtype × shape. Data bytes are not hashed
    /// (see [`Bundle::verify`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Bundle> {
        let path = path.as_ref();
        let io = |action| move |cause| BundleError::Io { action, path: path.to_path_buf(), cause };
        let file = File::open(path).map_err(io("opening"))?;
        let metadata = file.metadata().map_err(io("reading the metadata of"))?;
        // Mapping a directory fails with ENODEV ("No such device").
        if metadata.is_dir() {
            return Err(BundleError::IsADirectory { path: path.to_path_buf() });
        }
        let len = metadata.len();
        if len < crate::HEADER_LEN as u64 {
            return Err(BundleError::FileTooSmall { len, min: crate::HEADER_LEN as u64 });
        }
        // SAFETY: memmap2 cannot prove that nobody changes the file while it
        // is mapped. We open it read-only and map it read-only (private), so
        // this process never writes through the map, and every offset we
        // later read was bounds-checked against the mapped length during
        // validation. What remains is another process truncating or rewriting
        // the file while it is mapped: reads past the new end then raise
        // SIGBUS, and rewritten bytes may differ from what was validated (a
        // tensor may change, but no read leaves the map). Bundles are written
        // to a temporary file and renamed into place, so a compile in progress
        // never touches a mapped bundle; that is the contract we rely on. The
        // map can outlive this `Bundle` (clones of `shared_bytes`, e.g. MLX
        // arrays borrowing weights) under the same contract, and stays
        // read-only: a write through it would fault, not change the file.
        #[allow(unsafe_code)]
        let map = unsafe { Mmap::map(&file) }.map_err(io("mapping"))?;
        let mut bundle = Bundle::from_backing(Backing::mapped(map))?;
        bundle.path = Some(path.to_path_buf());
        Ok(bundle)
    }

    /// Validates a bundle held in memory (copied into an aligned buffer).
    /// Used by tests and fuzzing; production code maps files with [`Bundle::open`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Bundle> {
        let mut owned = AlignedVec::<16>::with_capacity(bytes.len());
        owned.extend_from_slice(bytes);
        Bundle::from_backing(Backing::owned(owned))
    }

    fn from_backing(backing: Backing) -> Result<Bundle> {
        let header = Header::parse(backing.bytes())?;
        let cell = BundleCell::try_new(backing, |backing| validate(backing.bytes(), &header))?;
        Ok(Bundle { cell, header, path: None })
    }

    /// Tells the kernel how the mapping will be read (readahead for verify);
    /// a no-op for in-memory bundles. Advice is only a hint: failures are ignored.
    pub(crate) fn advise_sequential(&self, sequential: bool) {
        if let Some(map) = &self.cell.borrow_owner().map {
            let advice = if sequential { memmap2::Advice::Sequential } else { memmap2::Advice::Normal };
            let _ = map.advise(advice);
        }
    }

    fn validated(&self) -> &Validated<'_> {
        self.cell.borrow_dependent()
    }

    /// The path the bundle was opened from, if it came from a file.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The root hash: the bundle's identity (see the spec).
    pub fn root_hash(&self) -> [u8; 32] {
        self.header.root_hash
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.validated().bytes
    }

    /// The whole file as shared bytes: a reference-counted handle to the same
    /// memory (the read-only map, for a bundle from [`Bundle::open`]), not a
    /// copy. It keeps that memory alive after the `Bundle` is dropped, so
    /// tensor data can be handed to consumers that outlive the `Bundle`
    /// without copying it: `shared_bytes().slice(range)` for a tensor's
    /// [`TensorView::offset`] and [`TensorView::byte_len`], or the whole file
    /// and the offset (as the runtime gives MLX its weights).
    pub fn shared_bytes(&self) -> Bytes {
        self.cell.borrow_owner().bytes.clone()
    }

    /// A section's bytes as shared bytes that keep the map alive (see
    /// [`Bundle::shared_bytes`]), by kind, key and target.
    pub fn shared_section(&self, kind: &str, key: &str, target: &str) -> Option<Bytes> {
        let s = self.section(kind, key, target)?;
        let start = usize::try_from(s.offset()).ok()?;
        Some(self.shared_bytes().slice(start..start + s.data().len()))
    }

    /// The archived manifest, for fields without a dedicated accessor.
    pub fn manifest(&self) -> &ArchivedManifest {
        self.validated().manifest
    }

    /// An owned copy of the manifest (for `inspect --json` and tooling).
    pub fn to_manifest(&self) -> Result<Manifest> {
        rkyv::deserialize::<Manifest, rkyv::rancor::BoxedError>(self.manifest()).map_err(|e| {
            BundleError::ManifestInvalid {
                offset: self.header.manifest_offset,
                length: self.header.manifest_len,
                detail: e.to_string(),
            }
        })
    }

    /// The architecture name, e.g. `llama`.
    pub fn architecture(&self) -> &str {
        self.manifest().model.architecture.as_str()
    }

    /// The model name.
    pub fn model_name(&self) -> &str {
        self.manifest().model.name.as_str()
    }

    /// The hyperparameters (Hugging Face-style config JSON text).
    pub fn config_json(&self) -> &str {
        self.manifest().model.config_json.as_str()
    }

    /// The chat template, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.manifest().tokenizer.chat_template.as_ref().map(|t| t.as_str())
    }

    /// The generation defaults JSON, if any.
    pub fn generation_defaults_json(&self) -> Option<&str> {
        self.manifest().tokenizer.generation_defaults_json.as_ref().map(|t| t.as_str())
    }

    /// The `tokenizer.json` bytes, if the bundle has them.
    pub fn tokenizer_json(&self) -> Option<&[u8]> {
        self.section(kinds::TOKENIZER, kinds::TOKENIZER_JSON_KEY, "").map(|s| s.data())
    }

    /// The compiled tokenizer section, if the compiler wrote one.
    pub fn compiled_tokenizer(&self) -> Option<&[u8]> {
        self.section(kinds::TOKENIZER, kinds::TOKENIZER_COMPILED_KEY, "").map(|s| s.data())
    }

    /// The provenance record.
    pub fn provenance(&self) -> &ArchivedProvenance {
        &self.manifest().provenance
    }

    /// A metadata value by key (the first entry with that key).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        find_value(&self.manifest().metadata, key)
    }

    /// An extension record by name.
    pub fn extension(&self, name: &str) -> Option<&ArchivedExtension> {
        self.manifest().extensions.iter().find(|e| e.name == name)
    }

    fn tensor_at(&self, index: usize) -> Option<TensorView<'_>> {
        let v = self.validated();
        let entry = v.manifest.tensors.get(index)?;
        let dtype = *v.dtypes.get(index)?;
        Some(TensorView { entry, dtype, data: slice(v.bytes, entry.offset.to_native(), entry.length.to_native()) })
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensor_at(*self.validated().by_name.get(name)?)
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorView<'_>> + '_ {
        let v = self.validated();
        v.manifest.tensors.iter().zip(v.dtypes.iter()).map(|(entry, &dtype)| TensorView {
            entry,
            dtype,
            data: slice(v.bytes, entry.offset.to_native(), entry.length.to_native()),
        })
    }

    /// The number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.manifest().tensors.len()
    }

    /// Every non-tensor section, in manifest order.
    pub fn sections(&self) -> impl ExactSizeIterator<Item = SectionView<'_>> + '_ {
        let v = self.validated();
        v.manifest.sections.iter().map(|entry| SectionView {
            entry,
            data: slice(v.bytes, entry.offset.to_native(), entry.length.to_native()),
        })
    }

    /// The number of non-tensor sections.
    pub fn section_count(&self) -> usize {
        self.manifest().sections.len()
    }

    /// The section with exactly this kind, key and target.
    pub fn section(&self, kind: &str, key: &str, target: &str) -> Option<SectionView<'_>> {
        self.sections().find(|s| s.kind() == kind && s.key() == key && s.target() == target)
    }

    /// The sections of one kind (e.g. every IREE vmfb, to pick one by target).
    pub fn sections_of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = SectionView<'a>> + 'a {
        self.sections().filter(move |s| s.kind() == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Bundle>();
    }
}
