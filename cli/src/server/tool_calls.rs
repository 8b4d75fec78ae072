//! Reading tool calls back out of the generated text, whole or as it
//! streams: [`CallReader`] takes the text piece by piece and gives text to
//! show and calls, each as soon as its block is complete, in OpenAI's shape
//! (`{"id": "call_...", "type": "function", "function": {"name",
//! "arguments"}}`, the arguments a JSON string).
//!
//! A forced call (`required`, a named function) is read from the first
//! byte; under `auto` the text is held until it either opens a call block
//! (then it is read as calls) or cannot (then it is text, passed on). Markup
//! is never returned as content once calls are being read: a block cut
//! short (the token budget, a stop string) is dropped.

use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::{Value, json};

use mlxcel_runtime::tool_grammar::{CALL_CLOSE, CALL_OPEN};

/// What the reader makes of the text so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `auto`, and the text is still a prefix of the call marker.
    Undecided,
    /// Free text.
    Text,
    /// Call blocks.
    Calls,
}

/// One piece of the answer, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text to show as content.
    Text(String),
    /// A complete call, in OpenAI's shape, and its index in the answer.
    Call(usize, Value),
}

/// Reads one answer's text.
pub struct CallReader {
    mode: Mode,
    /// Text not yet given out: all of it while undecided, else the call
    /// block being written.
    held: String,
    /// Calls given out so far.
    pub calls: usize,
}

impl CallReader {
    /// A reader for an answer that may be text (`auto`) or must be calls.
    pub fn new(text_allowed: bool) -> CallReader {
        CallReader { mode: if text_allowed { Mode::Undecided } else { Mode::Calls }, held: String::new(), calls: 0 }
    }

    /// Takes the next piece of text; gives what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.mode == Mode::Text {
            if !text.is_empty() {
                out.push(Piece::Text(text.to_string()));
            }
            return out;
        }
        self.held.push_str(text);
        if self.mode == Mode::Undecided {
            if self.held.starts_with(CALL_OPEN) {
                self.mode = Mode::Calls;
            } else if !CALL_OPEN.starts_with(self.held.as_str()) {
                self.mode = Mode::Text;
                out.push(Piece::Text(std::mem::take(&mut self.held)));
                return out;
            } else {
                return out;
            }
        }
        while let Some((call, used)) = next_call(&self.held) {
            self.held.drain(..used);
            out.push(Piece::Call(self.calls, openai_call(call)));
            self.calls += 1;
        }
        out
    }

    /// The end of the answer: text still held while undecided is text; a
    /// call block left incomplete is dropped.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        match self.mode {
            Mode::Undecided if !held.is_empty() => vec![Piece::Text(held)],
            _ => Vec::new(),
        }
    }
}

/// A call in OpenAI's shape, with a fresh id.
fn openai_call((name, arguments): (String, String)) -> Value {
    json!({"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// The first complete call block of `text` (after whitespace): its name,
/// its arguments as JSON text, and the bytes it takes.
fn next_call(text: &str) -> Option<((String, String), usize)> {
    let start = text.len() - text.trim_start().len();
    let rest = text[start..].strip_prefix(CALL_OPEN)?;
    let end = rest.find(CALL_CLOSE)?;
    let used = start + CALL_OPEN.len() + end + CALL_CLOSE.len();
    let call: Value = serde_json::from_str(rest[..end].trim()).ok()?;
    let name = call.get("name")?.as_str()?.to_string();
    let arguments = call.get("arguments").filter(|a| a.is_object())?.to_string();
    Some(((name, arguments), used))
}

/// A call's id: `call_` and 24 random letters and digits.
fn call_id() -> String {
    let tail: String = rand::rng().sample_iter(&Alphanumeric).take(24).map(char::from).collect();
    format!("call_{tail}")
}

/// A call as a streamed `delta.tool_calls` entry (with its index).
pub fn delta_entry(index: usize, call: &Value) -> Value {
    let mut entry = call.clone();
    entry["index"] = index.into();
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";

    fn read(text_allowed: bool, pieces: &[&str]) -> Vec<Piece> {
        let mut reader = CallReader::new(text_allowed);
        let mut out: Vec<Piece> = pieces.iter().flat_map(|p| reader.push(p)).collect();
        out.extend(reader.finish());
        out
    }

    fn call_of(piece: &Piece) -> (String, String) {
        let Piece::Call(_, c) = piece else { panic!("{piece:?}") };
        assert!(c["id"].as_str().unwrap().starts_with("call_") && c["type"] == "function", "{c}");
        (c["function"]["name"].as_str().unwrap().into(), c["function"]["arguments"].as_str().unwrap().into())
    }

    #[test]
    fn calls_are_read_whole_or_piece_by_piece() {
        let two = format!("{CALL}\n{CALL}");
        for pieces in [vec![two.as_str()], two.split_inclusive(['{', '\n', '"']).collect()] {
            for text_allowed in [false, true] {
                let out = read(text_allowed, &pieces);
                assert_eq!(out.len(), 2, "{out:?}");
                assert!(matches!((&out[0], &out[1]), (Piece::Call(0, _), Piece::Call(1, _))), "{out:?}");
                assert_eq!(call_of(&out[0]), ("f".into(), r#"{"a":1}"#.into()));
                assert_eq!(call_of(&out[1]), ("f".into(), r#"{"a":1}"#.into()));
            }
        }
    }

    #[test]
    fn auto_text_is_passed_on_and_cut_calls_are_dropped() {
        assert_eq!(read(true, &["<tool", " is a word"]), [Piece::Text("<tool is a word".into())]);
        assert_eq!(read(true, &["<tool"]), [Piece::Text("<tool".into())]);
        assert_eq!(read(true, &["Hello", " there"]), [Piece::Text("Hello".into()), Piece::Text(" there".into())]);
        // Cut short: no call and no markup.
        assert!(read(true, &["<tool_call>\n{\"name\": \"f\""]).is_empty());
        assert!(read(false, &[&CALL[..20]]).is_empty());
        let mut reader = CallReader::new(false);
        assert_eq!(reader.push(CALL).len(), 1);
        assert_eq!(reader.calls, 1);
    }
}
