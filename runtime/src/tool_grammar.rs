//! The grammar of tool calls: what a model must write to call one of a
//! set of functions, each with a JSON schema for its arguments, in the
//! layout its chat template uses ([`CallLayout`]): Hermes' markup, one
//! block per call,
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! or Llama 3's bare JSON, one call: `{"name": "get_weather",
//! "parameters": {"city": "Paris"}}`.
//!
//! [`call_grammar`] builds it in llguidance's Lark syntax, each function's
//! arguments its schema through `%json` (laid out as
//! [`Grammar::JsonSchema`] lays JSON out), so a call's name is one of the
//! functions and its arguments validate against that function's schema.

use crate::constraint::{Grammar, lark_json, lark_literal};

/// How a model writes a call: `before`, `{"name": "NAME", "KEY": ARGS}`
/// (KEY [`CallLayout::arguments_key`]), `after`; calls one after another
/// separated by `separator`, when the layout has several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLayout {
    /// Text before a call's JSON object.
    pub before: &'static str,
    /// The key of the arguments in the call's object.
    pub arguments_key: &'static str,
    /// Text after a call's JSON object.
    pub after: &'static str,
    /// What separates calls; `None`: one call only.
    pub separator: Option<&'static str>,
    /// What an answer that is a call begins with, and text never does.
    pub marker: &'static str,
}

/// Hermes' `<tool_call>` blocks (Qwen 2.5 and 3, Hermes, and the fallback
/// for templates without tools).
pub const HERMES: CallLayout = CallLayout {
    before: "<tool_call>\n",
    arguments_key: "arguments",
    after: "\n</tool_call>",
    separator: Some("\n"),
    marker: "<tool_call>",
};

/// Llama 3.1 and 3.2's custom tool calls: one bare JSON object.
pub const LLAMA3: CallLayout =
    CallLayout { before: "", arguments_key: "parameters", after: "", separator: None, marker: "{\"name\"" };

impl CallLayout {
    /// A call's text up to its function's name (`<tool_call>\n{"name": "`).
    pub fn name_head(&self) -> String {
        format!("{}{{\"name\": \"", self.before)
    }

    /// A call's text from its name's closing quote up to its arguments.
    pub fn arguments_head(&self) -> String {
        format!("\", \"{}\": ", self.arguments_key)
    }

    /// A call's text after its arguments (`}\n</tool_call>`).
    pub fn tail(&self) -> String {
        format!("}}{}", self.after)
    }
}

/// The grammar of calls of `functions` (name, arguments' schema) in
/// `layout`: one call, or with `several` (when the layout has a
/// separator) one or more; with `text_allowed`, free text that does not
/// start with the layout's marker is the other choice (a model may answer
/// instead of calling).
pub fn call_grammar(
    layout: &CallLayout,
    functions: &[(&str, &serde_json::Value)],
    text_allowed: bool,
    several: bool,
) -> Grammar {
    let calls = match layout.separator {
        Some(separator) if several => format!("call ({} call)*", lark_literal(separator)),
        _ => "call".to_string(),
    };
    let mut lark = if text_allowed { format!("start: TEXT | {calls}\n") } else { format!("start: {calls}\n") };
    let alternatives: Vec<String> = (0..functions.len()).map(|i| format!("fn{i}")).collect();
    let literal = |text: &str| if text.is_empty() { String::new() } else { lark_literal(text) };
    lark.push_str(&format!(
        "call: {} ({}) {}\n",
        literal(layout.before),
        alternatives.join(" | "),
        literal(layout.after)
    ));
    for (i, (name, parameters)) in functions.iter().enumerate() {
        let name = serde_json::Value::from(*name);
        let head = lark_literal(&format!("{{\"name\": {name}, \"{}\": ", layout.arguments_key));
        lark.push_str(&format!("fn{i}: {head} args{i} \"}}\"\n"));
        lark.push_str(&format!("args{i}: {}\n", lark_json(parameters)));
    }
    // Free text, but never text that begins as a call does.
    lark.push_str(&format!("TEXT: /(?s:.+)/ & ~/(?s:{}.*)/\n", regex_literal(layout.marker)));
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
        format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n</tool_call>")
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
        let one = call_grammar(&HERMES, &functions, false, false);
        assert!(allows(&one, &block("get_weather", r#"{"city": "Paris"}"#)));
        assert!(allows(&one, &block("add", r#"{"a": 3}"#)));
        assert!(!allows(&one, &block("add", r#"{"a": "3"}"#)));
        assert!(!allows(&one, &block("add", r#"{"city": "Paris"}"#)));
        assert!(!allows(&one, &block("sub", r#"{"a": 3}"#)));
        assert!(!allows(&one, "Hello"));
        let two = format!("{}\n{}", block("add", r#"{"a": 1}"#), block("add", r#"{"a": 2}"#));
        assert!(!allows(&one, &two));
        let several = call_grammar(&HERMES, &functions, false, true);
        assert!(allows(&several, &two));
        assert!(allows(&several, &block("add", r#"{"a": 1}"#)));
        assert!(!allows(&several, ""));

        // Text or calls: any text that does not open a call block.
        let auto = call_grammar(&HERMES, &functions, true, true);
        assert!(allows(&auto, "Hello, <tool_call> is markup."));
        assert!(allows(&auto, "<tool_cal"));
        assert!(allows(&auto, &two));
        assert!(!allows(&auto, "<tool_call>\nHello"));
        assert!(!allows(&auto, &block("add", r#"{"a": 1.5}"#)));

        // Llama 3: one bare object, "parameters"; text must not begin as one.
        let one = call_grammar(&LLAMA3, &functions, false, true);
        assert!(allows(&one, r#"{"name": "add", "parameters": {"a": 3}}"#));
        assert!(!allows(&one, r#"{"name": "add", "arguments": {"a": 3}}"#));
        assert!(!allows(&one, &format!("{0}\n{0}", r#"{"name": "add", "parameters": {"a": 3}}"#)));
        let auto = call_grammar(&LLAMA3, &functions, true, true);
        assert!(allows(&auto, "It is sunny."));
        assert!(allows(&auto, r#"{"name": "add", "parameters": {"a": 3}}"#));
        assert!(!allows(&auto, r#"{"name": "sub", "parameters": {"a": 3}}"#));
    }
}
