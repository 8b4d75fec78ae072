//! A `.mlxb` writer built from docs/bundle-format.md alone (not
//! `mlxcel-bundle`'s writer), so the corpus can write bundles whose hashes
//! are all valid but whose content is hostile: the attack then reaches the
//! parsers behind the hashes (config, tokenizer, template, tensor table).
//!
//! The manifest is an rkyv 0.8 archive (§5): values are written children
//! first, in field order, and each record after its children, which is the
//! order rkyv's validator requires (a value's subtree lies before it and
//! after its previous sibling's); the root record is the last 184 bytes.

/// `ALIGNMENT` (§1).
pub const ALIGN: usize = 16384;
/// The magic (§3).
pub const MAGIC: [u8; 8] = *b"\x89MLXB\r\n\x1a";

/// A tensor entry (§6.3).
#[derive(Clone, Debug)]
pub struct TensorEntry {
    /// Name.
    pub name: String,
    /// Dtype name (§4.1).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Region bytes (offset, length and hash are computed).
    pub data: Vec<u8>,
    /// Layout tag.
    pub layout: String,
    /// Quantization: mode, bits, group size, scales, biases.
    pub quantization: Option<(String, u32, u32, String, Option<String>)>,
    /// Length override (a table that lies about its region).
    pub length: Option<u64>,
}

/// A section entry (§6.4).
#[derive(Clone, Debug)]
pub struct SectionEntry {
    /// Kind.
    pub kind: String,
    /// Key.
    pub key: String,
    /// Target.
    pub target: String,
    /// Region bytes.
    pub data: Vec<u8>,
}

/// Everything a bundle holds.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// `ModelInfo.architecture`.
    pub architecture: String,
    /// `ModelInfo.name`.
    pub name: String,
    /// `ModelInfo.config_json`.
    pub config_json: String,
    /// `TokenizerInfo.chat_template`.
    pub chat_template: Option<String>,
    /// `TokenizerInfo.generation_defaults_json`.
    pub generation_defaults_json: Option<String>,
    /// Tensors, in file order.
    pub tensors: Vec<TensorEntry>,
    /// Sections, after the tensors.
    pub sections: Vec<SectionEntry>,
    /// Metadata pairs.
    pub metadata: Vec<(String, String)>,
    /// Extensions: name, required, payload.
    pub extensions: Vec<(String, bool, Vec<u8>)>,
    /// `format_major` (§3).
    pub major: u16,
    /// Bytes of the manifest overwritten before it is hashed: (offset from
    /// the root record's start, bytes), for archives that are invalid
    /// behind a valid hash.
    pub manifest_patch: Option<(usize, Vec<u8>)>,
}

/// The archive being written: positions are relative to its start.
struct Arena {
    buf: Vec<u8>,
}

/// A string already placed (out-of-line) or to be stored inline.
#[derive(Clone, Copy)]
enum Str {
    Inline([u8; 8]),
    Out { pos: usize, len: usize },
}

impl Arena {
    fn align(&mut self, a: usize) -> usize {
        self.buf.resize(self.buf.len().div_ceil(a) * a, 0);
        self.buf.len()
    }

    /// Places a string's bytes if it needs them out of line (§5.2).
    fn string(&mut self, s: &str) -> Str {
        if s.len() <= 8 {
            let mut b = [0xFF; 8];
            b[..s.len()].copy_from_slice(s.as_bytes());
            Str::Inline(b)
        } else {
            let pos = self.buf.len();
            self.buf.extend(s.as_bytes());
            Str::Out { pos, len: s.len() }
        }
    }

    /// Places the bytes of an array of `align`-aligned elements.
    fn array(&mut self, align: usize, bytes: &[u8]) -> usize {
        let pos = self.align(align);
        self.buf.extend(bytes);
        pos
    }

    /// Places a record of `size` bytes at the next `align` boundary; `fill`
    /// sets its fields knowing its position.
    fn record(&mut self, align: usize, size: usize, fill: impl FnOnce(&mut Rec)) -> usize {
        let pos = self.align(align);
        let mut r = Rec { pos, bytes: vec![0; size] };
        fill(&mut r);
        self.buf.extend(r.bytes);
        pos
    }
}

