//! Full verification: every byte of the file is hashed or checked to be zero padding.

use crate::HEADER_LEN;
use crate::error::{BundleError, RegionName, Result, VerifyFailure};
use crate::reader::{Bundle, slice};

/// Bytes hashed between two progress reports.
const PROGRESS_CHUNK: usize = 8 << 20;

/// Progress of [`Bundle::verify`], reported after every chunk.
#[derive(Clone, Copy, Debug)]
pub struct VerifyProgress<'a> {
    /// Bytes checked so far (hashed or checked as padding).
    pub checked_bytes: u64,
    /// The file length.
    pub total_bytes: u64,
    /// The region being checked.
    pub region: &'a RegionName,
}

/// What a successful verification covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    /// Bytes checked (the whole file).
    pub checked_bytes: u64,
    /// Tensors whose hash matched.
    pub tensors: usize,
    /// Sections whose hash matched.
    pub sections: usize,
}

struct Planned {
    offset: u64,
    length: u64,
    stored: [u8; 32],
    name: RegionName,
}

impl Bundle {
    /// Checks every byte: recomputes the blake3 of every tensor, section and
    /// the manifest, checks that all padding is zero and that the surgery YAML
    /// matches its hash. The header's root hash was checked on open. Reports
    /// progress after each chunk; returns [`BundleError::VerifyFailed`] listing
    /// every mismatch (each naming its tensor or section and offset).
    pub fn verify(&self, mut progress: impl FnMut(&VerifyProgress<'_>)) -> Result<VerifyReport> {
        let bytes = self.as_bytes();
        let total = bytes.len() as u64;
        let mut plan: Vec<Planned> = self
            .tensors()
            .map(|t| Planned {
                offset: t.offset(),
                length: t.byte_len(),
                stored: t.blake3(),
                name: RegionName::Tensor(t.name().to_string()),
            })
            .chain(self.sections().map(|s| Planned {
                offset: s.offset(),
                length: s.byte_len(),
                stored: s.blake3(),
                name: RegionName::Section {
                    kind: s.kind().to_string(),
                    key: s.key().to_string(),
                    target: s.target().to_string(),
                },
            }))
            .collect();
        plan.push(Planned {
            offset: self.header().manifest_offset,
            length: self.header().manifest_len,
            stored: self.header().manifest_blake3,
            name: RegionName::Manifest,
        });
        plan.sort_by_key(|p| p.offset);

        self.advise_sequential(true);
        let mut failures = Vec::new();
        let mut checked = HEADER_LEN as u64;
        let mut cursor = HEADER_LEN as u64;
        let padding_name = RegionName::Header;
        for region in &plan {
            // Zero-length regions may share an offset with the next region; padding
            // runs from the end of the previous region to this one's start.
            if region.offset > cursor {
                if let Some(bad) = first_nonzero(slice(bytes, cursor, region.offset - cursor)) {
                    failures.push(VerifyFailure::NonZeroPadding { offset: cursor + bad as u64 });
                }
                checked += region.offset - cursor;
                progress(&VerifyProgress { checked_bytes: checked, total_bytes: total, region: &padding_name });
            }
            let mut hasher = blake3::Hasher::new();
            for chunk in slice(bytes, region.offset, region.length).chunks(PROGRESS_CHUNK) {
                hasher.update(chunk);
                checked += chunk.len() as u64;
                progress(&VerifyProgress { checked_bytes: checked, total_bytes: total, region: &region.name });
            }
            let computed = *hasher.finalize().as_bytes();
            if computed != region.stored {
                failures.push(VerifyFailure::HashMismatch {
                    region: region.name.clone(),
                    offset: region.offset,
                    length: region.length,
                    stored: region.stored,
                    computed,
                });
            }
            cursor = cursor.max(region.offset + region.length);
        }
        self.advise_sequential(false);
        if let Some(surgery) = self.provenance().surgery.as_ref()
            && *blake3::hash(surgery.yaml.as_bytes()).as_bytes() != surgery.blake3
        {
            failures.push(VerifyFailure::SurgeryHashMismatch);
        }
        if !failures.is_empty() {
            return Err(BundleError::VerifyFailed { failures });
        }
        Ok(VerifyReport { checked_bytes: checked, tensors: self.tensor_count(), sections: self.section_count() })
    }
}

/// Index of the first non-zero byte.
fn first_nonzero(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b != 0)
}
