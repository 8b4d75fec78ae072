//! The engine on a real (tiny, random) bundle: requests stream tokens and
//! end with one `Done` or `Failed`; a bad request fails alone; cancelling or
//! dropping a request stops it; dropping the engine stops everything; stop
//! strings cut the text; long prompts are read a chunk at a time while
//! other streams flow; the prefix cache reuses shared prompts without
//! changing a token; the KV budget refuses and queues.

use std::path::PathBuf;

use mlxcel_runtime::engine::{Engine, EngineOptions, EngineStats, Event, PrefixReuse, Request};
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

/// An engine over a tiny `arch` bundle with `options` (its `load` is the default).
fn engine_with(bundle: &std::path::Path, options: EngineOptions) -> Engine {
    Engine::load(bundle, EngineOptions { load: LoadOptions::default(), ..options }).unwrap()
}

fn tokens_request(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { prompt, options: GenerationOptions { max_tokens, ignore_eos: true, ..GenerationOptions::default() } }
}

/// The bits of log-probabilities: the prefix cache must not change one.
fn bits(logprobs: &[f32]) -> Vec<u32> {
    logprobs.iter().map(|x| x.to_bits()).collect()
}

/// Waits until the engine has published `done(stats)` (it publishes after
/// each iteration, just after the events of that iteration go out).
fn stats_when(engine: &Engine, done: impl Fn(&EngineStats) -> bool) -> EngineStats {
    for _ in 0..500 {
        let s = engine.stats();
        if done(&s) {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    engine.stats()
}

#[test]
fn a_stream_keeps_flowing_while_a_long_prompt_is_prefilled() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let engine = engine_with(&bundle, EngineOptions { max_batch: 2, prefill_chunk: 8, ..EngineOptions::default() });
    // 200 prompt tokens: 25 chunks of 8, one per iteration.
    let long_prompt: Vec<u32> = (0..200).map(|i| (i * 7 % 250) as u32).collect();
    let short = engine.submit(request("short", 10)).unwrap();
    let mut long = engine.submit(tokens_request(long_prompt, 3)).unwrap();
    // The short request decodes a token per iteration while the long one is
    // read: it is done before the long one's first token. (Prefilling the
    // whole prompt at admission would give both their first token in the
    // same step.)
    assert!(matches!(long.next(), Some(Event::Token { .. })));
    let before: Vec<Event> = std::iter::from_fn(|| short.try_next()).collect();
    let tokens = before.iter().filter(|e| matches!(e, Event::Token { .. })).count();
    assert_eq!(tokens, 10, "{before:?}");
    assert!(matches!(before.last(), Some(Event::Done { .. })), "{before:?}");
    assert_eq!(long.collect::<Vec<_>>().len(), 3, "two more tokens and Done");
}

#[test]
fn decode_steps_count_steps_not_iterations() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let engine = engine_with(&bundle, EngineOptions { prefill_chunk: 8, ..EngineOptions::default() });
    // 40 prompt tokens: 5 prefill iterations (39 tokens), the last with the one decode step.
    let g = engine.generate(tokens_request((0..40).collect(), 1)).unwrap();
    assert_eq!(g.tokens.len(), 1);
    let s = stats_when(&engine, |s| s.running == 0 && s.decode_steps > 0);
    assert_eq!((s.decode_steps, s.running, s.kv_bytes, s.kv_tokens), (1, 0, 0, 0), "{s:?}");
    engine.generate(tokens_request((0..4).collect(), 5)).unwrap();
    let s = stats_when(&engine, |s| s.decode_steps >= 6);
    assert_eq!(s.decode_steps, 6, "{s:?}");
    assert_eq!((s.prefix_cache_hits, s.prefix_cache_misses, s.prefix_cache_entries), (0, 0, 0), "cache off");
}

