//! Turning next-token logits into a token: penalties, then greedy or
//! temperature sampling restricted by top-k, top-p and min-p, from a seeded
//! generator. The order and the semantics follow mlx-lm's `sample_utils`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

/// How to pick tokens. The defaults pick greedily with no penalty.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of recent tokens (1: off).
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token seen recently (0: off).
    pub presence_penalty: f32,
    /// Subtracted once per occurrence of a recent token (0: off).
    pub frequency_penalty: f32,
    /// How many of the latest tokens the penalties look at.
    pub penalty_window: usize,
    /// Seed of the generator (`None`: a fresh random seed).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_window: 64,
            seed: None,
        }
    }
}

/// A sampling parameter with a range, so that every front end (the CLI's
/// flags, a request's fields, a bundle's generation defaults) checks it as
/// [`SamplingParams::validate`] does and words the range alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// [`SamplingParams::temperature`].
    Temperature,
    /// [`SamplingParams::top_p`].
    TopP,
    /// [`SamplingParams::min_p`].
    MinP,
    /// [`SamplingParams::repetition_penalty`].
    RepetitionPenalty,
    /// [`SamplingParams::presence_penalty`].
    PresencePenalty,
    /// [`SamplingParams::frequency_penalty`].
    FrequencyPenalty,
}

impl Param {
    /// The field's name (as in [`SamplingParams`] and Hugging Face's
    /// `generation_config.json`).
    pub fn name(self) -> &'static str {
        match self {
            Param::Temperature => "temperature",
            Param::TopP => "top_p",
            Param::MinP => "min_p",
            Param::RepetitionPenalty => "repetition_penalty",
            Param::PresencePenalty => "presence_penalty",
            Param::FrequencyPenalty => "frequency_penalty",
        }
    }

    /// What a valid value is, completing "must be ...".
    pub fn requirement(self) -> &'static str {
        match self {
            Param::Temperature => "a finite number >= 0",
            Param::TopP => "in (0, 1]",
            Param::MinP => "in [0, 1]",
            Param::RepetitionPenalty => "a finite number > 0",
            Param::PresencePenalty | Param::FrequencyPenalty => "in [-2, 2]",
        }
    }

    /// Whether `value` is valid. NaN never is.
    pub fn accepts(self, value: f32) -> bool {
        match self {
            Param::Temperature => value.is_finite() && value >= 0.0,
            Param::TopP => value > 0.0 && value <= 1.0,
            Param::MinP => (0.0..=1.0).contains(&value),
            Param::RepetitionPenalty => value.is_finite() && value > 0.0,
            Param::PresencePenalty | Param::FrequencyPenalty => (-2.0..=2.0).contains(&value),
        }
    }

    /// `value` if valid, else [`Error::InvalidParameter`] naming the field.
    pub fn check(self, value: f32) -> Result<f32> {
        if self.accepts(value) {
            Ok(value)
        } else {
            Err(Error::InvalidParameter {
                name: self.name(),
                message: format!("must be {}, got {value}", self.requirement()),
            })
        }
    }
}

impl SamplingParams {
    /// Checks every field's range, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        Param::Temperature.check(self.temperature)?;
        Param::TopP.check(self.top_p)?;
        Param::MinP.check(self.min_p)?;
        Param::RepetitionPenalty.check(self.repetition_penalty)?;
        Param::PresencePenalty.check(self.presence_penalty)?;
        Param::FrequencyPenalty.check(self.frequency_penalty)?;
        Ok(())
    }

    fn penalties_active(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// A chosen token and its log-probability under the (penalised) distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// `log p(token)` before temperature and filtering.
    pub logprob: f32,
    /// The log-normaliser of that distribution (the log-sum-exp of the
    /// penalised logits `sample` left in place): `logit - log_z` is any
    /// token's log-probability ([`crate::generate::top_logprobs`]).
    pub log_z: f32,
}

/// A sampler: parameters plus its random generator.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Each token's weight in the last unfiltered draw (kept to reuse the memory).
    weights: Vec<f32>,
    /// The sums of `weights` by blocks of [`BLOCK`] tokens.
    block_sums: Vec<f64>,
}

