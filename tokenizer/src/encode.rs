//! Text to ids: added tokens, normalizers, pre-tokenizers and BPE, each as
//! `tokenizers` 0.23 does it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::Tokenizer;
use crate::error::Result;
use crate::pipeline::{Behavior, Normalizer, PreTokenizer, PrependScheme, SplitPattern};
use crate::regex::SplitRegex;

/// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the
/// rest for code points from U+0100 up.
pub fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\u{FFFD}')
        };
    }
    table
}

/// A piece of the input on its way to the model: its text and where it
/// started in the original input (Metaspace's `first` scheme asks).
struct Piece {
    text: String,
    origin: usize,
    /// Whether the text is already byte-level spelled.
    byte_level: bool,
}

/// Splits `text` at `pattern`'s matches as `tokenizers`' `NormalizedString::split`.
fn split_with(matches: &[(usize, usize, bool)], behavior: Behavior) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(matches.len());
    match behavior {
        Behavior::Isolated => out.extend(matches.iter().map(|&(s, e, _)| (s, e))),
        Behavior::Removed => out.extend(matches.iter().filter(|m| !m.2).map(|&(s, e, _)| (s, e))),
        Behavior::Contiguous => {
            let mut previous = false;
            for &(s, e, is_match) in matches {
                match out.last_mut() {
                    Some(last) if is_match == previous => last.1 = e,
                    _ => out.push((s, e)),
                }
                previous = is_match;
            }
        }
        Behavior::MergedWithPrevious => {
            let mut previous = false;
            for &(s, e, is_match) in matches {
                match out.last_mut() {
                    Some(last) if is_match && !previous => last.1 = e,
                    _ => out.push((s, e)),
                }
                previous = is_match;
            }
        }
        Behavior::MergedWithNext => {
            let mut previous = false;
            for &(s, e, is_match) in matches.iter().rev() {
                match out.last_mut() {
                    Some(last) if is_match && !previous => last.0 = s,
                    _ => out.push((s, e)),
                }
                previous = is_match;
            }
            out.reverse();
        }
    }
    out
}

/// Match and gap ranges covering `text` (`tokenizers`' `Pattern::find_matches`);
/// a regex that exceeds its backtracking limits is an error.
fn find_matches(text: &str, pattern: &SplitPattern, regex: Option<&SplitRegex>) -> Result<Vec<(usize, usize, bool)>> {
    if text.is_empty() {
        return Ok(vec![(0, 0, false)]);
    }
    let mut out = Vec::new();
    let mut prev = 0;
    let mut push = |start: usize, end: usize, out: &mut Vec<(usize, usize, bool)>| {
        if prev != start {
            out.push((prev, start, false));
        }
        out.push((start, end, true));
        prev = end;
    };
    match (pattern, regex) {
        (SplitPattern::Regex(_), Some(re)) => {
            for (s, e) in re.find_all(text)? {
                push(s, e, &mut out);
            }
        }
        (SplitPattern::Literal(lit), _) => {
            for (s, m) in text.match_indices(lit.as_str()) {
                push(s, s + m.len(), &mut out);
            }
        }
        (SplitPattern::Numeric, _) => {
            for (s, c) in text.char_indices().filter(|(_, c)| c.is_numeric()) {
                push(s, s + c.len_utf8(), &mut out);
            }
        }
        (SplitPattern::Regex(_), None) => {}
    }
    if prev != text.len() {
        out.push((prev, text.len(), false));
    }
    Ok(out)
}

/// One BPE symbol: a token id and its neighbours (a linked list over the word).
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: isize,
    next: isize,
    removed: bool,
}

