//! Malformed bundles: every kind of damage gets its own error, none panics.

mod common;

use mlxcel_bundle::manifest::ArchivedManifest;
use mlxcel_bundle::raw::{assemble, replace_manifest};
use mlxcel_bundle::{
    ALIGNMENT, Bundle, BundleError, Extension, HEADER_LEN, Header, Manifest, RegionName, VerifyFailure, header_offsets,
};

fn sample() -> Vec<u8> {
    common::sample_bytes()
}

fn open(bytes: &[u8]) -> Result<Bundle, BundleError> {
    Bundle::from_bytes(bytes)
}

fn header(bytes: &[u8]) -> Header {
    Header::parse(bytes).expect("valid header")
}

/// The sample's manifest, changed by `edit`, written back with valid hashes.
fn with_manifest(edit: impl FnOnce(&mut Manifest)) -> Vec<u8> {
    let bytes = sample();
    let mut manifest = open(&bytes).unwrap().to_manifest().unwrap();
    edit(&mut manifest);
    replace_manifest(&bytes, &manifest).unwrap()
}

/// A header with correct root hash but arbitrary fields, written over `bytes`.
fn rewrite_header(bytes: &mut [u8], edit: impl FnOnce(&mut Header)) {
    let mut h = header(bytes);
    edit(&mut h);
    h.root_hash = h.compute_root_hash();
    bytes[..HEADER_LEN].copy_from_slice(&h.to_bytes());
}

/// Every region boundary of the sample: region starts and ends, the manifest, the end.
fn boundaries(bundle: &Bundle) -> Vec<u64> {
    let mut points = vec![0, 1, HEADER_LEN as u64 - 1, HEADER_LEN as u64, ALIGNMENT];
    for t in bundle.tensors() {
        points.extend([t.offset(), t.offset() + t.byte_len()]);
    }
    for s in bundle.sections() {
        points.extend([s.offset(), s.offset() + s.byte_len()]);
    }
    let h = bundle.header();
    points.extend([h.manifest_offset, h.manifest_offset + h.manifest_len / 2, h.file_len - 1]);
    points
}

#[test]
fn truncation_at_every_boundary_is_reported() {
    let bytes = sample();
    let bundle = open(&bytes).unwrap();
    let file_len = bytes.len() as u64;
    for cut in boundaries(&bundle) {
        let err = open(&bytes[..cut as usize]).unwrap_err();
        if cut < HEADER_LEN as u64 {
            assert!(matches!(err, BundleError::FileTooSmall { len, .. } if len == cut), "cut {cut}: {err}");
        } else {
            assert!(
                matches!(err, BundleError::Truncated { expected, actual } if expected == file_len && actual == cut),
                "cut {cut}: {err}"
            );
        }
    }
}

#[test]
fn truncated_file_on_disk_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("t.mlxb"));
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1).unwrap();
    assert!(matches!(Bundle::open(&path), Err(BundleError::Truncated { .. })));
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(10).unwrap();
    assert!(matches!(Bundle::open(&path), Err(BundleError::FileTooSmall { len: 10, .. })));
    let missing = Bundle::open(dir.path().join("nope.mlxb")).unwrap_err();
    assert!(matches!(&missing, BundleError::Io { action: "opening", .. }));
    assert!(missing.to_string().contains("nope.mlxb"));
}

#[test]
fn every_header_byte_flip_gets_the_error_of_its_field() {
    let bytes = sample();
    for at in 0..HEADER_LEN {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        let err = open(&bad).unwrap_err();
        let ok = match at {
            0..8 => matches!(err, BundleError::BadMagic { .. }),
            8..10 => matches!(err, BundleError::UnsupportedVersion { .. }),
            12..16 => matches!(err, BundleError::BadHeaderLength { .. }),
            120..128 => matches!(err, BundleError::ReservedNotZero { offset: 120 }),
            _ => matches!(err, BundleError::HeaderHashMismatch { .. }),
        };
        assert!(ok, "byte {at}: {err}");
    }
}

