//! `mlxcel-server` end to end: the real binary on loopback, driven over
//! HTTP (ureq for whole answers, raw sockets where a test needs to stop
//! reading or hang up mid-stream).
//!
//! Most tests serve the tiny bundle (byte-level tokenizer, end token 255);
//! the batch-invariance and timeout test serves the real SmolLM2 bundle.
//!
//! The binaries are not dependencies of this crate: build them first
//! (`cargo build -p mlxcel-cli -p mlxcel-compiler`), or a stale
//! `mlxcel-server` is tested.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mlxcel_tests::server::{Server, sse_data};
use mlxcel_tests::{reference_python, smollm2_bundle, tiny_bundle, workspace_root};
use serde_json::{Value, json};

/// The tiny bundle, made once per test binary.
fn tiny() -> &'static Path {
    static BUNDLE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = BUNDLE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny_bundle(dir.path(), "llama", 4);
        (dir, path)
    });
    path
}

/// Asserts an error envelope with `status`, and returns its `error` object.
fn assert_error(status: u16, body: &Value, expected: u16, kind: &str) -> Value {
    assert_eq!(status, expected, "{body}");
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(error["type"], kind, "{body}");
    assert!(error.get("param").is_some() && error.get("code").is_some(), "{body}");
    error.clone()
}

fn chat_body(content: &str, max_tokens: u64) -> Value {
    json!({"model": "x", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

/// A prompt the tiny model answers greedily for at least `tokens` tokens
/// (no end token), found by trying a few: what the long-running tests use.
fn long_prompt(server: &Server, tokens: u64) -> String {
    for i in 0..40 {
        let prompt = format!("long {i}");
        let (status, body) =
            server.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": tokens, "temperature": 0}));
        assert_eq!(status, 200, "{body}");
        if body["choices"][0]["finish_reason"] == "length" {
            return prompt;
        }
    }
    panic!("no prompt keeps the tiny model going for {tokens} tokens");
}

/// A completion request sent on a raw socket (the answer not read).
fn send_completion(server: &Server, body: &Value) -> TcpStream {
    let mut socket = TcpStream::connect(&server.addr).unwrap();
    let body = body.to_string();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket
}

/// A streamed completion on a raw socket, its response head read.
fn open_stream(server: &Server, body: &Value) -> BufReader<TcpStream> {
    let socket = send_completion(server, body);
    socket.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut reader = BufReader::new(socket);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    reader
}

/// Reads from a raw stream until `needle` has arrived.
fn read_until(reader: &mut BufReader<TcpStream>, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
    }
    seen
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn chat_and_completions_whole_and_streamed_have_openai_shapes() {
    let server = Server::start(tiny(), &[]);
    // Whole chat.
    let (status, body) = server.post("/v1/chat/completions", &chat_body("Hello", 8));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(body["model"], "tiny-llama", "the bundle's name, not the request's");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(choice["logprobs"].is_null());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    let usage = &body["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    // The template "<user>Hello\n<assistant>", one token a byte, plus BOS if any.
    assert!(prompt_tokens >= "<user>Hello\n<assistant>".len() as u64, "{usage}");
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 8);
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt_tokens + usage["completion_tokens"].as_u64().unwrap());
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    // The same streamed: role first, content deltas, an empty delta with the reason, [DONE].
    let mut streamed = chat_body("Hello", 8);
    streamed["stream"] = json!(true);
    let (status, data) = server.post_stream("/chat/completions", &streamed);
    assert_eq!(status, 200);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], choice["finish_reason"]);
    let mut joined = String::new();
    for c in &chunks {
        assert!(c.get("usage").is_none(), "usage only when asked: {c}");
        assert_eq!(c["id"], chunks[0]["id"]);
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            joined.push_str(t);
        }
    }
    assert_eq!(joined, text, "streamed text equals the whole answer");

    // Completions, whole and streamed.
    let req = json!({"prompt": "Once upon", "max_tokens": 6, "temperature": 0});
    let (status, body) = server.post("/v1/completions", &req);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    let text = body["choices"][0]["text"].as_str().unwrap().to_string();
    let mut req_stream = req.clone();
    req_stream["stream"] = json!(true);
    req_stream["stream_options"] = json!({"include_usage": true});
    let (status, data) = server.post_stream("/completions", &req_stream);
    assert_eq!(status, 200);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    // The same prompt again: all of it but its last token (which the decode
    // step feeds) comes from the prefix cache.
    let mut expected_usage = body["usage"].clone();
    expected_usage["prompt_tokens_details"]["cached_tokens"] =
        json!(body["usage"]["prompt_tokens"].as_u64().unwrap() - 1);
    assert_eq!(usage_chunk["usage"], expected_usage);
    let mut joined = String::new();
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!(c["object"], "text_completion");
        assert!(c["usage"].is_null() && c.get("usage").is_some(), "usage: null when asked: {c}");
        joined.push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(joined, text);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], body["choices"][0]["finish_reason"]);
}

