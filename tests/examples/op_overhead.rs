//! MLX's per-operation cost on this machine: chains of tiny ops evaluated
//! together (the graph-building and dispatch overhead a decode step pays per op).
//!
//! cargo run --release -p mlxcel-tests --example op_overhead
use std::time::Instant;

use mlxcel_mlx::{Array, Dtype, fast};

fn per_op(n: usize, f: impl Fn(&Array) -> Array, x: &Array) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        let t = Instant::now();
        let mut y = x.clone();
        for _ in 0..n {
            y = f(&y);
        }
        y.eval().unwrap();
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    best
}

fn main() {
    let x = Array::ones(&[1, 576], Dtype::F32).unwrap();
    x.eval().unwrap();
    let w = Array::ones(&[576], Dtype::F32).unwrap();
    w.eval().unwrap();
    let n = 1000;
    println!("add: {:.2} us/op", per_op(n, |y| y.add(&x).unwrap(), &x));
    println!("reshape: {:.2} us/op", per_op(n, |y| y.reshape(&[1, 576]).unwrap(), &x));
    println!(
        "reshape+transpose: {:.2} us/pair",
        per_op(n, |y| y.reshape(&[576, 1]).unwrap().transpose(&[1, 0]).unwrap(), &x)
    );
    println!("slice: {:.2} us/op", per_op(n, |y| y.slice(&[0, 0], &[1, 576], &[1, 1]).unwrap(), &x));
    println!("mlxcel rms_norm: {:.2} us/op", per_op(n, |y| fast::rms_norm(y, Some(&w), 1e-5).unwrap(), &x));
    println!(
        "mlx rms_norm: {:.2} us/op",
        per_op(n, |y| fast::on(fast::Path::Mlx).rms_norm(y, Some(&w), 1e-5).unwrap(), &x)
    );
    // A KV-cache style update of a 64 MiB buffer: in place when MLX can donate
    // the buffer (microseconds), a full copy otherwise (milliseconds).
    let mut buf = Array::zeros(&[1, 4, 4096, 1024], Dtype::F32).unwrap();
    buf.eval().unwrap();
    let row = Array::ones(&[1, 4, 1, 1024], Dtype::F32).unwrap();
    row.eval().unwrap();
    let t = Instant::now();
    for i in 0..100 {
        buf = buf.slice_update(&row, &[0, 0, i, 0], &[1, 4, i + 1, 1024], &[1, 1, 1, 1]).unwrap();
        buf.eval().unwrap();
    }
    println!("slice_update of a 64 MiB buffer: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 100.0);
    let t = Instant::now();
    let mut y = x.clone();
    for _ in 0..n {
        y = y.add(&x).unwrap();
        y.eval().unwrap();
    }
    println!("add, evaluated one by one: {:.2} us/op", t.elapsed().as_secs_f64() * 1e6 / n as f64);
}