#[test]
fn the_warm_up_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let options =
        |warm_up| EngineOptions { prefill_chunk: 8, prefix_cache: 1 << 30, warm_up, ..EngineOptions::default() };
    // The warm-up prefills token 0 (twice on the CPU) and decodes one more:
    // a prompt of zeros would reuse its caches had it left any.
    let zeros = vec![0u32; 20];
    mlxcel_tests::isa::each_kernel_build(|build, _| {
        let cold = engine_with(&bundle, options(false));
        let warm = engine_with(&bundle, options(true));
        assert_eq!(cold.model().warm_up_time, None);
        assert!(warm.model().warm_up_time.is_some(), "{build}");
        assert_eq!(warm.stats(), EngineStats::default(), "{build}: the warm-up is not a request");
        let expected = cold.generate(tokens_request(zeros.clone(), 6)).unwrap();
        let g = warm.generate(tokens_request(zeros.clone(), 6)).unwrap();
        assert_eq!(g.stats.cached_tokens, 0, "{build}: the warm-up's caches were reused");
        assert_eq!(g.tokens, expected.tokens, "{build}: the warm-up changed the tokens");
        assert_eq!(bits(&g.logprobs), bits(&expected.logprobs), "{build}: the warm-up changed the logprobs");
        let s = stats_when(&warm, |s| s.prefix_cache_entries > 0 && s.running == 0);
        assert_eq!((s.prefix_cache_hits, s.prefix_cache_misses, s.decode_steps), (0, 1, 6), "{build}: {s:?}");
    });
}

#[test]
fn a_context_too_short_for_the_warm_up_skips_it() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let engine = engine_with(&bundle, EngineOptions { context: Some(1), warm_up: true, ..EngineOptions::default() });
    assert_eq!(engine.model().warm_up_time, None);
}

/// A system prompt shared by chat requests: 44 tokens.
fn with_system(question: &str) -> Vec<u32> {
    let system = "You are a helpful assistant. Answer briefly.";
    assert_eq!(system.len(), 44);
    format!("{system}{question}").bytes().map(u32::from).collect()
}

#[test]
fn a_shared_prefix_is_reused_with_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let options = |prefix_cache| EngineOptions { prefill_chunk: 8, prefix_cache, ..EngineOptions::default() };
    let questions = ["What is the sea?", "What is the sky?", "What"];
    // The kernel build is process-wide: hold it while comparing bits (and
    // start the engines under it: cached state is the build's own).
    mlxcel_tests::isa::each_kernel_build(|build, _| {
        let plain = engine_with(&bundle, options(0));
        let cached = engine_with(&bundle, options(1 << 30));
        for (i, q) in questions.iter().enumerate() {
            let expected = plain.generate(tokens_request(with_system(q), 12)).unwrap();
            let g = cached.generate(tokens_request(with_system(q), 12)).unwrap();
            assert_eq!(g.tokens, expected.tokens, "{build}: request {i}: the prefix cache changed the tokens");
            assert_eq!(bits(&g.logprobs), bits(&expected.logprobs), "{build}: request {i}: logprobs differ");
            assert_eq!(expected.stats.cached_tokens, 0);
            if i == 0 {
                continue;
            }
            // Shared with the previous request's tokens: the system prompt
            // plus "What is the s" (57) for the second, and all of the third's
            // 48 tokens but its last one; in whole chunks of 8.
            let expected_cached = if i == 1 { 56 } else { 40 };
            assert_eq!(g.stats.cached_tokens, expected_cached, "{build}: request {i}");
        }
        let s = stats_when(&cached, |s| s.prefix_cache_entries > 0 && s.running == 0);
        assert_eq!((s.prefix_cache_hits, s.prefix_cache_misses, s.prefix_cache_tokens), (2, 1, 96), "{s:?}");
        assert!(s.prefix_cache_entries == 1 && s.prefix_cache_bytes > 0, "{s:?}");
    });
}