#[test]
fn stop_strings_seeds_and_max_tokens() {
    let server = Server::start(tiny(), &["--ctx-size", "64"]);
    let complete = |extra: Value| {
        let mut req = json!({"prompt": "abc", "max_tokens": 24, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        let (status, body) = server.post("/v1/completions", &req);
        assert_eq!(status, 200, "{body}");
        body
    };
    let prompt = long_prompt(&server, 24);
    let full = complete(json!({"prompt": prompt}));
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 6, "{text:?}");
    let stop: String = chars[3..5].iter().collect();
    let stopped = complete(json!({"prompt": prompt, "stop": [stop.clone(), "\u{1}never"]}));
    assert_eq!(stopped["choices"][0]["text"].as_str().unwrap(), &text[..text.find(&stop).unwrap()]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    let stopped = complete(json!({"prompt": prompt, "stop": stop}));
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Seeds: the same seed, the same sample; another seed, another.
    let sampled =
        |seed: u64| complete(json!({"temperature": 1.0, "seed": seed, "max_tokens": 16}))["choices"][0]["text"].clone();
    assert_eq!(sampled(42), sampled(42));
    assert_ne!(sampled(42), sampled(7));

    // A huge max_tokens is capped by the context (64): prompt + completion fit it.
    let capped = complete(json!({"prompt": prompt, "max_tokens": 1_000_000_000u64}));
    let usage = &capped["usage"];
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), 64, "{usage}");
    assert_eq!(capped["choices"][0]["finish_reason"], "length");

    // llama-server's ignore_eos (benchmarks with fixed output lengths) is accepted.
    let fixed = complete(json!({"prompt": prompt, "max_tokens": 20, "ignore_eos": true}));
    assert_eq!(fixed["usage"]["completion_tokens"], 20, "{fixed}");
}

#[test]
fn logprobs_have_openai_shapes() {
    let server = Server::start(tiny(), &[]);
    let mut req = chat_body("Hi", 5);
    req["logprobs"] = json!(true);
    req["top_logprobs"] = json!(3);
    let (status, body) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 200, "{body}");
    let content = body["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!content.is_empty());
    // The tokens' bytes make the answer (an end token is not listed).
    let bytes: Vec<u8> =
        content.iter().flat_map(|e| e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8)).collect();
    assert_eq!(String::from_utf8_lossy(&bytes), body["choices"][0]["message"]["content"].as_str().unwrap());
    for entry in content {
        let lp = entry["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        // Byte-level: each token is one byte.
        assert_eq!(entry["bytes"].as_array().unwrap().len(), 1, "{entry}");
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the token is the most likely one.
        assert_eq!(top[0]["token"], entry["token"]);
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-5);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        assert!(top[0]["bytes"].is_array());
    }
    // Streamed: the entries arrive with the chunks.
    req["stream"] = json!(true);
    let (_, data) = server.post_stream("/v1/chat/completions", &req);
    let streamed: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, content);

    // Completions: tokens, token_logprobs, top_logprobs (dicts), text_offset.
    let (status, body) =
        server.post("/v1/completions", &json!({"prompt": "abcd", "max_tokens": 4, "temperature": 0, "logprobs": 2}));
    assert_eq!(status, 200, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty());
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 4, "offsets start after the prompt, as OpenAI's");
    let top = lp["top_logprobs"].as_array().unwrap();
    assert!(top.iter().all(|t| t.as_object().unwrap().len() <= 2 && !t.as_object().unwrap().is_empty()));
    let generated = body["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let ended = body["choices"][0]["finish_reason"] == "stop";
    assert_eq!(tokens.len(), generated - usize::from(ended), "one entry per token but the end token");
}

