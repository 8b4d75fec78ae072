//! The pieces of MLX's CUDA wheel that compiling its kernels takes: the
//! version (its `version.h`), the module sources and device headers (the
//! `jit_source_*` strings built into `libmlx.so`) and the include folders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSymbol};

use super::KernelError;

/// The MLX version the kernel names of `plan.rs` are written for: MLX
/// builds them in its host code, which changes between versions, and a
/// cache entry under a name MLX no longer asks for is dead weight (or,
/// with changed kernel arguments, wrong).
pub const MLX_VERSION: &str = "0.32.4";

/// The device headers every module is compiled with, in MLX's order
/// (`jit_module.cpp`'s `g_headers`), by `jit_source_` name; each is
/// included as `mlx/backend/cuda/device/NAME.cuh` (`config` as `config.h`).
pub const DEVICE_HEADERS: [&str; 17] = [
    "atomic_ops",
    "binary_ops",
    "cast_op",
    "config",
    "complex",
    "cute_dequant",
    "fp16_math",
    "gemm_sm70",
    "hadamard",
    "indexing",
    "qmm_naive",
    "qmm_sm80",
    "qmm_sm90",
    "scatter_ops",
    "unary_ops",
    "ternary_ops",
    "utils",
];

/// The include name of a device header.
pub fn include_name(header: &str) -> String {
    let file = if header == "config" { "config.h".to_string() } else { format!("{header}.cuh") };
    format!("mlx/backend/cuda/device/{file}")
}

/// An installed MLX CUDA wheel (its `mlx/` folder), checked and read.
#[derive(Debug)]
pub struct MlxCuda {
    /// The wheel's `mlx/` folder.
    pub dir: PathBuf,
    /// Every `jit_source_NAME` string of `libmlx.so`, by NAME.
    pub sources: BTreeMap<String, String>,
}

impl MlxCuda {
    /// Opens the wheel's `mlx/` folder: refuses any MLX but [`MLX_VERSION`],
    /// and reads the module sources out of `lib/libmlx.so`.
    pub fn open(dir: &Path) -> Result<MlxCuda, KernelError> {
        let version_h = dir.join("include/mlx/version.h");
        let library = dir.join("lib/libmlx.so");
        if !version_h.is_file() || !library.is_file() {
            return Err(KernelError::NoMlxCuda { dir: dir.to_path_buf() });
        }
        let text =
            std::fs::read_to_string(&version_h).map_err(|cause| KernelError::Io { path: version_h.clone(), cause })?;
        let found = version_from_header(&text).ok_or_else(|| KernelError::Library {
            path: version_h.clone(),
            message: "no MLX_VERSION_* defines".into(),
        })?;
        if found != MLX_VERSION {
            return Err(KernelError::MlxVersion { path: version_h, found, expected: MLX_VERSION });
        }
        let map = crate::ingest::mmap::map_file(&library)
            .map_err(|e| KernelError::Library { path: library.clone(), message: e.to_string() })?;
        let sources = jit_sources(&map).map_err(|message| KernelError::Library { path: library.clone(), message })?;
        for name in DEVICE_HEADERS.iter().chain(&["gather", "qmm_naive"]) {
            if !sources.contains_key(*name) {
                return Err(KernelError::Library {
                    path: library.clone(),
                    message: format!("no jit_source_{name} symbol (not MLX's CUDA build?)"),
                });
            }
        }
        Ok(MlxCuda { dir: dir.to_path_buf(), sources })
    }

    /// The source of module or header `name`.
    pub fn source(&self, name: &str) -> Option<&str> {
        self.sources.get(name).map(String::as_str)
    }
}

/// `major.minor.patch` from the `MLX_VERSION_{MAJOR,MINOR,PATCH}` defines of
/// MLX's `version.h`.
pub fn version_from_header(text: &str) -> Option<String> {
    let define = |name: &str| {
        text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("#define") && words.next() == Some(name))
                .then(|| words.next().and_then(|v| v.parse::<u32>().ok()))
                .flatten()
        })
    };
    Some(format!("{}.{}.{}", define("MLX_VERSION_MAJOR")?, define("MLX_VERSION_MINOR")?, define("MLX_VERSION_PATCH")?))
}

/// The NAME of a `jit_source_NAME` symbol: `mlx::core::jit_source_NAME`
/// (`_ZN3mlx4core{len}jit_source_NAME E`, with an `L` before the length for
/// internal linkage as the wheel has it).
fn jit_source_name(symbol: &str) -> Option<&str> {
    let rest = symbol.strip_prefix("_ZN3mlx4core")?;
    let rest = rest.strip_prefix('L').unwrap_or(rest);
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let len: usize = rest[..digits].parse().ok()?;
    let ident = rest[digits..].strip_suffix('E')?;
    (ident.len() == len).then_some(())?;
    ident.strip_prefix("jit_source_")
}

/// Every `jit_source_NAME` string of an ELF shared library: each symbol is a
/// NUL-terminated char array; its address is mapped to a file offset
/// through the section holding it. A name defined twice (one copy per
/// translation unit) must hold the same text.
fn jit_sources(data: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for symbol in file.symbols() {
        let Some(name) = symbol.name().ok().and_then(jit_source_name) else { continue };
        let index = symbol.section_index().ok_or_else(|| format!("jit_source_{name} is in no section"))?;
        let section = file.section_by_index(index).map_err(|e| e.to_string())?;
        let (file_offset, file_size) =
            section.file_range().ok_or_else(|| format!("jit_source_{name}'s section has no file data"))?;
        let at = symbol
            .address()
            .checked_sub(section.address())
            .filter(|&o| o < file_size)
            .ok_or_else(|| format!("jit_source_{name} lies outside its section"))?;
        let start = usize::try_from(file_offset + at).map_err(|e| e.to_string())?;
        let end = usize::try_from(file_offset + file_size).map_err(|e| e.to_string())?;
        let bytes = data.get(start..end).ok_or_else(|| format!("jit_source_{name} lies past the end of the file"))?;
        let len = bytes.iter().position(|&b| b == 0).ok_or_else(|| format!("jit_source_{name} has no NUL"))?;
        let text = std::str::from_utf8(&bytes[..len]).map_err(|e| format!("jit_source_{name}: {e}"))?;
        if let Some(previous) = out.insert(name.to_string(), text.to_string())
            && previous != text
        {
            return Err(format!("jit_source_{name} is defined twice with different text"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_names() {
        assert_eq!(jit_source_name("_ZN3mlx4coreL20jit_source_qmm_naiveE"), Some("qmm_naive"));
        assert_eq!(jit_source_name("_ZN3mlx4core17jit_source_gatherE"), Some("gather"));
        // The length must be the identifier's.
        assert_eq!(jit_source_name("_ZN3mlx4coreL18jit_source_gatherE"), None);
        assert_eq!(jit_source_name("_ZN3mlx4core2cu6gatherE"), None);
    }

    #[test]
    fn version_defines() {
        let h = "#pragma once\n#define MLX_VERSION_MAJOR 0\n#define MLX_VERSION_MINOR 32\n#define MLX_VERSION_PATCH 4\n#define MLX_VERSION_NUMERIC \\\n";
        assert_eq!(version_from_header(h).as_deref(), Some("0.32.4"));
        assert_eq!(version_from_header("#define MLX_VERSION_MAJOR 0\n"), None);
    }

    #[test]
    fn include_names() {
        assert_eq!(include_name("config"), "mlx/backend/cuda/device/config.h");
        assert_eq!(include_name("utils"), "mlx/backend/cuda/device/utils.cuh");
    }
}
