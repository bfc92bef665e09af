use super::files::write_whole;
use super::*;

fn on(file: &str) -> TraceSettings {
    TraceSettings {
        level: vec!["TIMESTAMPS".into()],
        rate: 2,
        count: 3,
        log_frequency: 0,
        file: file.into(),
        mode: "triton".into(),
    }
}

#[test]
fn samples_by_rate_and_count() {
    let t = TraceControl::new(on("/dev/null"), None);
    let taken = (0..20)
        .filter(|_| t.sample("m", 1, "", None).is_some())
        .count();
    assert_eq!(taken, 3, "every 2nd request, 3 at most");
    assert!(TraceControl::new(TraceSettings::default(), None)
        .sample("m", 1, "", None)
        .is_none());
}

#[test]
fn updates_are_checked_all_or_nothing_and_per_model() {
    let t = TraceControl::new(on("/tmp/x"), None);
    let upd = |v: Value| v.as_object().unwrap().clone();
    let s = t
        .update(Some("m"), &upd(serde_json::json!({"trace_rate": "5"})))
        .unwrap();
    assert_eq!(s.rate, 5);
    assert_eq!(t.settings(None).rate, 2, "the global setting is untouched");
    let bad = upd(serde_json::json!({"trace_rate": "7", "trace_file": "/etc/passwd"}));
    assert!(t.update(None, &bad).is_err());
    assert_eq!(t.settings(None).rate, 2, "all or nothing");
    assert!(t
        .update(None, &upd(serde_json::json!({"trace_level": ["TENSORS"]})))
        .is_err());
    assert!(t
        .update(
            None,
            &upd(serde_json::json!({"trace_mode": "opentelemetry"}))
        )
        .is_err());
    let s = t
        .update(Some("m"), &upd(serde_json::json!({"trace_rate": null})))
        .unwrap();
    assert_eq!(s.rate, 2, "cleared back to the global setting");
    assert_eq!(
        t.settings(None).to_json()["trace_level"],
        serde_json::json!(["TIMESTAMPS"])
    );
}

#[test]
fn writes_tritons_json_every_log_frequency_traces() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.json").display().to_string();
    let mut s = on(&file);
    s.rate = 1;
    s.count = -1;
    s.log_frequency = 2;
    let t = TraceControl::new(s, None);
    for _ in 0..4 {
        let tr = t.sample("m", 1, "", None).unwrap();
        tr.mark("REQUEST_START");
        tr.mark("REQUEST_END");
        t.finish(&tr);
    }
    t.flush();
    for i in 0..2 {
        let text = std::fs::read_to_string(format!("{file}.{i}")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v.as_array().unwrap().len(),
            4,
            "two traces, two objects each"
        );
        assert_eq!(v[0]["model_name"], "m");
        assert_eq!(v[1]["timestamps"][1]["name"], "REQUEST_END");
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.ends_with(".partial")),
        "files are renamed into place: {names:?}"
    );
}

/// `log_frequency` 1 makes a file per trace: only the newest [`MAX_TRACE_FILES`] stay.
#[test]
fn old_trace_files_are_removed_past_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.json").display().to_string();
    let mut s = on(&file);
    s.rate = 1;
    s.count = -1;
    s.log_frequency = 1;
    let t = TraceControl::new(s, None);
    let n = MAX_TRACE_FILES + 10;
    for _ in 0..n {
        let tr = t.sample("m", 1, "", None).unwrap();
        tr.mark("REQUEST_START");
        t.finish(&tr);
    }
    t.flush();
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), MAX_TRACE_FILES, "{names:?}");
    assert!(!names.contains(&"trace.json.0".to_string()), "{names:?}");
    assert!(
        names.contains(&format!("trace.json.{}", n - 1)),
        "{names:?}"
    );
}

/// A link planted where the partial file goes is replaced, not written through.
#[test]
fn a_planted_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join(".trace.json.partial")).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("trace.json")).unwrap();
    write_whole(&dir.path().join("trace.json"), b"[1]").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert_eq!(
        std::fs::read(dir.path().join("trace.json")).unwrap(),
        b"[1]"
    );
}

#[test]
fn a_trace_file_appears_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json.7");
    write_whole(&path, b"[1,2]").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"[1,2]");
    assert!(!dir.path().join(".trace.json.7.partial").exists());
    // A directory that is gone fails cleanly and leaves nothing behind.
    let gone = dir.path().join("missing").join("trace.json");
    assert!(write_whole(&gone, b"[]").is_err());
}

/// What a [`TraceExport`] was given, in order.
#[derive(Default)]
struct Collector {
    seen: Mutex<Vec<String>>,
}

impl TraceExport for Collector {
    fn export(&self, trace: &Arc<Trace>) {
        let id = trace.request_id.clone();
        self.seen.lock().unwrap().push(format!("export {id}"));
    }
    fn flush(&self) {
        self.seen.lock().unwrap().push("flush".into());
    }
    fn shutdown(&self) {
        self.seen.lock().unwrap().push("shutdown".into());
    }
}

/// In `opentelemetry` mode every finished trace goes to the exporter (no file is written),
/// a propagated trace context is honoured whatever the rate, and shutdown flushes then stops.
#[test]
fn opentelemetry_mode_hands_every_trace_to_the_exporter() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.json").display().to_string();
    let mut s = on(&file);
    s.mode = "opentelemetry".into();
    s.rate = 1000;
    let collector = Arc::new(Collector::default());
    let t = TraceControl::new(s, Some(collector.clone() as Arc<dyn TraceExport>));
    let parent = TraceParent {
        trace_id: [7; 16],
        span_id: [9; 8],
        flags: 1,
    };
    for id in ["a", "b"] {
        let tr = t
            .sample("m", 1, id, Some(parent))
            .expect("propagated context");
        tr.mark("REQUEST_START");
        t.finish(&tr);
    }
    t.shutdown();
    assert_eq!(
        *collector.seen.lock().unwrap(),
        ["export a", "export b", "flush", "shutdown"],
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no trace file"
    );
}