#[test]
fn bad_requests_get_the_right_status_and_envelope_and_the_server_keeps_serving() {
    let server = Server::start(tiny(), &["--ctx-size", "64", "--max-body-size", "4096"]);
    let good = || {
        let (status, body) = server.post("/v1/chat/completions", &chat_body("ok", 2));
        assert_eq!(status, 200, "the server still serves: {body}");
    };
    let post_text = |path: &str, body: &str| {
        let (status, _, text) = server.post_raw(path, body, &[]);
        (status, serde_json::from_str::<Value>(&text).unwrap_or_else(|_| panic!("not JSON: {text}")))
    };
    // Bad JSON.
    let (status, body) = post_text("/v1/chat/completions", "{\"messages\": [");
    assert_error(status, &body, 400, "invalid_request_error");
    good();
    // A wrong type names the field.
    let mut req = chat_body("x", 2);
    req["temperature"] = json!("hot");
    let (status, body) = server.post("/v1/chat/completions", &req);
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["param"], "temperature");
    let (status, body) = server.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": 7}]}));
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["param"], "messages[0].content");
    good();
    // Unknown and unsupported fields, n = 2, other content parts, roles.
    for (field, value) in [
        ("frobnicate", json!(1)),
        ("grammar", json!("root ::= \"a\"")),
        ("tools", json!([])),
        ("logit_bias", json!({"1": 2})),
        ("n", json!(2)),
    ] {
        let mut req = chat_body("x", 2);
        req[field] = value;
        let (status, body) = server.post("/v1/chat/completions", &req);
        let error = assert_error(status, &body, 400, "invalid_request_error");
        assert_eq!(error["param"], field, "{body}");
        assert!(error["message"].as_str().unwrap().contains(field), "{body}");
    }
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    );
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert!(error["message"].as_str().unwrap().contains("image_url"), "{body}");
    let (status, body) =
        server.post("/v1/chat/completions", &json!({"messages": [{"role": "function", "content": "x"}]}));
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["param"], "messages[0].role");
    // Parts of type text are the message.
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "developer", "content": "be brief"},
                             {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{body}");
    good();
    // Ranges, with the runtime's wording.
    let mut req = chat_body("x", 2);
    req["top_p"] = json!(1.5);
    let (status, body) = server.post("/v1/chat/completions", &req);
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!(error["param"], "top_p");
    assert!(error["message"].as_str().unwrap().contains("must be in (0, 1]"), "{body}");
    let mut req = chat_body("x", 2);
    req["max_tokens"] = json!(-5);
    let (status, body) = server.post("/v1/chat/completions", &req);
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["param"], "max_tokens");
    let (status, body) = server.post("/v1/completions", &json!({"prompt": "x", "logprobs": 9, "max_tokens": 1}));
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["param"], "logprobs");
    let (status, body) = server.post("/v1/completions", &json!({"prompt": "x", "suffix": "y"}));
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["param"], "suffix");
    good();
    // A prompt longer than the context (64): the error names the field the
    // prompt came in.
    let (status, body) = server.post("/v1/completions", &json!({"prompt": "y".repeat(100), "max_tokens": 1}));
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!((&error["code"], &error["param"]), (&json!("context_length_exceeded"), &json!("prompt")), "{body}");
    let (status, body) = server.post("/v1/chat/completions", &chat_body(&"y".repeat(100), 1));
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!((&error["code"], &error["param"]), (&json!("context_length_exceeded"), &json!("messages")), "{body}");
    good();
    // Token ids outside the vocabulary (the engine refuses them at
    // submission): 400 naming `prompt`, flat or nested.
    for prompt in [json!([1, 2, 1_000_000]), json!([[1, u32::MAX]])] {
        let (status, body) = server.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 1}));
        let error = assert_error(status, &body, 400, "invalid_request_error");
        assert_eq!(error["param"], "prompt", "{body}");
        assert!(error["message"].as_str().unwrap().contains("not in the model's vocabulary"), "{body}");
    }
    let (status, body) = server.post("/v1/completions", &json!({"prompt": [1, 2, 3], "max_tokens": 1}));
    assert_eq!(status, 200, "in-vocabulary token ids are a prompt: {body}");
    good();
    // A body over the limit (4096 bytes): 413 in the envelope.
    let big = chat_body(&"z".repeat(10_000), 1).to_string();
    let (status, body) = post_text("/v1/chat/completions", &big);
    assert_error(status, &body, 413, "invalid_request_error");
    good();
    // Unknown routes: 404 in the envelope.
    let (status, text) = server.get("/v2/nothing");
    assert_error(status, &serde_json::from_str(&text).unwrap(), 404, "not_found_error");
    // /metrics is off without --metrics: 501, as llama-server.
    let (status, text) = server.get("/metrics");
    assert_error(status, &serde_json::from_str(&text).unwrap(), 501, "not_supported_error");
    good();
}

