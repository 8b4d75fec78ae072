//! Structured output end to end: `response_format` JSON schemas through the
//! official `openai` client on the real SmolLM2 and Gemma 3 bundles (every
//! answer must parse and validate with the `jsonschema` package; schemas
//! llguidance cannot enforce must be a 400 naming the construct), and
//! `mlxcel run --json-schema` / `--grammar` on the tiny bundle.
//!
//! The binaries are not dependencies of this crate: build them first
//! (`cargo build -p mlxcel-cli -p mlxcel-compiler`).

use std::process::Command;

use mlxcel_tests::server::Server;
use mlxcel_tests::{compile_gguf, mlxcel_bin, reference_python, tiny_bundle, workspace_root};
use serde_json::{Value, json};

/// tests/python/structured_output_check.py over tests/data/json_schemas.json
/// (52 schemas of real-world shape: objects, arrays, enums, nesting,
/// patterns, formats, numeric bounds, anyOf/oneOf/allOf, $ref; 7 that
/// llguidance refuses) against a server on `gguf`.
fn check_corpus(gguf: &str) {
    let dir = tempfile::tempdir().unwrap();
    let bundle = compile_gguf(gguf, &dir.path().join("model.mlxb"));
    let server = Server::start(&bundle, &["--parallel", "4", "--threads", "2"]);
    let root = workspace_root();
    let out = Command::new(reference_python())
        .arg(root.join("tests/python/structured_output_check.py"))
        .arg(server.url("/v1"))
        .arg(root.join("tests/data/json_schemas.json"))
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("running structured_output_check.py");
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{gguf}:\n{report}");
    assert!(
        out.status.success(),
        "{gguf}: structured_output_check.py failed:\n{report}\nserver log:\n{}",
        server.log()
    );
}

#[test]
fn json_schemas_are_enforced_on_smollm2() {
    check_corpus("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn json_schemas_are_enforced_on_gemma3() {
    check_corpus("gemma-3-270m-q4_k_m.gguf");
}

/// `response_format` errors name the field; `text` is free text.
#[test]
fn response_format_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&tiny_bundle(dir.path(), "llama", 4), &[]);
    let ask = |format: Value| {
        server.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 4, "response_format": format}),
        )
    };
    let (status, body) = ask(json!({"type": "xml"}));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["param"].as_str().unwrap().starts_with("response_format"), "{body}");
    let (status, body) =
        ask(json!({"type": "json_schema", "json_schema": {"schema": {"type": "array", "uniqueItems": true}}}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "response_format", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("uniqueItems"), "{body}");
    let (status, body) = ask(json!({"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}}));
    assert_eq!(status, 400, "{body}");
    let (status, body) = ask(json!({"type": "text"}));
    assert_eq!(status, 200, "{body}");
    // The server serves on.
    let (status, body) = ask(json!({"type": "json_object"}));
    assert_eq!(status, 200, "{body}");
}

/// `mlxcel run --json-schema` and `--grammar` constrain a random model's
/// output; a schema that cannot be enforced fails naming the keyword.
#[test]
fn mlxcel_run_json_schema_and_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let run = |extra: &[&str]| {
        Command::new(mlxcel_bin())
            .arg("run")
            .arg(&bundle)
            .args(["-p", "answer", "-n", "200", "--no-chat-template", "--temp", "1", "--seed", "3"])
            .args(extra)
            .env("MLXCEL_DEVICE", "cpu")
            .output()
            .unwrap()
    };
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2]}},
               "required": ["ok", "n"], "additionalProperties": false})
        .to_string(),
    )
    .unwrap();
    let out = run(&["--json-schema", schema.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(v["ok"].is_boolean() && (v["n"] == 1 || v["n"] == 2), "{v}");

    let grammar = dir.path().join("g.lark");
    std::fs::write(&grammar, "start: \"yes\" | \"no\"\n").unwrap();
    let out = run(&["--grammar", grammar.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(["yes", "no"].contains(&text.trim()), "{text:?}");

    std::fs::write(&schema, r#"{"type": "array", "uniqueItems": true}"#).unwrap();
    let out = run(&["--json-schema", schema.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("uniqueItems"), "{err}");
    std::fs::write(&schema, "{not json").unwrap();
    let out = run(&["--json-schema", schema.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--json-schema") && err.contains("schema.json"), "{err}");
}