#[test]
fn wrong_magic_and_newer_major_are_refused_with_the_supported_version() {
    let mut bytes = sample();
    bytes[..8].copy_from_slice(b"GGUF\x03\0\0\0");
    assert!(matches!(open(&bytes), Err(BundleError::BadMagic { found }) if &found[..4] == b"GGUF"));

    let mut newer = sample();
    newer[header_offsets::MAJOR..header_offsets::MAJOR + 2].copy_from_slice(&2u16.to_le_bytes());
    newer[header_offsets::MINOR..header_offsets::MINOR + 2].copy_from_slice(&3u16.to_le_bytes());
    let err = open(&newer).unwrap_err();
    assert!(matches!(err, BundleError::UnsupportedVersion { major: 2, minor: 3, supported_major: 1 }));
    let message = err.to_string();
    assert!(
        message.contains("2.3") && message.contains("supports version 1.x") && message.contains("upgrade"),
        "{message}"
    );

    // A newer minor of the same major is read.
    let mut minor = sample();
    rewrite_header(&mut minor, |h| h.format_minor = 7);
    assert_eq!(open(&minor).unwrap().header().format_minor, 7);
}

#[test]
fn header_fields_with_a_valid_hash_are_still_checked() {
    let mut flags = sample();
    rewrite_header(&mut flags, |h| h.flags = 1 << 3);
    assert!(matches!(open(&flags), Err(BundleError::UnsupportedFlags { flags: 8 })));
    let mut optional = sample();
    rewrite_header(&mut optional, |h| h.flags = 1 << 40);
    assert!(open(&optional).is_ok(), "unknown optional flags are ignored");

    let mut align = sample();
    rewrite_header(&mut align, |h| h.alignment = 4096);
    assert!(matches!(open(&align), Err(BundleError::BadAlignment { found: 4096, .. })));

    let mut misplaced = sample();
    rewrite_header(&mut misplaced, |h| h.manifest_offset += 8);
    assert!(
        matches!(open(&misplaced), Err(BundleError::ManifestMisplaced { reason, .. }) if reason.contains("multiple"))
    );
    let mut early = sample();
    rewrite_header(&mut early, |h| {
        h.manifest_len += h.manifest_offset;
        h.manifest_offset = 0;
    });
    assert!(matches!(open(&early), Err(BundleError::ManifestMisplaced { reason, .. }) if reason.contains("header")));
    let mut short = sample();
    rewrite_header(&mut short, |h| h.manifest_len -= 16);
    assert!(matches!(open(&short), Err(BundleError::ManifestMisplaced { reason, .. }) if reason.contains("end")));
    let mut absurd = sample();
    rewrite_header(&mut absurd, |h| h.manifest_len = u64::MAX);
    assert!(matches!(open(&absurd), Err(BundleError::ManifestMisplaced { length: u64::MAX, .. })));

    let mut longer = sample();
    longer.push(0);
    assert!(matches!(open(&longer), Err(BundleError::TrailingData { .. })));
    let mut huge = sample();
    rewrite_header(&mut huge, |h| h.file_len = u64::MAX);
    assert!(matches!(open(&huge), Err(BundleError::Truncated { expected: u64::MAX, .. })));
}

#[test]
fn flipped_manifest_bytes_fail_the_manifest_hash() {
    let bytes = sample();
    let h = header(&bytes);
    for at in (h.manifest_offset..h.file_len).step_by(7) {
        let mut bad = bytes.clone();
        bad[at as usize] ^= 0x01;
        let err = open(&bad).unwrap_err();
        assert!(
            matches!(err, BundleError::ManifestHashMismatch { offset, .. } if offset == h.manifest_offset),
            "{at}: {err}"
        );
    }
}

#[test]
fn flipped_data_bytes_fail_verify_naming_the_tensor_or_section() {
    let bytes = sample();
    let bundle = open(&bytes).unwrap();
    let targets: Vec<(u64, RegionName)> = bundle
        .tensors()
        .filter(|t| t.byte_len() > 0)
        .map(|t| (t.offset() + t.byte_len() - 1, RegionName::Tensor(t.name().to_string())))
        .chain(bundle.sections().map(|s| {
            (s.offset(), RegionName::Section { kind: s.kind().into(), key: s.key().into(), target: s.target().into() })
        }))
        .collect();
    for (at, region) in targets {
        let mut bad = bytes.clone();
        bad[at as usize] ^= 0x80;
        let damaged = open(&bad).expect("open does not hash data");
        let err = damaged.verify(|_| {}).unwrap_err();
        let BundleError::VerifyFailed { failures } = &err else { panic!("{err}") };
        assert_eq!(failures.len(), 1, "{err}");
        assert!(matches!(&failures[0], VerifyFailure::HashMismatch { region: r, .. } if *r == region), "{err}");
        assert!(err.to_string().contains(&region.to_string()), "{err}");
    }
}

