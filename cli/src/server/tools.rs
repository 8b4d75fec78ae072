//! OpenAI function tools on `/v1/chat/completions`: `tools`, `tool_choice`
//! and `parallel_tool_calls` checked field by field, the conversation's
//! tool calls and tool results put into the chat template's form, and the
//! grammar that enforces the calls.
//!
//! Calls are written in the Hermes markup, one block per call:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! or, for a Llama 3 template ([`ToolFormat::Llama3`]), as one bare
//! `{"name": "get_weather", "parameters": {...}}`. A template that renders
//! tools itself ([`ToolFormat::Hermes`]: Qwen 2.5 and 3, Hermes; Llama 3.1
//! and 3.2) gets `tools`, assistant `tool_calls` and `tool` messages as
//! they are. A template without tool support (SmolLM2, Gemma 3) gets the
//! fallback: the tools described in a system-prompt preamble, an
//! assistant's calls as its text in the Hermes markup, and tool results as
//! a user turn of `<tool_response>` blocks (Hermes' own rendering, which
//! keeps templates that insist on alternating roles working).
//!
//! What is enforced, by a Lark grammar whose arguments are llguidance's
//! `%json` of each tool's `parameters` ([`grammar`]): `required` = one call
//! (one or more with `parallel_tool_calls`) of one of the tools with valid
//! arguments; a named function = one call of that one; `auto` = either free
//! text that does not start as a call does (`<tool_call>`, Llama 3:
//! `{"name"`), or calls as `required`;
//! `none` = no tools rendered, no grammar, nothing parsed.

use mlxcel_runtime::chat::{Message, ToolFormat};
use mlxcel_runtime::constraint::Grammar;
use mlxcel_runtime::tool_grammar::{CallLayout, HERMES, LLAMA3, call_grammar};
use serde_json::{Map, Value, json};

use crate::errors::ApiError;

/// The longest function name (OpenAI's limit).
const MAX_NAME: usize = 64;

/// One function tool.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// Its name: `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    /// Its arguments' schema (no `parameters`: an empty object).
    pub parameters: Value,
    /// The request's tool object, as the template and the preamble show it.
    pub spec: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// No calls: tools are not rendered.
    None,
    /// Text or calls, the model's choice.
    Auto,
    /// At least one call.
    Required,
    /// One call of this function.
    Named(String),
}

/// A request's tools, checked.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The tools, in the request's order.
    pub tools: Vec<Tool>,
    /// What the model may or must do.
    pub choice: Choice,
    /// Several calls in one answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// How calls are written: the template's layout ([`layout`]), Hermes'
    /// until [`Tools::for_template`].
    pub layout: &'static CallLayout,
}

/// How a template's model writes calls: Llama 3's bare JSON for a Llama 3
/// template, else Hermes' markup (the fallback's too).
pub fn layout(format: ToolFormat) -> &'static CallLayout {
    match format {
        ToolFormat::Llama3 => &LLAMA3,
        ToolFormat::Hermes | ToolFormat::None => &HERMES,
    }
}

impl Tools {
    /// These tools, their calls written as a template of `format` has them.
    pub fn for_template(self, format: ToolFormat) -> Tools {
        Tools { layout: layout(format), ..self }
    }

    /// Whether the answer is read for calls (any choice but `none`).
    pub fn active(&self) -> bool {
        self.choice != Choice::None
    }

    /// Whether the answer may be text instead of calls (`auto`).
    pub fn text_allowed(&self) -> bool {
        self.choice == Choice::Auto
    }
}

fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|v| !v.is_null())
}

/// The request's `tools`, `tool_choice` and `parallel_tool_calls`; `None`
/// when it gives no tools (and no `tool_choice` other than `none`).
pub fn parse(object: &Map<String, Value>) -> Result<Option<Tools>, ApiError> {
    let parallel = match field(object, "parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid_param("parallel_tool_calls", "parallel_tool_calls must be a boolean")),
    };
    let tools = match field(object, "tools") {
        None => Vec::new(),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid_param("tools", "tools must not be empty (leave it out for no tools)"));
        }
        Some(Value::Array(items)) => items.iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid_param("tools", "tools must be a list of tool objects")),
    };
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(ApiError::invalid_param(
                format!("tools[{i}].function.name"),
                format!("two tools are named {:?}", t.name),
            ));
        }
    }
    let choice = match field(object, "tool_choice") {
        None if tools.is_empty() => Choice::None,
        None => Choice::Auto,
        Some(c) => choice(c, &tools)?,
    };
    if tools.is_empty() && choice != Choice::None {
        return Err(ApiError::invalid_param("tool_choice", "tool_choice needs tools"));
    }
    if tools.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tools { tools, choice, parallel, layout: &HERMES }))
}

