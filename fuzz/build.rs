//! The fuzz targets link the compiler, surgery and runtime crates, which load
//! libmlx at run time: give them the rpath (and, for CUDA builds, the link
//! flags) that mlxcel-mlx chose; link args do not propagate from a dependency.
fn main() {
    if let Ok(args) = std::env::var("DEP_MLX_LINK_ARGS") {
        for arg in args.split(' ') {
            println!("cargo::rustc-link-arg={arg}");
        }
    }
}
