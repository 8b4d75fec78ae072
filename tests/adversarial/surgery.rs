//! Surgery YAML: alias bombs, factors that overflow f32, unknown keys, deep
//! nesting, wrong types, hostile globs and ids, and donor files outside the
//! directory, each given to `mlxcel-compile --surgery` over the tiny HF
//! directory.

use crate::corpus::{Case, Expect, hf, refuse, refuse_or_run};

fn case(name: impl Into<String>, yaml: impl Into<Vec<u8>>, expect: Expect) -> Case {
    let mut c = Case::compile("surgery", name, "m", expect);
    c.files = hf::files();
    c.files.push(("s.yaml".into(), yaml.into()));
    c.args.extend(["--surgery".into(), "{dir}/s.yaml".into()]);
    c
}

/// A billion-laughs document: `levels` levels of `width` aliases of the
/// level below, inside an operation (operations are read as YAML values
/// first, so the parser expands it before any field is checked).
fn alias_bomb(levels: usize, width: usize) -> String {
    let mut y = String::from("version: 1\noperations:\n  - op: scale\n    targets: \"model.norm.weight\"\n");
    y.push_str("    factor: 0.5\n    bomb:\n      - &l0 [\"model.norm.weight\"]\n");
    for i in 1..=levels {
        let refs = vec![format!("*l{}", i - 1); width].join(", ");
        y.push_str(&format!("      - &l{i} [{refs}]\n"));
    }
    y
}

