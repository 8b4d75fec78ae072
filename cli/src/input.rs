//! The interactive chat's input: lines of stdin read on a thread of their
//! own, so that the chat waits on one channel for the next line, the end of
//! input or Ctrl-C alike, and returns from the wait to end cleanly (the
//! engine shut down, the exit status set) instead of being killed inside a
//! blocking read.

use std::io::{self, BufRead, Read};
use std::sync::mpsc::Sender;

/// The longest line read; the rest of a longer one is skipped unread into
/// memory. Far above any context (a 128 k-token context is about 0.5 MB of
/// text), so it bounds memory without refusing a message that could fit.
pub const MAX_LINE_BYTES: usize = 4 << 20;

/// What the chat waits for.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// A line of text (without its line end), numbered from 1.
    Line {
        /// Its line number on stdin.
        number: usize,
        /// The text.
        text: String,
    },
    /// A line that cannot be a message; the chat says why and goes on.
    Skipped {
        /// Its line number on stdin.
        number: usize,
        /// Why, completing "line N ...".
        reason: String,
    },
    /// The end of input (Ctrl-D).
    End,
    /// Reading stdin failed.
    Failed(String),
    /// Ctrl-C at the prompt.
    Interrupted,
}

/// Starts reading stdin's lines on a thread that sends them on `sender`
/// (which others, the Ctrl-C handler, send on too).
pub fn read_lines(sender: Sender<Input>) {
    let reader = sender.clone();
    let started = std::thread::Builder::new().name("mlxcel-stdin".into()).spawn(move || {
        let mut stdin = io::stdin().lock();
        for number in 1.. {
            let input = read_line(&mut stdin, number, MAX_LINE_BYTES);
            let last = matches!(input, Input::End | Input::Failed(_));
            if reader.send(input).is_err() || last {
                return;
            }
        }
    });
    if let Err(e) = started {
        let _ = sender.send(Input::Failed(format!("starting the stdin reader: {e}")));
    }
}

/// Reads line `number` of `reader`: its text without the line end, or why
/// it is skipped (not UTF-8, longer than `limit` bytes).
pub fn read_line<R: BufRead>(reader: &mut R, number: usize, limit: usize) -> Input {
    let mut bytes = Vec::new();
    let limited = <&mut R as Read>::take(&mut *reader, limit as u64 + 1).read_until(b'\n', &mut bytes);
    match limited {
        Err(e) => return Input::Failed(format!("reading stdin: {e}")),
        Ok(0) => return Input::End,
        Ok(_) => {}
    }
    if !bytes.ends_with(b"\n") && bytes.len() > limit {
        // Skip the rest of the line without keeping it.
        if let Err(e) = skip_line(reader) {
            return Input::Failed(format!("reading stdin: {e}"));
        }
        return Input::Skipped { number, reason: format!("is longer than {limit} bytes; ignored") };
    }
    while bytes.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
        bytes.pop();
    }
    match String::from_utf8(bytes) {
        Ok(text) => Input::Line { number, text },
        Err(e) => Input::Skipped {
            number,
            reason: format!("is not valid UTF-8 (at byte {}); ignored", e.utf8_error().valid_up_to()),
        },
    }
}

/// Reads and drops bytes up to and including the next line end.
fn skip_line(reader: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_skipped_and_reading_goes_on() {
        let mut input: &[u8] = b"hello\r\n\xff\xfe bad\nxxxxxxxxxx\nok";
        let mut next = |n| read_line(&mut input, n, 8);
        assert_eq!(next(1), Input::Line { number: 1, text: "hello".into() });
        assert_eq!(next(2), Input::Skipped { number: 2, reason: "is not valid UTF-8 (at byte 0); ignored".into() });
        assert_eq!(next(3), Input::Skipped { number: 3, reason: "is longer than 8 bytes; ignored".into() });
        assert_eq!(next(4), Input::Line { number: 4, text: "ok".into() });
        assert_eq!(next(5), Input::End);
    }
}
