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
    /// What every sequence's caches take from its first token, whatever its
    /// length, when the backend allocates them whole
    /// ([`crate::backend::Backend::fixed_cache_bytes`]).
    pub per_sequence: Option<u64>,
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
        KvSizing { layers, per_sequence: None }
    }

    /// The sizes of a backend whose sequences take `bytes` of caches each
    /// from their first token ([`crate::backend::Backend::fixed_cache_bytes`]):
    /// `layers` caches of `capacity` positions.
    pub fn fixed(layers: usize, capacity: usize, bytes: u64) -> KvSizing {
        let bytes_per_position = bytes / (layers.max(1) as u64 * capacity.max(1) as u64);
        KvSizing { layers: vec![LayerKv { bytes_per_position, window: None }; layers], per_sequence: Some(bytes) }
    }

    /// Bytes of KV state per position while a sequence is within every
    /// layer's window.
    pub fn bytes_per_token(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes_per_position).sum()
    }

    /// The most bytes the caches of a sequence holding `tokens` positions
    /// reach: all of [`KvSizing::per_sequence`] where set; else a growing
    /// cache allocates [`CACHE_CHUNK`] positions at a time past what it
    /// holds (so up to `tokens + CACHE_CHUNK − 1` positions), a sliding ring
    /// never more than its window.
    pub fn bytes_for(&self, tokens: usize) -> u64 {
        if tokens == 0 {
            return 0;
        }
        if let Some(bytes) = self.per_sequence {
            return bytes;
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
            per_sequence: None,
        };
        assert_eq!(sizing.bytes_per_token(), 20);
        assert_eq!(sizing.bytes_for(0), 0);
        assert_eq!(sizing.bytes_for(1), 10 * CACHE_CHUNK as u64 + 10 * 8);
        assert_eq!(sizing.bytes_for(1000), 10 * (1000 + CACHE_CHUNK as u64 - 1) + 10 * 8);
    }

    #[test]
    fn whole_caches_take_their_bytes_from_the_first_token() {
        // 2 layers of 64 positions, 12 bytes a position each.
        let sizing = KvSizing::fixed(2, 64, 2 * 64 * 12);
        assert_eq!(sizing.bytes_per_token(), 24);
        assert_eq!(sizing.bytes_for(0), 0);
        assert_eq!(sizing.bytes_for(1), 1536);
        assert_eq!(sizing.bytes_for(64), 1536);
    }
}