/// Every surgery case.
pub fn cases() -> Vec<Case> {
    let scale = |f: &str| {
        format!("version: 1\noperations:\n  - op: scale\n    targets: \"model.norm.weight\"\n    factor: {f}\n")
    };
    let mut c = vec![case("valid-scale", scale("0.5"), Expect::Succeed)];
    for f in
        ["1e39", "-1e39", "1e300", "3.5e38", ".nan", ".inf", "-.inf", "1e-50", "\"half\"", "[1]", "null", "0x7FFFFFFF"]
    {
        let tag = f.replace(['"', '[', ']'], "");
        // 1e-50 rounds to 0 and 0x7FFFFFFF is a finite f32: either answer is honest.
        let expect = if f == "1e-50" || f == "0x7FFFFFFF" { refuse_or_run("factor") } else { refuse("factor") };
        c.push(case(format!("scale-factor-{tag}"), scale(f), expect));
    }
    for (levels, width) in [(9, 9), (12, 6), (20, 3), (30, 2)] {
        c.push(case(
            format!("alias-bomb-{levels}x{width}"),
            alias_bomb(levels, width),
            refuse("alias|limit|repetition"),
        ));
    }
    // Few events, many bytes: one long anchored string and thousands of
    // aliases of it stay under an event-counting repetition limit while
    // expanding to about 500 MB of target patterns (the case's memory bound
    // is 400 MB).
    for (len, copies) in [(50_000usize, 10_000usize), (100_000, 5_000)] {
        let yaml = format!(
            "version: 1\noperations:\n  - op: scale\n    factor: 0.5\n    targets: [&s \"{}\", {}]\n",
            "x".repeat(len),
            vec!["*s"; copies].join(", ")
        );
        let mut k = case(format!("alias-string-bomb-{len}x{copies}"), yaml, refuse("alias|limit|repetition|size"));
        k.memory_mb = Some(400);
        c.push(k);
    }
    let op = |body: &str| format!("version: 1\noperations:\n  - {body}\n");
    let bodies: Vec<(&str, String, &str)> = vec![
        ("unknown-op", op("op: teleport\n    targets: \"x\""), "teleport"),
        ("unknown-key", op("op: scale\n    targets: \"model.norm.weight\"\n    factor: 0.5\n    fator: 2"), "fator"),
        ("missing-factor", op("op: scale\n    targets: \"model.norm.weight\""), "factor"),
        ("missing-targets", op("op: scale\n    factor: 0.5"), "targets"),
        ("targets-number", op("op: scale\n    targets: 7\n    factor: 0.5"), "targets"),
        ("targets-match-nothing", op("op: scale\n    targets: \"nothing.*\"\n    factor: 0.5"), "nothing.*"),
        ("targets-bad-glob", op("op: scale\n    targets: \"model.[\"\n    factor: 0.5"), "model.["),
        ("prune-layer-out-of-range", op("op: prune\n    granularity: layer\n    ids: [7]\n    mode: remove"), "7"),
        (
            "prune-layer-huge",
            op("op: prune\n    granularity: layer\n    ids: [18446744073709551615]\n    mode: remove"),
            "layer|ids",
        ),
        ("prune-layer-negative", op("op: prune\n    granularity: layer\n    ids: [-1]\n    mode: remove"), "ids|-1"),
        ("prune-all-layers", op("op: prune\n    granularity: layer\n    ids: [0, 1]\n    mode: remove"), "layer"),
        (
            "prune-all-heads",
            op("op: prune\n    granularity: attention_head\n    ids: [0, 1, 2, 3]\n    mode: remove"),
            "head",
        ),
        (
            "prune-head-out-of-range",
            op("op: prune\n    granularity: attention_head\n    ids: [4]\n    mode: remove"),
            "4",
        ),
        (
            "prune-granularity-unknown",
            op("op: prune\n    granularity: molecule\n    ids: [0]\n    mode: remove"),
            "molecule",
        ),
        ("prune-mode-unknown", op("op: prune\n    granularity: layer\n    ids: [0]\n    mode: vaporize"), "vaporize"),
        (
            "prune-channels-all",
            op(&format!(
                "op: prune\n    granularity: mlp_channel\n    ids: {:?}\n    mode: remove",
                (0..64).collect::<Vec<_>>()
            )),
            "channel",
        ),
        (
            "donor-outside",
            op("op: replace\n    targets: \"model.norm.weight\"\n    source: ../../../../etc/passwd"),
            "etc/passwd",
        ),
        (
            "donor-missing",
            op("op: replace\n    targets: \"model.norm.weight\"\n    source: nowhere.safetensors"),
            "nowhere.safetensors",
        ),
        ("donor-directory", op("op: replace\n    targets: \"model.norm.weight\"\n    source: m"), "m"),
        (
            "donor-dev-zero",
            op("op: add\n    targets: \"model.norm.weight\"\n    source: /dev/zero\n    alpha: 1"),
            "/dev/zero",
        ),
        (
            "interpolate-ratio-nan",
            op(
                "op: interpolate\n    targets: \"model.norm.weight\"\n    sources: [model, model]\n    ratio: .nan\n    method: linear",
            ),
            "ratio",
        ),
        (
            "interpolate-ratio-2",
            op(
                "op: interpolate\n    targets: \"model.norm.weight\"\n    sources: [model, model]\n    ratio: 2\n    method: linear",
            ),
            "ratio",
        ),
        (
            "interpolate-method-unknown",
            op(
                "op: interpolate\n    targets: \"model.norm.weight\"\n    sources: [model, model]\n    ratio: 0.5\n    method: alchemy",
            ),
            "alchemy",
        ),
        (
            "add-alpha-huge",
            op("op: add\n    targets: \"model.norm.weight\"\n    source: model\n    alpha: 1e39"),
            "alpha",
        ),
    ];
    // Pruning everything may give a model that still runs, and
    // extrapolating is a choice: either answer is honest.
    let either = ["prune-all-layers", "prune-channels-all", "interpolate-ratio-2"];
    for (name, yaml, needle) in bodies {
        let expect = if either.contains(&name) { refuse_or_run(needle) } else { refuse(needle) };
        c.push(case(name, yaml, expect));
    }
    for (name, yaml, needle) in [
        ("version-2", "version: 2\noperations: []\n".to_string(), "version"),
        ("version-string", "version: \"one\"\noperations: []\n".into(), "version"),
        ("version-missing", "operations:\n  - op: scale\n".into(), "version"),
        ("operations-empty", "version: 1\noperations: []\n".into(), "operations"),
        ("operations-not-list", "version: 1\noperations: 7\n".into(), "operations"),
        ("empty-file", String::new(), "s.yaml"),
        ("not-yaml", "version: [1\n".into(), "s.yaml"),
        ("top-level-list", "- 1\n- 2\n".into(), "s.yaml"),
        ("deep-nesting", format!("version: 1\noperations: {}{}\n", "[".repeat(10_000), "]".repeat(10_000)), "s.yaml"),
        (
            "deep-mapping",
            format!("version: 1\nx: {}1{}\noperations: []\n", "{a: ".repeat(5_000), "}".repeat(5_000)),
            "s.yaml",
        ),
        ("tab-indent", "version: 1\noperations:\n\t- op: scale\n".into(), "s.yaml"),
        (
            "huge-string",
            format!(
                "version: 1\noperations:\n  - op: scale\n    targets: \"{}\"\n    factor: 0.5\n",
                "a".repeat(2_000_000)
            ),
            // Over the 1 MiB limit: refused before it is parsed.
            "limit",
        ),
        (
            "many-operations",
            format!(
                "version: 1\noperations:\n{}",
                "  - op: scale\n    targets: \"model.norm.weight\"\n    factor: 1.0\n".repeat(100_000)
            ),
            "operations",
        ),
        (
            "duplicate-keys",
            "version: 1\nversion: 1\noperations:\n  - op: scale\n    targets: \"model.norm.weight\"\n    factor: 0.5\n"
                .into(),
            "version",
        ),
        ("custom-tag", "version: 1\noperations:\n  - !!python/object:os.system {op: scale}\n".into(), "s.yaml"),
    ] {
        // Document-level errors name the surgery file or say "surgery";
        // many operations is a size question, not a malformed file.
        let needle = if needle == "s.yaml" { "s.yaml|surgery" } else { needle };
        let expect = if name == "many-operations" { refuse_or_run(needle) } else { refuse(needle) };
        c.push(case(format!("doc-{name}"), yaml, expect));
    }
    c.push(case("invalid-utf8", b"version: 1\noperations:\n  - op: \xff\xfe\n".to_vec(), refuse("s.yaml")));
    let mut missing = case("surgery-file-missing", "", refuse("nope.yaml"));
    missing.files.retain(|(p, _)| p != "s.yaml");
    missing.args = missing.args.iter().map(|a| a.replace("s.yaml", "nope.yaml")).collect();
    c.push(missing);
    c
}
