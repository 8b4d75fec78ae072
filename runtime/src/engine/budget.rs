//! How many bytes of KV cache a sequence takes, from the model's shape:
//! what the engine's KV budget ([`super::EngineOptions::kv_budget`]) counts
//! and what a server reports.

use mlxcel_arch::ModelConfig;
use mlxcel_mlx::Dtype;

use crate::kv_cache::CACHE_CHUNK;

/// The KV cache of one layer: bytes per cached position, and the most
/// positions it keeps (a sliding window, or the `max_kv` cap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKv {
    /// Keys and values of one position: `2 × kv_heads × head_dim × dtype size`.
    pub bytes_per_position: u64,
    /// The most positions the layer's cache holds (`None`: all of them).
    pub window: Option<usize>,
}

/// The KV cache sizes of a model's layers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvSizing {
    /// One entry per layer.
    pub layers: Vec<LayerKv>,
}

impl KvSizing {
    /// The sizes of `config`'s layers with keys and values of `dtype` (the
    /// compute dtype) and every layer capped at `max_kv` positions when given
    /// (as [`crate::backend::MlxOptions::max_kv`] caps the caches).
    pub fn from_config(config: &ModelConfig, dtype: Dtype, max_kv: Option<usize>) -> KvSizing {
        let bytes_per_position = 2 * config.num_key_value_heads as u64 * config.head_dim as u64 * dtype.size() as u64;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let window = match (config.window(i), max_kv) {
                    (Some(w), Some(m)) => Some(w.min(m)),
                    (w, m) => w.or(m),
                };
                LayerKv { bytes_per_position, window }
            })
            .collect();
        KvSizing { layers }
    }

    /// Bytes of KV state per position while a sequence is within every
    /// layer's window.
    pub fn bytes_per_token(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes_per_position).sum()
    }

    /// The most bytes the caches of a sequence holding `tokens` positions
    /// reach: a growing cache allocates [`CACHE_CHUNK`] positions at a time
    /// past what it holds (so up to `tokens + CACHE_CHUNK − 1` positions), a
    /// sliding ring never more than its window.
    pub fn bytes_for(&self, tokens: usize) -> u64 {
        if tokens == 0 {
            return 0;
        }
        let allocated = tokens.saturating_add(CACHE_CHUNK - 1);
        self.layers.iter().map(|l| l.bytes_per_position * l.window.map_or(allocated, |w| w.min(allocated)) as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cap_the_bytes_and_full_layers_round_up() {
        let sizing = KvSizing {
            layers: vec![
                LayerKv { bytes_per_position: 10, window: None },
                LayerKv { bytes_per_position: 10, window: Some(8) },
            ],
        };
        assert_eq!(sizing.bytes_per_token(), 20);
        assert_eq!(sizing.bytes_for(0), 0);
        assert_eq!(sizing.bytes_for(1), 10 * CACHE_CHUNK as u64 + 10 * 8);
        assert_eq!(sizing.bytes_for(1000), 10 * (1000 + CACHE_CHUNK as u64 - 1) + 10 * 8);
    }
}
