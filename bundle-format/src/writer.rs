//! The streaming writer: tensors and sections go to disk one at a time.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{BundleError, RegionName, Result};
use crate::header::Header;
use crate::manifest::{Extension, KeyValue, Manifest, ModelInfo, Provenance, Quantization, SectionEntry, TensorEntry};
use crate::temp::TempBundleFile;
use crate::{ALIGNMENT, Dtype, LAYOUT_ROW_MAJOR, MAX_DIMS, kinds};

/// Bytes copied per read from a data source: large enough for blake3's SIMD
/// and for few syscalls, small enough that nothing is held whole.
const COPY_CHUNK: usize = 1 << 20;

/// What the writer needs to know about a tensor before its bytes arrive.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// Canonical (Hugging Face) name; unique in the bundle.
    pub name: String,
    /// Element type of the stored bytes.
    pub dtype: Dtype,
    /// Shape of the stored bytes (for a quantized weight, the packed u32 shape).
    pub shape: Vec<u64>,
    /// Layout tag; [`LAYOUT_ROW_MAJOR`] unless repacked.
    pub layout: String,
    /// Quantization descriptor of a quantized weight.
    pub quantization: Option<Quantization>,
    /// Free-form per-tensor properties.
    pub properties: Vec<KeyValue>,
}

impl TensorSpec {
    /// A row-major, unquantized tensor.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: impl Into<Vec<u64>>) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.into(),
            layout: LAYOUT_ROW_MAJOR.to_string(),
            quantization: None,
            properties: Vec::new(),
        }
    }

    /// Marks this tensor as a quantized weight described by `quantization`.
    pub fn quantized(mut self, quantization: Quantization) -> Self {
        self.quantization = Some(quantization);
        self
    }

    /// Sets the layout tag (for repacked tensors).
    pub fn with_layout(mut self, layout: impl Into<String>) -> Self {
        self.layout = layout.into();
        self
    }

    /// Adds a per-tensor property.
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push(KeyValue::new(key, value));
        self
    }

    /// The number of data bytes dtype × shape requires, or `None` on overflow.
    pub fn byte_len(&self) -> Option<u64> {
        self.dtype.byte_len(self.shape.iter().copied())
    }
}

/// What the writer needs to know about a non-tensor section.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SectionSpec {
    /// What the bytes are; see [`crate::kinds`].
    pub kind: String,
    /// Which one of that kind (graph name, file name, ...).
    pub key: String,
    /// What it runs on; empty when target-independent.
    pub target: String,
    /// Further matching keys.
    pub properties: Vec<KeyValue>,
}

impl SectionSpec {
    /// A target-independent section.
    pub fn new(kind: impl Into<String>, key: impl Into<String>) -> Self {
        SectionSpec { kind: kind.into(), key: key.into(), ..SectionSpec::default() }
    }

    /// Sets the target.
    pub fn with_target(mut self, target: impl Into<String>) -> Self {
        self.target = target.into();
        self
    }

    /// Adds a property.
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push(KeyValue::new(key, value));
        self
    }
}

/// What [`BundleWriter::finish`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenBundle {
    /// The final path.
    pub path: PathBuf,
    /// The root hash (the bundle's identity).
    pub root_hash: [u8; 32],
    /// Total file length.
    pub file_len: u64,
    /// Number of tensors.
    pub tensor_count: usize,
    /// Number of non-tensor sections.
    pub section_count: usize,
}

/// Writes a bundle in one pass: each tensor or section is streamed to a
/// temporary file beside the target, hashed on the way; [`BundleWriter::finish`]
/// appends the manifest, writes the header, fsyncs and renames. Dropping the
/// writer without finishing (or a failing `finish`) removes the temporary file.
///
/// ```no_run
/// use mlxcel_bundle::{BundleWriter, Dtype, ModelInfo, TensorSpec};
/// # fn main() -> mlxcel_bundle::Result<()> {
/// let model = ModelInfo { architecture: "llama".into(), name: "tiny".into(), config_json: "{}".into() };
/// let mut writer = BundleWriter::create("tiny.mlxb", model)?;
/// writer.add_tensor_bytes(TensorSpec::new("model.norm.weight", Dtype::F32, [2]), &[0u8; 8])?;
/// let written = writer.finish()?;
/// # Ok(()) }
/// ```
pub struct BundleWriter {
    file: TempBundleFile,
    target: PathBuf,
    /// Where the next byte goes (the file length).
    position: u64,
    manifest: Manifest,
    tensor_names: HashSet<String>,
    section_keys: HashSet<(String, String, String)>,
    chunk: Vec<u8>,
}

impl std::fmt::Debug for BundleWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BundleWriter")
            .field("target", &self.target)
            .field("temporary", &self.file.path())
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BundleError + 'a {
    move |cause| BundleError::Io { action, path: path.to_path_buf(), cause }
}

