//! Property-based fuzzing of the config pipeline: `config.pbtxt` text and load-request JSON,
//! valid configs mutated token by token, go through parse → normalize → validate, which must
//! answer with a value or an error, never a panic or an unbounded allocation.
//!
//! CI runs a short fixed-seed pass; `./dev fuzz` runs millions of cases (`PROPTEST_CASES`,
//! `PROPTEST_RNG_SEED` override both).

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::{config_from_json, normalize, parse_pbtxt, validate};

/// Short and reproducible unless the environment asks otherwise.
pub(crate) fn config() -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = 512;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(0x5715_3eed);
    }
    c.failure_persistence = None;
    c
}

const SEEDS: &[&str] = &[
    include_str!("../../tests/ui/many_errors/config.pbtxt"),
    include_str!("../../tests/ui/out_of_bounds/config.pbtxt"),
    include_str!("../../tests/ui/escaping_paths/config.pbtxt"),
    include_str!("../../../../model_repo/text_direction/config.pbtxt"),
    include_str!("../../../../model_repo/ppocr_preprocess/config.pbtxt"),
    r#"platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape: { shape: [ 3 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
dynamic_batching { preferred_batch_size: [ 2, 4 ] priority_levels: 2 default_priority_level: 1
  priority_queue_policy { key: 1 value: { timeout_action: DELAY max_queue_size: 4 } } }
model_warmup [ { name: "w" batch_size: 2 count: 3 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3 ] random_data: true } } } ]
version_policy: { specific: { versions: [ 1, 3 ] } }"#,
];

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "-",
    "0",
    "1",
    "-1",
    "9223372036854775807",
    "18446744073709551616",
    "4294967296",
    "1e309",
    "..",
    "/",
    "name",
    "dims",
    "count",
    "max_batch_size",
    "input",
    "output",
    "TYPE_STRING",
    "KIND_GPU",
    "reshape",
    "\\",
    "\n",
    "#",
    "model_warmup",
    "priority_levels",
    "ensemble_scheduling",
    "step",
    "input_map",
    "true",
];

/// A seed config with `edits` applied: (position, token, delete-length).
fn mutate(seed: &str, edits: &[(usize, usize, usize)]) -> String {
    let mut s: Vec<char> = seed.chars().collect();
    for &(pos, tok, del) in edits {
        let at = pos % (s.len() + 1);
        let end = (at + del % 4).min(s.len());
        s.splice(at..end, TOKENS[tok % TOKENS.len()].chars());
    }
    s.into_iter().collect()
}

fn check_text(text: &str) {
    let dir = Path::new("/nonexistent/model");
    if let Ok(mut cfg) = parse_pbtxt("model", text) {
        normalize(&mut cfg, "model", dir);
        let _ = validate(cfg.clone(), "model", dir);
        let _ = cfg.instance_count();
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mutated_pbtxt_never_panics(
        seed in 0..SEEDS.len(),
        edits in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<usize>()), 0..8),
    ) {
        check_text(&mutate(SEEDS[seed], &edits));
    }

    #[test]
    fn arbitrary_pbtxt_never_panics(text in "\\PC{0,200}") {
        check_text(&text);
    }

    #[test]
    fn arbitrary_json_config_never_panics(
        seed in 0..SEEDS.len(),
        edits in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<usize>()), 0..4),
    ) {
        // A valid config as JSON (as a load request sends it), then mutated.
        if let Ok(cfg) = parse_pbtxt("model", SEEDS[seed]) {
            let json = serde_json::to_string(&super::config_to_json(&cfg)).unwrap_or_default();
            let text = mutate(&json, &edits);
            if let Ok(mut cfg) = config_from_json(&text) {
                let dir = Path::new("/nonexistent/model");
                normalize(&mut cfg, "model", dir);
                let _ = validate(cfg, "model", dir);
            }
        }
    }
}