#[test]
fn non_zero_padding_fails_verify() {
    let bytes = sample();
    for at in [HEADER_LEN as u64, ALIGNMENT - 1, header(&bytes).manifest_offset - 1] {
        let mut bad = bytes.clone();
        bad[at as usize] = 1;
        let err = open(&bad).unwrap().verify(|_| {}).unwrap_err();
        assert!(
            matches!(&err, BundleError::VerifyFailed { failures } if failures == &[VerifyFailure::NonZeroPadding { offset: at }]),
            "{at}: {err}"
        );
    }
}

#[test]
fn surgery_yaml_that_does_not_match_its_hash_fails_verify() {
    let bad = with_manifest(|m| m.provenance.surgery.as_mut().unwrap().yaml.push('x'));
    let err = open(&bad).unwrap().verify(|_| {}).unwrap_err();
    assert!(
        matches!(&err, BundleError::VerifyFailed { failures } if failures == &[VerifyFailure::SurgeryHashMismatch])
    );
}

#[test]
fn overlapping_regions_are_refused() {
    let bad = with_manifest(|m| m.tensors[1].offset = m.tensors[0].offset);
    let err = open(&bad).unwrap_err();
    assert!(
        matches!(&err, BundleError::Overlap { first, second, .. } if matches!((&**first, &**second), (RegionName::Tensor(_), RegionName::Tensor(_)))),
        "{err}"
    );
    let bad = with_manifest(|m| m.sections[1].offset = m.tensors[2].offset);
    assert!(matches!(open(&bad), Err(BundleError::Overlap { .. })));
}

#[test]
fn offsets_past_the_end_and_misaligned_offsets_are_refused() {
    let bad = with_manifest(|m| m.tensors[0].offset = 1 << 40);
    assert!(matches!(open(&bad), Err(BundleError::OutOfBounds { offset, .. }) if offset == 1 << 40));
    let bad = with_manifest(|m| m.tensors[0].offset = u64::MAX / ALIGNMENT * ALIGNMENT);
    assert!(matches!(open(&bad), Err(BundleError::OutOfBounds { .. })));
    // A section may not reach into the manifest, nor sit in the header page.
    let bad = with_manifest(|m| m.sections[0].length = 2 * ALIGNMENT * 100);
    assert!(matches!(open(&bad), Err(BundleError::OutOfBounds { region: RegionName::Section { .. }, .. })));
    let bad = with_manifest(|m| m.sections[0].offset = 0);
    assert!(matches!(open(&bad), Err(BundleError::OutOfBounds { offset: 0, .. })));
    let bad = with_manifest(|m| m.tensors[3].offset += 64);
    let err = open(&bad).unwrap_err();
    assert!(
        matches!(&err, BundleError::Misaligned { region: RegionName::Tensor(name), .. } if name == "model.embed_tokens.weight")
    );
    assert!(err.to_string().contains("16384"));
}

#[test]
fn tensor_entries_are_checked_against_dtype_and_shape() {
    let bad = with_manifest(|m| m.tensors[0].length += 4);
    assert!(matches!(open(&bad), Err(BundleError::SizeMismatch { expected: 128, length: 132, .. })));
    let bad = with_manifest(|m| m.tensors[0].length = u64::MAX);
    assert!(matches!(open(&bad), Err(BundleError::SizeMismatch { length: u64::MAX, .. })));
    let bad = with_manifest(|m| m.tensors[0].shape = vec![u64::MAX, u64::MAX]);
    assert!(matches!(open(&bad), Err(BundleError::ShapeOverflow { .. })));
    let bad = with_manifest(|m| m.tensors[0].shape = vec![1; 40]);
    assert!(matches!(open(&bad), Err(BundleError::TooManyDims { ndim: 40, .. })));
    let bad = with_manifest(|m| m.tensors[0].dtype = "fp8".into());
    assert!(matches!(open(&bad), Err(BundleError::UnknownDtype { dtype, .. }) if dtype == "fp8"));
    let bad = with_manifest(|m| m.tensors[1].name = m.tensors[0].name.clone());
    let err = open(&bad).unwrap_err();
    assert!(matches!(&err, BundleError::DuplicateTensor { entry_offset, .. } if *entry_offset > 0), "{err}");
    let bad = with_manifest(|m| m.tensors[1].name.clear());
    assert!(matches!(open(&bad), Err(BundleError::EmptyName { what: "tensor name", .. })));
    let bad = with_manifest(|m| m.tensors[1].name = "renamed".into());
    assert!(matches!(open(&bad), Err(BundleError::MissingQuantTensor { role: "scales", .. })));
}

