//! OpenAI function tool calls end to end on the real SmolLM2 bundle (and
//! one forced call on Gemma 3): `tools`, `tool_choice` none | auto |
//! required | a named function, `parallel_tool_calls`, calls returned as
//! `message.tool_calls` and streamed as `delta.tool_calls`, tool results
//! sent back and rendered, and the 400s. Neither model's template knows
//! tools, so most tests run the documented fallback (a system-prompt
//! preamble, calls in `<tool_call>` blocks), enforced by the calls'
//! grammar; one stores a Hermes tool template (tests/data/hermes_tools.jinja,
//! modelled on Qwen 2.5's) in the SmolLM2 bundle for the native path.
//!
//! The binaries are not dependencies of this crate: build them first
//! (`cargo build -p mlxcel-cli -p mlxcel-compiler`).

use std::process::Command;

use mlxcel_tests::server::Server;
use mlxcel_tests::{compile_gguf, mlxcel_compile_bin, real_model, smollm2_bundle, workspace_root};
use serde_json::{Map, Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
         "parameters": {"type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 20},
                                       "unit": {"enum": ["celsius", "fahrenheit"]}},
                        "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "description": "Add two integers",
         "parameters": {"type": "object",
                        "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                       "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                        "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

fn request(content: &str, extra: Value) -> Value {
    let mut body = json!({"model": "x", "messages": [{"role": "user", "content": content}], "tools": tools(),
                          "temperature": 0, "max_tokens": 80});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// A call's arguments, parsed and checked against its tool's schema (the
/// two schemas above, checked by hand: every property required and typed,
/// no other property, the bounds held).
fn check_call(call: &Value) -> (String, Map<String, Value>) {
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_") && id.len() > 10), "{call}");
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().unwrap_or_else(|| panic!("{call}")).to_string();
    let text = call["function"]["arguments"].as_str().unwrap_or_else(|| panic!("arguments not a string: {call}"));
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(text) else {
        panic!("arguments are not a JSON object: {text:?}")
    };
    let mut keys: Vec<&str> = args.keys().map(String::as_str).collect();
    keys.sort_unstable();
    match name.as_str() {
        "get_weather" => {
            assert_eq!(keys, ["city", "unit"], "{text}");
            assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 20), "{text}");
            assert!(args["unit"] == "celsius" || args["unit"] == "fahrenheit", "{text}");
        }
        "add" => {
            assert_eq!(keys, ["a", "b"], "{text}");
            for k in ["a", "b"] {
                assert!(args[k].as_i64().is_some_and(|n| (-1000..=1000).contains(&n)), "{text}");
            }
        }
        other => panic!("a call of {other:?}, not one of the tools"),
    }
    (name, args)
}

fn choice(body: &Value) -> &Value {
    &body["choices"][0]
}

#[test]
fn forced_calls_are_valid_calls_of_the_right_function() {
    let server = Server::start(smollm2_bundle(), &["--parallel", "2", "--threads", "2"]);
    // A named function: exactly one call of it.
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "add"}}});
    let (status, body) = server.post("/v1/chat/completions", &request("What is 12 plus 30?", named));
    assert_eq!(status, 200, "{body}");
    assert_eq!(choice(&body)["finish_reason"], "tool_calls", "{body}");
    let message = &choice(&body)["message"];
    assert!(message["content"].is_null(), "{body}");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(check_call(&calls[0]).0, "add");

    // required, one call: one of the tools.
    let required = json!({"tool_choice": "required", "parallel_tool_calls": false});
    let (status, body) = server.post("/v1/chat/completions", &request("What is the weather in Paris?", required));
    assert_eq!(status, 200, "{body}");
    assert_eq!(choice(&body)["finish_reason"], "tool_calls", "{body}");
    let calls = choice(&body)["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{body}");
    check_call(&calls[0]);

    // required with parallel calls: one or more, each valid, never markup
    // as content (a small model may repeat calls until max_tokens).
    let (status, body) =
        server.post("/v1/chat/completions", &request("Weather in Paris and Rome?", json!({"tool_choice": "required"})));
    assert_eq!(status, 200, "{body}");
    let message = &choice(&body)["message"];
    assert!(message["content"].is_null(), "{body}");
    let calls = message["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{body}");
    calls.iter().for_each(|c| {
        check_call(c);
    });
    let reason = &choice(&body)["finish_reason"];
    assert!(reason == "tool_calls" || reason == "length", "{body}");
}

