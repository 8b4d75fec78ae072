//! Writer → reader round trips, writer errors, determinism and property tests.

mod common;

use common::{pattern, write_sample};
use mlxcel_bundle::{
    ALIGNMENT, Bundle, BundleError, BundleWriter, Dtype, ModelInfo, Quantization, RegionName, SectionSpec, TensorSpec,
    kinds,
};
use proptest::prelude::*;

fn tmp_entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn sample_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("m.mlxb"));
    let bundle = Bundle::open(&path).unwrap();
    assert_eq!(bundle.architecture(), "llama");
    assert_eq!(bundle.model_name(), "tiny-llama-test");
    assert!(bundle.config_json().contains("hidden_size"));
    assert_eq!(bundle.chat_template(), Some("{% for m in messages %}{{ m.content }}{% endfor %}"));
    assert!(bundle.generation_defaults_json().unwrap().contains("eos_token_id"));
    assert_eq!(bundle.tokenizer_json(), Some(&br#"{"model":{"type":"BPE"}}"#[..]));
    assert_eq!(bundle.metadata("mlxcel.test"), Some("yes"));
    assert_eq!(bundle.tensor_count(), 6);
    assert_eq!(bundle.section_count(), 4);

    let w = bundle.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(w.dtype(), Dtype::U32);
    assert_eq!(w.shape(), vec![8, 4]);
    assert_eq!(w.data(), &pattern(1, 128)[..]);
    assert_eq!(w.offset() % ALIGNMENT, 0);
    assert_eq!(w.layout(), "row-major");
    let q = w.quantization().unwrap();
    assert_eq!((q.mode, q.bits, q.group_size), ("affine", 4, 32));
    assert_eq!(q.scales, "model.layers.0.mlp.down_proj.scales");
    assert_eq!(q.biases, Some("model.layers.0.mlp.down_proj.biases"));
    assert_eq!(w.blake3(), *blake3::hash(&pattern(1, 128)).as_bytes());

    let e = bundle.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!((e.dtype(), e.shape(), e.data()), (Dtype::Bf16, vec![16, 8], &pattern(4, 256)[..]));
    assert_eq!(bundle.tensor("model.norm.weight").unwrap().property("note"), Some("ones"));
    assert_eq!(bundle.tensor("empty").unwrap().data(), &[] as &[u8]);
    assert!(bundle.tensor("missing").is_none());

    let names: Vec<&str> = bundle.tensors().map(|t| t.name()).collect();
    assert_eq!(names[0], "model.layers.0.mlp.down_proj.weight");
    assert_eq!(names.len(), 6);

    let vmfbs: Vec<_> = bundle.sections_of_kind(kinds::IREE_VMFB).collect();
    assert_eq!(vmfbs.len(), 2);
    let cuda = bundle.section(kinds::IREE_VMFB, "decode", "cuda:sm_90").unwrap();
    assert_eq!(cuda.data(), &pattern(7, 100)[..]);
    assert_eq!(cuda.property("iree_version"), Some("3.13.0"));
    assert_eq!(bundle.section(kinds::STABLEHLO, "decode", "").unwrap().data(), b"module @decode {}");

    let p = bundle.provenance();
    assert_eq!(p.compiler_version, "mlxcel-compile 0.1.0");
    assert_eq!(p.surgery.as_ref().unwrap().operations.len(), 1);

    let report = bundle.verify(|_| {}).unwrap();
    assert_eq!(report.checked_bytes, bundle.header().file_len);
    assert_eq!((report.tensors, report.sections), (6, 4));

    // The owned manifest matches what went in, and the file is exactly the bytes read.
    let manifest = bundle.to_manifest().unwrap();
    assert_eq!(manifest.provenance, common::provenance());
    assert_eq!(manifest.model, common::model());
    let from_memory = Bundle::from_bytes(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(from_memory.root_hash(), bundle.root_hash());
    // Only the finished file remains in the directory.
    assert_eq!(tmp_entries(dir.path()), vec!["m.mlxb".to_string()]);
}

#[test]
fn shared_bytes_are_the_file_without_a_copy_and_outlive_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("m.mlxb"));
    let from_memory = Bundle::from_bytes(&std::fs::read(&path).unwrap()).unwrap();
    for bundle in [Bundle::open(&path).unwrap(), from_memory] {
        let shared = bundle.shared_bytes();
        assert_eq!(shared.as_ptr(), bundle.as_bytes().as_ptr(), "the same memory, not a copy");
        assert_eq!(shared.len(), bundle.as_bytes().len());
        let w = bundle.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
        let range = w.offset() as usize..(w.offset() + w.byte_len()) as usize;
        let expected = w.data().to_vec();
        drop(bundle);
        // The map (or buffer) is still there after the bundle is gone.
        assert_eq!(&shared[range.clone()], &expected[..]);
        assert_eq!(shared.slice(range), pattern(1, 128));
    }
}

