//! Request traces (Triton's trace extension): a sampled request carries a [`Trace`] from the
//! front end through the scheduler, which marks when it was queued and computed; an ensemble
//! gives each of its steps a child trace. The server writes finished traces in Triton's
//! trace-file JSON.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Trace ids, unique in the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One traced request: its model, its timestamps, and its children (ensemble steps).
#[derive(Debug)]
pub struct Trace {
    /// The trace's id.
    pub id: u64,
    /// The trace of the ensemble request this one is a step of.
    pub parent_id: Option<u64>,
    /// Model name.
    pub model: String,
    /// Model version.
    pub version: u64,
    events: Mutex<Vec<(&'static str, u64)>>,
    children: Mutex<Vec<Arc<Trace>>>,
}

/// Nanoseconds since the Unix epoch of `t`.
pub fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Events one trace keeps, at most (a trace's size stays bounded whatever happens to it).
const MAX_EVENTS: usize = 64;
/// Children one trace keeps, at most.
const MAX_CHILDREN: usize = 1024;

impl Trace {
    /// A new trace of `model` version `version`.
    pub fn new(model: &str, version: u64) -> Arc<Trace> {
        Arc::new(Trace {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parent_id: None,
            model: model.to_string(),
            version,
            events: Mutex::new(Vec::with_capacity(8)),
            children: Mutex::new(Vec::new()),
        })
    }

    /// A child of `self` for a call to `model` (an ensemble step), kept with `self`.
    pub fn child(self: &Arc<Self>, model: &str, version: Option<u64>) -> Arc<Trace> {
        let child = Arc::new(Trace {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parent_id: Some(self.id),
            model: model.to_string(),
            version: version.unwrap_or(0),
            events: Mutex::new(Vec::new()),
            children: Mutex::new(Vec::new()),
        });
        let mut children = self.children.lock().expect("trace lock");
        if children.len() < MAX_CHILDREN {
            children.push(child.clone());
        }
        child
    }

    /// Records event `name` now.
    pub fn mark(&self, name: &'static str) {
        self.mark_at(name, unix_ns(SystemTime::now()));
    }

    /// Records event `name` `ago` before now.
    pub fn mark_ago(&self, name: &'static str, ago: Duration) {
        let at = SystemTime::now().checked_sub(ago).unwrap_or(UNIX_EPOCH);
        self.mark_at(name, unix_ns(at));
    }

    /// Records event `name` at `ns` since the Unix epoch.
    pub fn mark_at(&self, name: &'static str, ns: u64) {
        let mut events = self.events.lock().expect("trace lock");
        if events.len() < MAX_EVENTS {
            events.push((name, ns));
        }
    }

    /// The events so far, in time order.
    pub fn events(&self) -> Vec<(&'static str, u64)> {
        let mut e = self.events.lock().expect("trace lock").clone();
        e.sort_by_key(|&(_, ns)| ns);
        e
    }

    /// This trace and its descendants, parents first.
    pub fn flatten(self: &Arc<Self>) -> Vec<Arc<Trace>> {
        let mut out = vec![self.clone()];
        let mut i = 0;
        while i < out.len() {
            let children = out[i].children.lock().expect("trace lock").clone();
            out.extend(children);
            i += 1;
        }
        out
    }

    /// Appends Triton's trace-file objects for this trace and its descendants to `out`, comma
    /// separated (the same objects as [`Trace::to_json`], written directly: a writer tracing
    /// every request does this thousands of times a second).
    pub fn write_json(self: &Arc<Self>, out: &mut Vec<u8>) {
        use std::io::Write as _;
        for (n, t) in self.flatten().iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            let model = serde_json::to_string(&t.model).unwrap_or_else(|_| "\"\"".into());
            let _ = write!(
                out,
                "{{\"id\":{},\"model_name\":{model},\"model_version\":{}",
                t.id, t.version
            );
            if let Some(p) = t.parent_id {
                let _ = write!(out, ",\"parent_id\":{p}");
            }
            let _ = write!(out, "}},{{\"id\":{},\"timestamps\":[", t.id);
            for (k, (name, ns)) in t.events().into_iter().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                let _ = write!(out, "{{\"name\":\"{name}\",\"ns\":{ns}}}");
            }
            out.extend_from_slice(b"]}");
        }
    }

    /// Triton's trace-file objects for this trace and its descendants: for each, one object
    /// naming the model (and parent) and one with the timestamps.
    pub fn to_json(self: &Arc<Self>) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for t in self.flatten() {
            let mut head = serde_json::json!({
                "id": t.id, "model_name": t.model, "model_version": t.version,
            });
            if let Some(p) = t.parent_id {
                head["parent_id"] = p.into();
            }
            out.push(head);
            let stamps: Vec<serde_json::Value> = t
                .events()
                .into_iter()
                .map(|(name, ns)| serde_json::json!({"name": name, "ns": ns}))
                .collect();
            out.push(serde_json::json!({"id": t.id, "timestamps": stamps}));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_and_its_children_become_tritons_objects() {
        let t = Trace::new("ens", 1);
        t.mark_at("REQUEST_START", 10);
        t.mark_at("REQUEST_END", 90);
        let c = t.child("step", None);
        c.mark_at("COMPUTE_END", 50);
        c.mark_at("QUEUE_START", 20);
        let json = t.to_json();
        assert_eq!(json.len(), 4);
        assert_eq!(json[0]["model_name"], "ens");
        assert_eq!(json[1]["timestamps"][0]["name"], "REQUEST_START");
        assert_eq!(json[2]["parent_id"], t.id);
        assert_eq!(
            json[3]["timestamps"][0]["name"], "QUEUE_START",
            "sorted by time"
        );
        let mut bytes = b"[".to_vec();
        t.write_json(&mut bytes);
        bytes.push(b']');
        let written: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            written,
            serde_json::Value::Array(json),
            "both writers agree"
        );
        for _ in 0..2 * MAX_EVENTS {
            c.mark("X");
        }
        assert_eq!(c.events().len(), MAX_EVENTS, "bounded");
    }
}
