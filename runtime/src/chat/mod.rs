//! Chat templates: the Jinja template a model ships with, rendered with
//! minijinja in Python-compatibility mode (HF templates call `.strip()`,
//! `.startswith()`, `raise_exception(...)` and friends).
//!
//! A template comes from a bundle, so from whoever built it: it is bounded
//! like any other input. Its source may be at most [`MAX_TEMPLATE_BYTES`],
//! and every render runs on [`TEMPLATE_FUEL`] (minijinja's budget of
//! instructions and created data, plus the items of every container it
//! formats, serializes, concatenates or compares: fuel.rs, operators.rs), so
//! nested loops and huge values end in an error instead of a hang. [`ChatTemplate::validate`] renders a representative
//! conversation, so the compiler and `verify` can refuse a template that
//! `run` could not use.

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value, context, machinery};
use serde::Serialize;

use crate::error::{Error, Result};

mod fuel;
mod operators;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (or `tool`).
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant's tool calls, as tool-calling templates read them
    /// (`{"id", "type": "function", "function": {"name", "arguments": {...}}}`,
    /// the arguments an object); absent from the template's view when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// A tool result's call id (role `tool`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
}

/// The largest template source accepted: 1 MiB (real templates are under
/// 20 KB; tool-calling ones under 100 KB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// The fuel of one render: minijinja spends one per instruction and about
/// one per 64 bytes of data a template creates, so this bounds a render to
/// roughly a tenth of a second and 256 MB. A ChatML conversation of 100
/// turns spends about 10,000.
pub const TEMPLATE_FUEL: u64 = 4_000_000;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    tool_format: ToolFormat,
}

/// How a template takes tools and writes tool calls, read from its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// The template renders `tools`, assistant `tool_calls` and `tool`
    /// messages itself, and calls are `<tool_call>\n{"name": ..., "arguments":
    /// {...}}\n</tool_call>` (Hermes, Qwen 2.5 and 3): its source uses both
    /// `tools` and `<tool_call>`.
    Hermes,
    /// The template renders `tools`, assistant `tool_calls` and `tool`
    /// messages itself, and a call is one bare `{"name": ..., "parameters":
    /// {...}}` (Llama 3.1 and 3.2): its source uses `tools` and `ipython`
    /// (the role of tool results) and no `<tool_call>`.
    Llama3,
    /// The template knows nothing of tools (SmolLM2, Gemma 3): whoever
    /// offers tools describes them in the prompt and renders calls and
    /// results as text, in the Hermes markup.
    None,
}

impl ChatTemplate {
    /// Compiles `source` (at most [`MAX_TEMPLATE_BYTES`]); errors point at
    /// the template's line.
    pub fn new(source: &str) -> Result<ChatTemplate> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(Error::ChatTemplate(format!(
                "the bundle's template is {} bytes, more than the limit of {MAX_TEMPLATE_BYTES}",
                source.len()
            )));
        }
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        minijinja_contrib::add_to_environment(&mut env);
        fuel::install(&mut env);
        operators::install(&mut env);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string()).map_err(|e| Error::ChatTemplate(describe(&e)))?;
        let tool_format = match (source.contains("tools"), source.contains("<tool_call>"), source.contains("ipython")) {
            (true, true, _) => ToolFormat::Hermes,
            (true, false, true) => ToolFormat::Llama3,
            _ => ToolFormat::None,
        };
        Ok(ChatTemplate { env, tool_format })
    }

    /// How this template takes tools.
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// The prompt text for `messages`, ending with the assistant's turn opener
    /// when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String> {
        self.render_with_tools(messages, &[], add_generation_prompt, bos_token, eos_token)
    }

    /// [`ChatTemplate::render`] with `tools` (OpenAI's `{"type": "function",
    /// "function": {...}}` objects) in the template's `tools` variable
    /// (`none` when there are none), for templates that render them
    /// ([`ToolFormat::Hermes`]).
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String> {
        self.render_jinja(messages, tools, add_generation_prompt, bos_token, eos_token)
            .map_err(|e| Error::ChatTemplate(describe(&e)))
    }

    /// [`ChatTemplate::render`] with minijinja's error (so callers can tell
    /// the template's own `raise_exception` from the engine's errors).
    fn render_jinja(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> std::result::Result<String, JinjaError> {
        let root = context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            tools => if tools.is_empty() { Value::from(()) } else { Value::from(minijinja::value::Serde(tools)) },
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token.unwrap_or(""),
            eos_token => eos_token.unwrap_or(""),
        };
        // The template as compiled, with its operators made to pay for
        // what they walk (operators.rs), run as `Template::render` would.
        let template = self.env.get_template("chat")?;
        let compiled = machinery::get_compiled_template(&template);
        let instructions = operators::rewrite(&compiled.instructions);
        let blocks = compiled.blocks.iter().map(|(&name, block)| (name, operators::rewrite(block))).collect();
        let mut text = String::new();
        let mut out = machinery::make_string_output(&mut text);
        machinery::eval(&self.env, &instructions, root, &blocks, &mut out, compiled.initial_auto_escape.clone())?;
        Ok(text)
    }

    /// Renders a representative conversation (a user turn; then a system
    /// prompt, a whole exchange and a second user turn) under the same fuel
    /// as [`ChatTemplate::render`]. The first must render; the second may
    /// be refused by the template itself (many raise on a system role) but
    /// must not run out of fuel or fail in the engine. This is what a
    /// whole-bundle check calls so that a template `run` would hang on, or
    /// fail on at the first prompt, is refused before anyone runs it.
    pub fn validate(&self, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<()> {
        self.render(&[Message::new("user", "Hello!")], true, bos_token, eos_token)?;
        let conversation = [
            Message::new("system", "You are a helpful assistant."),
            Message::new("user", "What is 2 + 2?"),
            Message::new("assistant", "4."),
            Message::new("user", "And 3 + 3?"),
        ];
        match self.render_jinja(&conversation, &[], true, bos_token, eos_token) {
            Err(e) if e.kind() != ErrorKind::InvalidOperation => Err(Error::ChatTemplate(describe(&e))),
            _ => Ok(()),
        }
    }
}