/// `tools[i]`: `{"type": "function", "function": {"name", "description",
/// "parameters", "strict"}}`.
fn tool(i: usize, value: &Value) -> Result<Tool, ApiError> {
    let at = format!("tools[{i}]");
    let Value::Object(object) = value else {
        return Err(ApiError::invalid_param(at, "a tool must be an object"));
    };
    if let Some(key) = object.keys().find(|k| !["type", "function"].contains(&k.as_str())) {
        return Err(ApiError::invalid_param(format!("{at}.{key}"), format!("unknown field {key:?}")));
    }
    match object.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::unsupported(
                &format!("{at}.type"),
                &format!(": tools of type {other:?} (only \"function\")"),
            ));
        }
        None => return Err(ApiError::invalid_param(format!("{at}.type"), "a tool needs a string `type`")),
    }
    let Some(Value::Object(function)) = object.get("function") else {
        return Err(ApiError::invalid_param(format!("{at}.function"), "a function tool needs a `function` object"));
    };
    let known = ["name", "description", "parameters", "strict"];
    if let Some(key) = function.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::invalid_param(format!("{at}.function.{key}"), format!("unknown field {key:?}")));
    }
    let name = match function.get("name").and_then(Value::as_str) {
        Some(n) if valid_name(n) => n.to_string(),
        _ => {
            return Err(ApiError::invalid_param(
                format!("{at}.function.name"),
                format!("a function name is 1 to {MAX_NAME} of a-z, A-Z, 0-9, _ and -"),
            ));
        }
    };
    if function.get("description").is_some_and(|d| !d.is_string() && !d.is_null()) {
        return Err(ApiError::invalid_param(format!("{at}.function.description"), "description must be a string"));
    }
    if function.get("strict").is_some_and(|d| !d.is_boolean() && !d.is_null()) {
        return Err(ApiError::invalid_param(format!("{at}.function.strict"), "strict must be a boolean"));
    }
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}, "additionalProperties": false}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::invalid_param(
                format!("{at}.function.parameters"),
                "parameters must be a JSON schema object",
            ));
        }
    };
    Ok(Tool { name, parameters, spec: value.clone() })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function",
/// "function": {"name": ...}}` naming one of `tools`.
fn choice(value: &Value, tools: &[Tool]) -> Result<Choice, ApiError> {
    let refuse = |message: String| ApiError::invalid_param("tool_choice", message);
    match value {
        Value::String(s) => match s.as_str() {
            "none" => Ok(Choice::None),
            "auto" => Ok(Choice::Auto),
            "required" => Ok(Choice::Required),
            other => Err(refuse(format!("tool_choice {other:?} is not one of none, auto, required or a function"))),
        },
        Value::Object(object) => {
            match object.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(ApiError::unsupported(
                        "tool_choice",
                        &format!(": a tool_choice of type {other:?} (only \"function\")"),
                    ));
                }
                None => return Err(refuse("a tool_choice object needs `\"type\": \"function\"`".into())),
            }
            if let Some(key) = object.keys().find(|k| !["type", "function"].contains(&k.as_str())) {
                return Err(refuse(format!("unknown field {key:?} in tool_choice")));
            }
            let name = object.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name else {
                return Err(refuse("a tool_choice object needs `function.name`".into()));
            };
            if !tools.iter().any(|t| t.name == name) {
                return Err(refuse(format!("tool_choice names the function {name:?}, which is not in tools")));
            }
            Ok(Choice::Named(name.to_string()))
        }
        _ => Err(refuse("tool_choice must be a string or a function object".into())),
    }
}