impl Sampler {
    /// A sampler for `params` (validated).
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        Ok(Sampler { params, rng: StdRng::seed_from_u64(seed), weights: Vec::new(), block_sums: Vec::new() })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (modified in place by the penalties),
    /// given the tokens so far (`history`, prompt included).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<Sampled> {
        if logits.is_empty() {
            return Err(Error::InvalidParameter { name: "logits", message: "empty".into() });
        }
        if self.params.penalties_active() {
            apply_penalties(&self.params, logits, history);
        }
        let max = make_finite(logits)?;
        let inv_t = 1.0 / self.params.temperature;
        let p = &self.params;
        // A temperature so small its inverse overflows picks as greedily as 0.
        let greedy = p.temperature == 0.0 || !inv_t.is_finite();
        if !greedy && (p.top_k == 0 || p.top_k >= logits.len()) && p.top_p >= 1.0 && p.min_p == 0.0 {
            let (token, total) = self.draw_unfiltered(logits, max, inv_t);
            // At temperature 1 the draw's weights were the normaliser's terms.
            let sum = if inv_t == 1.0 { total } else { exp_sum(logits, max) };
            let log_z = max + sum.ln() as f32;
            return Ok(Sampled { token, logprob: logits[token as usize] - log_z, log_z });
        }
        let log_z = max + exp_sum(logits, max).ln() as f32;
        if greedy {
            let token = argmax(logits);
            return Ok(Sampled { token, logprob: logits[token as usize] - log_z, log_z });
        }
        // Candidates as (logprob, token); filters narrow them down.
        let mut cands: Vec<(f32, u32)> = Vec::new();
        if self.params.top_p < 1.0 {
            // Tokens below (1 - top_p)/V in probability together hold less than
            // 1 - top_p, so the nucleus never needs them: skip them before sorting.
            let floor = ((1.0 - self.params.top_p) / logits.len() as f32).ln();
            cands.extend(logits.iter().enumerate().map(|(i, &l)| (l - log_z, i as u32)).filter(|c| c.0 >= floor));
        } else {
            cands.extend(logits.iter().enumerate().map(|(i, &l)| (l - log_z, i as u32)));
        }
        let by_prob_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if self.params.top_k > 0 && self.params.top_k < cands.len() {
            cands.select_nth_unstable_by(self.params.top_k - 1, by_prob_desc);
            cands.truncate(self.params.top_k);
        }
        if self.params.top_p < 1.0 {
            cands.sort_unstable_by(by_prob_desc);
            let mut mass = 0.0f32;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                mass += c.0.exp();
                if mass >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep);
        }
        if self.params.min_p > 0.0 {
            let top = cands.iter().map(|c| c.0).fold(f32::NEG_INFINITY, f32::max);
            let threshold = top + self.params.min_p.ln();
            cands.retain(|c| c.0 >= threshold);
        }
        // Categorical draw from softmax(logprob / temperature) over the candidates.
        let top = cands.iter().map(|c| c.0).fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> = cands.iter().map(|c| f64::from((c.0 - top) * inv_t).exp()).collect();
        let total: f64 = weights.iter().sum();
        let u = self.rng.random::<f64>() * total;
        // The top candidate's weight is 1, so some weight is positive.
        let (i, _) = locate(weights.iter().copied(), u).unwrap_or((0, 0.0));
        let (logprob, token) = cands.get(i).copied().unwrap_or((logits[0] - log_z, 0));
        Ok(Sampled { token, logprob, log_z })
    }
}

impl Sampler {
    /// A categorical draw from softmax(logits / T) over the whole vocabulary
    /// (`inv_t` = 1/T, `max` the largest logit). The weights are computed once
    /// into `self.weights` with their sums by block, so the draw finds its
    /// block first and scans only that one. Returns the token and the sum
    /// of the weights.
    fn draw_unfiltered(&mut self, logits: &[f32], max: f32, inv_t: f32) -> (u32, f64) {
        // Every weight is written below: the buffer keeps its length (the
        // vocabulary's) from draw to draw and is never cleared.
        self.weights.resize(logits.len(), 0.0);
        self.block_sums.clear();
        for (l, w) in logits.chunks(BLOCK).zip(self.weights.chunks_mut(BLOCK)) {
            self.block_sums.push(exp_block(l, max, inv_t, w));
        }
        let total: f64 = self.block_sums.iter().sum();
        let u = self.rng.random::<f64>() * total;
        // The largest logit's weight is 1, so some block sum is positive.
        let Some((b, u)) = locate(self.block_sums.iter().copied(), u) else { return (argmax(logits), total) };
        let start = b * BLOCK;
        let block = &self.weights[start..(start + BLOCK).min(logits.len())];
        let token = match locate(block.iter().map(|&w| f64::from(w)), u) {
            Some((i, _)) => (start + i) as u32,
            // A block whose weights all underflowed in f32: the most likely token.
            None => argmax(logits),
        };
        (token, total)
    }
}