#[test]
fn longest_reuse_takes_a_conversations_whole_history() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let options = |prefix_reuse| EngineOptions {
        prefill_chunk: 8,
        prefix_cache: 1 << 30,
        prefix_reuse,
        ..EngineOptions::default()
    };
    // Turn one: a 50-token prompt (not a whole number of chunks) and 10
    // generated tokens; turn two repeats both and asks more.
    let first = with_system("Why?!");
    let turn = |engine: &Engine| {
        let one = engine.generate(tokens_request(first.clone(), 10)).unwrap();
        let mut second = first.clone();
        second.extend(&one.tokens);
        second.extend("And then?".bytes().map(u32::from));
        (one, engine.generate(tokens_request(second, 6)).unwrap())
    };
    let (one, two) = turn(&engine_with(&bundle, options(PrefixReuse::Longest)));
    assert_eq!(one.stats.cached_tokens, 0);
    // Everything turn one's forward passes fed: its prompt and 9 of its 10
    // tokens (the last one was sampled, never fed).
    assert_eq!(two.stats.cached_tokens, first.len() + 9, "{:?}", two.stats);
    assert_eq!(two.tokens.len(), 6);
    // Exact reuse stops at the last whole chunk the first prompt filled.
    let (_, exact) = turn(&engine_with(&bundle, options(PrefixReuse::Exact)));
    assert_eq!(exact.stats.cached_tokens, 48, "{:?}", exact.stats);
}

#[test]
fn the_prefix_cache_evicts_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let a: Vec<u32> = (0..30).collect();
    let b: Vec<u32> = (100..130).collect();
    // One entry's bytes, measured.
    let entry = {
        let engine =
            engine_with(&bundle, EngineOptions { prefill_chunk: 8, prefix_cache: 1 << 30, ..Default::default() });
        engine.generate(tokens_request(a.clone(), 4)).unwrap();
        let bytes = stats_when(&engine, |s| s.prefix_cache_entries == 1).prefix_cache_bytes;
        // It holds 29 + 3 positions; the budget reserved for 30 + 4 bounds it.
        let model = engine.model();
        assert!(bytes >= 32 * model.kv_bytes_per_token() && bytes <= model.kv_bytes_for(34), "{bytes}");
        bytes
    };
    // Room for one entry, not two.
    let engine =
        engine_with(&bundle, EngineOptions { prefill_chunk: 8, prefix_cache: entry * 3 / 2, ..Default::default() });
    let cached = |prompt: &[u32]| engine.generate(tokens_request(prompt.to_vec(), 4)).unwrap().stats.cached_tokens;
    assert_eq!(cached(&a), 0);
    assert_eq!(cached(&b), 0);
    // `a`'s entry went for `b`'s.
    assert_eq!(cached(&a), 0);
    let s = stats_when(&engine, |s| s.running == 0 && s.prefix_cache_misses == 3);
    assert_eq!((s.prefix_cache_entries, s.prefix_cache_bytes), (1, entry), "{s:?}");
    // Now `a`'s is the one kept: a prompt extending it reuses 24 positions.
    let mut longer = a.clone();
    longer.extend([7, 7, 7]);
    assert_eq!(cached(&longer), 24);
    assert_eq!(cached(&b), 0);
    // A budget smaller than any entry keeps nothing.
    let tiny = engine_with(&bundle, EngineOptions { prefill_chunk: 8, prefix_cache: entry / 2, ..Default::default() });
    tiny.generate(tokens_request(a.clone(), 4)).unwrap();
    assert_eq!(tiny.generate(tokens_request(a.clone(), 4)).unwrap().stats.cached_tokens, 0);
    assert_eq!(tiny.stats().prefix_cache_entries, 0);
}

