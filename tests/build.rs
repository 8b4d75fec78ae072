//! Binaries and tests of this crate load libmlx at run time: give them an
//! rpath to the libmlx that mlxcel-mlx linked (link args do not propagate).
fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo::rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
}