#[test]
fn verify_reports_progress_up_to_the_file_length() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = Bundle::open(write_sample(&dir.path().join("m.mlxb"))).unwrap();
    let mut last = 0;
    let mut calls = 0;
    bundle
        .verify(|p| {
            assert!(p.checked_bytes >= last && p.checked_bytes <= p.total_bytes);
            last = p.checked_bytes;
            calls += 1;
        })
        .unwrap();
    assert_eq!(last, bundle.header().file_len);
    assert!(calls > 10);
}

#[test]
fn output_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let a = std::fs::read(write_sample(&dir.path().join("a.mlxb"))).unwrap();
    let b = std::fs::read(write_sample(&dir.path().join("b.mlxb"))).unwrap();
    assert_eq!(a, b);
}

fn writer(dir: &std::path::Path) -> BundleWriter {
    BundleWriter::create(dir.join("w.mlxb"), common::model()).unwrap()
}

#[test]
fn writer_rejects_duplicates_and_bad_lengths_and_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    w.add_tensor_bytes(TensorSpec::new("a", Dtype::F32, [2]), &[0; 8]).unwrap();
    let before = w.bytes_written();
    assert!(matches!(
        w.add_tensor_bytes(TensorSpec::new("a", Dtype::F32, [2]), &[0; 8]),
        Err(BundleError::DuplicateTensor { name, .. }) if name == "a"
    ));
    assert!(matches!(
        w.add_tensor_bytes(TensorSpec::new("b", Dtype::F32, [2]), &[0; 7]),
        Err(BundleError::SizeMismatch { expected: 8, length: 7, .. })
    ));
    // A streaming source that is too short or too long is rolled back.
    assert!(matches!(
        w.add_tensor(TensorSpec::new("b", Dtype::F32, [1024]), &[1u8; 4000][..]),
        Err(BundleError::LengthMismatch { expected: 4096, actual: 4000, .. })
    ));
    assert!(matches!(
        w.add_tensor(TensorSpec::new("b", Dtype::F32, [4]), &[1u8; 100][..]),
        Err(BundleError::LengthMismatch { expected: 16, actual: 17, region: RegionName::Tensor(_) })
    ));
    assert_eq!(w.bytes_written(), before);
    assert!(matches!(
        w.add_tensor_bytes(TensorSpec::new("huge", Dtype::F64, [u64::MAX, 2]), &[]),
        Err(BundleError::ShapeOverflow { .. })
    ));
    assert!(matches!(w.add_tensor_bytes(TensorSpec::new("", Dtype::U8, [0]), &[]), Err(BundleError::EmptyName { .. })));
    assert!(matches!(
        w.add_tensor_bytes(TensorSpec::new("deep", Dtype::U8, vec![1; 33]), &[0]),
        Err(BundleError::TooManyDims { ndim: 33, .. })
    ));
    w.add_section_bytes(SectionSpec::new("blob", "x"), b"1").unwrap();
    assert!(matches!(
        w.add_section_bytes(SectionSpec::new("blob", "x"), b"2"),
        Err(BundleError::DuplicateSection { .. })
    ));
    assert!(matches!(w.add_section_bytes(SectionSpec::new("", "x"), b"2"), Err(BundleError::EmptyName { .. })));
    // The same key with another target is a different section.
    w.add_section_bytes(SectionSpec::new("blob", "x").with_target("cuda:sm_90"), b"3").unwrap();
    w.add_tensor_bytes(TensorSpec::new("b", Dtype::F32, [2]), &[1; 8]).unwrap();
    let written = w.finish().unwrap();
    let bundle = Bundle::open(&written.path).unwrap();
    assert_eq!(bundle.tensor("b").unwrap().data(), &[1; 8]);
    assert_eq!(bundle.section("blob", "x", "cuda:sm_90").unwrap().data(), b"3");
    bundle.verify(|_| {}).unwrap();
}

#[test]
fn tensors_can_be_streamed_from_chunk_iterators() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    let data = pattern(11, 3 * 1000 * 4);
    // Uneven chunks, including empty ones, crossing the writer's copy buffer.
    let chunks = [&data[..1], &data[1..1], &data[1..5000], &data[5000..]];
    w.add_tensor_chunks(TensorSpec::new("rows", Dtype::F32, [3, 1000]), chunks).unwrap();
    let rows: Vec<Vec<u8>> = data.chunks(4000).map(<[u8]>::to_vec).collect();
    w.add_tensor_chunks(TensorSpec::new("rows2", Dtype::F32, [3, 1000]), rows).unwrap();
    assert!(matches!(
        w.add_tensor_chunks(TensorSpec::new("short", Dtype::F32, [3, 1000]), [&data[..100]]),
        Err(BundleError::LengthMismatch { expected: 12000, actual: 100, .. })
    ));
    let bundle = Bundle::open(w.finish().unwrap().path).unwrap();
    assert_eq!(bundle.tensor("rows").unwrap().data(), &data[..]);
    assert_eq!(bundle.tensor("rows2").unwrap().data(), &data[..]);
}

struct FailingReader;

impl std::io::Read for FailingReader {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("disk on fire"))
    }
}

