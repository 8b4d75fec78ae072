//! The chat template renderer as `mlxcel run` uses it (the bundle's Jinja
//! source through `ChatTemplate::new` and `render`). A template must render
//! or give an error in bounded time; one that loops without bound (nested
//! loops over huge ranges) is a libFuzzer timeout, reported as a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_runtime::chat::{ChatTemplate, Message};

fuzz_target!(|input: &[u8]| {
    let Ok(source) = std::str::from_utf8(input) else { return };
    let Ok(template) = ChatTemplate::new(source) else { return };
    let messages = [Message::new("system", "be brief"), Message::new("user", "hi"), Message::new("assistant", "yo")];
    let _ = template.render(&messages, true, Some("<s>"), Some("</s>"));
    let _ = template.render(&[], false, None, None);
});