/// A record's bytes at a known archive position.
struct Rec {
    pos: usize,
    bytes: Vec<u8>,
}

impl Rec {
    fn put(&mut self, off: usize, b: &[u8]) {
        self.bytes[off..off + b.len()].copy_from_slice(b);
    }

    fn rel(&self, off: usize, target: usize) -> [u8; 4] {
        ((target as i64 - (self.pos + off) as i64) as i32).to_le_bytes()
    }

    fn string(&mut self, off: usize, s: Str) {
        match s {
            Str::Inline(b) => self.put(off, &b),
            Str::Out { pos, len } => {
                let w = 0x80 | (len as u32 & 0x3F) | ((len as u32 >> 6) << 8);
                self.put(off, &w.to_le_bytes());
                let r = self.rel(off, pos);
                self.put(off + 4, &r);
            }
        }
    }

    fn vec(&mut self, off: usize, target: usize, count: usize) {
        let r = self.rel(off, target);
        self.put(off, &r);
        self.put(off + 4, &(count as u32).to_le_bytes());
    }

    fn opt_string(&mut self, off: usize, s: Option<Str>) {
        if let Some(s) = s {
            self.bytes[off] = 1;
            self.string(off + 4, s);
        }
    }
}

/// Fills a record's fields once its position is known.
type Fill = Box<dyn Fn(&mut Rec)>;

/// Places a vector of records: every element's children first, then the
/// array; `children` places one element's children and returns a closure
/// that fills the element.
fn records<T>(
    a: &mut Arena,
    items: &[T],
    align: usize,
    size: usize,
    mut children: impl FnMut(&mut Arena, &T) -> Fill,
) -> (usize, usize) {
    let fills: Vec<Fill> = items.iter().map(|t| children(a, t)).collect();
    let start = a.align(align);
    for f in fills {
        a.record(align, size, |r| f(r));
    }
    (start, items.len())
}

fn key_values(a: &mut Arena, kvs: &[(String, String)]) -> (usize, usize) {
    records(a, kvs, 4, 16, |a, (k, v)| {
        let (k, v) = (a.string(k), a.string(v));
        Box::new(move |r| {
            r.string(0, k);
            r.string(8, v);
        })
    })
}

impl Bundle {
    /// The bundle's bytes, every hash valid.
    pub fn bytes(&self) -> Vec<u8> {
        let mut file = vec![0u8; ALIGN];
        let mut place = |data: &[u8]| {
            let offset = file.len();
            file.extend(data);
            file.resize(file.len().div_ceil(ALIGN) * ALIGN, 0);
            (offset as u64, data.len() as u64, *blake3::hash(data).as_bytes())
        };
        let tensor_regions: Vec<_> = self.tensors.iter().map(|t| place(&t.data)).collect();
        let section_regions: Vec<_> = self.sections.iter().map(|s| place(&s.data)).collect();
        let mut manifest = self.manifest(&tensor_regions, &section_regions);
        if let Some((at, bytes)) = &self.manifest_patch {
            let root = manifest.len() - 184;
            manifest[root + at..root + at + bytes.len()].copy_from_slice(bytes);
        }
        let manifest_offset = file.len() as u64;
        file.extend(&manifest);
        let mut h = Vec::with_capacity(128);
        h.extend(MAGIC);
        h.extend(self.major.to_le_bytes());
        h.extend(0u16.to_le_bytes());
        h.extend(128u32.to_le_bytes());
        h.extend(0u64.to_le_bytes());
        h.extend((ALIGN as u64).to_le_bytes());
        h.extend((file.len() as u64).to_le_bytes());
        h.extend(manifest_offset.to_le_bytes());
        h.extend((manifest.len() as u64).to_le_bytes());
        h.extend(blake3::hash(&manifest).as_bytes());
        let root = blake3::hash(&h);
        h.extend(root.as_bytes());
        h.extend([0u8; 8]);
        file[..128].copy_from_slice(&h);
        file
    }

