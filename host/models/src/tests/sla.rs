//! SLA-guarded rollout: rollback of a slow or failing version, withholding across restarts.

use super::*;

/// A plain model whose SLA is a p99 of 5 ms and no failures at all, judged over 10 requests,
/// watched for `window_secs` after a reload.
fn guarded_config(window_secs: u64) -> String {
    format!(
        r#"{}parameters [
  {{ key: "sla.p99_latency_ms" value {{ string_value: "5" }} }},
  {{ key: "sla.max_error_rate" value {{ string_value: "0" }} }},
  {{ key: "sla.min_requests" value {{ string_value: "10" }} }},
  {{ key: "sla.window_secs" value {{ string_value: "{window_secs}" }} }}
]
"#,
        plain_config(1)
    )
}

/// Sends `n` requests to `name`, returning how many failed.
fn send(r: &Registry, name: &str, n: usize) -> usize {
    let m = r.get(name, None).unwrap();
    (0..n)
        .filter(|_| {
            let input = Tensor::new("IN", DataType::Fp32, vec![1], vec![0u8; 4].into()).unwrap();
            let request = InferRequest {
                inputs: vec![input],
                ..Default::default()
            };
            m.infer_blocking(request, Instant::now() + Duration::from_secs(10))
                .is_err()
        })
        .count()
}