/// The grammar that enforces `tools.choice` (`None` for `none`).
pub fn grammar(tools: &Tools) -> Option<Grammar> {
    let callable: Vec<(&str, &Value)> = match &tools.choice {
        Choice::None => return None,
        Choice::Named(name) => {
            tools.tools.iter().filter(|t| &t.name == name).map(|t| (t.name.as_str(), &t.parameters)).collect()
        }
        Choice::Auto | Choice::Required => tools.tools.iter().map(|t| (t.name.as_str(), &t.parameters)).collect(),
    };
    let several = tools.parallel && !matches!(tools.choice, Choice::Named(_));
    Some(call_grammar(tools.layout, &callable, tools.text_allowed(), several))
}

/// One call in the Hermes markup (what the model writes, and how a past
/// call is shown to a template without tool support).
pub fn call_block(name: &str, arguments: &Value) -> String {
    let h = &HERMES;
    format!("{}{{\"name\": {}, \"{}\": {arguments}}}{}", h.before, Value::from(name), h.arguments_key, h.after)
}

/// The system-prompt preamble that offers `tools` to a template without
/// tool support.
fn preamble(tools: &Tools) -> String {
    let mut text = String::from(
        "You can call functions (tools). The available tools, with their arguments as JSON schemas:\n<tools>\n",
    );
    for tool in &tools.tools {
        text.push_str(&tool.spec.to_string());
        text.push('\n');
    }
    text.push_str("</tools>\nTo call a tool, answer with one block per call and nothing else:\n");
    let h = &HERMES;
    let form =
        format!("{}{{\"name\": <function name>, \"{}\": <arguments object>}}{}", h.before, h.arguments_key, h.after);
    text.push_str(&form);
    text.push('\n');
    text.push_str("The results come back as <tool_response> blocks.");
    if let Choice::Named(name) = &tools.choice {
        text.push_str(&format!(" Call the function {name:?} now."));
    } else if tools.choice == Choice::Required {
        text.push_str(" Call a tool now.");
    }
    text
}

/// The conversation as the template takes it, and the tools it is given:
/// as they are for a template that renders tools, else the fallback
/// (preamble, calls and results as text) described in the module's docs.
pub fn conversation(messages: Vec<Message>, tools: Option<&Tools>, format: ToolFormat) -> (Vec<Message>, Vec<Value>) {
    let tools = tools.filter(|t| t.active());
    if format != ToolFormat::None {
        let specs = tools.map(|t| t.tools.iter().map(|t| t.spec.clone()).collect()).unwrap_or_default();
        return (messages, specs);
    }
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        if m.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            // Results of one turn's calls share one user turn.
            match out.last_mut() {
                Some(last) if last.role == "user" && last.content.starts_with("<tool_response>") => {
                    last.content.push('\n');
                    last.content.push_str(&block);
                }
                _ => out.push(Message::new("user", block)),
            }
            continue;
        }
        let mut text = m.content;
        for call in &m.tool_calls {
            let function = &call["function"];
            let block = call_block(function["name"].as_str().unwrap_or_default(), &function["arguments"]);
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&block);
        }
        out.push(Message::new(m.role, text));
    }
    if let Some(tools) = tools {
        let preamble = preamble(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{preamble}", first.content);
            }
            _ => out.insert(0, Message::new("system", preamble)),
        }
    }
    (out, Vec::new())
}

