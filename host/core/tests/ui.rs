//! Golden tests for invalid configs: each `tests/ui/<case>/config.pbtxt` is parsed, normalized
//! and validated as the loader does (without a model file), and every reported error must match
//! `tests/ui/<case>/expected.txt`, one per line. `BLESS=1 cargo test -p wisp-core --test ui`
//! rewrites the expectations after a deliberate change.

use std::path::Path;

use wisp_core::config::{normalize, parse_pbtxt, validate};

fn errors_for(case: &Path) -> String {
    let name = case.file_name().unwrap().to_str().unwrap();
    let text = std::fs::read_to_string(case.join("config.pbtxt")).unwrap();
    let result = parse_pbtxt(name, &text).and_then(|mut cfg| {
        normalize(&mut cfg, name, case);
        validate(cfg, name, case)
    });
    match result {
        Ok(_) => "(valid)\n".to_string(),
        Err(e) => {
            let mut out = format!("model '{}'\n", e.model);
            for err in &e.errors {
                if err.path.is_empty() {
                    out.push_str(&format!("{}\n", err.message));
                } else {
                    out.push_str(&format!("{}: {}\n", err.path, err.message));
                }
            }
            out
        }
    }
}

#[test]
fn invalid_configs_report_every_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty());
    let bless = std::env::var_os("BLESS").is_some();
    let mut failures = Vec::new();
    for case in cases {
        let got = errors_for(&case);
        let expected_path = case.join("expected.txt");
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != want {
            failures.push(format!(
                "{}:\n--- expected\n{want}--- got\n{got}",
                case.display()
            ));
        }
        assert_ne!(got, "(valid)\n", "{} should be invalid", case.display());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