#[test]
fn source_errors_name_the_region() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    let err = w.add_section(SectionSpec::new("blob", "x"), FailingReader).unwrap_err();
    assert!(matches!(&err, BundleError::Source { region: RegionName::Section { key, .. }, .. } if key == "x"));
    assert!(err.to_string().contains("disk on fire"));
}

#[test]
fn missing_quantization_reference_fails_finish_and_removes_the_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    let q =
        Quantization { mode: "affine".into(), bits: 4, group_size: 64, scales: "s".into(), biases: Some("b".into()) };
    w.add_tensor_bytes(TensorSpec::new("w", Dtype::U32, [1]), &[0; 4]).unwrap();
    w.add_tensor_bytes(TensorSpec::new("q", Dtype::U32, [1]).quantized(q), &[0; 4]).unwrap();
    w.add_tensor_bytes(TensorSpec::new("s", Dtype::F32, [1]), &[0; 4]).unwrap();
    let err = w.finish().unwrap_err();
    assert!(
        matches!(&err, BundleError::MissingQuantTensor { tensor, role: "biases", missing } if tensor == "q" && missing == "b")
    );
    assert!(tmp_entries(dir.path()).is_empty(), "{:?}", tmp_entries(dir.path()));
}

#[test]
fn dropping_an_unfinished_writer_removes_the_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = writer(dir.path());
    w.add_tensor_bytes(TensorSpec::new("a", Dtype::U8, [3]), &[1, 2, 3]).unwrap();
    assert_eq!(tmp_entries(dir.path()).len(), 1);
    assert!(tmp_entries(dir.path())[0].starts_with("w.mlxb.tmp"));
    drop(w);
    assert!(tmp_entries(dir.path()).is_empty());
}

#[test]
fn an_empty_bundle_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let written = BundleWriter::create(dir.path().join("e.mlxb"), ModelInfo::default()).unwrap().finish().unwrap();
    let bundle = Bundle::open(&written.path).unwrap();
    assert_eq!(bundle.tensor_count(), 0);
    assert_eq!(bundle.header().manifest_offset, ALIGNMENT);
    assert_eq!(written.file_len, ALIGNMENT + bundle.header().manifest_len);
    assert!(bundle.tokenizer_json().is_none());
    bundle.verify(|_| {}).unwrap();
}

#[derive(Debug, Clone)]
struct RandomTensor {
    dtype: Dtype,
    shape: Vec<u64>,
    seed: u64,
}

fn random_tensor() -> impl Strategy<Value = RandomTensor> {
    (0..Dtype::ALL.len(), prop::collection::vec(0u64..6, 0..4), any::<u64>())
        .prop_map(|(d, shape, seed)| RandomTensor { dtype: Dtype::ALL[d], shape, seed })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_bundles_round_trip(
        tensors in prop::collection::vec(random_tensor(), 0..12),
        sections in prop::collection::vec((any::<u64>(), 0usize..40000, "[a-z]{1,12}", "[a-z0-9:_]{0,20}"), 0..4),
        template in proptest::option::of(".{0,40}"),
        arch in "[a-z0-9]{0,12}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        let model = ModelInfo { architecture: arch.clone(), name: "p".into(), config_json: "{}".into() };
        let mut w = BundleWriter::create(dir.path().join("p.mlxb"), model).unwrap();
        if let Some(t) = &template {
            w.set_chat_template(t.clone());
        }
        let mut expected_tensors = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            let name = format!("t{i}.weight");
            let len = t.dtype.byte_len(t.shape.iter().copied()).unwrap() as usize;
            let data = pattern(t.seed, len);
            w.add_tensor(TensorSpec::new(name.clone(), t.dtype, t.shape.clone()), &data[..]).unwrap();
            expected_tensors.push((name, t.clone(), data));
        }
        let mut expected_sections = Vec::new();
        for (i, (seed, len, kind, target)) in sections.iter().enumerate() {
            let data = pattern(*seed, *len);
            let key = format!("s{i}");
            w.add_section(SectionSpec::new(kind.clone(), key.clone()).with_target(target.clone()), &data[..]).unwrap();
            expected_sections.push((kind.clone(), key, target.clone(), data));
        }
        let written = w.finish().unwrap();
        let bundle = Bundle::open(&written.path).unwrap();
        prop_assert_eq!(bundle.root_hash(), written.root_hash);
        prop_assert_eq!(bundle.architecture(), arch.as_str());
        prop_assert_eq!(bundle.chat_template(), template.as_deref());
        prop_assert_eq!(bundle.tensor_count(), expected_tensors.len());
        for (name, t, data) in &expected_tensors {
            let view = bundle.tensor(name).unwrap();
            prop_assert_eq!(view.dtype(), t.dtype);
            prop_assert_eq!(view.shape(), t.shape.clone());
            prop_assert_eq!(view.data(), &data[..]);
            prop_assert_eq!(view.offset() % ALIGNMENT, 0);
        }
        for (kind, key, target, data) in &expected_sections {
            prop_assert_eq!(bundle.section(kind, key, target).unwrap().data(), &data[..]);
        }
        let verified = bundle.verify(|_| ());
        prop_assert!(verified.is_ok(), "{:?}", verified);
    }
}