/// The error's message, its line and that the template is the bundle's
/// (minijinja's own message names the template "chat").
fn describe(e: &JinjaError) -> String {
    let what = match e.kind() {
        ErrorKind::OutOfFuel => {
            format!("rendering used up its fuel of {TEMPLATE_FUEL} steps (a loop that never ends?)")
        }
        _ => e.detail().map_or_else(|| e.kind().to_string(), |d| format!("{}: {d}", e.kind())),
    };
    match e.line() {
        Some(line) => format!("the bundle's template, line {line}: {what}"),
        None => format!("the bundle's template: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods() {
        let src = "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src).unwrap();
        let out = t.render(&[Message::new("user", "  Hi!  ")], true, None, None).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_errors() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}ok",
        )
        .unwrap();
        let err = t.render(&[Message::new("system", "x")], true, None, None).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
        let err = ChatTemplate::new("{% for m in messages %}").err().expect("unclosed for").to_string();
        assert!(err.starts_with("chat template: the bundle's template, line 1:"), "{err}");
    }

    /// Nested loops over a large range hung `run` forever (no fuel).
    #[test]
    fn a_template_that_never_ends_runs_out_of_fuel() {
        let t = ChatTemplate::new(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}",
        )
        .unwrap();
        let start = std::time::Instant::now();
        let err = t.render(&[Message::new("user", "Hi")], true, None, None).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "chat template: the bundle's template, line 1: rendering used up its fuel of {TEMPLATE_FUEL} steps (a loop that never ends?)"
            )
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "{:?}", start.elapsed());
        assert_eq!(t.validate(None, None).unwrap_err().to_string(), err);
    }

    /// A template may refuse a system role itself; it must still render a
    /// user turn, and a huge output is stopped by the same fuel.
    #[test]
    fn validate_accepts_refusals_but_not_failures() {
        let refuses_system = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}{{ m['content'] }}{% endfor %}";
        ChatTemplate::new(refuses_system).unwrap().validate(None, None).unwrap();
        let needs_system = "{{ messages[0]['content'] ~ messages[1]['content'].strip() }}";
        let err = ChatTemplate::new(needs_system).unwrap().validate(None, None).unwrap_err().to_string();
        assert!(err.starts_with("chat template: the bundle's template, line 1:"), "{err}");
        let huge = "{% set s = 'x' * 100000000 %}{{ s }}{{ s }}{{ s }}";
        let err = ChatTemplate::new(huge).unwrap().validate(None, None).unwrap_err().to_string();
        assert!(err.contains("used up its fuel"), "{err}");
    }

    /// A template that renders tools (Hermes' markup) gets them, the
    /// assistant's calls and the results' ids; one without tool support is
    /// told apart.
    #[test]
    fn tool_templates_get_tools_calls_and_results() {
        let src = "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}\
                   {% for m in messages %}{{ m.role }}:{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}\
                   {{ c.function.arguments | tojson }}</tool_call>{% endfor %}{{ m.content }}\
                   {% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}|{% endfor %}";
        let t = ChatTemplate::new(src).unwrap();
        assert_eq!(t.tool_format(), ToolFormat::Hermes);
        let mut call = Message::new("assistant", "");
        call.tool_calls = vec![serde_json::json!({"function": {"name": "f", "arguments": {"a": 1}}})];
        let mut result = Message::new("tool", "2");
        result.tool_call_id = Some("call_1".into());
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let out = t.render_with_tools(&[Message::new("user", "go"), call, result], &tools, false, None, None).unwrap();
        assert_eq!(out, r#"<tools>f;</tools>user:go|assistant:<tool_call>f{"a": 1}</tool_call>|tool:2(call_1)|"#);
        // Without tools, `tools` is none.
        assert_eq!(t.render(&[Message::new("user", "go")], false, None, None).unwrap(), "user:go|");
        let plain = ChatTemplate::new("{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
        assert_eq!(plain.tool_format(), ToolFormat::None);
        let llama = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{% if m.role == 'tool' %}ipython{% endif %}{% endfor %}";
        assert_eq!(ChatTemplate::new(llama).unwrap().tool_format(), ToolFormat::Llama3);
    }

    #[test]
    fn an_oversized_template_is_refused() {
        let big = "x".repeat(MAX_TEMPLATE_BYTES + 1);
        let err = ChatTemplate::new(&big).err().expect("refused").to_string();
        assert_eq!(
            err,
            format!(
                "chat template: the bundle's template is {} bytes, more than the limit of {MAX_TEMPLATE_BYTES}",
                MAX_TEMPLATE_BYTES + 1
            )
        );
    }

    /// Values whose walk costs far more than building them: a lazily
    /// repeated list (the fuzzer's find: `666.0*66*66.0*9.*['\0']`, formatted,
    /// walked 26 million items unpaid and took over 10 s) and a list that
    /// shares itself (2^60 items from 60 instructions). Formatting,
    /// serializing, concatenating or comparing them must end in an error
    /// within the render's fuel.
    #[test]
    fn huge_values_cost_what_walking_them_costs() {
        let doubled =
            "{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}";
        let templates = [
            "{{666.0*66*66.0*9.*['\0'] }}\nont}.0*9.*['\0'] }}\nont}\nonten\u{1}{".to_string(),
            "{% set l = ['a'] * 10000 %}{% set m = [l] * 10000 %}{{ [m] * 10000 }}".to_string(),
            "{{ ([0] + [1]) * 50000000 }}".to_string(),
            format!("{doubled}{{{{ ns.a }}}}"),
            format!("{doubled}{{{{ ns.a ~ '' }}}}"),
            format!("{doubled}{{{{ ns.a | tojson }}}}"),
            format!("{doubled}{{{{ ns.a | string | length }}}}"),
            format!("{doubled}{{{{ ', '.join(ns.a) }}}}"),
            format!(
                "{doubled}{{% set ns.b = [1] %}}{{% for i in range(60) %}}{{% set ns.b = [ns.b, ns.b] %}}{{% endfor %}}{{{{ ns.a == ns.b }}}}"
            ),
        ];
        for source in &templates {
            let start = std::time::Instant::now();
            let result = ChatTemplate::new(source).unwrap().render(&[Message::new("user", "Hi")], true, None, None);
            let err = result.expect_err(source).to_string();
            assert!(err.contains("used up its fuel"), "{source}: {err}");
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "{source}: {:?}", start.elapsed());
        }
    }

    /// The operators keep their meaning when they are made to pay.
    #[test]
    fn operators_mean_what_they_meant() {
        let source = "{{ 'a' ~ 1 ~ none }}|{{ [1, 2] + [3] }}|{{ [0] * 3 }}|{{ 'ab' * 2 }}|{{ 1 + 2 * 3 }}|\
                      {{ (1, 2) + (3,) }}|{{ [[1]] == [[1]] }}|{{ 'b' in ['a', 'b'] }}|{{ 2 < 3 <= 3 }}|\
                      {{ ('<b>' | safe) ~ ('<i>' | safe) }}|{{ messages[0].content ~ '!' }}|{{ 'x' in {'x': 1} }}";
        let out = ChatTemplate::new(source).unwrap().render(&[Message::new("user", "Hi")], true, None, None).unwrap();
        assert_eq!(out, "a1None|[1, 2, 3]|[0, 0, 0]|abab|7|(1, 2, 3)|True|True|True|<b><i>|Hi!|True");
        let err = ChatTemplate::new("\n{{ 1 + 'a' }}").unwrap().render(&[], false, None, None).unwrap_err().to_string();
        assert!(err.starts_with("chat template: the bundle's template, line 2: invalid operation"), "{err}");
    }
}