#[test]
fn api_keys_guard_every_route_but_health() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    std::fs::write(&key_file, "# keys\nfile-key\n\n").unwrap();
    let server =
        Server::start(tiny(), &["--api-key", "secret-1", "--api-key-file", key_file.to_str().unwrap(), "--metrics"]);
    let body = chat_body("hi", 2).to_string();
    for headers in [vec![], vec![("authorization", "Bearer wrong")], vec![("x-api-key", "secret-")]] {
        let (status, _, text) = server.post_raw("/v1/chat/completions", &body, &headers);
        assert_error(status, &serde_json::from_str(&text).unwrap(), 401, "authentication_error");
    }
    for path in ["/v1/models", "/metrics"] {
        let (status, text) = server.get(path);
        assert_error(status, &serde_json::from_str(&text).unwrap(), 401, "authentication_error");
    }
    let (status, _, text) = server.post_raw("/tokenize", r#"{"content": "a"}"#, &[]);
    assert_eq!(status, 401, "{text}");
    assert_eq!(server.get("/health").0, 200);
    let (status, _, text) = server.post_raw("/v1/chat/completions", &body, &[("authorization", "Bearer secret-1")]);
    assert_eq!(status, 200, "{text}");
    let (status, _, text) = server.post_raw("/v1/chat/completions", &body, &[("x-api-key", "file-key")]);
    assert_eq!(status, 200, "{text}");
    assert_eq!(server.get_with("/metrics", &[("authorization", "Bearer file-key")]).0, 200);
}

#[test]
fn tokenize_detokenize_apply_template_and_models() {
    let server = Server::start(tiny(), &[]);
    let (status, body) = server.post("/tokenize", &json!({"content": "hi!"}));
    assert_eq!(status, 200, "{body}");
    let tokens: Vec<u64> = body["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(tokens.len(), 3, "byte-level: a token a byte: {body}");
    let (_, with_special) = server.post("/tokenize", &json!({"content": "hi!", "add_special": true}));
    assert!(with_special["tokens"].as_array().unwrap().len() >= 3);
    let (_, pieces) = server.post("/tokenize", &json!({"content": "hi!", "with_pieces": true}));
    assert_eq!(pieces["tokens"][0]["piece"], "h", "{pieces}");
    assert_eq!(pieces["tokens"][0]["id"], tokens[0]);
    let (status, body) = server.post("/detokenize", &json!({"tokens": tokens}));
    assert_eq!(status, 200);
    assert_eq!(body["content"], "hi!");
    let (status, body) = server.post("/detokenize", &json!({"tokens": "hi"}));
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["param"], "tokens");
    let (status, body) = server.post(
        "/apply-template",
        &json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["prompt"], "<system>s\n<user>u\n<assistant>");
    let (status, text) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny-llama");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(server.get("/models").0, 200);
}

