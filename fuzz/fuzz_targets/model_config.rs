//! The model config a bundle carries, as the runtime reads it
//! (`ModelConfig::from_bundle_json`): normalized configs of this compiler and
//! Hugging Face configs of older bundles. The input's first line names the
//! architecture the bundle records; the rest is the config text. Whatever it
//! is, reading must return a config or an error, never panic; a config that
//! is accepted must validate and survive a round trip through its JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_arch::ModelConfig;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else { return };
    let (architecture, json) = text.split_once('\n').unwrap_or((text, ""));
    if let Ok(config) = ModelConfig::from_bundle_json(architecture, json) {
        config.validate().expect("an accepted config validates");
        let again = ModelConfig::from_bundle_json(config.architecture.name(), &config.to_json())
            .expect("a normalized config reads back");
        assert_eq!(again, config);
    }
});