#[test]
fn none_is_text_and_auto_is_text_or_calls() {
    let server = Server::start(smollm2_bundle(), &["--threads", "2"]);
    let (status, plain) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "temperature": 0,
                "max_tokens": 24}),
    );
    assert_eq!(status, 200, "{plain}");
    let (status, none) = server.post(
        "/v1/chat/completions",
        &request("What is the weather in Paris?", json!({"tool_choice": "none", "max_tokens": 24})),
    );
    assert_eq!(status, 200, "{none}");
    // none: the tools are not rendered, so the answer is the plain one.
    assert_eq!(none["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"], "{none}");
    assert_eq!(choice(&none)["message"], choice(&plain)["message"], "{none}");
    assert!(choice(&none)["message"].get("tool_calls").is_none(), "{none}");
    assert_ne!(choice(&none)["finish_reason"], "tool_calls");

    // auto (the default with tools): whatever the model chooses, a valid shape.
    for content in ["What is the weather in Paris?", "Say hello.", "Use the add tool to add 2 and 3."] {
        let (status, body) = server.post("/v1/chat/completions", &request(content, json!({})));
        assert_eq!(status, 200, "{body}");
        let message = &choice(&body)["message"];
        let reason = choice(&body)["finish_reason"].as_str().unwrap();
        match message.get("tool_calls") {
            Some(calls) => {
                assert!(calls.as_array().is_some_and(|c| !c.is_empty()), "{body}");
                calls.as_array().unwrap().iter().for_each(|c| {
                    check_call(c);
                });
                assert!(reason == "tool_calls" || reason == "length", "{body}");
            }
            None => {
                let text = message["content"].as_str().unwrap_or_else(|| panic!("{body}"));
                assert!(!text.starts_with("<tool_call>"), "{body}");
                assert!(reason == "stop" || reason == "length", "{body}");
            }
        }
        println!("auto, {content:?}: {message}");
    }
}

/// The streamed calls, assembled from `delta.tool_calls` by index (the
/// first entry of a call has its id), the content, and the finish reason.
fn assemble(chunks: &[String]) -> (Vec<(String, String)>, String, String) {
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut content = String::new();
    let mut reason = String::new();
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"), "{chunks:?}");
    for chunk in &chunks[..chunks.len() - 1] {
        let chunk: Value = serde_json::from_str(chunk).unwrap();
        let choice = &chunk["choices"][0];
        if let Some(r) = choice["finish_reason"].as_str() {
            reason = r.to_string();
        }
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        for entry in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = entry["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                assert!(entry["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{entry}");
                assert_eq!(entry["type"], "function", "{entry}");
                calls.push((String::new(), String::new()));
            }
            let call = &mut calls[index];
            call.0.push_str(entry["function"]["name"].as_str().unwrap_or(""));
            call.1.push_str(entry["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    (calls, content, reason)
}

#[test]
fn a_streamed_forced_call_equals_the_whole_one() {
    let server = Server::start(smollm2_bundle(), &["--threads", "2"]);
    for extra in [
        json!({"tool_choice": "required", "parallel_tool_calls": false}),
        json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ] {
        let body = request("What is the weather in Paris?", extra);
        let (status, whole) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{whole}");
        let expected: Vec<(String, String)> = choice(&whole)["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                check_call(c);
                (c["function"]["name"].as_str().unwrap().into(), c["function"]["arguments"].as_str().unwrap().into())
            })
            .collect();
        let mut streamed = body.clone();
        streamed["stream"] = true.into();
        let (status, chunks) = server.post_stream("/v1/chat/completions", &streamed);
        assert_eq!(status, 200, "{chunks:?}");
        let (calls, content, reason) = assemble(&chunks);
        assert_eq!(calls, expected, "{chunks:?}");
        assert_eq!(content, "", "markup streamed as content: {chunks:?}");
        assert_eq!(reason, "tool_calls", "{chunks:?}");
        // The arguments come as they are generated, in several entries.
        let entries = chunks.iter().filter(|c| c.contains("\"tool_calls\"")).count();
        assert!(entries > calls.len() + 1, "arguments sent whole: {chunks:?}");
    }
}

/// A conversation with a past call of get_weather and its `result`.
fn round_trip(result: &str) -> Value {
    json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": result}
    ])
}

/// `messages` through the bundle's template (`/apply-template`).
fn rendered(server: &Server, messages: &Value) -> String {
    let (status, body) = server.post("/apply-template", &json!({"messages": messages}));
    assert_eq!(status, 200, "{body}");
    body["prompt"].as_str().unwrap().to_string()
}

