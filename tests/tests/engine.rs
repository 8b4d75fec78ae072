//! The engine on a real (tiny, random) bundle: requests stream tokens and
//! end with one `Done` or `Failed`; a bad request fails alone; cancelling or
//! dropping a request stops it; dropping the engine stops everything; stop
//! strings cut the text.

use std::path::PathBuf;

use mlxcel_runtime::engine::{Engine, EngineOptions, Event, Request};
use mlxcel_runtime::generate::{FinishReason, GenerationOptions};
use mlxcel_runtime::loader::LoadOptions;
use mlxcel_tests::tiny_bundle;

fn engine(dir: &tempfile::TempDir, max_batch: usize) -> (Engine, PathBuf) {
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    (
        Engine::load(&bundle, EngineOptions { load: LoadOptions::default(), max_batch, ..EngineOptions::default() })
            .unwrap(),
        bundle,
    )
}

fn request(prompt: &str, max_tokens: usize) -> Request {
    Request {
        prompt: prompt.bytes().map(u32::from).collect(),
        options: GenerationOptions { max_tokens, ignore_eos: true, ..GenerationOptions::default() },
    }
}

#[test]
fn a_request_streams_tokens_then_done() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 4);
    let events: Vec<Event> = engine.submit(request("hello", 5)).unwrap().collect();
    let tokens = events.iter().filter(|e| matches!(e, Event::Token { .. })).count();
    assert_eq!(tokens, 5);
    match events.last() {
        Some(Event::Done { finish_reason: FinishReason::Length, stats }) => {
            assert_eq!((stats.prompt_tokens, stats.generated_tokens), (5, 5));
        }
        other => panic!("last event {other:?}"),
    }
    assert!(events[..events.len() - 1].iter().all(|e| matches!(e, Event::Token { .. } | Event::Text(_))), "{events:?}");
}

#[test]
fn bad_requests_fail_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 4);
    let good = engine.submit(request("a good prompt", 8)).unwrap();
    let empty = engine.submit(Request { prompt: Vec::new(), options: GenerationOptions::default() }).unwrap();
    let context = engine.model().context_length();
    let long = engine.submit(Request { prompt: vec![1; context], options: GenerationOptions::default() }).unwrap();
    let mut bad_sampling = request("x", 4);
    bad_sampling.options.sampling.top_p = 2.0;
    let bad_sampling = engine.submit(bad_sampling).unwrap();
    let failure = |g: mlxcel_runtime::engine::Generating| g.collect_generation().unwrap_err().to_string();
    assert_eq!(failure(empty), "invalid parameter prompt: is empty");
    assert_eq!(
        failure(long),
        format!("the prompt has {context} tokens but the context holds {context} (with 256 tokens to generate)")
    );
    assert!(failure(bad_sampling).contains("top_p"));
    let g = good.collect_generation().unwrap();
    assert_eq!((g.tokens.len(), g.finish_reason), (8, FinishReason::Length));
}

#[test]
fn cancelling_stops_a_request_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 4);
    let mut long = engine.submit(request("keep going", 400)).unwrap();
    let other = engine.submit(request("another", 20)).unwrap();
    for _ in 0..3 {
        assert!(matches!(long.next(), Some(Event::Token { .. })));
    }
    long.cancel();
    let rest: Vec<Event> = long.collect();
    match rest.last() {
        Some(Event::Done { finish_reason: FinishReason::Cancelled, stats }) => {
            assert!(stats.generated_tokens < 400, "{}", stats.generated_tokens)
        }
        other => panic!("last event {other:?}"),
    }
    assert_eq!(other.collect_generation().unwrap().tokens.len(), 20);
    // A dropped stream cancels too; the engine keeps serving.
    drop(engine.submit(request("nobody listens", 400)).unwrap());
    assert_eq!(engine.generate(request("after", 3)).unwrap().tokens.len(), 3);
}

#[test]
fn requests_beyond_the_batch_wait_their_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 2);
    let streams: Vec<_> = (0..5).map(|i| engine.submit(request(&format!("prompt {i}"), 4 + i)).unwrap()).collect();
    for (i, s) in streams.into_iter().enumerate() {
        assert_eq!(s.collect_generation().unwrap().tokens.len(), 4 + i);
    }
}

#[test]
fn zero_max_tokens_is_done_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 1);
    let g = engine.generate(request("nothing", 0)).unwrap();
    assert!(g.tokens.is_empty() && g.text.is_empty());
    assert_eq!(g.finish_reason, FinishReason::Length);
}

#[test]
fn stop_strings_cut_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 1);
    let full = engine.generate(request("the sea", 24)).unwrap();
    // A stop string from the middle of what greedy decoding produces.
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() >= 8, "{:?}", full.text);
    let stop: String = chars[4..7].iter().collect();
    let mut stopped = request("the sea", 24);
    stopped.options.stop_strings = vec![stop.clone()];
    let g = engine.generate(stopped).unwrap();
    assert_eq!(g.finish_reason, FinishReason::Stop);
    let at = full.text.find(&stop).unwrap();
    assert_eq!(g.text, full.text[..at]);
}

#[test]
fn dropping_the_engine_ends_every_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 1);
    let mut running = engine.submit(request("running", 100_000)).unwrap();
    let waiting = engine.submit(request("waiting", 10)).unwrap();
    // Started requests end cancelled, queued ones fail: wait for the first to start.
    assert!(matches!(running.next(), Some(Event::Token { .. })));
    drop(engine);
    let last = running.last();
    assert!(matches!(last, Some(Event::Done { finish_reason: FinishReason::Cancelled, .. })), "{last:?}");
    let err = waiting.collect_generation().unwrap_err().to_string();
    assert_eq!(err, "the engine has stopped");
}

#[test]
fn a_bundle_that_cannot_load_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.mlxb");
    let err = Engine::load(&missing, EngineOptions::default()).err().unwrap().to_string();
    assert!(err.starts_with("bundle: ") && err.contains("missing.mlxb"), "{err}");
}
