//! The grammar of tool calls: what a model must write to call one of a
//! set of functions, each with a JSON schema for its arguments, in the
//! Hermes markup (one block per call):
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! [`call_grammar`] builds it in llguidance's Lark syntax, each function's
//! arguments its schema through `%json` (laid out as
//! [`Grammar::JsonSchema`] lays JSON out), so a call's name is one of the
//! functions and its arguments validate against that function's schema.

use crate::constraint::{Grammar, lark_json, lark_literal};

/// Opens a call block.
pub const CALL_OPEN: &str = "<tool_call>";
/// Closes a call block.
pub const CALL_CLOSE: &str = "</tool_call>";

/// The grammar of calls of `functions` (name, arguments' schema): one
/// call, or with `several` one or more separated by a newline; with
/// `text_allowed`, free text that does not start with [`CALL_OPEN`] is the
/// other choice (a model may answer instead of calling).
pub fn call_grammar(functions: &[(&str, &serde_json::Value)], text_allowed: bool, several: bool) -> Grammar {
    let calls = if several { "calls" } else { "call" };
    let mut lark = if text_allowed { format!("start: TEXT | {calls}\n") } else { format!("start: {calls}\n") };
    lark.push_str("calls: call (\"\\n\" call)*\n");
    let alternatives: Vec<String> = (0..functions.len()).map(|i| format!("fn{i}")).collect();
    lark.push_str(&format!(
        "call: {} ({}) {}\n",
        lark_literal(&format!("{CALL_OPEN}\n")),
        alternatives.join(" | "),
        lark_literal(&format!("\n{CALL_CLOSE}"))
    ));
    for (i, (name, parameters)) in functions.iter().enumerate() {
        let name = serde_json::Value::from(*name);
        let head = lark_literal(&format!("{{\"name\": {name}, \"arguments\": "));
        lark.push_str(&format!("fn{i}: {head} args{i} \"}}\"\n"));
        lark.push_str(&format!("args{i}: {}\n", lark_json(parameters)));
    }
    // Free text, but never text that opens a call block.
    lark.push_str(&format!("TEXT: /(?s:.+)/ & ~/(?s:{}.*)/\n", regex_literal(CALL_OPEN)));
    Grammar::Lark(lark)
}

/// `text` as a regular expression matching it literally.
fn regex_literal(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_string() } else { format!("\\x{:02x}", c as u32) })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::constraint::tests::{compiler, walk};

    fn block(name: &str, arguments: &str) -> String {
        format!("{CALL_OPEN}\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n{CALL_CLOSE}")
    }

    /// Whether `grammar` allows `text` whole (and nothing more is needed).
    fn allows(grammar: &Grammar, text: &str) -> bool {
        let mut c = compiler().compile(grammar).unwrap();
        walk(&mut c, text).is_ok() && {
            // Complete: the end token is allowed.
            let mut logits = vec![0.0f32; 260];
            c.mask(&mut logits).is_ok() && logits[256] > f32::NEG_INFINITY
        }
    }

    #[test]
    fn calls_name_a_function_and_validate_its_arguments() {
        let weather = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                             "additionalProperties": false});
        let add = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                         "additionalProperties": false});
        let functions = [("get_weather", &weather), ("add", &add)];
        let one = call_grammar(&functions, false, false);
        assert!(allows(&one, &block("get_weather", r#"{"city": "Paris"}"#)));
        assert!(allows(&one, &block("add", r#"{"a": 3}"#)));
        assert!(!allows(&one, &block("add", r#"{"a": "3"}"#)));
        assert!(!allows(&one, &block("add", r#"{"city": "Paris"}"#)));
        assert!(!allows(&one, &block("sub", r#"{"a": 3}"#)));
        assert!(!allows(&one, "Hello"));
        let two = format!("{}\n{}", block("add", r#"{"a": 1}"#), block("add", r#"{"a": 2}"#));
        assert!(!allows(&one, &two));
        let several = call_grammar(&functions, false, true);
        assert!(allows(&several, &two));
        assert!(allows(&several, &block("add", r#"{"a": 1}"#)));
        assert!(!allows(&several, ""));

        // Text or calls: any text that does not open a call block.
        let auto = call_grammar(&functions, true, true);
        assert!(allows(&auto, "Hello, <tool_call> is markup."));
        assert!(allows(&auto, "<tool_cal"));
        assert!(allows(&auto, &two));
        assert!(!allows(&auto, "<tool_call>\nHello"));
        assert!(!allows(&auto, &block("add", r#"{"a": 1.5}"#)));
    }
}