#[test]
fn the_kv_budget_refuses_what_never_fits_and_queues_what_fits_later() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let probe = engine_with(&bundle, EngineOptions::default());
    let model = probe.model().clone();
    drop(probe);
    // Each request holds 20 + 30 tokens; the budget holds one such, not two.
    let one = model.kv_bytes_for(50);
    assert!(one > 0 && model.kv_bytes_per_token() > 0);
    let budget = one * 3 / 2;
    let engine = engine_with(&bundle, EngineOptions { kv_budget: Some(budget), ..EngineOptions::default() });
    // Refused at submission: it never waits in the queue.
    let too_big = engine.submit(tokens_request(vec![5; 20], 100_000)).err().unwrap();
    let tokens = model.context_length();
    let needed = model.kv_bytes_for(tokens);
    assert!(needed > budget);
    assert_eq!(
        too_big.to_string(),
        format!("the request needs {needed} bytes of KV cache ({tokens} tokens) but the KV budget is {budget} bytes")
    );
    let first = engine.submit(tokens_request(vec![6; 20], 30)).unwrap();
    let mut second = engine.submit(tokens_request(vec![7; 20], 30)).unwrap();
    // The second starts only once the first is done.
    assert!(matches!(second.next(), Some(Event::Token { .. })));
    let first_events: Vec<Event> = std::iter::from_fn(|| first.try_next()).collect();
    assert!(matches!(first_events.last(), Some(Event::Done { finish_reason: FinishReason::Length, .. })));
    assert_eq!(second.collect_generation().unwrap().tokens.len(), 29);
}

#[test]
fn a_sliding_window_prefix_is_reused_while_its_ring_has_not_wrapped() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "gemma3", 4);
    let options = |prefix_cache| EngineOptions { prefill_chunk: 4, prefix_cache, ..EngineOptions::default() };
    mlxcel_tests::isa::each_kernel_build(|build, _| {
        let plain = engine_with(&bundle, options(0));
        let cached = engine_with(&bundle, options(1 << 30));
        // Window 8. A 6-token prompt and 2 tokens generated hold 7 positions:
        // unwrapped, cut back to 4 for a prompt sharing its first 6.
        let short: Vec<u32> = (10..16).collect();
        let extended: Vec<u32> = (10..21).collect();
        // 16 prompt tokens and 4 generated: 19 positions, wrapped.
        let long: Vec<u32> = (30..46).collect();
        let long_extended: Vec<u32> = (30..52).collect();
        for (prompt, max, expected_cached) in [(&short, 2, 0), (&extended, 6, 4), (&long, 4, 0), (&long_extended, 6, 0)]
        {
            let expected = plain.generate(tokens_request(prompt.clone(), max)).unwrap();
            let g = cached.generate(tokens_request(prompt.clone(), max)).unwrap();
            assert_eq!(g.tokens, expected.tokens, "{build}: {prompt:?}: the prefix cache changed the tokens");
            assert_eq!(bits(&g.logprobs), bits(&expected.logprobs), "{build}: {prompt:?}: logprobs differ");
            assert_eq!(g.stats.cached_tokens, expected_cached, "{build}: {prompt:?}");
        }
    });
}

#[test]
fn a_request_cancelled_while_its_prompt_is_read_ends_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let engine = engine_with(&bundle, EngineOptions { max_batch: 2, prefill_chunk: 2, ..EngineOptions::default() });
    let mut stream = engine.submit(request("stream", 400)).unwrap();
    // 480 prompt tokens, 2 per iteration: 240 iterations to read.
    let long = engine.submit(tokens_request((0..480).map(|i| (i % 250) as u32).collect(), 5)).unwrap();
    for _ in 0..5 {
        assert!(matches!(stream.next(), Some(Event::Token { .. })));
    }
    while stream.try_next().is_some() {}
    long.cancel();
    let events: Vec<Event> = long.collect();
    assert!(
        matches!(events[..], [Event::Done { finish_reason: FinishReason::Cancelled, .. }]),
        "cancelled before its first token: {events:?}"
    );
    // The cancel was noticed within a few iterations, not after the prompt.
    let meanwhile = std::iter::from_fn(|| stream.try_next()).count();
    assert!(meanwhile < 100, "{meanwhile} tokens of the other stream before the cancel was noticed");
    stream.cancel();
    assert!(matches!(stream.last(), Some(Event::Done { finish_reason: FinishReason::Cancelled, .. })));
}

