//! Writes a bundle's weights as an mlx-lm model directory, so that mlx-lm can
//! run exactly the weights mlxcel runs (benchmarks, parity checks).
//!
//! `cargo run --release -p mlxcel-tests --example export_mlx_lm -- BUNDLE OUT_DIR`

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: export_mlx_lm BUNDLE OUT_DIR");
        std::process::exit(2);
    }
    mlxcel_tests::export_mlx_lm_dir(std::path::Path::new(&args[1]), std::path::Path::new(&args[2]));
}
