//! Bundle benchmarks on a 1 GiB, 500-tensor bundle (see docs/benchmarks.md):
//!
//! 1. disk write speed with `dd` (1 GiB, fsync) against the writer's
//!    throughput (1 GiB bundle, hashing and fsync included), twice each;
//! 2. `Bundle::open` (map + full structural validation, no data hashing);
//! 3. `Bundle::verify` (blake3 of every byte, from the page cache).
//!
//! The bundle is written under the cargo target directory and deleted at
//! the end. `MLXCEL_BENCH_DIR` puts it elsewhere (e.g. another disk).
//!
//! `cargo bench -p mlxcel-bundle --bench bundle`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use mlxcel_bundle::{Bundle, BundleWriter, Dtype, ModelInfo, TensorSpec};

const TENSORS: usize = 500;
/// bf16 [1024, 1049]: 2,148,352 bytes, deliberately not a multiple of 16 KiB,
/// so every tensor is followed by padding as in real models.
const SHAPE: [u64; 2] = [1024, 1049];
const GIB: u64 = 1 << 30;

fn bench_dir() -> PathBuf {
    std::env::var_os("MLXCEL_BENCH_DIR").map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from)
}

fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e9
}

/// Writes 1 GiB of zeros with `dd ... conv=fsync`, timed end to end.
fn dd_write(dir: &Path) -> Option<(u64, Duration)> {
    let target = dir.join("dd-write-test.bin");
    let start = Instant::now();
    let status = Command::new("dd")
        .args(["if=/dev/zero", &format!("of={}", target.display()), "bs=16M", "count=64", "conv=fsync"])
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    let elapsed = start.elapsed();
    let _ = std::fs::remove_file(&target);
    status.success().then_some((GIB, elapsed))
}

/// Writes the 500-tensor bundle, timed end to end (create, stream + hash, manifest, fsync, rename).
fn write_bundle(path: &Path, payload: &[u8]) -> (u64, Duration) {
    let start = Instant::now();
    let model = ModelInfo { architecture: "llama".into(), name: "bench".into(), config_json: "{}".into() };
    let mut writer = BundleWriter::create(path, model).expect("create");
    for i in 0..TENSORS {
        let spec = TensorSpec::new(format!("model.layers.{}.mlp.w{}.weight", i / 7, i % 7), Dtype::Bf16, SHAPE);
        writer.add_tensor(spec, payload).expect("tensor");
    }
    let written = writer.finish().expect("finish");
    (written.file_len, start.elapsed())
}

fn main() {
    let dir = bench_dir();
    std::fs::create_dir_all(&dir).expect("bench dir");
    let path = dir.join("bench-1gib-500.mlxb");
    let len = Dtype::Bf16.byte_len(SHAPE).expect("size") as usize;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let payload: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();

    println!("bundle write vs dd (1 GiB each, fsync included), in {}", dir.display());
    for round in 1..=2 {
        match dd_write(&dir) {
            Some((bytes, t)) => {
                println!("  round {round}: dd      {:>6.2} GB/s ({:.2} s)", gbps(bytes, t), t.as_secs_f64())
            }
            None => println!("  round {round}: dd      unavailable"),
        }
        let (bytes, t) = write_bundle(&path, &payload);
        println!("  round {round}: writer  {:>6.2} GB/s ({:.2} s, {bytes} bytes)", gbps(bytes, t), t.as_secs_f64());
    }

    let file_len = std::fs::metadata(&path).expect("bundle").len();
    let mut c = Criterion::default().configure_from_args();
    c.bench_function("open+validate 1 GiB, 500 tensors", |b| {
        b.iter(|| black_box(Bundle::open(&path).expect("open").tensor_count()))
    });
    let bundle = Bundle::open(&path).expect("open");
    let mut group = c.benchmark_group("verify");
    group.sample_size(10).throughput(Throughput::Bytes(file_len));
    group.bench_function("verify 1 GiB, 500 tensors (1 core, page cache)", |b| {
        b.iter(|| black_box(bundle.verify(|_| {}).expect("verify")))
    });
    group.finish();
    drop(bundle);
    c.final_summary();
    std::fs::remove_file(&path).expect("delete the benchmark bundle");
}