#[test]
fn a_tool_result_round_trip_renders_and_answers() {
    let server = Server::start(smollm2_bundle(), &["--threads", "2"]);
    let messages = round_trip("{\"temperature\": 18, \"sky\": \"cloudy\"}");
    // The template sees the call and the result as text.
    let prompt = rendered(&server, &messages);
    assert!(
        prompt.contains(
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"celsius\"}}\n</tool_call><|im_end|>"
        ),
        "{prompt}"
    );
    assert!(
        prompt.contains(
            "<|im_start|>user\n<tool_response>\n{\"temperature\": 18, \"sky\": \"cloudy\"}\n</tool_response><|im_end|>"
        ),
        "{prompt}"
    );
    // With tools, the fallback's preamble is the system turn (SmolLM2's
    // default system prompt gives way); without, the default stays.
    let (status, body) = server.post("/apply-template", &json!({"messages": messages, "tools": tools()}));
    assert_eq!(status, 200, "{body}");
    let with_tools = body["prompt"].as_str().unwrap();
    assert!(with_tools.starts_with("<|im_start|>system\nYou can call functions (tools)."), "{with_tools}");
    assert!(with_tools.contains("\"name\":\"get_weather\"") && with_tools.contains("\"name\":\"add\""), "{with_tools}");
    assert!(prompt.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"), "{prompt}");
    let none = json!({"messages": messages, "tools": tools(), "tool_choice": "none"});
    assert_eq!(server.post("/apply-template", &none).1["prompt"], prompt, "tool_choice none renders no tools");
    let body = json!({"messages": messages, "tools": tools(), "temperature": 0, "max_tokens": 32});
    let (status, body) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{body}");
    let message = &choice(&body)["message"];
    assert!(
        message["content"].as_str().is_some_and(|t| !t.is_empty()) || message.get("tool_calls").is_some(),
        "{body}"
    );
    println!("after the tool result: {message}");
}

#[test]
fn bad_tools_and_tool_choice_are_400s_naming_the_field() {
    let server = Server::start(smollm2_bundle(), &["--threads", "2"]);
    let refused = |body: Value, param: &str, says: &str| {
        let (status, body) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], param, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}");
    };
    let mut bad_schema = tools();
    bad_schema[1]["function"]["parameters"]["properties"]["a"] = json!({"type": "array", "uniqueItems": true});
    refused(
        request("x", json!({"tools": bad_schema, "tool_choice": "required"})),
        "tools[1].function.parameters",
        "uniqueItems",
    );
    refused(
        request("x", json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}})),
        "tool_choice",
        "nope",
    );
    refused(request("x", json!({"tools": [{"type": "file_search"}]})), "tools[0].type", "file_search");
    refused(request("x", json!({"tool_choice": "sometimes"})), "tool_choice", "sometimes");
    let mut no_tools = request("x", json!({"tool_choice": "required"}));
    no_tools.as_object_mut().unwrap().remove("tools");
    refused(no_tools, "tool_choice", "needs tools");
    refused(request("x", json!({"response_format": {"type": "json_object"}})), "response_format", "tools");
    let orphan = json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}]});
    refused(orphan, "messages[1].tool_call_id", "tool_call_id");
    let bad_args = json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": "not json"}}]}]});
    refused(bad_args, "messages[1].tool_calls[0].function.arguments", "JSON object");
    // The server serves on.
    let (status, body) =
        server.post("/v1/chat/completions", &request("Hi", json!({"tool_choice": "none", "max_tokens": 4})));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_forced_call_on_gemma3() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = compile_gguf("gemma-3-270m-q4_k_m.gguf", &dir.path().join("gemma3.mlxb"));
    let server = Server::start(&bundle, &["--threads", "2"]);
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (status, body) = server.post("/v1/chat/completions", &request("What is the weather in Paris?", named));
    assert_eq!(status, 200, "{body}");
    assert_eq!(choice(&body)["finish_reason"], "tool_calls", "{body}");
    let calls = choice(&body)["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(check_call(&calls[0]).0, "get_weather");
    // A round trip renders through Gemma's template (roles must alternate:
    // the results are a user turn).
    let messages = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [calls[0]]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C, cloudy"}
    ]);
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "tools": tools(), "tool_choice": "none", "temperature": 0, "max_tokens": 16}),
    );
    assert_eq!(status, 200, "{body}");
}

