//! Seeded random numbers (determinism and distributions) and device selection.

mod common;

use common::*;
use mlxcel_mlx::{Array, Device, DeviceRequest, Dtype, device, random};

#[test]
fn keys_are_deterministic() {
    init();
    let a = random::uniform(0.0, 1.0, &[64], Dtype::F32, &random::Key::new(42).unwrap()).unwrap();
    let b = random::uniform(0.0, 1.0, &[64], Dtype::F32, &random::Key::new(42).unwrap()).unwrap();
    let c = random::uniform(0.0, 1.0, &[64], Dtype::F32, &random::Key::new(43).unwrap()).unwrap();
    assert_eq!(vals(&a), vals(&b));
    assert_ne!(vals(&a), vals(&c));
    let (k1, k2) = random::Key::new(7).unwrap().split().unwrap();
    let x = vals(&random::normal(&[16], Dtype::F32, 0.0, 1.0, &k1).unwrap());
    let y = vals(&random::normal(&[16], Dtype::F32, 0.0, 1.0, &k2).unwrap());
    assert_ne!(x, y, "split keys draw different numbers");
}

#[test]
fn distributions_have_their_moments() {
    init();
    let (mut rng, seed) = rng("distributions_have_their_moments");
    let _ = &mut rng;
    let key = random::Key::new(seed).unwrap();
    let (k1, k2) = key.split().unwrap();
    let n = 100_000usize;
    let u = vals(&random::uniform(-2.0, 6.0, &[n as i32], Dtype::F32, &k1).unwrap());
    assert!(u.iter().all(|&v| (-2.0..6.0).contains(&v)));
    let mean = u.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
    // Standard error of the mean of U(-2, 6) is 8/sqrt(12 n) ≈ 0.0073: 6 sigma.
    assert!((mean - 2.0).abs() < 0.045, "uniform mean {mean}");
    let g = vals(&random::normal(&[n as i32], Dtype::F32, 1.5, 3.0, &k2).unwrap());
    let mean = g.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
    let var = g.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
    assert!((mean - 1.5).abs() < 0.06, "normal mean {mean}");
    assert!((var.sqrt() - 3.0).abs() < 0.05, "normal std {}", var.sqrt());
}

#[test]
fn categorical_follows_softmax() {
    init();
    let (_, seed) = rng("categorical_follows_softmax");
    let logits = [0.0f32, 1.0, 2.0, -1.0, 0.5];
    let n = 20_000usize;
    let rows: Vec<f32> = (0..n).flat_map(|_| logits).collect();
    let l = arr(&rows, &[n as i32, logits.len() as i32]);
    let draws = random::categorical(&l, -1, &random::Key::new(seed).unwrap()).unwrap().to_vec::<u32>().unwrap();
    let probs = ref_softmax(&logits, logits.len());
    for (i, &p) in probs.iter().enumerate() {
        let freq = draws.iter().filter(|&&d| d as usize == i).count() as f64 / n as f64;
        // 6 standard errors of a binomial proportion.
        let se = (f64::from(p) * (1.0 - f64::from(p)) / n as f64).sqrt();
        assert!((freq - f64::from(p)).abs() < 6.0 * se + 1e-3, "class {i}: freq {freq}, p {p}");
    }
    // Greedy limit: a dominant logit is always drawn.
    let sharp = arr(&[0.0, 50.0, 0.0], &[1, 3]);
    let k = random::Key::new(seed ^ 1).unwrap();
    assert_eq!(random::categorical(&sharp, -1, &k).unwrap().to_vec::<u32>().unwrap(), vec![1]);
}

#[test]
fn device_requests() {
    init();
    let cpu = DeviceRequest::Exactly(Device::Cpu);
    assert_eq!(DeviceRequest::parse("cpu"), Some(cpu));
    assert_eq!(DeviceRequest::parse(" CPU "), Some(cpu));
    assert_eq!(cpu.resolve().unwrap(), Device::Cpu);
    let auto = DeviceRequest::Auto.resolve().unwrap();
    assert_eq!(auto == Device::Gpu, Device::Gpu.is_available());
    assert_eq!(DeviceRequest::parse("auto"), Some(DeviceRequest::Auto));
    assert_eq!(DeviceRequest::parse("tpu"), None);
    let gpu = DeviceRequest::parse("gpu").unwrap();
    if Device::Gpu.is_available() {
        assert_eq!(gpu.resolve().unwrap(), Device::Gpu);
    } else {
        let err = gpu.resolve().unwrap_err().to_string();
        assert!(err.contains("gpu device was requested"), "{err}");
        assert!(device::set_default_device(Device::Gpu).is_err());
        assert_eq!(device::default_device(), Device::Cpu);
    }
    assert!(!Device::Cpu.description().is_empty());
    assert!(mlxcel_mlx::mlx_version().starts_with("0.32."));
    // Memory counters move when arrays are computed.
    let a = Array::ones(&[1024, 1024], Dtype::F32).unwrap();
    a.eval().unwrap();
    assert!(mlxcel_mlx::memory::peak() >= 4 << 20);
}
