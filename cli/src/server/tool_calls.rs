//! Reading tool calls back out of the generated text, whole or as it
//! streams. [`CallReader`] takes the text piece by piece and gives
//! [`Piece`]s: text to show, and calls as they are written (a call's start
//! with its id and name as soon as the name is complete, then its
//! arguments' JSON text as it comes, then its end), which [`delta`] turns
//! into streamed `delta.tool_calls` entries and [`assemble`] into a whole
//! answer's `message.tool_calls` (OpenAI's shape: `{"id": "call_...",
//! "type": "function", "function": {"name", "arguments"}}`, the arguments
//! the JSON text the model wrote).
//!
//! A forced call (`required`, a named function) is read from the first
//! byte; under `auto` the text is held until it either opens a call block
//! (then it is read as calls) or cannot (then it is text, passed on).
//! Markup is never returned as content once calls are being read. The
//! calls' grammar fixes their layout ([`CallLayout`]: `<tool_call>\n{"name":
//! "f", "arguments": ARGS}\n</tool_call>` or Llama 3's `{"name": "f",
//! "parameters": ARGS}`, ARGS compact JSON, so with no raw newline); text
//! that leaves it (which the grammar does not allow) ends the reading. A
//! Hermes call ends at its closing tag; a Llama 3 call, which has none, at
//! the end of the answer. A whole answer keeps only complete calls; a stream has
//! already sent the start of a call cut short (the token budget), as
//! OpenAI's do.

use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::{Value, json};

use mlxcel_runtime::tool_grammar::CallLayout;

/// What the reader makes of the text so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `auto`, and the text is still a prefix of the call marker.
    Undecided,
    /// Free text.
    Text,
    /// Between call blocks.
    Calls,
    /// Inside call `index`'s arguments.
    Arguments { index: usize },
    /// The text left the calls' layout: nothing more is read.
    Stopped,
}

/// One piece of the answer, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text to show as content.
    Text(String),
    /// Call `index` begins (its arguments follow).
    Start { index: usize, id: String, name: String },
    /// More of call `index`'s arguments (JSON text).
    Arguments { index: usize, text: String },
    /// Call `index` is complete.
    End { index: usize },
}

/// Reads one answer's text.
pub struct CallReader {
    layout: &'static CallLayout,
    mode: Mode,
    /// The current call's arguments given out so far.
    arguments: String,
    /// Text not yet given out: all of it while undecided, else the part of
    /// a call block that is not decided yet.
    held: String,
    /// Calls begun so far.
    started: usize,
    /// Calls completed so far.
    pub calls: usize,
}

/// How far a call's head (`<tool_call>\n{"name": "f", "arguments": `) is
/// written at the start of `text` (after whitespace).
enum Head {
    /// Not complete yet, but still a head.
    Partial,
    /// Complete: the function's name and the bytes the head takes.
    Complete(String, usize),
    /// Not a call's head.
    Not,
}

fn head(layout: &CallLayout, text: &str) -> Head {
    // Each part must be matched whole, or be what the text ends with.
    fn part<'a>(rest: &'a str, expected: &str) -> Result<&'a str, Head> {
        match rest.strip_prefix(expected) {
            Some(after) => Ok(after),
            None if expected.starts_with(rest) => Err(Head::Partial),
            None => Err(Head::Not),
        }
    }
    let start = text.len() - text.trim_start().len();
    let after_open = match part(&text[start..], &layout.name_head()) {
        Ok(after) => after,
        Err(head) => return head,
    };
    // Names are [A-Za-z0-9_-]: no escapes before the closing quote.
    let Some(end) = after_open.find('"') else {
        return Head::Partial;
    };
    let name = &after_open[..end];
    match part(&after_open[end..], &layout.arguments_head()) {
        Ok(after) => Head::Complete(name.to_string(), text.len() - after.len()),
        Err(head) => head,
    }
}

impl CallReader {
    /// A reader for an answer in `layout` that may be text (`auto`) or
    /// must be calls.
    pub fn new(layout: &'static CallLayout, text_allowed: bool) -> CallReader {
        let mode = if text_allowed { Mode::Undecided } else { Mode::Calls };
        CallReader { layout, mode, arguments: String::new(), held: String::new(), started: 0, calls: 0 }
    }