#[test]
fn section_entries_and_extensions_are_checked() {
    let bad = with_manifest(|m| {
        m.sections[2].target = m.sections[1].target.clone();
        m.sections[2].key = m.sections[1].key.clone();
        m.sections[2].kind = m.sections[1].kind.clone();
    });
    assert!(matches!(open(&bad), Err(BundleError::DuplicateSection { .. })));
    let bad = with_manifest(|m| m.sections[0].kind.clear());
    assert!(matches!(open(&bad), Err(BundleError::EmptyName { what: "section kind", .. })));
    let bad = with_manifest(|m| {
        m.extensions.push(Extension { name: "mlxcel.future".into(), required: true, payload: vec![1, 2] })
    });
    assert!(matches!(open(&bad), Err(BundleError::UnsupportedExtension { name }) if name == "mlxcel.future"));
    let fine = with_manifest(|m| {
        m.extensions.push(Extension { name: "mlxcel.future".into(), required: false, payload: vec![1, 2] });
        m.sections[0].kind = "some-future-kind".into();
        m.metadata.push(mlxcel_bundle::KeyValue::new("future.key", "v"));
    });
    let bundle = open(&fine).expect("unknown optional content is ignored");
    assert_eq!(bundle.extension("mlxcel.future").unwrap().payload.as_slice(), &[1, 2]);
}

#[test]
fn absurd_counts_and_garbage_manifests_fail_bytecheck() {
    let bytes = sample();
    let h = header(&bytes);
    let data_area = &bytes[..h.manifest_offset as usize];
    let manifest = &bytes[h.manifest_offset as usize..];

    // The tensor table's element count, made absurd.
    let root = manifest.len() - size_of::<ArchivedManifest>();
    let len_field = root + std::mem::offset_of!(ArchivedManifest, tensors) + 4;
    for count in [u32::MAX, 0x7fff_ffff, 1_000_000] {
        let mut m = manifest.to_vec();
        m[len_field..len_field + 4].copy_from_slice(&count.to_le_bytes());
        let err = open(&assemble(data_area, &m)).unwrap_err();
        assert!(matches!(err, BundleError::ManifestInvalid { .. }), "{count}: {err}");
        // rkyv's default error type keeps no detail in release builds
        // ("failed without error information; ..."): the reader must say what
        // is wrong in every build.
        assert!(!err.to_string().contains("without error information"), "{err}");
    }
    // A relative pointer aimed outside the manifest.
    let mut m = manifest.to_vec();
    let ptr_field = root + std::mem::offset_of!(ArchivedManifest, tensors);
    m[ptr_field..ptr_field + 4].copy_from_slice(&(-(1i32 << 30)).to_le_bytes());
    assert!(matches!(open(&assemble(data_area, &m)), Err(BundleError::ManifestInvalid { .. })));
    // Pure garbage, and nothing at all.
    let garbage = common::pattern(9, 500);
    assert!(matches!(open(&assemble(data_area, &garbage)), Err(BundleError::ManifestInvalid { .. })));
    assert!(matches!(open(&assemble(data_area, &[])), Err(BundleError::ManifestInvalid { .. })));
}

#[test]
fn no_single_byte_flip_panics() {
    let bytes = sample();
    let h = header(&bytes);
    let manifest_start = h.manifest_offset as usize;
    // Every byte of header and manifest, and a stride through the data area.
    let positions = (0..HEADER_LEN).chain(manifest_start..bytes.len()).chain((HEADER_LEN..manifest_start).step_by(997));
    for at in positions {
        for mask in [0x01u8, 0xff] {
            let mut bad = bytes.clone();
            bad[at] ^= mask;
            if let Ok(bundle) = open(&bad) {
                let _ = bundle.verify(|_| {});
                for t in bundle.tensors() {
                    let _ = (t.data().len(), t.shape(), t.quantization());
                }
            }
        }
    }
}