impl Tokenizer {
    /// Token ids of `text`; `add_special` adds what the post-processor adds
    /// (typically BOS).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let pipeline = &self.layout.pipeline;
        let mut ids = Vec::with_capacity(text.len() / 3 + 4);
        if add_special {
            ids.extend_from_slice(&pipeline.prefix);
        }
        for (start, end, added) in self.split_added(text) {
            if let Some(id) = added {
                ids.push(id);
                continue;
            }
            let mut piece = text[start..end].to_string();
            for n in &pipeline.normalizers {
                match n {
                    Normalizer::Replace { pattern, content } => piece = piece.replace(pattern.as_str(), content),
                    Normalizer::Prepend { prepend } => {
                        if !piece.is_empty() {
                            piece.insert_str(0, prepend);
                        }
                    }
                }
            }
            if piece.is_empty() {
                continue;
            }
            let mut pieces = vec![Piece { text: piece, origin: start, byte_level: false }];
            for (pre, splitter) in pipeline.pre_tokenizers.iter().zip(&self.splitters) {
                let mut split = Vec::with_capacity(pieces.len());
                for p in pieces {
                    split.extend(self.pre_tokenize(pre, splitter.as_ref(), p)?);
                }
                pieces = split;
            }
            for p in &pieces {
                self.bpe(p, &mut ids)?;
            }
        }
        if add_special {
            ids.extend_from_slice(&pipeline.suffix);
        }
        Ok(ids)
    }

    /// Ranges of `text` between and at added tokens (leftmost-longest matches,
    /// as `tokenizers`' Aho-Corasick split).
    fn split_added(&self, text: &str) -> Vec<(usize, usize, Option<u32>)> {
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let mut last = 0;
        let mut i = 0;
        while i < bytes.len() {
            let found = self.added_lengths.get(&bytes[i]).and_then(|lengths| {
                lengths.iter().find_map(|&len| {
                    let candidate = text.get(i..i + len)?;
                    self.added_by_text.get(candidate).map(|&id| (len, id))
                })
            });
            match found {
                Some((len, id)) => {
                    if last < i {
                        out.push((last, i, None));
                    }
                    out.push((i, i + len, Some(id)));
                    i += len;
                    last = i;
                }
                None => i += 1,
            }
        }
        if last < text.len() {
            out.push((last, text.len(), None));
        }
        out
    }

    fn pre_tokenize(&self, pre: &PreTokenizer, regex: Option<&SplitRegex>, piece: Piece) -> Result<Vec<Piece>> {
        let sub = |p: &Piece, ranges: Vec<(usize, usize)>| -> Vec<Piece> {
            ranges
                .into_iter()
                .filter(|(s, e)| e > s)
                .map(|(s, e)| Piece { text: p.text[s..e].to_string(), origin: p.origin + s, byte_level: p.byte_level })
                .collect()
        };
        match pre {
            PreTokenizer::Split { pattern, behavior } => {
                let matches = find_matches(&piece.text, pattern, regex)?;
                Ok(sub(&piece, split_with(&matches, *behavior)))
            }
            PreTokenizer::ByteLevel { add_prefix_space, use_regex } => {
                let mut piece = piece;
                if *add_prefix_space && !piece.text.starts_with(' ') {
                    piece.text.insert(0, ' ');
                }
                let mut pieces = if *use_regex {
                    let matches = find_matches(&piece.text, &SplitPattern::Regex(String::new()), regex)?;
                    sub(&piece, split_with(&matches, Behavior::Isolated))
                } else {
                    vec![piece]
                };
                for p in &mut pieces {
                    p.byte_level = true;
                }
                Ok(pieces)
            }
            PreTokenizer::Metaspace { replacement, prepend, split } => {
                let mut piece = piece;
                let mut rep = [0u8; 4];
                let rep: &str = replacement.encode_utf8(&mut rep);
                piece.text = piece.text.replace(' ', rep);
                let add = match prepend {
                    PrependScheme::Always => !piece.text.starts_with(*replacement),
                    PrependScheme::First => !piece.text.starts_with(*replacement) && piece.origin == 0,
                    PrependScheme::Never => false,
                };
                if add {
                    piece.text.insert_str(0, rep);
                }
                if *split {
                    let matches = find_matches(&piece.text, &SplitPattern::Literal(rep.to_string()), None)?;
                    Ok(sub(&piece, split_with(&matches, Behavior::MergedWithNext)))
                } else {
                    Ok(vec![piece])
                }
            }
        }
    }

    /// The initial symbols of a piece: one per character (byte-level: one
    /// per byte), with byte fallback and unknown tokens as `tokenizers`' BPE.
    fn initial_symbols(&self, piece: &Piece) -> Result<Vec<u32>> {
        let model = &self.layout.pipeline.model;
        let mut ids = Vec::with_capacity(piece.text.len());
        if piece.byte_level {
            // The piece's characters are spelled from bytes on the fly.
            let mut unk: Option<u32> = None;
            for &b in piece.text.as_bytes() {
                match self.byte_level_ids[b as usize] {
                    Some(id) => {
                        if let Some(u) = unk.take() {
                            ids.push(u);
                        }
                        ids.push(id);
                    }
                    None => self.unknown(&mut ids, &mut unk, model.fuse_unk),
                }
            }
            if let Some(u) = unk {
                ids.push(u);
            }
            return Ok(ids);
        }
        let bytes = self.bytes();
        let mut unk: Option<u32> = None;
        for (i, c) in piece.text.char_indices() {
            let s = &piece.text[i..i + c.len_utf8()];
            if let Some(id) = self.layout.id_of(bytes, s)? {
                if let Some(u) = unk.take() {
                    ids.push(u);
                }
                ids.push(id);
                continue;
            }
            if model.byte_fallback {
                let fallback: Option<Vec<u32>> = s.bytes().map(|b| self.byte_tokens[b as usize]).collect();
                if let Some(fallback) = fallback {
                    // tokenizers keeps a pending unknown token across byte fallbacks.
                    ids.extend(fallback);
                    continue;
                }
            }
            self.unknown(&mut ids, &mut unk, model.fuse_unk);
        }
        if let Some(u) = unk {
            ids.push(u);
        }
        Ok(ids)
    }

    fn unknown(&self, ids: &mut Vec<u32>, pending: &mut Option<u32>, fuse: bool) {
        let Some(unk) = self.layout.pipeline.model.unk else {
            return;
        };
        match (*pending, fuse) {
            (Some(_), true) => {}
            (Some(u), false) => ids.push(u),
            (None, _) => {}
        }
        *pending = Some(unk);
    }

    /// BPE on one piece, appending its ids (`tokenizers`' `Word::merge_all`:
    /// the lowest-ranked pair first, leftmost among equals).
    fn bpe(&self, piece: &Piece, out: &mut Vec<u32>) -> Result<()> {
        let bytes = self.bytes();
        let model = &self.layout.pipeline.model;
        if model.ignore_merges {
            let whole = if piece.byte_level { self.spell_byte_level(&piece.text) } else { piece.text.clone() };
            if let Some(id) = self.layout.id_of(bytes, &whole)? {
                out.push(id);
                return Ok(());
            }
        }
        let initial = self.initial_symbols(piece)?;
        let n = initial.len();
        let mut symbols: Vec<Symbol> = initial
            .iter()
            .enumerate()
            .map(|(i, &id)| Symbol {
                id,
                prev: i as isize - 1,
                next: if i + 1 < n { i as isize + 1 } else { -1 },
                removed: false,
            })
            .collect();
        // (rank, position, merged id), smallest rank then position first.
        let mut queue: BinaryHeap<Reverse<(u32, usize, u32)>> = BinaryHeap::with_capacity(n);
        for i in 0..n.saturating_sub(1) {
            if let Some((rank, merged)) = self.layout.merge(bytes, symbols[i].id, symbols[i + 1].id) {
                queue.push(Reverse((rank, i, merged)));
            }
        }
        while let Some(Reverse((_, pos, merged))) = queue.pop() {
            let current = symbols[pos];
            if current.removed || current.next < 0 {
                continue;
            }
            let next = current.next as usize;
            let right = symbols[next];
            // A stale entry: the pair at `pos` changed since it was queued.
            if self.layout.merge(bytes, current.id, right.id).is_none_or(|(_, m)| m != merged) {
                continue;
            }
            symbols[pos].id = merged;
            symbols[pos].next = right.next;
            symbols[next].removed = true;
            if right.next >= 0 {
                symbols[right.next as usize].prev = pos as isize;
            }
            let current = symbols[pos];
            if current.prev >= 0 {
                let prev = current.prev as usize;
                if let Some((rank, m)) = self.layout.merge(bytes, symbols[prev].id, current.id) {
                    queue.push(Reverse((rank, prev, m)));
                }
            }
            if current.next >= 0
                && let Some((rank, m)) = self.layout.merge(bytes, current.id, symbols[current.next as usize].id)
            {
                queue.push(Reverse((rank, pos, m)));
            }
        }
        out.extend(symbols.iter().filter(|s| !s.removed).map(|s| s.id));
        Ok(())
    }

    fn spell_byte_level(&self, text: &str) -> String {
        text.bytes().map(|b| self.stand_ins[b as usize]).collect()
    }
}
