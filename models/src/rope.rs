//! Rotary position embeddings as numbers: which features rotate and at
//! which frequencies, from a config's `rope_theta` and `rope_scaling`
//! (mirroring mlx-lm's `initialize_rope`). Each backend turns a
//! [`RopeSpec`] into its own form ([`crate::Loader::rope`]).

use mlxcel_arch::RopeScaling;

use crate::error::{Error, Result};

/// How positions become angles.
#[derive(Clone, Debug, PartialEq)]
pub enum Frequencies {
    /// Pair `i`'s angle at position `p` is `p · scale / base^(2i/dims)`
    /// (`scale` below one stretches positions: linear scaling).
    Base {
        /// The base (`rope_theta`).
        base: f32,
        /// Multiplies positions.
        scale: f32,
    },
    /// Pair `i`'s angle at position `p` is `p / wavelengths[i]` (llama3,
    /// YaRN, LongRoPE: MLX's `freqs`).
    Wavelengths(Vec<f32>),
}

/// A rotary embedding of the first `dims` features of each head.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// Rotated features at the start of each head (even).
    pub dims: usize,
    /// Pairs are adjacent features (GPT-J) rather than the two halves.
    pub traditional: bool,
    /// The angles.
    pub frequencies: Frequencies,
    /// Multiplies the rotated features before rotating (YaRN's and
    /// LongRoPE's mscale).
    pub input_scale: Option<f32>,
}

impl RopeSpec {
    /// Plain RoPE with base `base`; `scale` multiplies positions.
    pub fn new(dims: usize, traditional: bool, base: f32, scale: f32) -> RopeSpec {
        RopeSpec { dims, traditional, frequencies: Frequencies::Base { base, scale }, input_scale: None }
    }

    /// RoPE with explicit wavelengths, `dims / 2` of them.
    pub fn with_wavelengths(
        dims: usize,
        traditional: bool,
        wavelengths: Vec<f32>,
        input_scale: Option<f32>,
    ) -> Result<RopeSpec> {
        if wavelengths.len() != dims / 2 {
            return Err(Error::Config(format!(
                "rope: {} frequencies for {dims} rotated dimensions (need {})",
                wavelengths.len(),
                dims / 2
            )));
        }
        Ok(RopeSpec { dims, traditional, frequencies: Frequencies::Wavelengths(wavelengths), input_scale })
    }

    /// The RoPE of `dims` rotated features with base `base` and the config's
    /// frequency scaling.
    pub fn scaled(
        dims: usize,
        traditional: bool,
        base: f32,
        scaling: Option<&RopeScaling>,
        max_position_embeddings: usize,
    ) -> Result<RopeSpec> {
        let exponents = |d: usize| (0..d / 2).map(move |i| (2 * i) as f64 / d as f64);
        match scaling {
            None => Ok(RopeSpec::new(dims, traditional, base, 1.0)),
            Some(RopeScaling::Linear { factor }) => Ok(RopeSpec::new(dims, traditional, base, 1.0 / factor)),
            Some(&RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let factor = f64::from(factor);
                let (low, high) = (f64::from(low_freq_factor), f64::from(high_freq_factor));
                let old = f64::from(original_max_position_embeddings);
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                let freqs: Vec<f32> = exponents(dims)
                    .map(|e| {
                        let f = (f64::from(base) as f32).powf(e as f32);
                        let wavelen = 2.0 * std::f32::consts::PI * f;
                        let f = if f64::from(wavelen) > low_wavelen { f * factor as f32 } else { f };
                        let medium = f64::from(wavelen) > high_wavelen && f64::from(wavelen) < low_wavelen;
                        if medium {
                            let smooth = ((old / f64::from(wavelen)) - low) / (high - low);
                            (f64::from(f) / ((1.0 - smooth) / factor + smooth)) as f32
                        } else {
                            f
                        }
                    })
                    .collect();
                RopeSpec::with_wavelengths(dims, traditional, freqs, None)
            }
            Some(&RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            }) => {
                let factor = f64::from(factor);
                let original = f64::from(original_max_position_embeddings);
                let (beta_fast, beta_slow) = (f64::from(beta_fast), f64::from(beta_slow));
                let (mscale, mscale_all_dim) = (f64::from(mscale), f64::from(mscale_all_dim));
                let b = f64::from(base);
                let d = dims as f64;
                let correction = |rot: f64| d * (original / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * b.ln());
                let low = correction(beta_fast).floor().max(0.0);
                let high = correction(beta_slow).ceil().min(d - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                let get_mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
                let input_scale = get_mscale(mscale) / get_mscale(mscale_all_dim);
                let freqs: Vec<f32> = exponents(dims)
                    .enumerate()
                    .map(|(i, e)| {
                        let extra = (b as f32).powf(e as f32);
                        let inter = factor as f32 * extra;
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0) as f32;
                        let mask = 1.0 - ramp;
                        (inter * extra) / (inter * mask + extra * (1.0 - mask))
                    })
                    .collect();
                let s = (input_scale != 1.0).then_some(input_scale as f32);
                RopeSpec::with_wavelengths(dims, traditional, freqs, s)
            }
            Some(RopeScaling::Longrope { long_factor, original_max_position_embeddings }) => {
                let freqs: Vec<f32> =
                    exponents(dims).zip(long_factor).map(|(e, l)| l * (base.powf(e as f32))).collect();
                let original = *original_max_position_embeddings as f64;
                let factor = max_position_embeddings as f64 / original;
                let scale = if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / original.ln()).sqrt() };
                let s = (scale != 1.0).then_some(scale as f32);
                RopeSpec::with_wavelengths(dims, traditional, freqs, s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wavelengths_must_cover_half_the_rotated_features() {
        assert!(RopeSpec::with_wavelengths(8, false, vec![1.0; 4], None).is_ok());
        let err = RopeSpec::with_wavelengths(8, false, vec![1.0; 3], None).unwrap_err();
        assert!(err.to_string().contains("3 frequencies for 8 rotated dimensions (need 4)"), "{err}");
    }

    #[test]
    fn linear_scaling_divides_positions() {
        let spec = RopeSpec::scaled(64, false, 10000.0, Some(&RopeScaling::Linear { factor: 4.0 }), 4096).unwrap();
        assert_eq!(spec.frequencies, Frequencies::Base { base: 10000.0, scale: 0.25 });
    }

    #[test]
    fn llama3_scaling_stretches_only_long_wavelengths() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let spec = RopeSpec::scaled(128, false, 500000.0, Some(&scaling), 131072).unwrap();
        let Frequencies::Wavelengths(w) = &spec.frequencies else { panic!("llama3 gives explicit wavelengths") };
        assert_eq!(w.len(), 64);
        // The fastest pair (wavelength 2π < 8192/4) is untouched; the
        // slowest (wavelength ≫ 8192) is stretched by the factor.
        assert_eq!(w[0], 1.0);
        let plain = 500000f32.powf(126.0 / 128.0);
        assert!((w[63] / plain - 8.0).abs() < 1e-3, "{} vs {}", w[63], plain);
    }
}