/// Where `u`, drawn uniformly in `[0, Σ weights)`, falls among `weights`:
/// the first index whose running sum passes it, with what is left of `u`
/// inside that weight. When rounding leaves `u` at or past the total, the
/// last index with a positive weight. `None` when no weight is positive.
/// (The categorical draw's one walk: over block sums, then one block's
/// weights, or over the filtered candidates.)
fn locate(weights: impl IntoIterator<Item = f64>, mut u: f64) -> Option<(usize, f64)> {
    let mut last = None;
    for (i, w) in weights.into_iter().enumerate() {
        if w > 0.0 {
            if u < w {
                return Some((i, u));
            }
            u -= w;
            last = Some((i, w));
        }
    }
    last
}

/// Tokens per block of the sums below: each of the eight f32 lanes adds 32
/// terms of at most 1 (relative rounding error under 2e-6) before the
/// block's total goes into an f64.
const BLOCK: usize = 256;

/// `Σ e^(l - max)` over `logits` (all `<= max`), accurate to ~2e-6 relative.
fn exp_sum(logits: &[f32], max: f32) -> f64 {
    let mut terms = [0.0f32; BLOCK];
    logits.chunks(BLOCK).map(|l| exp_block(l, max, 1.0, &mut terms)).sum()
}

/// `Σ e^((l - max) · inv_t)` over one block, each term written to `out`
/// (at least as long as `logits`). Two simple loops, which the compiler
/// vectorises (one loop doing both does not).
fn exp_block(logits: &[f32], max: f32, inv_t: f32, out: &mut [f32]) -> f64 {
    let out = &mut out[..logits.len()];
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = exp_nonpositive((l - max) * inv_t);
    }
    lane_sum(out)
}

/// The sum of `v` in eight f32 lanes (added apart, then in f64).
fn lane_sum(v: &[f32]) -> f64 {
    let mut lanes = [0.0f32; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] += c[i];
        }
    }
    lanes.iter().chain(tail).map(|&x| f64::from(x)).sum()
}

/// `e^x` for `x <= 0` within 2 ulp (Cephes' `expf`: `x = n ln 2 + r`,
/// a degree-6 polynomial in `r`, then `2^n` through the exponent bits);
/// 0 below -87 (where f32's normal range ends), for -inf and for NaN.
/// Branch-free, so the loops above vectorise where a libm call per
/// element would not (the sampler evaluates it over the vocabulary,
/// 49,152 times a token for SmolLM2).
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to the nearest integer, which then sits in the
    // low bits of the sum (read there, not with a saturating `as` cast,
    // which would keep the loop from vectorising).
    const ROUND: f32 = 12_582_912.0;
    let xc = if x > -87.0 { x } else { -87.0 };
    let rounded = xc * std::f32::consts::LOG2_E + ROUND;
    let n = rounded - ROUND;
    let n_int = (rounded.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    // ln 2 in two parts, so that n * LN2_HI is exact.
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    if x >= -87.0 { e * scale } else { 0.0 }
}

/// Makes `logits` safe to normalise and returns their maximum: a NaN (a
/// broken model or an overflow) becomes impossible (-inf) rather than
/// poisoning the normaliser and with it every probability; when some logits
/// are +inf, those tokens share all the mass (0) and the others get none.
/// Refuses logits where no token is possible.
fn make_finite(logits: &mut [f32]) -> Result<f32> {
    let mut max = f32::NEG_INFINITY;
    for l in logits.iter_mut() {
        if l.is_nan() {
            *l = f32::NEG_INFINITY;
        }
        max = max.max(*l);
    }
    if max == f32::INFINITY {
        for l in logits.iter_mut() {
            *l = if *l == f32::INFINITY { 0.0 } else { f32::NEG_INFINITY };
        }
        max = 0.0;
    }
    if max == f32::NEG_INFINITY {
        return Err(Error::InvalidParameter { name: "logits", message: "no token has a finite logit".into() });
    }
    Ok(max)
}