/// The SmolLM2 bundle with the chat template tests/data/`template`, in `dir`.
fn with_template(dir: &std::path::Path, template: &str) -> std::path::PathBuf {
    let bundle = dir.join("model.mlxb");
    let template = workspace_root().join("tests/data").join(template);
    let out = Command::new(mlxcel_compile_bin())
        .arg(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"))
        .args(["-o", bundle.to_str().unwrap(), "--quiet", "--chat-template", template.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    bundle
}

/// A template that renders tools itself (Hermes markup) gets `tools`, the
/// assistant's `tool_calls` and the `tool` results as they are.
#[test]
fn a_template_that_renders_tools_gets_them_natively() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&with_template(dir.path(), "hermes_tools.jinja"), &["--threads", "2"]);
    let messages = round_trip("18 C");
    let prompt = rendered(&server, &messages);
    // The template's own rendering: no preamble, its tojson of the arguments object.
    assert!(!prompt.contains("You can call functions"), "{prompt}");
    assert!(
        prompt.contains(
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>"
        ),
        "{prompt}"
    );
    // The tools reach the template: its system turn lists them, no preamble.
    let (status, body) = server.post("/apply-template", &json!({"messages": messages, "tools": tools()}));
    assert_eq!(status, 200, "{body}");
    let with_tools = body["prompt"].as_str().unwrap();
    assert!(with_tools.starts_with("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n"), "{with_tools}");
    assert!(with_tools.contains("get_weather") && !with_tools.contains("You can call functions"), "{with_tools}");
    // And to the chat route: a longer prompt than without.
    let ask = |extra: Value| server.post("/v1/chat/completions", &request("What is the weather in Paris?", extra));
    let (status, none) = ask(json!({"tool_choice": "none", "max_tokens": 4}));
    assert_eq!(status, 200, "{none}");
    let (status, body) = ask(json!({"tool_choice": "required", "parallel_tool_calls": false}));
    assert_eq!(status, 200, "{body}");
    let tools_tokens = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tools_tokens > none["usage"]["prompt_tokens"].as_u64().unwrap() + 100, "{body}\n{none}");
    assert_eq!(choice(&body)["finish_reason"], "tool_calls", "{body}");
    let calls = choice(&body)["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{body}");
    check_call(&calls[0]);
    // A round trip answers.
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "tools": tools(), "temperature": 0, "max_tokens": 16}),
    );
    assert_eq!(status, 200, "{body}");
}

/// A Llama 3 template (tests/data/llama3_tools.jinja, modelled on Llama
/// 3.1's): tools given to it, a call as one bare `{"name", "parameters"}`
/// object (enforced, one call even with parallel calls allowed), the
/// history rendered by it, streamed and whole alike.
#[test]
fn a_llama3_template_gets_bare_json_calls() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&with_template(dir.path(), "llama3_tools.jinja"), &["--threads", "2"]);
    let messages = round_trip("18 C");
    let (status, body) = server.post("/apply-template", &json!({"messages": messages, "tools": tools()}));
    assert_eq!(status, 200, "{body}");
    let prompt = body["prompt"].as_str().unwrap();
    assert!(prompt.contains("Environment: ipython\n") && !prompt.contains("You can call functions"), "{prompt}");
    assert!(
        prompt.contains(
            "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n18 C<|eot_id|>"
        ),
        "{prompt}"
    );
    for extra in
        [json!({"tool_choice": "required"}), json!({"tool_choice": {"type": "function", "function": {"name": "add"}}})]
    {
        let body = request("What is the weather in Paris?", extra);
        let (status, whole) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{whole}");
        assert_eq!(choice(&whole)["finish_reason"], "tool_calls", "{whole}");
        let calls = choice(&whole)["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{whole}");
        let (name, _) = check_call(&calls[0]);
        let mut streamed = body.clone();
        streamed["stream"] = true.into();
        let (status, chunks) = server.post_stream("/v1/chat/completions", &streamed);
        assert_eq!(status, 200, "{chunks:?}");
        let (streamed_calls, content, reason) = assemble(&chunks);
        let arguments = calls[0]["function"]["arguments"].as_str().unwrap().to_string();
        assert_eq!(streamed_calls, [(name, arguments)], "{chunks:?}");
        assert_eq!((content.as_str(), reason.as_str()), ("", "tool_calls"), "{chunks:?}");
    }
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "tools": tools(), "temperature": 0, "max_tokens": 16}),
    );
    assert_eq!(status, 200, "{body}");
}
