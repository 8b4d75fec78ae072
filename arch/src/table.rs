//! The architecture table: one row per supported architecture.

use std::fmt;

/// A supported model architecture.
///
/// Adding one: a row in [`TABLE`], its defaults in `config.rs`
/// ([`crate::ModelConfig::from_hf`]), its GGUF tensor names in the compiler's
/// `ingest/gguf/config.rs`, and its builder in the runtime's `models/`
/// (docs/architecture.md, "Adding an architecture").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// Llama and its family (SmolLM2, TinyLlama, ...).
    Llama,
    /// Mistral: a Llama whose layers attend over a sliding window.
    Mistral,
    /// Qwen 2 / 2.5: biases on the q/k/v projections.
    Qwen2,
    /// Qwen 3 (dense): per-head q/k RMS norms.
    Qwen3,
    /// Qwen 3 mixture of experts: Qwen 3 attention, routed SwiGLU experts.
    Qwen3Moe,
    /// Gemma 3 (text): sandwich norms with gain `1 + w`, interleaved
    /// sliding-window and global layers, GeGLU.
    Gemma3,
    /// Phi-3 / Phi-3.5 / Phi-4 mini: fused q/k/v and gate/up projections.
    Phi3,
}

/// What ingest must undo, or the runtime must know, about an architecture
/// that its config does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quirks {
    /// GGUF stores the q/k projection rows permuted (llama.cpp's converter
    /// permutes them for its interleaved RoPE); ingest permutes them back.
    pub gguf_permutes_qk: bool,
    /// RMS norms scale by `1 + w`; GGUF stores `w + 1`, Hugging Face `w`.
    pub norm_offset: bool,
    /// Queries and keys are RMS-normalised per head before RoPE.
    pub qk_norm: bool,
}

/// One row of the architecture table.
#[derive(Clone, Copy, Debug)]
pub struct ArchInfo {
    /// The architecture.
    pub arch: Architecture,
    /// The name bundles record and the runtime dispatches on.
    pub name: &'static str,
    /// Other names a bundle may record for it (older compilers wrote some).
    pub aliases: &'static [&'static str],
    /// Hugging Face `model_type` values; the first is the one written.
    pub hf_model_types: &'static [&'static str],
    /// Hugging Face class names (`architectures[0]`); the first is the one written.
    pub hf_classes: &'static [&'static str],
    /// GGUF `general.architecture` values.
    pub gguf_names: &'static [&'static str],
    /// What its configs leave unsaid.
    pub quirks: Quirks,
}

const PLAIN: Quirks = Quirks { gguf_permutes_qk: false, norm_offset: false, qk_norm: false };

/// Every supported architecture.
pub const TABLE: [ArchInfo; 7] = [
    ArchInfo {
        arch: Architecture::Llama,
        name: "llama",
        aliases: &[],
        hf_model_types: &["llama"],
        hf_classes: &["LlamaForCausalLM"],
        gguf_names: &["llama"],
        quirks: Quirks { gguf_permutes_qk: true, ..PLAIN },
    },
    ArchInfo {
        arch: Architecture::Mistral,
        name: "mistral",
        aliases: &[],
        hf_model_types: &["mistral"],
        hf_classes: &["MistralForCausalLM"],
        gguf_names: &["mistral"],
        quirks: Quirks { gguf_permutes_qk: true, ..PLAIN },
    },
    ArchInfo {
        arch: Architecture::Qwen2,
        name: "qwen2",
        aliases: &[],
        hf_model_types: &["qwen2"],
        hf_classes: &["Qwen2ForCausalLM"],
        gguf_names: &["qwen2"],
        quirks: PLAIN,
    },
    ArchInfo {
        arch: Architecture::Qwen3,
        name: "qwen3",
        aliases: &[],
        hf_model_types: &["qwen3"],
        hf_classes: &["Qwen3ForCausalLM"],
        gguf_names: &["qwen3"],
        quirks: Quirks { qk_norm: true, ..PLAIN },
    },
    ArchInfo {
        arch: Architecture::Qwen3Moe,
        name: "qwen3_moe",
        aliases: &["qwen3moe"],
        hf_model_types: &["qwen3_moe"],
        hf_classes: &["Qwen3MoeForCausalLM"],
        gguf_names: &["qwen3moe"],
        quirks: Quirks { qk_norm: true, ..PLAIN },
    },
    ArchInfo {
        arch: Architecture::Gemma3,
        name: "gemma3",
        aliases: &["gemma3_text"],
        hf_model_types: &["gemma3_text"],
        hf_classes: &["Gemma3ForCausalLM"],
        gguf_names: &["gemma3"],
        quirks: Quirks { norm_offset: true, qk_norm: true, ..PLAIN },
    },
    ArchInfo {
        arch: Architecture::Phi3,
        name: "phi3",
        aliases: &[],
        hf_model_types: &["phi3"],
        hf_classes: &["Phi3ForCausalLM"],
        gguf_names: &["phi3"],
        quirks: PLAIN,
    },
];