/// An assistant message's `tool_calls[j]`, checked, in the template's form
/// (the arguments an object, as tool-calling templates read them).
pub fn history_call(i: usize, j: usize, call: &Value) -> Result<Value, ApiError> {
    let at = format!("messages[{i}].tool_calls[{j}]");
    let Value::Object(object) = call else {
        return Err(ApiError::invalid_param(at, "a tool call must be an object"));
    };
    if object.get("type").and_then(Value::as_str).is_some_and(|t| t != "function") {
        return Err(ApiError::unsupported(&format!("{at}.type"), " (only \"function\")"));
    }
    let id = object.get("id").and_then(Value::as_str).unwrap_or_default();
    let function = object.get("function");
    let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str) else {
        return Err(ApiError::invalid_param(format!("{at}.function.name"), "a tool call needs a function name"));
    };
    let arguments = match function.and_then(|f| f.get("arguments")) {
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Err(ApiError::invalid_param(
                    format!("{at}.function.arguments"),
                    "arguments must be a JSON object, as a string",
                ));
            }
        },
        _ => {
            return Err(ApiError::invalid_param(
                format!("{at}.function.arguments"),
                "a tool call needs its arguments, a JSON object as a string",
            ));
        }
    };
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(body: Value) -> Result<Option<Tools>, ApiError> {
        parse(body.as_object().unwrap())
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn tools_and_tool_choice_are_checked_and_named() {
        let t = parsed(json!({"tools": [weather()]})).unwrap().unwrap();
        assert_eq!((t.choice.clone(), t.parallel, t.tools[0].name.as_str()), (Choice::Auto, true, "get_weather"));
        assert!(parsed(json!({})).unwrap().is_none());
        assert!(parsed(json!({"tool_choice": "none"})).unwrap().is_none());
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let t = parsed(json!({"tools": [weather()], "tool_choice": named, "parallel_tool_calls": false})).unwrap();
        assert_eq!(t.unwrap().choice, Choice::Named("get_weather".into()));
        let param = |body: Value| parsed(body).unwrap_err().param.unwrap();
        let unknown = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(param(json!({"tools": [weather()], "tool_choice": unknown})), "tool_choice");
        assert_eq!(param(json!({"tools": [weather()], "tool_choice": "sometimes"})), "tool_choice");
        assert_eq!(param(json!({"tool_choice": "required"})), "tool_choice");
        assert_eq!(param(json!({"tools": [{"type": "code_interpreter"}]})), "tools[0].type");
        assert_eq!(
            param(json!({"tools": [weather(), {"type": "function", "function": {"name": "a b"}}]})),
            "tools[1].function.name"
        );
        assert_eq!(param(json!({"tools": [weather(), weather()]})), "tools[1].function.name");
        let bad = json!({"type": "function", "function": {"name": "f", "parameters": [1]}});
        assert_eq!(param(json!({"tools": [bad]})), "tools[0].function.parameters");
        assert_eq!(param(json!({"tools": []})), "tools");
        assert_eq!(param(json!({"tools": [weather()], "parallel_tool_calls": 1})), "parallel_tool_calls");
    }

    #[test]
    fn the_grammar_follows_the_choice() {
        let mut t = parsed(json!({"tools": [weather()], "tool_choice": "required"})).unwrap().unwrap();
        let Some(Grammar::Lark(lark)) = grammar(&t) else { panic!("no grammar") };
        assert!(lark.starts_with("start: call (\"\\n\" call)*\n"), "{lark}");
        assert!(lark.contains(r#"fn0: "{\"name\": \"get_weather\", \"arguments\": " args0 "}""#), "{lark}");
        assert!(lark.contains("args0: %json {"), "{lark}");
        t.choice = Choice::Auto;
        t.parallel = false;
        let Some(Grammar::Lark(lark)) = grammar(&t) else { panic!("no grammar") };
        assert!(lark.starts_with("start: TEXT | call\n"), "{lark}");
        t.choice = Choice::None;
        assert!(grammar(&t).is_none());
    }

    #[test]
    fn the_fallback_renders_calls_and_results_as_text() {
        let tools = parsed(json!({"tools": [weather()], "tool_choice": "required"})).unwrap().unwrap();
        let call = history_call(
            1,
            0,
            &json!({"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}),
        )
        .unwrap();
        let mut assistant = Message::new("assistant", "");
        assistant.tool_calls = vec![call];
        let mut result = Message::new("tool", "18 C");
        result.tool_call_id = Some("call_1".into());
        let messages = vec![Message::new("user", "Weather?"), assistant, result.clone(), result];
        let (out, specs) = conversation(messages.clone(), Some(&tools), ToolFormat::None);
        assert!(specs.is_empty());
        assert_eq!(out.len(), 4, "{out:?}");
        assert!(out[0].role == "system" && out[0].content.contains("get_weather"), "{out:?}");
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert_eq!(out[3].role, "user");
        assert_eq!(out[3].content.matches("<tool_response>\n18 C\n</tool_response>").count(), 2, "{out:?}");
        // A template that renders tools gets everything as it is.
        let (out, specs) = conversation(messages.clone(), Some(&tools), ToolFormat::Hermes);
        assert_eq!((out, specs), (messages, vec![weather()]));
        let e = history_call(0, 1, &json!({"function": {"name": "f", "arguments": "[1]"}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls[1].function.arguments"));
    }
}