#[test]
fn a_slow_new_version_is_rolled_back_and_stays_listed_with_why() {
    let repo = tempfile::tempdir().unwrap();
    // (the default version policy serves the latest version only)
    write_model(repo.path(), "m", &guarded_config(60), Some("one"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert!(r.lifecycle_counts().is_empty(), "no watch at first load");
    // Latency is judged against the previous version on like-sized requests: it served some.
    assert_eq!(send(&r, "m", 10), 0);

    std::fs::create_dir_all(repo.path().join("m/2")).unwrap();
    std::fs::write(repo.path().join("m/2/model.onnx"), "slow two").unwrap();
    r.poll();
    assert_eq!(served_tag(&r, "m"), "slow two");
    assert!(index_row(&r, "m").reason.starts_with("under SLA watch"));
    r.watch_rollouts();
    assert_eq!(
        served_tag(&r, "m"),
        "slow two",
        "two requests are too few to judge"
    );

    assert_eq!(send(&r, "m", 10), 0);
    r.watch_rollouts();
    assert_eq!(served_tag(&r, "m"), "one");
    let rows = r.index(false).unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!((rows[0].version, rows[0].state), (Some(1), "READY"));
    assert_eq!((rows[1].version, rows[1].state), (Some(2), "UNAVAILABLE"));
    for row in &rows {
        assert!(
            row.reason.starts_with("rolled back: the new version (2)"),
            "{row:?}"
        );
        assert!(row.reason.contains("p99 latency"), "{row:?}");
    }
    assert_eq!(counts(&r, "m").rollbacks, 1);

    // Poll does not retry the same files; a change to them does.
    r.poll();
    assert_eq!(served_tag(&r, "m"), "one");
    rewrite(&repo.path().join("m/2/model.onnx"), "fine two, fast");
    r.poll();
    assert_eq!(served_tag(&r, "m"), "fine two, fast");
    assert_eq!(index_row(&r, "m").version, Some(2));
}

#[test]
fn a_rolled_back_version_stays_withheld_after_a_restart_until_its_files_change() {
    let repo = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &guarded_config(60), Some("one"));
    {
        let (r, _) = registry_with_state(repo.path(), Some(state.path()));
        r.load_initial(None).unwrap();
        assert_eq!(send(&r, "m", 10), 0);
        std::fs::create_dir_all(repo.path().join("m/2")).unwrap();
        std::fs::write(repo.path().join("m/2/model.onnx"), "slow two").unwrap();
        r.poll();
        assert_eq!(send(&r, "m", 10), 0);
        r.watch_rollouts();
        assert_eq!(served_tag(&r, "m"), "one");
    }
    // A restarted server (the same state directory) serves version 1, not the latest, and
    // says why version 2 is out.
    let (r, _) = registry_with_state(repo.path(), Some(state.path()));
    r.load_initial(None).unwrap();
    assert_eq!(served_tag(&r, "m"), "one");
    let rows = r.index(false).unwrap();
    let two = rows
        .iter()
        .find(|row| row.version == Some(2))
        .expect("listed");
    assert_eq!(two.state, "UNAVAILABLE");
    assert!(
        two.reason.starts_with("rolled back: the new version (2)")
            && two.reason.ends_with("(withheld until its files change)"),
        "{two:?}"
    );
    // An explicit load of the same files withholds it too; new files load (under watch).
    r.load("m", None).unwrap();
    assert_eq!(served_tag(&r, "m"), "one");
    rewrite(&repo.path().join("m/2/model.onnx"), "fine two, fast");
    r.poll();
    assert_eq!(served_tag(&r, "m"), "fine two, fast");
    // ... and the record is gone for the next restart.
    let (r, _) = registry_with_state(repo.path(), Some(state.path()));
    r.load_initial(None).unwrap();
    assert_eq!(served_tag(&r, "m"), "fine two, fast");
}

#[test]
fn a_failing_new_version_is_rolled_back_and_only_its_own_requests_failed() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &guarded_config(60), Some("one"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(send(&r, "m", 5), 0);

    rewrite(&repo.path().join("m/1/model.onnx"), "fail two");
    r.load("m", None).unwrap();
    let old = r.get("m", None).unwrap();
    // Requests keep coming while the watch judges: the ones the bad version took fail, every
    // one after the swap back succeeds.
    assert_eq!(send(&r, "m", 10), 10);
    r.watch_rollouts();
    assert_eq!(send(&r, "m", 50), 0);
    assert_eq!(served_tag(&r, "m"), "one");
    // A request already holding the bad version still gets its answer (an error of its own).
    assert!(send_to(&old).is_err());
    assert_eq!(counts(&r, "m").rollbacks, 1);
}

fn send_to(m: &ModelVersion) -> Result<InferResponse> {
    let input = Tensor::new("IN", DataType::Fp32, vec![1], vec![0u8; 4].into()).unwrap();
    let request = InferRequest {
        inputs: vec![input],
        ..Default::default()
    };
    m.infer_blocking(request, Instant::now() + Duration::from_secs(10))
}

#[test]
fn a_healthy_new_version_is_kept_after_its_window() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &guarded_config(1), Some("one"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();

    rewrite(&repo.path().join("m/1/model.onnx"), "two, healthy");
    r.load("m", None).unwrap();
    assert_eq!(send(&r, "m", 30), 0);
    r.watch_rollouts();
    assert_eq!(
        r.lifecycle_counts(),
        vec![("m".to_string(), Default::default(), true)]
    );
    std::thread::sleep(Duration::from_millis(1100));
    r.watch_rollouts();
    assert_eq!(served_tag(&r, "m"), "two, healthy");
    let c = counts(&r, "m");
    assert_eq!((c.kept, c.rollbacks), (1, 0));
    assert_eq!(index_row(&r, "m").reason, "");
}

#[test]
fn a_reload_during_the_watch_keeps_the_last_good_version_for_rollback() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &guarded_config(60), Some("one"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(send(&r, "m", 10), 0);
    let file = repo.path().join("m/1/model.onnx");
    rewrite(&file, "slow two");
    r.load("m", None).unwrap();
    rewrite(&file, "slow three!");
    r.load("m", None).unwrap();
    assert_eq!(send(&r, "m", 10), 0);
    r.watch_rollouts();
    assert_eq!(served_tag(&r, "m"), "one");

    // A load that fails counts in the metrics and leaves the serving version alone.
    rewrite(&file, "broken again");
    assert!(r.load("m", None).is_err());
    assert_eq!(served_tag(&r, "m"), "one");
    assert_eq!(counts(&r, "m").load_failures, 1);
}

#[test]
fn unload_ends_a_watch_and_a_bad_sla_parameter_fails_the_load() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &guarded_config(60), Some("one"));
    write_model(repo.path(), "bad", &guarded_config(0), Some("one"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    let row = index_row(&r, "bad");
    assert_eq!(row.state, "UNAVAILABLE");
    assert!(row.reason.contains("sla.window_secs"), "{row:?}");

    rewrite(&repo.path().join("m/1/model.onnx"), "slow two");
    r.load("m", None).unwrap();
    r.unload("m").unwrap();
    r.watch_rollouts();
    assert!(r.get("m", None).is_err(), "unloaded stays unloaded");
    assert!(!r
        .lifecycle_counts()
        .iter()
        .any(|(_, _, watching)| *watching));
}