    fn manifest(&self, tensors: &[(u64, u64, [u8; 32])], sections: &[(u64, u64, [u8; 32])]) -> Vec<u8> {
        let mut a = Arena { buf: Vec::new() };
        // ModelInfo, TokenizerInfo: strings in field order.
        let (arch, name, config) = (a.string(&self.architecture), a.string(&self.name), a.string(&self.config_json));
        let template = self.chat_template.as_deref().map(|s| a.string(s));
        let defaults = self.generation_defaults_json.as_deref().map(|s| a.string(s));
        let items: Vec<_> = self.tensors.iter().zip(tensors).collect();
        let (tensors_at, n_tensors) = records(&mut a, &items, 8, 128, |a, &(t, &(offset, length, hash))| {
            let name = a.string(&t.name);
            let dtype = a.string(&t.dtype);
            let shape_bytes: Vec<u8> = t.shape.iter().flat_map(|d| d.to_le_bytes()).collect();
            let shape = a.array(8, &shape_bytes);
            let layout = a.string(&t.layout);
            let q = t.quantization.clone().map(|(mode, bits, group, scales, biases)| {
                (a.string(&mode), bits, group, a.string(&scales), biases.map(|b| a.string(&b)))
            });
            let props = a.align(4);
            let (n_shape, length) = (t.shape.len(), t.length.unwrap_or(length));
            Box::new(move |r| {
                r.string(0, name);
                r.string(8, dtype);
                r.vec(16, shape, n_shape);
                r.put(24, &offset.to_le_bytes());
                r.put(32, &length.to_le_bytes());
                r.put(40, &hash);
                r.string(72, layout);
                if let Some((mode, bits, group, scales, biases)) = q {
                    r.bytes[80] = 1;
                    r.string(84, mode);
                    r.put(92, &bits.to_le_bytes());
                    r.put(96, &group.to_le_bytes());
                    r.string(100, scales);
                    r.opt_string(108, biases);
                }
                r.vec(120, props, 0);
            })
        });
        let items: Vec<_> = self.sections.iter().zip(sections).collect();
        let (sections_at, n_sections) = records(&mut a, &items, 8, 80, |a, &(s, &(offset, length, hash))| {
            let (kind, key, target) = (a.string(&s.kind), a.string(&s.key), a.string(&s.target));
            let props = a.align(4);
            Box::new(move |r| {
                r.string(0, kind);
                r.string(8, key);
                r.string(16, target);
                r.put(24, &offset.to_le_bytes());
                r.put(32, &length.to_le_bytes());
                r.put(40, &hash);
                r.vec(72, props, 0);
            })
        });
        // Provenance: versions, no source files, options, no recipe, no
        // surgery, no repacks.
        let compiler = a.string("adversarial-corpus 0");
        let mlx = a.string("0.32.4");
        let sources = a.align(8);
        let options = a.string("{}");
        let repacks = a.align(4);
        let (metadata_at, n_metadata) = key_values(&mut a, &self.metadata);
        let (ext_at, n_ext) = records(&mut a, &self.extensions, 4, 20, |a, (name, required, payload)| {
            let name = a.string(name);
            let data = a.array(1, payload);
            let (required, n) = (*required, payload.len());
            Box::new(move |r| {
                r.string(0, name);
                r.bytes[8] = required as u8;
                r.vec(12, data, n);
            })
        });
        a.record(4, 184, |r| {
            r.string(0, arch);
            r.string(8, name);
            r.string(16, config);
            r.opt_string(24, template);
            r.opt_string(36, defaults);
            r.vec(48, tensors_at, n_tensors);
            r.vec(56, sections_at, n_sections);
            r.string(64, compiler);
            r.string(72, mlx);
            r.vec(80, sources, 0);
            r.string(88, options);
            r.vec(160, repacks, 0);
            r.vec(168, metadata_at, n_metadata);
            r.vec(176, ext_at, n_ext);
        });
        a.buf
    }
}
