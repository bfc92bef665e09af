//! Triton's `--host-policy NAME,cpu-cores=a-b` and `instance_group { host_policy: "NAME" }`:
//! the instances of such a group have their threads pinned, one core each, round-robin over the
//! policy's cores. (ONNX Runtime's own intra-op pool threads are not pinned.)

use std::collections::HashMap;

use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::{Error, InferRequest, InferResponse, Result};

/// Named CPU sets from `--host-policy`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPolicies(HashMap<String, Vec<usize>>);

impl HostPolicies {
    /// Parses every `--host-policy NAME,cpu-cores=a-b[,...]` value (`a-b`, `a`, or `a-b:c-d`
    /// lists separated by `:`).
    pub fn parse(items: &[String]) -> std::result::Result<Self, String> {
        let mut map = HashMap::new();
        for item in items {
            let mut parts = item.split(',');
            let name = parts
                .next()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("--host-policy '{item}': expected NAME,cpu-cores=a-b"))?;
            let mut cores = Vec::new();
            for kv in parts {
                match kv.split_once('=') {
                    Some(("cpu-cores", v)) => {
                        for range in v.split(':') {
                            let (a, b) = range.split_once('-').unwrap_or((range, range));
                            let (a, b) = (a.trim().parse::<usize>(), b.trim().parse::<usize>());
                            match (a, b) {
                                (Ok(a), Ok(b)) if a <= b => cores.extend(a..=b),
                                _ => {
                                    return Err(format!(
                                        "--host-policy {name}: bad cpu-cores range '{range}'"
                                    ))
                                }
                            }
                        }
                    }
                    Some(("numa-node", _)) => {
                        return Err(format!(
                            "--host-policy {name}: numa-node is not supported, use cpu-cores"
                        ))
                    }
                    _ => return Err(format!("--host-policy {name}: unknown setting '{kv}'")),
                }
            }
            if cores.is_empty() {
                return Err(format!("--host-policy {name}: no cpu-cores given"));
            }
            map.insert(name.to_string(), cores);
        }
        Ok(HostPolicies(map))
    }

    /// The cores of policy `name`; `None` for the defaults Triton names (`cpu`, `model`, empty).
    pub fn cores(&self, name: &str) -> Result<Option<&[usize]>> {
        match name {
            "" | "cpu" | "model" => Ok(None),
            n => self.0.get(n).map(|v| Some(v.as_slice())).ok_or_else(|| {
                Error::invalid(format!(
                    "instance_group host_policy '{n}' is not defined (start wisp with --host-policy {n},cpu-cores=a-b)"
                ))
            }),
        }
    }
}

/// An instance pinned to `core`: the thread its scheduler starts for it is placed there
/// ([`Instance::on_thread_start`]); a thread that merely calls `execute` (warm-up on the
/// loader) is left alone.
pub struct Pinned {
    inner: Box<dyn Instance>,
    core: usize,
}

impl Pinned {
    /// Wraps `inner`.
    pub fn new(inner: Box<dyn Instance>, core: usize) -> Self {
        Pinned { inner, core }
    }
}

impl Instance for Pinned {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        self.inner.execute(batch, timing)
    }

    fn on_thread_start(&mut self) {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: self.core }) {
            tracing::warn!(core = self.core, "could not pin the instance thread");
        }
        self.inner.on_thread_start();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::backend::ExecTiming;
    use wisp_core::{InferRequest, InferResponse, Result};

    #[test]
    fn parses_triton_syntax() {
        let p =
            HostPolicies::parse(&["fast,cpu-cores=0-1".into(), "one,cpu-cores=3".into()]).unwrap();
        assert_eq!(p.cores("fast").unwrap(), Some(&[0usize, 1][..]));
        assert_eq!(p.cores("one").unwrap(), Some(&[3usize][..]));
        assert_eq!(p.cores("cpu").unwrap(), None);
        assert!(p
            .cores("nope")
            .unwrap_err()
            .message()
            .contains("--host-policy nope"));
        assert!(HostPolicies::parse(&["x,cpu-cores=3-1".into()]).is_err());
        assert!(HostPolicies::parse(&["x".into()]).is_err());
        assert!(HostPolicies::parse(&["x,numa-node=0".into()]).is_err());
    }

    /// The CPUs the calling thread may run on (Linux), as the kernel lists them.
    fn allowed_cpus() -> String {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or("")
            .trim()
            .to_string()
    }

    /// Reports the CPUs of whichever thread executes it.
    struct WhereAmI;

    impl Instance for WhereAmI {
        fn execute(
            &mut self,
            batch: &[InferRequest],
            _: &mut ExecTiming,
        ) -> Vec<Result<InferResponse>> {
            let cpus = allowed_cpus();
            batch
                .iter()
                .map(|_| {
                    Ok(InferResponse::new(vec![wisp_core::Tensor::new(
                        "cpus",
                        wisp_core::DataType::Bytes,
                        vec![1],
                        wisp_core::tensor::encode_bytes_elements([cpus.as_bytes()]).into(),
                    )
                    .unwrap()]))
                })
                .collect()
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_instance_thread_is_pinned_and_a_warm_up_caller_is_not() {
        let before = allowed_cpus();
        let mut pinned: Box<dyn Instance> = Box::new(Pinned::new(Box::new(WhereAmI), 0));
        // warm-up: executed on this (loader) thread, which must stay unpinned
        let out = pinned.execute(&[InferRequest::default()], &mut ExecTiming::default());
        assert!(out[0].is_ok());
        assert_eq!(allowed_cpus(), before, "the warm-up caller was pinned");
        // the scheduler's instance thread is pinned before its first batch
        let policy = wisp_scheduler::Policy::from_config(&Default::default(), None);
        let s = wisp_scheduler::Scheduler::start("pin", policy, vec![pinned], None).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        s.enqueue(
            InferRequest::default(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .unwrap();
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .unwrap();
        let got = wisp_core::tensor::decode_bytes_elements(&r.outputs[0].data).unwrap();
        assert_eq!(got, vec![&b"0"[..]], "instance thread CPUs");
        s.stop();
    }
}
