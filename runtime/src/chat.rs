//! Chat templates: the Jinja template a model ships with, rendered with
//! minijinja in Python-compatibility mode (HF templates call `.strip()`,
//! `.startswith()`, `raise_exception(...)` and friends).

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value, context};
use serde::Serialize;

use crate::error::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (or `tool`).
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles `source`; errors point at the template's line.
    pub fn new(source: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string()).map_err(|e| Error::ChatTemplate(describe(&e)))?;
        Ok(ChatTemplate { env })
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
        let tmpl = self.env.get_template("chat").map_err(|e| Error::ChatTemplate(describe(&e)))?;
        tmpl.render(context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token.unwrap_or(""),
            eos_token => eos_token.unwrap_or(""),
        })
        .map_err(|e| Error::ChatTemplate(describe(&e)))
    }
}

fn describe(e: &JinjaError) -> String {
    match e.line() {
        Some(line) => format!("{e} (template line {line})"),
        None => e.to_string(),
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
        assert!(err.starts_with("chat template:") && err.contains("line 1"), "{err}");
    }
}
