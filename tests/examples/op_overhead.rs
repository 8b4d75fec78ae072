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
    let t = Instant::now();
    let mut y = x.clone();
    for _ in 0..n {
        y = y.add(&x).unwrap();
        y.eval().unwrap();
    }
    println!("add, evaluated one by one: {:.2} us/op", t.elapsed().as_secs_f64() * 1e6 / n as f64);
}