    /// Takes the next piece of text; gives what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        match self.mode {
            Mode::Text if !text.is_empty() => out.push(Piece::Text(text.to_string())),
            Mode::Text | Mode::Stopped => {}
            Mode::Undecided => {
                self.held.push_str(text);
                let marker = self.layout.marker;
                if self.held.starts_with(marker) {
                    self.mode = Mode::Calls;
                    self.read_calls(&mut out);
                } else if !marker.starts_with(self.held.as_str()) {
                    self.mode = Mode::Text;
                    out.push(Piece::Text(std::mem::take(&mut self.held)));
                }
            }
            Mode::Calls | Mode::Arguments { .. } => {
                self.held.push_str(text);
                self.read_calls(&mut out);
            }
        }
        out
    }

    /// Reads what the held text decides: heads, arguments, ends.
    fn read_calls(&mut self, out: &mut Vec<Piece>) {
        loop {
            match self.mode {
                Mode::Calls => match head(self.layout, &self.held) {
                    Head::Partial => return,
                    Head::Not => {
                        self.mode = Mode::Stopped;
                        self.held.clear();
                        return;
                    }
                    Head::Complete(name, used) => {
                        self.held.drain(..used);
                        let index = self.started;
                        self.started += 1;
                        out.push(Piece::Start { index, id: call_id(), name });
                        self.mode = Mode::Arguments { index };
                    }
                },
                Mode::Arguments { index } => {
                    let tail = self.layout.tail();
                    // A tail with a closing tag ends the call where it
                    // stands (the arguments have no raw newline); a bare
                    // `}` only at the end of the answer.
                    if !self.layout.after.is_empty()
                        && let Some(end) = self.held.find(&tail)
                    {
                        let text: String = self.held.drain(..end).collect();
                        self.held.drain(..tail.len());
                        self.arguments_piece(index, text, out);
                        self.end(index, out);
                        continue;
                    }
                    // Everything but what may begin the tail.
                    let keep = (1..=tail.len()).rev().find(|&k| self.held.ends_with(&tail[..k])).unwrap_or(0);
                    let text: String = self.held.drain(..self.held.len() - keep).collect();
                    self.arguments_piece(index, text, out);
                    return;
                }
                _ => return,
            }
        }
    }

    fn arguments_piece(&mut self, index: usize, text: String, out: &mut Vec<Piece>) {
        if !text.is_empty() {
            self.arguments.push_str(&text);
            out.push(Piece::Arguments { index, text });
        }
    }

    fn end(&mut self, index: usize, out: &mut Vec<Piece>) {
        out.push(Piece::End { index });
        self.arguments.clear();
        self.calls += 1;
        self.mode = Mode::Calls;
    }

    /// The end of the answer: text still held while undecided is text; a
    /// call whose layout has no closing tag ends here when what is held is
    /// its tail and its arguments are a whole JSON object; a call left
    /// incomplete stays so.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.mode {
            Mode::Undecided if !held.is_empty() => out.push(Piece::Text(held)),
            Mode::Arguments { index } if held == self.layout.tail() => {
                if serde_json::from_str::<serde_json::Map<String, Value>>(&self.arguments).is_ok() {
                    self.end(index, &mut out);
                } else {
                    self.arguments_piece(index, held, &mut out);
                }
            }
            Mode::Arguments { index } => self.arguments_piece(index, held, &mut out),
            _ => {}
        }
        out
    }
}

/// A call's id: `call_` and 24 random letters and digits.
fn call_id() -> String {
    let tail: String = rand::rng().sample_iter(&Alphanumeric).take(24).map(char::from).collect();
    format!("call_{tail}")
}

/// A piece as a streamed chat delta: `{"content"}` or `{"tool_calls":
/// [entry]}` (a call's first entry has its id, type and name); `None` for
/// a call's end.
pub fn delta(piece: Piece) -> Option<Value> {
    match piece {
        Piece::Text(text) => Some(json!({"content": text})),
        Piece::Start { index, id, name } => Some(json!({"tool_calls": [
            {"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]})),
        Piece::Arguments { index, text } => {
            Some(json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]}))
        }
        Piece::End { .. } => None,
    }
}

/// A whole answer's pieces as its content and its complete calls.
pub fn assemble(pieces: Vec<Piece>) -> (String, Vec<Value>) {
    let mut content = String::new();
    let mut calls: Vec<(Value, bool)> = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => content.push_str(&text),
            Piece::Start { id, name, .. } => {
                calls.push((json!({"id": id, "type": "function", "function": {"name": name, "arguments": ""}}), false))
            }
            Piece::Arguments { index, text } => {
                if let Some((call, _)) = calls.get_mut(index) {
                    let arguments = format!("{}{text}", call["function"]["arguments"].as_str().unwrap_or(""));
                    call["function"]["arguments"] = arguments.into();
                }
            }
            Piece::End { index } => {
                if let Some((_, ended)) = calls.get_mut(index) {
                    *ended = true;
                }
            }
        }
    }
    (content, calls.into_iter().filter(|(_, ended)| *ended).map(|(call, _)| call).collect())
}