#[test]
fn a_full_queue_is_429_with_retry_after_and_a_disconnect_frees_the_slot() {
    let server = Server::start(tiny(), &["--parallel", "1", "--max-queue", "1", "--metrics"]);
    let prompt = long_prompt(&server, 400);
    let long = json!({"prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": true});
    // One request runs (streamed, read slowly)...
    let mut running = open_stream(&server, &long);
    read_until(&mut running, "data: ");
    assert_eq!(server.metric("mlxcel_requests_running"), 1.0);
    // ...one waits...
    let waiting = {
        let (addr, long) = (server.addr.clone(), long.clone());
        std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let mut r = agent.post(&format!("http://{addr}/v1/completions")).send(long.to_string()).unwrap();
            (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
        })
    };
    wait_for("a waiting request", Duration::from_secs(10), || server.metric("mlxcel_requests_waiting") == 1.0);
    // ...and the next is refused.
    let (status, retry, text) =
        server.post_raw("/v1/completions", &json!({"prompt": "q", "max_tokens": 1}).to_string(), &[]);
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(assert_error(status, &body, 429, "rate_limit_error")["code"], "queue_full");
    assert_eq!(retry.as_deref(), Some("1"));
    // The client of the running request hangs up: its slot frees within a second.
    let hung_up = Instant::now();
    drop(running);
    wait_for("the slot to free", Duration::from_secs(1), || {
        server.metric("mlxcel_requests_running") == 0.0 || server.metric("mlxcel_requests_waiting") == 0.0
    });
    assert!(hung_up.elapsed() < Duration::from_secs(1));
    // The waiting one then runs to its end.
    let (status, text) = waiting.join().unwrap();
    assert_eq!(status, 200);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    wait_for("nothing running", Duration::from_secs(5), || server.metric("mlxcel_requests_running") == 0.0);
    // The metrics counted the finished generations.
    let (_, metrics) = server.get("/metrics");
    for name in [
        "mlxcel_prompt_tokens_total",
        "mlxcel_generation_tokens_total",
        "mlxcel_time_to_first_token_seconds_count",
        "mlxcel_inter_token_latency_seconds_count",
        "mlxcel_kv_cache_bytes",
        "mlxcel_prefix_cache_hits_total",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    assert!(server.metric("mlxcel_generation_tokens_total") >= 400.0);
    let (status, body) = server.post("/v1/completions", &json!({"prompt": "q", "max_tokens": 1}));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn sigterm_during_a_stream_ends_it_cleanly_and_exits_0() {
    let mut server = Server::start(tiny(), &["--shutdown-grace", "0"]);
    let prompt = long_prompt(&server, 400);
    let mut stream =
        open_stream(&server, &json!({"prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": true}));
    read_until(&mut stream, "data: ");
    // SIGTERM now; the stream ends with an error event (cancelled at the
    // end of the grace) or the finish, then [DONE].
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stream.read_to_string(&mut rest);
        rest
    });
    let exit = server.terminate();
    let rest = reader.join().unwrap();
    let data = sse_data(&rest);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{rest}");
    assert!(exit.success(), "{exit:?}\n{}", server.log());
}

