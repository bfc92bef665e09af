//! The response cache (`--cache-config local,size=BYTES` plus `response_cache { enable: true }`
//! per model): successful responses keyed by a 64-bit hash of model, version and inputs, as
//! Triton's local cache. Memory is bounded: least recently used entries are evicted by bytes.
//! As in Triton, a hash collision could return another request's response (p ≈ 2⁻⁶⁴).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use wisp_core::{InferRequest, InferResponse};

/// Parses `--cache-config local,size=N` (Triton's syntax); other cache kinds are refused.
pub fn parse_cache_config(items: &[String]) -> Result<Option<usize>, String> {
    let mut size = None;
    for item in items {
        let (kind, rest) = item.split_once(',').unwrap_or((item.as_str(), ""));
        if kind != "local" {
            return Err(format!(
                "--cache-config '{item}': only the 'local' cache is supported"
            ));
        }
        for kv in rest.split(',').filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some(("size", v)) => {
                    size = Some(v.parse::<usize>().map_err(|_| {
                        format!("--cache-config local,size: '{v}' is not a byte count")
                    })?)
                }
                _ => return Err(format!("--cache-config local: unknown setting '{kv}'")),
            }
        }
    }
    Ok(size)
}

/// The cache key of a request to `model`/`version`. The requested outputs are part of it: an
/// ensemble leaves out the outputs (and steps) nobody asked for.
pub fn key(model: &str, version: u64, req: &InferRequest) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    model.hash(&mut h);
    version.hash(&mut h);
    let mut inputs: Vec<_> = req.inputs.iter().collect();
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    for t in inputs {
        t.name.hash(&mut h);
        t.datatype.as_str().hash(&mut h);
        t.shape.hash(&mut h);
        t.data.hash(&mut h);
    }
    let mut outputs: Vec<&String> = req.requested_outputs.iter().collect();
    outputs.sort();
    outputs.hash(&mut h);
    h.finish()
}

struct Entry {
    response: Arc<InferResponse>,
    bytes: usize,
    tick: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u64, Entry>,
    by_age: BTreeMap<u64, u64>,
    bytes: usize,
    tick: u64,
}

/// A byte-bounded LRU of responses.
pub struct ResponseCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

fn size_of(r: &InferResponse) -> usize {
    r.outputs
        .iter()
        .map(|t| t.data.len() + t.name.len() + t.shape.len() * 8 + 64)
        .sum()
}

impl ResponseCache {
    /// A cache holding at most `capacity` bytes of responses.
    pub fn new(capacity: usize) -> Self {
        ResponseCache {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The cached response, refreshed as most recently used.
    pub fn get(&self, key: u64) -> Option<Arc<InferResponse>> {
        let mut g = self.inner.lock().expect("cache lock");
        let inner = &mut *g;
        inner.tick += 1;
        let tick = inner.tick;
        let e = inner.entries.get_mut(&key)?;
        inner.by_age.remove(&e.tick);
        e.tick = tick;
        inner.by_age.insert(tick, key);
        Some(e.response.clone())
    }

    /// Stores a response, evicting the least recently used until it fits. A response larger
    /// than the whole cache is not stored.
    pub fn insert(&self, key: u64, response: Arc<InferResponse>) {
        let bytes = size_of(&response);
        if bytes > self.capacity {
            return;
        }
        let mut g = self.inner.lock().expect("cache lock");
        let inner = &mut *g;
        if let Some(old) = inner.entries.remove(&key) {
            inner.by_age.remove(&old.tick);
            inner.bytes -= old.bytes;
        }
        while inner.bytes + bytes > self.capacity {
            let Some((&tick, &victim)) = inner.by_age.iter().next() else {
                break;
            };
            inner.by_age.remove(&tick);
            if let Some(e) = inner.entries.remove(&victim) {
                inner.bytes -= e.bytes;
            }
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.by_age.insert(tick, key);
        inner.bytes += bytes;
        inner.entries.insert(
            key,
            Entry {
                response,
                bytes,
                tick,
            },
        );
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.inner.lock().expect("cache lock").bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::{DataType, Tensor};

    fn resp(n: usize) -> Arc<InferResponse> {
        Arc::new(InferResponse::new(vec![Tensor::new(
            "y",
            DataType::Uint8,
            vec![n as i64],
            vec![0; n].into(),
        )
        .unwrap()]))
    }

    #[test]
    fn evicts_least_recently_used_by_bytes() {
        let one = size_of(&resp(100));
        let c = ResponseCache::new(one * 2);
        c.insert(1, resp(100));
        c.insert(2, resp(100));
        assert!(c.get(1).is_some()); // 1 is now the most recent
        c.insert(3, resp(100)); // evicts 2
        assert!(c.get(2).is_none());
        assert!(c.get(1).is_some() && c.get(3).is_some());
        assert!(c.bytes() <= one * 2);
        c.insert(4, resp(10_000)); // larger than the cache: ignored
        assert!(c.get(4).is_none());
        assert!(c.get(1).is_some());
    }

    #[test]
    fn keys_depend_on_inputs() {
        let r = |v: u8| InferRequest {
            inputs: vec![Tensor::new("x", DataType::Uint8, vec![1], vec![v].into()).unwrap()],
            ..Default::default()
        };
        assert_eq!(key("m", 1, &r(1)), key("m", 1, &r(1)));
        assert_ne!(key("m", 1, &r(1)), key("m", 1, &r(2)));
        assert_ne!(key("m", 1, &r(1)), key("m", 2, &r(1)));
    }

    #[test]
    fn config_syntax() {
        assert_eq!(
            parse_cache_config(&["local,size=1048576".into()]).unwrap(),
            Some(1048576)
        );
        assert_eq!(parse_cache_config(&[]).unwrap(), None);
        assert!(parse_cache_config(&["redis,host=x".into()]).is_err());
        assert!(parse_cache_config(&["local,size=lots".into()]).is_err());
    }
}
