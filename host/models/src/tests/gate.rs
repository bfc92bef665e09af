//! A version's gate: a new version that answers differently, or slower, than its baseline on the
//! held-out inputs does not serve.

use super::*;

/// A plain model whose gate asks for a cosine of 0.999 and an absolute difference of 0.1,
/// with one held-out sample, and `extra` parameters.
fn gated_config(extra: &[(&str, &str)]) -> String {
    let mut params = vec![("gate.min_cosine", "0.999"), ("gate.max_abs_diff", "0.1")];
    params.extend_from_slice(extra);
    let params: Vec<String> = params
        .iter()
        .map(|(k, v)| format!(r#"{{ key: "{k}" value {{ string_value: "{v}" }} }}"#))
        .collect();
    format!(
        r#"{}parameters [ {} ]
model_warmup [ {{ name: "held-out" batch_size: 1 inputs {{ key: "IN" value {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }} }} }} ]
"#,
        plain_config(1),
        params.join(", ")
    )
}

fn add_version(root: &Path, v: u64, text: &str) {
    let dir = root.join(format!("m/{v}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.onnx"), text).unwrap();
}

/// The versions served and the scores the served one answers.
fn served(r: &Registry) -> (u64, Vec<f32>) {
    let (m, out) = ask(r, "m");
    (m.version, out.outputs[0].values().unwrap())
}

fn row(r: &Registry, v: u64) -> IndexEntry {
    r.index(false)
        .unwrap()
        .into_iter()
        .find(|e| e.name == "m" && e.version == Some(v))
        .unwrap_or_else(|| panic!("no row for version {v}"))
}

#[test]
fn a_new_version_that_agrees_serves_with_its_figures() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &gated_config(&[]), Some("scores 1 2 3"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert!(
        r.get("m", None).unwrap().gate.is_none(),
        "nothing to compare a first load with"
    );

    add_version(repo.path(), 2, "scores 1 2 3.05");
    r.poll();
    let (v, scores) = served(&r);
    assert_eq!((v, scores), (2, vec![1.0, 2.0, 3.05]));
    let report = r.get("m", None).unwrap().gate.clone().expect("judged");
    assert!(report.passed(), "{report}");
    assert_eq!((report.baseline, report.samples, report.rows), (1, 1, 1));
    assert!(
        report.min_cosine > 0.999 && report.max_abs_diff > 0.04,
        "{report}"
    );
    assert_eq!(counts(&r, "m").gate_passed, 1);
}

#[test]
fn a_new_version_that_disagrees_does_not_serve_and_says_what_was_measured() {
    let repo = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &gated_config(&[]), Some("scores 1 2 3"));
    {
        let (r, _) = registry_with_state(repo.path(), Some(state.path()));
        r.load_initial(None).unwrap();
        add_version(repo.path(), 2, "scores 3 2 1");
        r.poll();
        assert_eq!(served(&r).0, 1, "the previous version keeps serving");
        let why = index_row(&r, "m").reason;
        assert!(why.starts_with("reload failed, previous version still serving: version 2: failed its gate: min cosine 0.7143 under gate.min_cosine 0.999; max abs diff 2.000e0 over gate.max_abs_diff 0.1; measured against version 1"), "{why}");
        assert_eq!(counts(&r, "m").gate_failed, 1);
        // Poll does not judge the same files again.
        r.poll();
        assert_eq!(counts(&r, "m").gate_failed, 1);
    }
    // A restart with the same state directory does not serve it ungated.
    let (r, _) = registry_with_state(repo.path(), Some(state.path()));
    r.load_initial(None).unwrap();
    assert_eq!(served(&r).0, 1);
    let two = row(&r, 2);
    assert_eq!(two.state, "UNAVAILABLE");
    assert!(two.reason.contains("failed its gate"), "{two:?}");
    // New files for version 2 are judged afresh.
    rewrite(&repo.path().join("m/2/model.onnx"), "scores 1 2 3.01");
    r.poll();
    assert_eq!(served(&r), (2, vec![1.0, 2.0, 3.01]));
    assert_eq!(counts(&r, "m").gate_passed, 1);
}

#[test]
fn a_first_load_with_a_baseline_serves_the_baseline_in_place_of_a_failed_version() {
    let repo = tempfile::tempdir().unwrap();
    let config = gated_config(&[("gate.baseline_version", "1")]);
    write_model(repo.path(), "m", &config, Some("scores 1 2 3"));
    add_version(repo.path(), 2, "scores 0 0 9");
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(served(&r).0, 1);
    assert_eq!(row(&r, 1).state, "READY");
    let two = row(&r, 2);
    assert_eq!(two.state, "UNAVAILABLE");
    assert!(
        two.reason.starts_with("failed its gate: min cosine"),
        "{two:?}"
    );

    // One that agrees serves alone, as its version policy says; the baseline was only read.
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &config, Some("scores 1 2 3"));
    add_version(repo.path(), 2, "scores 1 2 3");
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(served(&r).0, 2);
    let versions: Vec<Option<u64>> = r.index(false).unwrap().iter().map(|e| e.version).collect();
    assert_eq!(versions, [Some(2)]);
}

#[test]
fn a_baseline_that_cannot_load_fails_the_gate_closed() {
    let repo = tempfile::tempdir().unwrap();
    let config = gated_config(&[("gate.baseline_version", "7")]);
    write_model(repo.path(), "m", &config, Some("scores 1 2 3"));
    let (r, _) = registry(repo.path());
    assert!(r.load_initial(None).is_ok());
    assert!(r.get("m", None).is_err());
    let one = row(&r, 1);
    assert!(
        one.reason
            .contains("the baseline version 7 cannot be loaded"),
        "{one:?}"
    );
}

#[test]
fn a_slower_version_breaks_its_latency_ratio() {
    let repo = tempfile::tempdir().unwrap();
    let config = gated_config(&[("gate.max_latency_ratio", "1.5"), ("gate.rounds", "3")]);
    write_model(repo.path(), "m", &config, Some("scores 1 2 3"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    add_version(repo.path(), 2, "slow scores 1 2 3");
    r.poll();
    assert_eq!(served(&r).0, 1);
    let why = index_row(&r, "m").reason;
    assert!(why.contains("over gate.max_latency_ratio 1.5"), "{why}");
}

#[test]
fn a_first_load_with_a_baseline_serves_it_in_place_of_a_version_that_does_not_load() {
    let repo = tempfile::tempdir().unwrap();
    let config = gated_config(&[("gate.baseline_version", "1")]);
    write_model(repo.path(), "m", &config, Some("scores 1 2 3"));
    add_version(repo.path(), 2, "broken two");
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(served(&r).0, 1);
    assert!(row(&r, 2).reason.contains("broken"), "{:?}", row(&r, 2));
    // Without a baseline, nothing stands in: the model is unavailable, as any broken latest
    // version leaves it.
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &gated_config(&[]), Some("scores 1 2 3"));
    add_version(repo.path(), 2, "broken two");
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert!(r.get("m", None).is_err());
}