/// The next multiple of [`ALIGNMENT`] at or after `position`.
pub(crate) fn align_up(position: u64) -> u64 {
    position.div_ceil(ALIGNMENT) * ALIGNMENT
}

impl BundleWriter {
    /// Starts a bundle that will be renamed to `path` on [`BundleWriter::finish`].
    /// The temporary file is `<name>.tmp<random>` in the same directory (so the
    /// rename is atomic).
    pub fn create(path: impl AsRef<Path>, model: ModelInfo) -> Result<Self> {
        let target = path.as_ref().to_path_buf();
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let prefix = format!("{file_name}.tmp");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).rand_bytes(8);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o644));
        }
        let file = TempBundleFile::create(&builder, &dir).map_err(io_error("creating a temporary file in", &dir))?;
        let mut writer = BundleWriter {
            file,
            target,
            position: 0,
            manifest: Manifest { model, ..Manifest::default() },
            tensor_names: HashSet::new(),
            section_keys: HashSet::new(),
            chunk: vec![0; COPY_CHUNK],
        };
        // The header is written last; reserve its page now.
        writer.pad_to(ALIGNMENT)?;
        Ok(writer)
    }

    /// The path the bundle will have once finished.
    pub fn target_path(&self) -> &Path {
        &self.target
    }

    /// Bytes written so far (data and padding).
    pub fn bytes_written(&self) -> u64 {
        self.position
    }

    /// Replaces the model description.
    pub fn set_model(&mut self, model: ModelInfo) {
        self.manifest.model = model;
    }

    /// Sets the chat template (Jinja source).
    pub fn set_chat_template(&mut self, template: impl Into<String>) {
        self.manifest.tokenizer.chat_template = Some(template.into());
    }

    /// Sets the generation defaults (a JSON object as text).
    pub fn set_generation_defaults_json(&mut self, json: impl Into<String>) {
        self.manifest.tokenizer.generation_defaults_json = Some(json.into());
    }

    /// Sets the provenance record.
    pub fn set_provenance(&mut self, provenance: Provenance) {
        self.manifest.provenance = provenance;
    }

    /// Adds a free-form metadata entry.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.manifest.metadata.push(KeyValue::new(key, value));
    }

    /// Adds a typed extension record.
    pub fn add_extension(&mut self, extension: Extension) {
        self.manifest.extensions.push(extension);
    }

    /// Streams `tokenizer.json` into its section (kind [`kinds::TOKENIZER`], key `tokenizer.json`).
    pub fn add_tokenizer_json(&mut self, data: impl Read) -> Result<()> {
        self.add_section(SectionSpec::new(kinds::TOKENIZER, kinds::TOKENIZER_JSON_KEY), data)
    }

    /// Streams one tensor's bytes from `data`, which must yield exactly
    /// dtype × shape bytes. On error nothing of this tensor remains in the
    /// file and the writer can go on.
    pub fn add_tensor(&mut self, spec: TensorSpec, data: impl Read) -> Result<()> {
        let region = RegionName::Tensor(spec.name.clone());
        if spec.name.is_empty() {
            return Err(BundleError::EmptyName { what: "tensor name", entry_offset: 0 });
        }
        if self.tensor_names.contains(&spec.name) {
            return Err(BundleError::DuplicateTensor { name: spec.name, entry_offset: 0 });
        }
        if spec.shape.len() > MAX_DIMS {
            return Err(BundleError::TooManyDims {
                tensor: spec.name,
                entry_offset: 0,
                ndim: spec.shape.len(),
                max: MAX_DIMS,
            });
        }
        let Some(length) = spec.byte_len() else {
            return Err(BundleError::ShapeOverflow { tensor: spec.name, entry_offset: 0, shape: spec.shape });
        };
        let (offset, blake3) = self.stream_region(&region, length, data)?;
        self.tensor_names.insert(spec.name.clone());
        self.manifest.tensors.push(TensorEntry {
            name: spec.name,
            dtype: spec.dtype.as_str().to_string(),
            shape: spec.shape,
            offset,
            length,
            blake3,
            layout: spec.layout,
            quantization: spec.quantization,
            properties: spec.properties,
        });
        Ok(())
    }

    /// Writes one tensor from a byte slice (see [`BundleWriter::add_tensor`]).
    pub fn add_tensor_bytes(&mut self, spec: TensorSpec, data: &[u8]) -> Result<()> {
        if let Some(expected) = spec.byte_len().filter(|&expected| expected != data.len() as u64) {
            return Err(BundleError::SizeMismatch {
                tensor: spec.name,
                offset: align_up(self.position),
                dtype: spec.dtype.as_str().to_string(),
                shape: spec.shape,
                expected,
                length: data.len() as u64,
            });
        }
        self.add_tensor(spec, data)
    }

    /// Streams one tensor from an iterator of byte chunks (e.g. quantized row
    /// blocks as the compiler produces them); the chunks together must be
    /// exactly dtype × shape bytes. See [`BundleWriter::add_tensor`].
    pub fn add_tensor_chunks<I>(&mut self, spec: TensorSpec, chunks: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        self.add_tensor(spec, ChunkReader { chunks: chunks.into_iter(), current: None, position: 0 })
    }

    /// Streams a non-tensor section of any length from `data` until it ends.
    pub fn add_section(&mut self, spec: SectionSpec, data: impl Read) -> Result<()> {
        self.add_section_inner(spec, None, data)
    }

    /// Writes a non-tensor section from a byte slice.
    pub fn add_section_bytes(&mut self, spec: SectionSpec, data: &[u8]) -> Result<()> {
        self.add_section_inner(spec, Some(data.len() as u64), data)
    }

    fn add_section_inner(&mut self, spec: SectionSpec, expected: Option<u64>, data: impl Read) -> Result<()> {
        if spec.kind.is_empty() {
            return Err(BundleError::EmptyName { what: "section kind", entry_offset: 0 });
        }
        let id = (spec.kind.clone(), spec.key.clone(), spec.target.clone());
        if self.section_keys.contains(&id) {
            return Err(BundleError::DuplicateSection {
                kind: spec.kind,
                key: spec.key,
                target: spec.target,
                entry_offset: 0,
            });
        }
        let region =
            RegionName::Section { kind: spec.kind.clone(), key: spec.key.clone(), target: spec.target.clone() };
        let (offset, length, blake3) = match expected {
            Some(length) => {
                let (offset, blake3) = self.stream_region(&region, length, data)?;
                (offset, length, blake3)
            }
            None => self.stream_unsized_region(&region, data)?,
        };
        self.section_keys.insert(id);
        self.manifest.sections.push(SectionEntry {
            kind: spec.kind,
            key: spec.key,
            target: spec.target,
            offset,
            length,
            blake3,
            properties: spec.properties,
        });
        Ok(())
    }

    /// Appends zero bytes up to `position`.
    fn pad_to(&mut self, position: u64) -> Result<()> {
        static ZEROS: [u8; ALIGNMENT as usize] = [0; ALIGNMENT as usize];
        while self.position < position {
            let n = (position - self.position).min(ALIGNMENT) as usize;
            self.file.write_all(&ZEROS[..n]).map_err(io_error("writing", self.file.path()))?;
            self.position += n as u64;
        }
        Ok(())
    }

    /// Copies `data` to the next aligned offset, expecting exactly `length` bytes.
    fn stream_region(&mut self, region: &RegionName, length: u64, data: impl Read) -> Result<(u64, [u8; 32])> {
        let start = self.position;
        let result = self.copy_aligned(region, Some(length), data);
        match result {
            Ok((offset, _, hash)) => Ok((offset, hash)),
            Err(e) => Err(self.roll_back(start, e)),
        }
    }

    /// Copies `data` to the next aligned offset until it ends.
    fn stream_unsized_region(&mut self, region: &RegionName, data: impl Read) -> Result<(u64, u64, [u8; 32])> {
        let start = self.position;
        self.copy_aligned(region, None, data).map_err(|e| self.roll_back(start, e))
    }

    /// Truncates the file back to `start` after a failed region, keeping the writer usable.
    fn roll_back(&mut self, start: u64, error: BundleError) -> BundleError {
        let path = self.file.path().to_path_buf();
        let rolled_back = self
            .file
            .as_file_mut()
            .and_then(|file| file.set_len(start).and_then(|()| file.seek(SeekFrom::Start(start)).map(|_| ())));
        if let Err(cause) = rolled_back {
            return BundleError::Io { action: "rolling back a failed write in", path, cause };
        }
        self.position = start;
        error
    }

    fn copy_aligned(
        &mut self,
        region: &RegionName,
        expected: Option<u64>,
        mut data: impl Read,
    ) -> Result<(u64, u64, [u8; 32])> {
        let offset = align_up(self.position);
        self.pad_to(offset)?;
        let mut hasher = blake3::Hasher::new();
        let mut copied: u64 = 0;
        loop {
            // Ask for one byte more than expected at most, to detect overlong sources.
            let want = match expected {
                Some(len) => (len.saturating_sub(copied).saturating_add(1)).min(COPY_CHUNK as u64) as usize,
                None => COPY_CHUNK,
            };
            let n = match data.read(&mut self.chunk[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(cause) => return Err(BundleError::Source { region: region.clone(), cause }),
            };
            copied += n as u64;
            if let Some(len) = expected.filter(|&len| copied > len) {
                return Err(BundleError::LengthMismatch { region: region.clone(), expected: len, actual: copied });
            }
            hasher.update(&self.chunk[..n]);
            self.file.write_all(&self.chunk[..n]).map_err(io_error("writing", self.file.path()))?;
            self.position += n as u64;
        }
        if let Some(len) = expected.filter(|&len| copied != len) {
            return Err(BundleError::LengthMismatch { region: region.clone(), expected: len, actual: copied });
        }
        Ok((offset, copied, *hasher.finalize().as_bytes()))
    }

    /// Checks that every quantization descriptor names tensors that exist.
    fn check_quantization_references(&self) -> Result<()> {
        for tensor in &self.manifest.tensors {
            let Some(q) = &tensor.quantization else { continue };
            let references = std::iter::once(("scales", &q.scales)).chain(q.biases.iter().map(|b| ("biases", b)));
            for (role, name) in references {
                if !self.tensor_names.contains(name) {
                    return Err(BundleError::MissingQuantTensor {
                        tensor: tensor.name.clone(),
                        role,
                        missing: name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks the manifest, appends it, writes the header, fsyncs and renames
    /// the file into place (then fsyncs the directory).
    pub fn finish(self) -> Result<WrittenBundle> {
        self.seal()?.persist()
    }

    /// Checks the manifest, appends it, writes the header and fsyncs, but
    /// leaves the file under its temporary name: the caller can open and
    /// check the complete bundle ([`SealedBundle::temporary_path`]) before
    /// [`SealedBundle::persist`] renames it. Dropping the sealed bundle
    /// removes the file.
    pub fn seal(mut self) -> Result<SealedBundle> {
        self.check_quantization_references()?;
        let manifest_bytes = encode_manifest(&self.manifest)?;
        let manifest_offset = align_up(self.position);
        self.pad_to(manifest_offset)?;
        let tmp_path = self.file.path().to_path_buf();
        self.file.write_all(&manifest_bytes).map_err(io_error("writing", &tmp_path))?;
        let header =
            Header::new(manifest_offset, manifest_bytes.len() as u64, *blake3::hash(&manifest_bytes).as_bytes());
        let file = self.file.as_file_mut().map_err(io_error("writing", &tmp_path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_error("seeking in", &tmp_path))?;
        file.write_all(&header.to_bytes()).map_err(io_error("writing", &tmp_path))?;
        file.sync_all().map_err(io_error("syncing", &tmp_path))?;
        let written = WrittenBundle {
            path: self.target.clone(),
            root_hash: header.root_hash,
            file_len: header.file_len,
            tensor_count: self.manifest.tensors.len(),
            section_count: self.manifest.sections.len(),
        };
        Ok(SealedBundle { file: self.file, written })
    }
}

/// A complete bundle still under its temporary name (from
/// [`BundleWriter::seal`]); removed on drop unless persisted.
#[derive(Debug)]
pub struct SealedBundle {
    file: TempBundleFile,
    written: WrittenBundle,
}

impl SealedBundle {
    /// Where the complete bundle is now, under its temporary name.
    pub fn temporary_path(&self) -> &Path {
        self.file.path()
    }

    /// Renames the bundle to its final name and fsyncs the directory.
    pub fn persist(self) -> Result<WrittenBundle> {
        let target = self.written.path.clone();
        self.file.persist(&target)?;
        sync_parent_dir(&target)?;
        Ok(self.written)
    }
}
/// Adapts an iterator of byte chunks to [`Read`].
struct ChunkReader<I: Iterator> {
    chunks: I,
    current: Option<I::Item>,
    position: usize,
}

impl<I> Read for ChunkReader<I>
where
    I: Iterator,
    I::Item: AsRef<[u8]>,
{
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(chunk) = &self.current {
                let rest = chunk.as_ref().get(self.position..).unwrap_or_default();
                if !rest.is_empty() {
                    let n = rest.len().min(out.len());
                    out[..n].copy_from_slice(&rest[..n]);
                    self.position += n;
                    return Ok(n);
                }
            }
            match self.chunks.next() {
                Some(next) => {
                    self.current = Some(next);
                    self.position = 0;
                }
                None => return Ok(0),
            }
        }
    }
}

/// Serializes a manifest into its archived bytes (the manifest region).
pub fn encode_manifest(manifest: &Manifest) -> Result<rkyv::util::AlignedVec> {
    rkyv::to_bytes::<rkyv::rancor::BoxedError>(manifest).map_err(|e| BundleError::Serialize { detail: e.to_string() })
}

/// Makes the rename durable: fsync the directory that holds `path`.
fn sync_parent_dir(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(io_error("syncing directory", dir))?;
    }
    #[cfg(not(unix))]
    let _ = (path, File::open);
    Ok(())
}
