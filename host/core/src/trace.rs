//! Request traces (Triton's trace extension): a sampled request carries a [`Trace`] from the
//! front end through the scheduler, which marks when it was queued and computed; an ensemble
//! gives each of its steps a child trace. The server writes finished traces in Triton's
//! trace-file JSON.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Trace ids, unique in the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A W3C trace context a client sent (`traceparent: 00-<trace id>-<parent span id>-<flags>`):
/// an OpenTelemetry export makes the request's spans children of that span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The distributed trace's id (never all zero).
    pub trace_id: [u8; 16],
    /// The caller's span (never all zero).
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value. Version `00` must have exactly four fields; a
    /// later version may add fields after them (W3C Trace Context, "versioning"). `None` for
    /// anything malformed, for the invalid version `ff`, and for all-zero ids: the request is
    /// then treated as if it carried no context.
    pub fn parse(header: &str) -> Option<TraceParent> {
        fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
            if s.len() != 2 * N || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return None;
            }
            let mut out = [0u8; N];
            for (i, o) in out.iter_mut().enumerate() {
                *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
            }
            Some(out)
        }
        let mut parts = header.trim().split('-');
        let version = hex::<1>(parts.next()?)?[0];
        let trace_id = hex::<16>(parts.next()?)?;
        let span_id = hex::<8>(parts.next()?)?;
        let flags = hex::<1>(parts.next()?)?[0];
        let more = parts.next().is_some();
        if version == 0xff || (version == 0 && more) {
            return None;
        }
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }
}

/// One traced request: its model, its timestamps, and its children (ensemble steps).
#[derive(Debug)]
pub struct Trace {
    /// The trace's id.
    pub id: u64,
    /// The trace of the ensemble request this one is a step of.
    pub parent_id: Option<u64>,
    /// The client's trace context, when it sent one (the root trace only).
    pub remote_parent: Option<TraceParent>,
    /// The request's id (`id` in the request), empty when it had none.
    pub request_id: String,
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
        Self::with_context(model, version, String::new(), None)
    }

    /// A new trace of request `request_id` to `model` version `version`, under the client's
    /// trace context when it sent one.
    pub fn with_context(
        model: &str,
        version: u64,
        request_id: String,
        remote_parent: Option<TraceParent>,
    ) -> Arc<Trace> {
        Arc::new(Trace {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parent_id: None,
            remote_parent,
            request_id,
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
            remote_parent: None,
            request_id: String::new(),
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

    /// This trace's children (the ensemble steps it ran), in the order they started.
    pub fn children(&self) -> Vec<Arc<Trace>> {
        self.children.lock().expect("trace lock").clone()
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
    fn traceparent_headers_parse_as_w3c_says() {
        let p = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .expect("valid");
        assert_eq!(p.trace_id[0], 0x0a);
        assert_eq!(p.trace_id[15], 0x9c);
        assert_eq!(p.span_id, [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]);
        assert_eq!(p.flags, 1);
        // a later version may carry more fields
        assert!(
            TraceParent::parse("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-x")
                .is_some()
        );
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333g-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-é7651916cd43dd8448eb211c80319c0-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

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
