//! Pre-tokenizer regexes on a budget.
//!
//! `tokenizers` splits with Oniguruma, a backtracking engine, and so does
//! this crate (the same engine gives the same splits). A pattern that
//! backtracks catastrophically (`(a*)*b` on a run of `a`s) makes Oniguruma
//! give up with "retry-limit-in-match over", and the `onig` crate's
//! iterators turn that into a panic; a pattern that backtracks
//! polynomially runs for hours. [`SplitRegex`] searches with explicit retry
//! limits and returns [`TokenizerError::RegexLimit`] naming the pattern
//! instead.

use onig::{MatchParam, Region, SearchOptions};

use crate::error::{Result, TokenizerError};

/// Backtracking steps one match attempt may take (Oniguruma's own default,
/// so that no single match `tokenizers` accepts is refused here).
pub const RETRY_LIMIT_IN_MATCH: u32 = 10_000_000;

/// Backtracking steps one search may take over all its start positions
/// (Oniguruma's default is unlimited: a search could try a costly match at
/// every position of the text). A search of the pre-tokenizer regexes of
/// real tokenizers takes a few steps per character.
pub const RETRY_LIMIT_IN_SEARCH: u32 = 10_000_000;

/// A compiled pre-tokenizer regex whose searches are bounded.
pub struct SplitRegex {
    pattern: String,
    regex: onig::Regex,
}

impl std::fmt::Debug for SplitRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SplitRegex").field(&self.pattern).finish()
    }
}

fn match_param() -> MatchParam {
    let mut param = MatchParam::default();
    param.set_retry_limit_in_match(RETRY_LIMIT_IN_MATCH);
    // SAFETY: `param.as_raw()` is the live `OnigMatchParam` that `param`
    // owns (allocated and initialized by `MatchParam::default`, freed on
    // drop); the call only stores the limit in it. The `onig` crate has no
    // safe setter for this limit.
    unsafe {
        onig_sys::onig_set_retry_limit_in_search_of_match_param(
            param.as_raw(),
            std::os::raw::c_ulong::from(RETRY_LIMIT_IN_SEARCH),
        );
    }
    param
}

impl SplitRegex {
    /// Compiles `pattern` (Oniguruma syntax, as `tokenizers`).
    pub fn new(pattern: &str) -> Result<SplitRegex> {
        let regex = onig::Regex::new(pattern)
            .map_err(|e| TokenizerError::Regex { pattern: pattern.to_string(), message: e.to_string() })?;
        Ok(SplitRegex { pattern: pattern.to_string(), regex })
    }

    /// The pattern.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The (start, end) byte ranges of the non-overlapping matches in
    /// `text`, leftmost first, exactly as `onig`'s `find_iter` (which
    /// `tokenizers` uses), or [`TokenizerError::RegexLimit`] where a search
    /// exceeds the retry limits.
    pub fn find_all(&self, text: &str) -> Result<Vec<(usize, usize)>> {
        let mut out = Vec::new();
        let mut region = Region::new();
        let mut from = 0;
        let mut last_match_end = None;
        while from <= text.len() {
            region.clear();
            let found = self
                .regex
                .search_with_param(
                    text,
                    from,
                    text.len(),
                    SearchOptions::SEARCH_OPTION_NONE,
                    Some(&mut region),
                    match_param(),
                )
                .map_err(|e| TokenizerError::RegexLimit {
                    pattern: self.pattern.clone(),
                    offset: from,
                    message: e.description().to_string(),
                })?;
            let Some((s, e)) = found.and(region.pos(0)) else { break };
            // An empty match right after the previous match is skipped (one
            // character on), as `find_iter` does, so the loop advances.
            if s == e && last_match_end == Some(e) {
                from += text[from..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            from = e;
            last_match_end = Some(e);
            out.push((s, e));
        }
        Ok(out)
    }
}

/// Strings that make backtracking patterns show themselves: long runs of
/// one character class, and of alternating classes, with a character at the
/// end that no run continues into.
pub(crate) fn probes() -> Vec<String> {
    let mut out = Vec::new();
    for unit in ["a", " ", "1", "aa1", "a ", "\n", "é", "日", "'", ".", "a-"] {
        for tail in ["", "!", "\u{0}", "a", " "] {
            out.push(format!("{}{tail}", unit.repeat(4096 / unit.len())));
        }
    }
    out
}

/// Checks `regex` on [`probes`]: a pattern that exceeds the limits there
/// would fail on ordinary long inputs, so a bundle should not carry it.
pub(crate) fn check_probes(regex: &SplitRegex) -> Result<()> {
    for p in probes() {
        regex.find_all(&p)?;
    }
    Ok(())
}