#[test]
fn a_cancelled_request_leaves_the_queue_behind_one_the_kv_budget_holds() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 4);
    let probe = engine_with(&bundle, EngineOptions::default());
    // Requests of 20 + 200 tokens; the budget holds one, not two.
    let one = probe.model().kv_bytes_for(220);
    drop(probe);
    let engine = engine_with(&bundle, EngineOptions { kv_budget: Some(one * 3 / 2), ..EngineOptions::default() });
    let mut running = engine.submit(tokens_request(vec![6; 20], 200)).unwrap();
    assert!(matches!(running.next(), Some(Event::Token { .. })));
    // Held back by the budget, and one behind it.
    let held = engine.submit(tokens_request(vec![7; 20], 200)).unwrap();
    let behind = engine.submit(tokens_request(vec![8; 20], 200)).unwrap();
    behind.cancel();
    let events: Vec<Event> = behind.collect();
    assert!(matches!(events[..], [Event::Done { finish_reason: FinishReason::Cancelled, .. }]), "{events:?}");
    // It left while the first request still ran (not once it reached the
    // head of the queue, after the first was done).
    let so_far: Vec<Event> = std::iter::from_fn(|| running.try_next()).collect();
    assert!(!so_far.iter().any(|e| matches!(e, Event::Done { .. })), "{} events", so_far.len());
    assert_eq!(running.collect_generation().unwrap().tokens.len() + so_far.len(), 199);
    assert_eq!(held.collect_generation().unwrap().tokens.len(), 200);
}

/// A grammar holds on a random model (whatever it would say, every token
/// is masked to the schema) and ends the output when the document is
/// complete; an unconstrained neighbour in the same batch is unchanged.
#[test]
fn a_json_schema_is_enforced_and_neighbours_are_unchanged() {
    use mlxcel_runtime::constraint::Grammar;
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 4);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"enum": [1, 2, 3]},
            "tag": {"type": "string", "maxLength": 5}
        },
        "required": ["ok", "n", "tag"],
        "additionalProperties": false
    });
    let constrained = |seed: u64| {
        let mut r = request("answer in JSON", 200);
        r.options.grammar = Some(Grammar::JsonSchema(schema.clone()));
        r.options.sampling.temperature = 1.0;
        r.options.sampling.seed = Some(seed);
        r
    };
    let alone = engine.generate(request("a neighbour", 24)).unwrap();
    let gens: Vec<_> = (0..3).map(|seed| engine.submit(constrained(seed)).unwrap()).collect::<Vec<_>>();
    let neighbour = engine.submit(request("a neighbour", 24)).unwrap();
    for g in gens {
        let g = g.collect_generation().unwrap();
        assert_eq!(g.finish_reason, FinishReason::Stop, "{:?}", g.text);
        let v: serde_json::Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{:?}: {e}", g.text));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 3, "{v}");
        assert!(o["ok"].is_boolean() && [1, 2, 3].contains(&o["n"].as_i64().unwrap()), "{v}");
        assert!(o["tag"].as_str().unwrap().chars().count() <= 5, "{v}");
    }
    assert_eq!(neighbour.collect_generation().unwrap().tokens, alone.tokens);
}

#[test]
fn a_grammar_that_cannot_be_enforced_is_refused_at_submit() {
    use mlxcel_runtime::constraint::Grammar;
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = engine(&dir, 4);
    let mut r = request("x", 8);
    r.options.grammar = Some(Grammar::JsonSchema(serde_json::json!({"type": "array", "uniqueItems": true})));
    let e = engine.submit(r).err().expect("refused").to_string();
    assert!(e.contains("uniqueItems"), "{e}");
}
