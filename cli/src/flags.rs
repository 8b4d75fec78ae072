//! Value parsers of numeric flags: each refuses what the command could not
//! use, so that clap's usage error names the flag and the value ("invalid
//! value '-1' for '--temp <TEMP>': must be a finite number >= 0") before
//! any work starts.
//!
//! Numeric flags also set `allow_negative_numbers`, so that `--temp -1` is
//! read as a (refused) value rather than as an unknown flag `-1`; float
//! flags set `allow_hyphen_values`, so that `-inf` is a (refused) value too.

use mlxcel_runtime::sampler::Param;

/// A parser for a sampling parameter's flag, with the runtime's range.
pub fn sampling(param: Param) -> impl Fn(&str) -> Result<f32, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value: f32 = text.trim().parse().map_err(|_| "not a number".to_string())?;
        if param.accepts(value) { Ok(value) } else { Err(format!("must be {}", param.requirement())) }
    }
}

/// A parser for a count that must be at least `min` and at most `max`.
pub fn count(min: usize, max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value: i128 = text.trim().parse().map_err(|_| "not a whole number".to_string())?;
        if value < min as i128 {
            Err(format!("must be at least {min}"))
        } else if value > max as i128 {
            Err(format!("must be at most {max}"))
        } else {
            Ok(value as usize)
        }
    }
}

/// A parser for a seed: any whole number in 0..=2^64-1.
pub fn seed(text: &str) -> Result<u64, String> {
    text.trim().parse().map_err(|_| "must be a whole number in 0..=18446744073709551615".to_string())
}

/// Parses `--dtype`, the activations' dtype: `f32`, `bf16` or `f16`.
pub fn activation_dtype(text: &str) -> Result<mlxcel_mlx::Dtype, String> {
    match text.trim() {
        "f32" | "float32" => Ok(mlxcel_mlx::Dtype::F32),
        "bf16" | "bfloat16" => Ok(mlxcel_mlx::Dtype::BF16),
        "f16" | "float16" => Ok(mlxcel_mlx::Dtype::F16),
        _ => Err("must be f32, bf16 or f16".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_out_of_range_are_refused_with_the_range() {
        let temp = sampling(Param::Temperature);
        assert_eq!(temp("0.7"), Ok(0.7));
        assert_eq!(temp("-1").unwrap_err(), "must be a finite number >= 0");
        for bad in ["nan", "NaN", "inf", "-inf", "1e39"] {
            assert!(temp(bad).is_err(), "{bad}");
        }
        assert_eq!(temp("x").unwrap_err(), "not a number");
        assert_eq!(sampling(Param::TopP)("7").unwrap_err(), "must be in (0, 1]");
        let chunk = count(1, usize::MAX);
        assert_eq!(chunk("0").unwrap_err(), "must be at least 1");
        assert_eq!(chunk("-3").unwrap_err(), "must be at least 1");
        assert_eq!(chunk("99999999999999999999999").unwrap_err(), format!("must be at most {}", usize::MAX));
        assert_eq!(count(1, 4096)("5000").unwrap_err(), "must be at most 4096");
        assert_eq!(count(0, usize::MAX)("0"), Ok(0));
        assert!(seed("-1").is_err());
        assert_eq!(seed("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn activation_dtypes() {
        assert_eq!(activation_dtype("bf16"), Ok(mlxcel_mlx::Dtype::BF16));
        assert_eq!(activation_dtype("float32"), Ok(mlxcel_mlx::Dtype::F32));
        assert!(activation_dtype("f64").unwrap_err().contains("f32, bf16 or f16"));
    }
}