#[cfg(test)]
mod tests {
    use mlxcel_runtime::tool_grammar::{HERMES, LLAMA3};

    use super::*;

    const CALL: &str = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": {\"b\": \"}\"}}}\n</tool_call>";

    fn read(text_allowed: bool, pieces: &[&str]) -> Vec<Piece> {
        read_in(&HERMES, text_allowed, pieces)
    }

    fn read_in(layout: &'static CallLayout, text_allowed: bool, pieces: &[&str]) -> Vec<Piece> {
        let mut reader = CallReader::new(layout, text_allowed);
        let mut out: Vec<Piece> = pieces.iter().flat_map(|p| reader.push(p)).collect();
        out.extend(reader.finish());
        out
    }

    #[test]
    fn calls_are_read_whole_or_piece_by_piece() {
        let two = format!("{CALL}\n{CALL}");
        let bytes: Vec<String> = two.chars().map(String::from).collect();
        let splits: [Vec<&str>; 3] = [
            vec![two.as_str()],
            two.split_inclusive(['{', '\n', '"', '}']).collect(),
            bytes.iter().map(String::as_str).collect(),
        ];
        for pieces in splits {
            for text_allowed in [false, true] {
                let out = read(text_allowed, &pieces);
                let (content, calls) = assemble(out.clone());
                assert_eq!(content, "", "{out:?}");
                assert_eq!(calls.len(), 2, "{out:?}");
                for call in &calls {
                    assert!(call["id"].as_str().unwrap().starts_with("call_") && call["type"] == "function", "{call}");
                    assert_eq!(call["function"]["name"], "f");
                    assert_eq!(call["function"]["arguments"], r#"{"a": {"b": "}"}}"#);
                }
                assert_ne!(calls[0]["id"], calls[1]["id"]);
                // Streamed: the start first, with the name; then only arguments.
                let deltas: Vec<Value> = out.into_iter().filter_map(delta).collect();
                assert_eq!(deltas[0]["tool_calls"][0]["function"]["name"], "f", "{deltas:?}");
                assert!(deltas.iter().all(|d| d.get("content").is_none()), "{deltas:?}");
            }
        }
    }

    #[test]
    fn auto_text_is_passed_on_and_cut_calls_are_not_answers() {
        assert_eq!(read(true, &["<tool", " is a word"]), [Piece::Text("<tool is a word".into())]);
        assert_eq!(read(true, &["<tool"]), [Piece::Text("<tool".into())]);
        assert_eq!(read(true, &["Hello", " there"]), [Piece::Text("Hello".into()), Piece::Text(" there".into())]);
        // Cut short: streamed as far as written, no call in a whole answer, no markup.
        let cut = read(true, &["<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1"]);
        assert!(matches!(&cut[..], [Piece::Start { .. }, Piece::Arguments { .. }]), "{cut:?}");
        assert_eq!(assemble(cut), (String::new(), Vec::new()));
        assert!(read(false, &[&CALL[..20]]).is_empty());
        // Text that leaves the layout ends the reading.
        assert!(read(false, &["<tool_call>\n[1]"]).is_empty());
        let mut reader = CallReader::new(&HERMES, false);
        assert_eq!(assemble(reader.push(CALL)).1.len(), 1);
        assert_eq!(reader.calls, 1);
    }

    #[test]
    fn a_llama3_call_ends_with_the_answer() {
        let call = r#"{"name": "f", "parameters": {"a": {"b": 1}}}"#;
        let bytes: Vec<String> = call.chars().map(String::from).collect();
        for pieces in [vec![call], bytes.iter().map(String::as_str).collect()] {
            for text_allowed in [false, true] {
                let (content, calls) = assemble(read_in(&LLAMA3, text_allowed, &pieces));
                assert_eq!(content, "");
                assert_eq!(calls.len(), 1, "{pieces:?}");
                assert_eq!(calls[0]["function"]["arguments"], r#"{"a": {"b": 1}}"#);
            }
        }
        // Cut before the wrapper's brace: the arguments lack theirs, no call.
        let cut = read_in(&LLAMA3, false, &[r#"{"name": "f", "parameters": {"a": {"b": 1}}"#]);
        assert_eq!(assemble(cut), (String::new(), Vec::new()));
        assert_eq!(read_in(&LLAMA3, true, &["It is ", "sunny."]).len(), 2);
    }
}