impl Architecture {
    /// Every supported architecture, in table order.
    pub fn all() -> impl Iterator<Item = Architecture> {
        TABLE.iter().map(|row| row.arch)
    }

    /// This architecture's row of [`TABLE`].
    pub fn info(self) -> &'static ArchInfo {
        TABLE.iter().find(|row| row.arch == self).expect("every architecture has a row in TABLE")
    }

    /// The name bundles record.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The Hugging Face `model_type` written into normalized configs.
    pub fn hf_model_type(self) -> &'static str {
        self.info().hf_model_types[0]
    }

    /// The Hugging Face class name written into normalized configs.
    pub fn hf_class(self) -> &'static str {
        self.info().hf_classes[0]
    }

    /// What its configs leave unsaid.
    pub fn quirks(self) -> Quirks {
        self.info().quirks
    }

    /// The architecture a bundle names (its name or an alias).
    pub fn from_name(name: &str) -> Option<Architecture> {
        TABLE.iter().find(|row| row.name == name || row.aliases.contains(&name)).map(|row| row.arch)
    }

    /// The architecture a Hugging Face class name or `model_type` names.
    pub fn from_hf(name: &str) -> Option<Architecture> {
        TABLE
            .iter()
            .find(|row| row.hf_classes.contains(&name) || row.hf_model_types.contains(&name))
            .map(|row| row.arch)
    }

    /// The architecture of a GGUF `general.architecture`.
    pub fn from_gguf(name: &str) -> Option<Architecture> {
        TABLE.iter().find(|row| row.gguf_names.contains(&name)).map(|row| row.arch)
    }

    /// The supported names, as error messages list them.
    pub fn names() -> Vec<&'static str> {
        TABLE.iter().map(|row| row.name).collect()
    }

    /// The supported list with Hugging Face class names, as ingest errors show it.
    pub fn supported_list() -> String {
        TABLE.iter().map(|row| format!("{} ({})", row.name, row.hf_classes[0])).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_finds_its_row_and_no_name_is_shared() {
        let mut seen = std::collections::HashSet::new();
        for row in &TABLE {
            assert_eq!(Architecture::from_name(row.name), Some(row.arch));
            for alias in row.aliases {
                assert_eq!(Architecture::from_name(alias), Some(row.arch));
            }
            for n in row.hf_model_types.iter().chain(row.hf_classes) {
                assert_eq!(Architecture::from_hf(n), Some(row.arch), "{n}");
            }
            for n in row.gguf_names {
                assert_eq!(Architecture::from_gguf(n), Some(row.arch), "{n}");
            }
            for n in std::iter::once(&row.name).chain(row.aliases) {
                assert!(seen.insert(*n), "{n} names two architectures");
            }
        }
        assert_eq!(Architecture::from_name("mamba"), None);
    }
}