#[test]
fn health_is_503_while_the_bundle_loads() {
    // A FIFO as the bundle: opening it blocks until a writer comes, so the
    // server is reliably still loading.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("slow.mlxb");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut server = Server::spawn(&fifo, &[]);
    let (status, text) = server.get("/health");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(assert_error(status, &body, 503, "unavailable_error")["code"], "loading");
    let (status, _, _) = server.post_raw("/v1/chat/completions", &chat_body("x", 1).to_string(), &[]);
    assert_eq!(status, 503);
    // Feed it something that is not a bundle: the load fails and the server exits 1.
    // (The server may close its end first: a failed write is fine.)
    let _ = std::fs::write(&fifo, b"not a bundle");
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(1), "{}", server.log());
    // A loaded bundle: 200, after the warm-up (its time in the "model
    // loaded" line), unless --no-warmup.
    let warm_up_ms = |log: &str| -> f64 {
        let value = log.split("warm_up_ms=").nth(1).unwrap_or_else(|| panic!("no warm_up_ms in the log:\n{log}"));
        value.split_whitespace().next().unwrap().parse().unwrap()
    };
    let server = Server::start(tiny(), &[]);
    assert_eq!(server.get("/health"), (200, r#"{"status":"ok"}"#.to_string()));
    assert!(warm_up_ms(&server.log()) > 0.0, "{}", server.log());
    let server = Server::start(tiny(), &["--no-warmup"]);
    assert_eq!(warm_up_ms(&server.log()), 0.0, "{}", server.log());
}

/// 16 concurrent greedy requests with different prompts answer exactly as
/// the same requests one at a time (batch invariance through the server).
#[test]
fn concurrent_greedy_requests_equal_serial_ones_on_smollm2() {
    let bundle = smollm2_bundle();
    let server = Server::start(bundle, &["--parallel", "16", "--threads", "2"]);
    let prompts: Vec<String> =
        (0..16).map(|i| format!("Name a fruit that starts with the letter {}.", (b'a' + i) as char)).collect();
    let ask = |addr: &str, prompt: &str| -> Value {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 0});
        let mut r = agent.post(&format!("http://{addr}/v1/chat/completions")).send(body.to_string()).unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        v["choices"][0]["message"]["content"].clone()
    };
    let serial: Vec<Value> = prompts.iter().map(|p| ask(&server.addr, p)).collect();
    let concurrent: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts.iter().map(|p| s.spawn(|| ask(&server.addr, p))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(concurrent, serial);
    assert!(serial.iter().any(|t| t.as_str().is_some_and(|t| !t.is_empty())));

    // A conversation's second turn reuses the first's KV state: at least
    // the first turn's whole prompt is cached, and only the rest is
    // prefilled (llama-server's `timings.prompt_n`).
    let mut messages = vec![json!({"role": "user", "content": "What is the capital of France? Answer in one word."})];
    let (status, one) =
        server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 16, "temperature": 0}));
    assert_eq!(status, 200, "{one}");
    messages.push(one["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "And of Italy?"}));
    let (status, two) =
        server.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 16, "temperature": 0}));
    assert_eq!(status, 200, "{two}");
    let first_prompt = one["usage"]["prompt_tokens"].as_u64().unwrap();
    let (prompt, cached) = (
        two["usage"]["prompt_tokens"].as_u64().unwrap(),
        two["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    );
    assert!(
        cached >= first_prompt && cached < prompt,
        "turn one: {first_prompt} prompt tokens; turn two: {}",
        two["usage"]
    );
    assert_eq!(two["timings"]["prompt_n"].as_u64(), Some(prompt - cached), "{}", two["timings"]);
    eprintln!(
        "second turn: {prompt} prompt tokens, {cached} cached, {} prefilled in {:.1} ms (first turn: {first_prompt} in {:.1} ms)",
        prompt - cached,
        two["timings"]["prompt_ms"].as_f64().unwrap(),
        one["timings"]["prompt_ms"].as_f64().unwrap(),
    );
    drop(server);

    // --timeout: a request running longer is cancelled: 503 "timeout"
    // whole, an error event then [DONE] streamed. Counting goes on for
    // longer than a second.
    let server = Server::start(bundle, &["--timeout", "1", "--threads", "2", "--metrics"]);
    let counting = json!({"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 4000, "temperature": 0});
    let started = Instant::now();
    let (status, body) = server.post("/v1/completions", &counting);
    assert_eq!(assert_error(status, &body, 503, "unavailable_error")["code"], "timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut streamed = counting.clone();
    streamed["stream"] = json!(true);
    let (status, data) = server.post_stream("/v1/completions", &streamed);
    assert_eq!(status, 200);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "timeout", "{error}");
    wait_for("the timed-out requests to end", Duration::from_secs(2), || {
        server.metric("mlxcel_requests_running") == 0.0
    });
}

/// llama-server's variables configure the server; `MLXCEL_*` ones and flags win.
#[test]
fn llama_server_variables_are_fallbacks_and_cors_is_opt_in() {
    let n_ctx = |server: &Server, key: &str| -> Value {
        let (status, text) = server.get_with("/v1/models", &[("authorization", &format!("Bearer {key}"))]);
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()["data"][0]["meta"]["n_ctx"].clone()
    };
    let llama = [("LLAMA_ARG_CTX_SIZE", "64"), ("LLAMA_API_KEY", "k1,k2"), ("LLAMA_ARG_ENDPOINT_METRICS", "1")];
    let server = Server::start_env(tiny(), &["-np", "2"], &llama);
    assert_eq!(n_ctx(&server, "k2"), 64);
    assert_eq!(server.get("/v1/models").0, 401, "LLAMA_API_KEY set keys");
    assert_eq!(server.get_with("/metrics", &[("x-api-key", "k1")]).0, 200, "LLAMA_ARG_ENDPOINT_METRICS=1");
    // No CORS headers unless asked.
    let r = Server::agent().get(&server.url("/health")).header("origin", "http://a.example").call().unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    drop(server);

    let mut env = llama.to_vec();
    env.push(("MLXCEL_CTX_SIZE", "32"));
    let server = Server::start_env(tiny(), &["--cors-origin", "http://a.example"], &env);
    assert_eq!(n_ctx(&server, "k1"), 32, "MLXCEL_CTX_SIZE wins over LLAMA_ARG_CTX_SIZE");
    let r = Server::agent().get(&server.url("/health")).header("origin", "http://a.example").call().unwrap();
    assert_eq!(r.headers().get("access-control-allow-origin").unwrap(), "http://a.example");
    drop(server);
    let server = Server::start_env(tiny(), &["--ctx-size", "48"], &env);
    assert_eq!(n_ctx(&server, "k1"), 48, "the flag wins over both");
}

/// Sends `request` (a whole HTTP/1.1 request) on a new connection and
/// returns the response's status line and headers (names lower-cased).
fn raw_head(server: &Server, request: &str) -> (String, Vec<(String, String)>) {
    let mut socket = TcpStream::connect(&server.addr).unwrap();
    socket.write_all(request.as_bytes()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reader = BufReader::new(socket);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    (status.trim().to_string(), headers)
}

/// A browser's CORS preflight for a chat completion with a key: allowed
/// for `--cors-origin`'s origin (the origin, POST and the asked headers,
/// `authorization` included: a `*` would not cover it), not for another
/// origin, and no CORS headers at all without `--cors-origin`.
#[test]
fn cors_preflight_allows_the_configured_origin_only() {
    let preflight = |server: &Server, origin: &str| {
        raw_head(
            server,
            &format!(
                "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    let header = |headers: &[(String, String)], name: &str| {
        headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.to_ascii_lowercase())
    };
    // With keys: a preflight carries none, and must not need one.
    let server = Server::start(tiny(), &["--cors-origin", "http://example.test", "--api-key", "k"]);
    let (status, headers) = preflight(&server, "http://example.test");
    assert!(status.starts_with("HTTP/1.1 200"), "{status} {headers:?}");
    assert_eq!(header(&headers, "access-control-allow-origin").as_deref(), Some("http://example.test"), "{headers:?}");
    let methods = header(&headers, "access-control-allow-methods").unwrap_or_default();
    assert!(methods.contains("post"), "{headers:?}");
    let allowed = header(&headers, "access-control-allow-headers").unwrap_or_default();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"), "{headers:?}");
    // Another origin: no allow-origin, so the browser refuses.
    let (_, headers) = preflight(&server, "http://other.test");
    assert_eq!(header(&headers, "access-control-allow-origin"), None, "{headers:?}");
    // The actual request from the allowed origin carries the header too.
    let (status, _, text) = server.post_raw(
        "/v1/chat/completions",
        &chat_body("x", 1).to_string(),
        &[("authorization", "Bearer k"), ("origin", "http://example.test")],
    );
    assert_eq!(status, 200, "{text}");
    drop(server);
    // Without --cors-origin: no CORS headers of any kind.
    let server = Server::start(tiny(), &[]);
    let (_, headers) = preflight(&server, "http://example.test");
    assert!(!headers.iter().any(|(n, _)| n.starts_with("access-control-")), "{headers:?}");
}

/// On SmolLM2 (its KV cache is large enough to count in MiB: 30 layers ×
/// 2 × 3 heads × 64 × f32 = 45 KiB a position): a request whose KV cache
/// could never fit `--kv-budget` is refused at once with 400
/// `kv_budget_exceeded` and the server goes on serving; and a client that
/// hangs up during a whole (non-streamed) answer frees its slot.
#[test]
fn kv_budget_refusals_and_a_whole_answers_disconnect_on_smollm2() {
    // 64 MiB hold about 1450 positions (1200 tokens and a cache chunk).
    let server = Server::start(smollm2_bundle(), &["--kv-budget", "64", "--threads", "2", "--metrics"]);
    let (status, body) = server.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": true, "temperature": 0}),
    );
    let error = assert_error(status, &body, 400, "invalid_request_error");
    assert_eq!(error["code"], "kv_budget_exceeded", "{body}");
    assert!(error["message"].as_str().unwrap().contains("budget"), "{body}");
    // Nor does a chat whose max_tokens defaults to the whole context.
    let (status, body) = server.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(assert_error(status, &body, 400, "invalid_request_error")["code"], "kv_budget_exceeded");
    let (status, body) = server.post("/v1/chat/completions", &chat_body("Hi", 4));
    assert_eq!(status, 200, "a request that fits is served: {body}");
    // The engine retires the sequence after the last token is sent: the
    // gauge may lag the response by a moment.
    wait_for("the request to retire", Duration::from_secs(2), || server.metric("mlxcel_requests_running") == 0.0);

    // A whole answer of 1000 tokens (far longer than this test waits),
    // sent on a raw socket that is closed once the request runs.
    let socket = send_completion(
        &server,
        &json!({"prompt": "1, 2, 3,", "max_tokens": 1000, "ignore_eos": true, "temperature": 0}),
    );
    wait_for("the request to run", Duration::from_secs(30), || server.metric("mlxcel_requests_running") == 1.0);
    let hung_up = Instant::now();
    drop(socket);
    wait_for("the slot to free", Duration::from_secs(2), || server.metric("mlxcel_requests_running") == 0.0);
    eprintln!("slot freed {:.0} ms after the hang-up", hung_up.elapsed().as_secs_f64() * 1e3);
    // Cancelled, not finished: the request's log line says the client left.
    // The line is written as the handler is dropped, before the engine
    // cancels; reading it from the server's stderr can lag on a loaded
    // machine (a CI run once missed it within 2 s), so wait longer and show
    // the log if it never comes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("client disconnected") {
        assert!(Instant::now() < deadline, "no 'client disconnected' log line:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(server.log().contains("status=499"), "{}", server.log());
    let (status, body) = server.post("/v1/chat/completions", &chat_body("Hi", 4));
    assert_eq!(status, 200, "{body}");
}

/// The official OpenAI Python client (openai, pinned in the reference
/// environment) against the real SmolLM2 bundle: tests/python/
/// openai_client_check.py checks chat and text completions, streamed and
/// not, stop strings, seeds, logprobs shapes, `stream_options.include_usage`,
/// `cached_tokens` across two turns, tool calls (a forced call, a tool
/// result round trip, a streamed call), and the errors (n=2, an unknown
/// field, a wrong key) with the client's own types; `--strict` holds the server to
/// what llama-server does not do (an unknown field is a 400 naming it;
/// /v1/completions has OpenAI's legacy logprobs and usage chunk). Then
/// SIGTERM must end the server with status 0.
#[test]
fn the_openai_python_client_works_unchanged() {
    const API_KEY: &str = "mlxcel-test-key";
    let mut server = Server::start(smollm2_bundle(), &["--parallel", "2", "--threads", "2", "--api-key", API_KEY]);
    let script = workspace_root().join("tests/python/openai_client_check.py");
    let out = Command::new(reference_python())
        .arg(&script)
        .args([&server.url("/v1"), "--api-key", API_KEY, "--strict"])
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{report}");
    assert!(out.status.success(), "openai_client_check.py failed:\n{report}\nserver log:\n{}", server.log());
    let exit = server.terminate();
    assert!(exit.success(), "exit after SIGTERM: {exit:?}\n{}", server.log());
}