/// The index of the largest logit (the first one on ties, like MLX's
/// argmax). A NaN never wins: it compares below every number.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Repetition (sign-aware, multiplicative), presence and frequency penalties
/// over the last `penalty_window` tokens of `history`.
fn apply_penalties(p: &SamplingParams, logits: &mut [f32], history: &[u32]) {
    let recent = &history[history.len().saturating_sub(p.penalty_window)..];
    let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for &t in recent {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &n) in &counts {
        let Some(l) = logits.get_mut(t as usize) else { continue };
        if p.repetition_penalty != 1.0 {
            *l = if *l < 0.0 { *l * p.repetition_penalty } else { *l / p.repetition_penalty };
        }
        *l -= p.presence_penalty + p.frequency_penalty * n as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(SamplingParams { seed: Some(7), ..params }).unwrap()
    }

    #[test]
    fn greedy_picks_the_first_maximum() {
        let mut s = sampler(SamplingParams::default());
        let mut logits = vec![0.0, 3.0, 1.0, 3.0];
        let got = s.sample(&mut logits, &[]).unwrap();
        assert_eq!(got.token, 1);
        let z = (1.0f32 + 3f32.exp() * 2.0 + 1f32.exp()).ln();
        assert!((got.logprob - (3.0 - z)).abs() < 1e-6);
    }

    #[test]
    fn filters_restrict_the_draw() {
        let logits = [5.0f32, 4.0, 3.0, -1.0, -2.0, -3.0];
        let draw = |params: SamplingParams| {
            let mut s = sampler(SamplingParams { temperature: 1.0, ..params });
            (0..2000).map(|_| s.sample(&mut logits.clone(), &[]).unwrap().token).collect::<Vec<_>>()
        };
        let seen = |v: &[u32]| {
            let mut s: Vec<u32> = v.to_vec();
            s.sort_unstable();
            s.dedup();
            s
        };
        assert_eq!(seen(&draw(SamplingParams { top_k: 2, ..Default::default() })), vec![0, 1]);
        // p = softmax: [0.665, 0.245, 0.090, ...]: top_p 0.8 keeps the first two.
        assert_eq!(seen(&draw(SamplingParams { top_p: 0.8, ..Default::default() })), vec![0, 1]);
        // min_p 0.2 keeps p >= 0.133: the first two.
        assert_eq!(seen(&draw(SamplingParams { min_p: 0.2, ..Default::default() })), vec![0, 1]);
        // Unfiltered, the third token shows up too.
        assert!(seen(&draw(SamplingParams::default())).contains(&2));
    }

    #[test]
    fn frequencies_follow_the_temperature() {
        let logits = [1.0f32, 0.0];
        for t in [0.5f32, 1.0, 2.0] {
            let mut s = sampler(SamplingParams { temperature: t, ..Default::default() });
            let n = 20_000;
            let ones = (0..n).filter(|_| s.sample(&mut logits.clone(), &[]).unwrap().token == 0).count();
            let p = 1.0 / (1.0 + (-1.0 / t).exp());
            let freq = ones as f32 / n as f32;
            let se = (p * (1.0 - p) / n as f32).sqrt();
            assert!((freq - p).abs() < 6.0 * se, "t={t}: {freq} vs {p}");
        }
    }

    #[test]
    fn draws_across_blocks_follow_the_weights() {
        // Weights 1, 2, 3 on tokens in three different blocks, every other
        // token impossible; then 600 equally likely tokens (blocks of 256,
        // 256 and 88).
        let mut sparse = vec![f32::NEG_INFINITY; 1000];
        sparse[10] = 0.0;
        sparse[300] = 2f32.ln();
        sparse[900] = 3f32.ln();
        let mut s = sampler(SamplingParams { temperature: 1.0, ..Default::default() });
        let n = 30_000;
        let mut counts = [0usize; 3];
        for _ in 0..n {
            let t = s.sample(&mut sparse.clone(), &[]).unwrap().token;
            counts[[10, 300, 900].iter().position(|&x| x == t).expect("an impossible token")] += 1;
        }
        let mut blocks = [0usize; 3];
        for _ in 0..n {
            blocks[s.sample(&mut vec![0.0; 600], &[]).unwrap().token as usize / 256] += 1;
        }
        for (got, p) in counts.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]).chain(blocks.iter().zip([
            256.0 / 600.0,
            256.0 / 600.0,
            88.0 / 600.0,
        ])) {
            let freq = *got as f64 / n as f64;
            let se = (p * (1.0 - p) / n as f64).sqrt();
            assert!((freq - p).abs() < 6.0 * se, "{freq} vs {p}");
        }
    }

    #[test]
    fn locate_walks_the_running_sums() {
        let w = [0.5, 0.0, 1.0, 0.25];
        assert_eq!(locate(w, 0.0), Some((0, 0.0)));
        assert_eq!(locate(w, 0.75), Some((2, 0.25)));
        assert_eq!(locate(w, 1.625), Some((3, 0.125)));
        // Rounding past the total: the last positive weight, never a zero one.
        assert_eq!(locate([0.5, 0.25, 0.0], 0.75), Some((1, 0.25)));
        assert_eq!(locate([0.0, 0.0], 0.0), None);
    }

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -87.0 {
            let got = f64::from(exp_nonpositive(x));
            let want = f64::from(x).exp();
            worst = worst.max((got - want).abs() / want);
            x -= 0.000_37;
        }
        assert!(worst < 3e-7, "largest relative error {worst}");
        for x in [-87.5, -1000.0, f32::NEG_INFINITY, f32::NAN] {
            assert_eq!(exp_nonpositive(x), 0.0, "{x}");
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    #[test]
    fn the_normaliser_is_the_log_sum_exp() {
        let logits: Vec<f32> = (0..49_153).map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 10.0).collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: f64 = logits.iter().map(|&l| (f64::from(l) - f64::from(max)).exp()).sum();
        let got = exp_sum(&logits, max);
        assert!((got - want).abs() / want < 2e-6, "{got} vs {want}");
    }

    #[test]
    fn seeds_reproduce() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s =
                Sampler::new(SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() }).unwrap();
            (0..50).map(|_| s.sample(&mut logits.clone(), &[]).unwrap().token).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn penalties_follow_their_definitions() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            penalty_window: 3,
            ..Default::default()
        };
        let mut logits = vec![4.0, -4.0, 4.0, 1.0];
        // Token 2 is outside the window of 3.
        apply_penalties(&p, &mut logits, &[2, 0, 1, 0]);
        assert_eq!(logits, vec![4.0 / 2.0 - 0.5 - 0.5, -4.0 * 2.0 - 0.5 - 0.25, 4.0, 1.0]);
    }

    #[test]
    fn nan_and_infinite_logits_never_win_by_accident() {
        // A NaN first used to win argmax (nothing compares greater than it)
        // and, with temperature, poisoned every probability.
        assert_eq!(argmax(&[f32::NAN, 1.0, 2.0, f32::NAN]), 2);
        for temperature in [0.0, 1.0] {
            let mut s = sampler(SamplingParams { temperature, top_p: 0.9, ..Default::default() });
            for _ in 0..50 {
                let got = s.sample(&mut [f32::NAN, -30.0, 5.0, f32::NAN], &[]).unwrap();
                assert_eq!(got.token, 2, "t={temperature}");
                assert!(got.logprob.is_finite() && got.logprob <= 0.0, "{got:?}");
            }
            let got = s.sample(&mut [1.0, f32::INFINITY, f32::NAN], &[]).unwrap();
            assert_eq!((got.token, got.logprob), (1, 0.0));
            let err = s.sample(&mut [f32::NAN, f32::NEG_INFINITY], &[]).unwrap_err().to_string();
            assert!(err.contains("logits: no token has a finite logit"), "{err}");
        }
    }

    #[test]
    fn bad_parameters_are_named() {
        let cases = [
            (SamplingParams { temperature: -1.0, ..Default::default() }, "temperature"),
            (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p"),
            (SamplingParams { min_p: 1.5, ..Default::default() }, "min_p"),
            (SamplingParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty"),
            (SamplingParams { presence_penalty: 3.0, ..Default::default() }, "presence_penalty"),
            (SamplingParams { frequency_penalty: f32::NAN, ..Default::default() }, "frequency_penalty"),
        ];
        for (p, name) in cases {
            let err = Sampler::new(p).err().expect("refused").to_string();
            assert!(err.starts_with(&format!("invalid parameter {name}:")), "{err}");
        }
    }
}
