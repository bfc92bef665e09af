//! Prometheus metrics on `--metrics-port` (`GET /metrics`), with Triton's family names and
//! labels (`model`, `version`, `reason`) so existing dashboards work unchanged.
//!
//! Counters and gauges are taken from each model version's statistics at scrape time (so the
//! statistics extension and the metrics can never disagree); latency summaries
//! (`--metrics-config summary_latencies=true`) are fed per request by the scheduler. Each server
//! owns its own recorder (`metrics::with_local_recorder`), so several servers can share a process.

use std::sync::{Arc, Mutex};

use metrics::{counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use wisp_scheduler::{FailReason, Observer, RequestTiming};

use crate::models::{Registry, VersionState};

/// Triton's default summary quantiles.
pub const DEFAULT_QUANTILES: [f64; 5] = [0.5, 0.9, 0.95, 0.99, 0.999];

/// What `--metrics-config` turns on.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsOptions {
    /// `summary_latencies`: per-request latency summaries.
    pub summary_latencies: bool,
    /// `summary_quantiles`.
    pub quantiles: Vec<f64>,
    /// `counter_latencies`: cumulative duration counters (default on).
    pub counter_latencies: bool,
    /// `histogram_latencies`: each decoupled model's time-to-first-response histogram
    /// (`nv_inference_first_response_histogram_ms`; default off, as in Triton).
    pub histogram_latencies: bool,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        MetricsOptions {
            summary_latencies: false,
            quantiles: DEFAULT_QUANTILES.to_vec(),
            counter_latencies: true,
            histogram_latencies: false,
        }
    }
}

impl MetricsOptions {
    /// Parses `--metrics-config` values (`key=value`, Triton's keys).
    pub fn parse(items: &[String]) -> Result<Self, String> {
        let mut o = MetricsOptions::default();
        let boolean = |k: &str, v: &str| match v {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(format!(
                "--metrics-config {k}: expected true or false, got '{v}'"
            )),
        };
        for item in items {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("--metrics-config '{item}': expected key=value"))?;
            match k {
                "summary_latencies" => o.summary_latencies = boolean(k, v)?,
                "counter_latencies" => o.counter_latencies = boolean(k, v)?,
                "summary_quantiles" => {
                    o.quantiles = v
                        .split(',')
                        .map(|q| {
                            q.split(':')
                                .next()
                                .and_then(|x| x.trim().parse::<f64>().ok())
                                .filter(|x| (0.0..=1.0).contains(x))
                                .ok_or_else(|| {
                                    format!(
                                        "--metrics-config summary_quantiles: bad quantile '{q}'"
                                    )
                                })
                        })
                        .collect::<Result<_, _>>()?;
                }
                "histogram_latencies" => o.histogram_latencies = boolean(k, v)?,
                other => return Err(format!("--metrics-config: unknown key '{other}'")),
            }
        }
        Ok(o)
    }
}

/// The server's metrics recorder.
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    options: MetricsOptions,
    cpu: Mutex<Option<(u64, u64)>>,
    plugin_failures: Arc<wisp_plugin_runtime::FailureCounts>,
    verify_failures: Arc<crate::signing::VerifyFailures>,
}

impl Metrics {
    /// A recorder with `options`, reporting the plugin failures counted in `plugin_failures`
    /// and the failed integrity checks counted in `verify_failures`.
    pub fn new(
        options: MetricsOptions,
        plugin_failures: Arc<wisp_plugin_runtime::FailureCounts>,
        verify_failures: Arc<crate::signing::VerifyFailures>,
    ) -> Result<Arc<Self>, String> {
        let recorder = PrometheusBuilder::new()
            .set_quantiles(&options.quantiles)
            .map_err(|e| format!("metrics: {e}"))?
            .build_recorder()
            .into();
        let m = Arc::new(Metrics {
            recorder,
            options,
            cpu: Mutex::new(None),
            plugin_failures,
            verify_failures,
        });
        with_local_recorder(&*m.recorder, describe);
        Ok(m)
    }

    /// The Prometheus text for the current state of `registry`.
    pub fn render(&self, registry: &Registry) -> String {
        with_local_recorder(&*self.recorder, || {
            for entry in registry.models().values() {
                for state in entry.versions.values() {
                    let VersionState::Ready(m) = state else {
                        continue;
                    };
                    let l = [
                        ("model", m.name.clone()),
                        ("version", m.version.to_string()),
                    ];
                    let s = m.stats();
                    counter!("nv_inference_request_success", &l).absolute(s.success.get().0);
                    for r in FailReason::ALL {
                        let lr = [
                            ("model", m.name.clone()),
                            ("version", m.version.to_string()),
                            ("reason", r.label().to_string()),
                        ];
                        counter!("nv_inference_request_failure", &lr).absolute(s.failures(r));
                    }
                    counter!("nv_inference_count", &l).absolute(s.inference_count());
                    counter!("nv_inference_exec_count", &l).absolute(s.execution_count());
                    for (n, (step_model, count)) in m.step_skips().into_iter().enumerate() {
                        let ls = [
                            ("model", m.name.clone()),
                            ("version", m.version.to_string()),
                            ("step", n.to_string()),
                            ("step_model", step_model),
                        ];
                        counter!("wisp_ensemble_step_skipped_total", &ls).absolute(count);
                    }
                    gauge!("nv_inference_pending_request_count", &l).set(m.pending() as f64);
                    gauge!("nv_model_load_duration_secs", &l).set(m.load_secs);
                    if self.options.counter_latencies {
                        let us = |(_, ns): (u64, u64)| ns / 1000;
                        let total = s.success.get().1 + s.fail.get().1;
                        counter!("nv_inference_request_duration_us", &l).absolute(total / 1000);
                        counter!("nv_inference_queue_duration_us", &l).absolute(us(s.queue.get()));
                        counter!("nv_inference_compute_input_duration_us", &l)
                            .absolute(us(s.compute_input.get()));
                        counter!("nv_inference_compute_infer_duration_us", &l)
                            .absolute(us(s.compute_infer.get()));
                        counter!("nv_inference_compute_output_duration_us", &l)
                            .absolute(us(s.compute_output.get()));
                    }
                    if m.config.response_cache.as_ref().is_some_and(|c| c.enable) {
                        let (hits, hit_ns) = s.cache_hit.get();
                        let (misses, miss_ns) = s.cache_miss.get();
                        counter!("nv_cache_num_hits_per_model", &l).absolute(hits);
                        counter!("nv_cache_num_misses_per_model", &l).absolute(misses);
                        counter!("nv_cache_hit_duration_per_model", &l).absolute(hit_ns / 1000);
                        counter!("nv_cache_miss_duration_per_model", &l).absolute(miss_ns / 1000);
                    }
                }
            }
            for (model, version, reason, n) in self.plugin_failures.snapshot() {
                let l = [
                    ("model", model),
                    ("version", version),
                    ("reason", reason.as_str().to_string()),
                ];
                counter!("wisp_plugin_failure_total", &l).absolute(n);
            }
            for (model, version, n) in self.verify_failures.snapshot() {
                let l = [("model", model), ("version", version.to_string())];
                counter!("wisp_model_verify_failure_total", &l).absolute(n);
            }
            for (model, c, watching) in registry.lifecycle_counts() {
                let l = [("model", model)];
                counter!("wisp_model_load_failure_total", &l).absolute(c.load_failures);
                counter!("wisp_model_rollback_total", &l).absolute(c.rollbacks);
                counter!("wisp_model_rollout_kept_total", &l).absolute(c.kept);
                counter!("wisp_model_gate_passed_total", &l).absolute(c.gate_passed);
                counter!("wisp_model_gate_failed_total", &l).absolute(c.gate_failed);
                gauge!("wisp_model_sla_watch", &l).set(if watching { 1.0 } else { 0.0 });
            }
            if let Some(u) = self.cpu_utilization() {
                gauge!("nv_cpu_utilization").set(u);
            }
            if let Some((total, used)) = memory() {
                gauge!("nv_cpu_memory_total_bytes").set(total as f64);
                gauge!("nv_cpu_memory_used_bytes").set(used as f64);
            }
        });
        let mut text = self.recorder.handle().render();
        if self.options.histogram_latencies {
            first_response_text(registry, &mut text);
        }
        text
    }

    /// CPU utilization (0..1) since the previous scrape (since boot on the first).
    fn cpu_utilization(&self) -> Option<f64> {
        let (busy, total) = cpu_times()?;
        let mut prev = self.cpu.lock().expect("cpu sample lock");
        let (pb, pt) = prev.unwrap_or((0, 0));
        *prev = Some((busy, total));
        let dt = total.saturating_sub(pt);
        (dt > 0).then(|| busy.saturating_sub(pb) as f64 / dt as f64)
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "wisp_model_verify_failure_total",
        "Model version loads refused because the version's files did not match its signed manifest, or it had none when one is required"
    );
    describe_counter!(
        "wisp_model_load_failure_total",
        "Loads and reloads of a model that failed (config, files, warm-up, signature); a serving version stays in place"
    );
    describe_counter!(
        "wisp_model_rollback_total",
        "New versions swapped back out because they breached the SLA in their config parameters (sla.*)"
    );
    describe_counter!(
        "wisp_model_rollout_kept_total",
        "New versions kept after holding their SLA through the watch window"
    );
    describe_counter!(
        "wisp_model_gate_passed_total",
        "New versions that kept their gate (gate.* parameters) against the version they replace before serving"
    );
    describe_counter!(
        "wisp_model_gate_failed_total",
        "New versions kept out of service because their answers or latency broke their gate (gate.* parameters)"
    );
    describe_gauge!(
        "wisp_model_sla_watch",
        "1 while a new version is under SLA watch with the previous one kept loaded for rollback"
    );
    describe_counter!(
        "wisp_plugin_failure_total",
        "Plugin calls that trapped, ran past their deadline, ran out of memory or fuel, returned bad outputs, or failed init (label reason)"
    );
    describe_counter!(
        "wisp_ensemble_step_skipped_total",
        "Ensemble requests that skipped a step because an input it requires was not produced (labels step, step_model)"
    );
    describe_counter!(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes"
    );
    describe_counter!(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes"
    );
    describe_counter!(
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)"
    );
    describe_counter!(
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)"
    );
    describe_gauge!(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model."
    );
    describe_counter!(
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)"
    );
    describe_counter!(
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)"
    );
    describe_counter!(
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)"
    );
    describe_counter!(
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)"
    );
    describe_counter!("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)");
    describe_gauge!("nv_model_load_duration_secs", "Model load time in seconds");
    describe_gauge!("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]");
    describe_gauge!(
        "nv_cpu_memory_total_bytes",
        "CPU total memory (RAM), in bytes"
    );
    describe_gauge!(
        "nv_cpu_memory_used_bytes",
        "CPU used memory (RAM), in bytes"
    );
    describe_counter!(
        "nv_cache_num_hits_per_model",
        "Number of cache hits per model"
    );
    describe_counter!(
        "nv_cache_num_misses_per_model",
        "Number of cache misses per model"
    );
    describe_counter!(
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds"
    );
    describe_counter!(
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insertion) duration per model, in microseconds"
    );
}

/// Appends every ready decoupled version's time-to-first-response histogram to `out`, in
/// Prometheus's text format (cumulative buckets, `+Inf`, `_sum`, `_count`), as Triton's
/// `--metrics-config histogram_latencies=true` shows them.
fn first_response_text(registry: &Registry, out: &mut String) {
    use std::fmt::Write as _;
    const FAMILY: &str = wisp_core::config::metrics::FIRST_RESPONSE;
    let mut rows = String::new();
    for entry in registry.models().values() {
        for state in entry.versions.values() {
            let VersionState::Ready(m) = state else {
                continue;
            };
            let Some(h) = &m.first_response else {
                continue;
            };
            let s = h.snapshot();
            let labels = format!(
                "model=\"{}\",version=\"{}\"",
                label_value(&m.name),
                m.version
            );
            for (le, n) in &s.buckets {
                let _ = writeln!(rows, "{FAMILY}_bucket{{{labels},le=\"{le}\"}} {n}");
            }
            let _ = writeln!(rows, "{FAMILY}_bucket{{{labels},le=\"+Inf\"}} {}", s.count);
            let _ = writeln!(rows, "{FAMILY}_sum{{{labels}}} {}", s.sum_ms);
            let _ = writeln!(rows, "{FAMILY}_count{{{labels}}} {}", s.count);
        }
    }
    if rows.is_empty() {
        return;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "# HELP {FAMILY} Duration from request to first response in milliseconds"
    );
    let _ = writeln!(out, "# TYPE {FAMILY} histogram");
    out.push_str(&rows);
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// (busy, total) jiffies from `/proc/stat`.
fn cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// (total, used) bytes from `/proc/meminfo`.
fn memory() -> Option<(u64, u64)> {
    let info = wisp_core::meminfo::MemInfo::read()?;
    let total = info.bytes("MemTotal")?;
    let avail = info.bytes("MemAvailable")?;
    Some((total, total.saturating_sub(avail)))
}

impl crate::models::Observers for Metrics {
    /// A per-request observer feeding the latency summaries, when they are on.
    fn observer(&self, model: &str, version: u64) -> Option<Observer> {
        if !self.options.summary_latencies {
            return None;
        }
        let recorder = self.recorder.clone();
        let (model, version) = (model.to_string(), version.to_string());
        Some(Arc::new(move |t: &RequestTiming| {
            with_local_recorder(&*recorder, || {
                let l = [("model", model.clone()), ("version", version.clone())];
                let us = |ns: u64| ns as f64 / 1000.0;
                histogram!("nv_inference_request_summary_us", &l)
                    .record(t.total.as_secs_f64() * 1e6);
                if t.ok {
                    histogram!("nv_inference_queue_summary_us", &l)
                        .record(t.queue.as_secs_f64() * 1e6);
                    histogram!("nv_inference_compute_input_summary_us", &l)
                        .record(us(t.exec.input_ns));
                    histogram!("nv_inference_compute_infer_summary_us", &l)
                        .record(us(t.exec.infer_ns));
                    histogram!("nv_inference_compute_output_summary_us", &l)
                        .record(us(t.exec.output_ns));
                }
            })
        }))
    }
}

/// The metrics front end: `GET /metrics` in Prometheus text format.
pub fn metrics_router(
    metrics: std::sync::Arc<Metrics>,
    registry: std::sync::Arc<crate::models::Registry>,
) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (metrics, registry) = (metrics.clone(), registry.clone());
            async move {
                let body = tokio::task::spawn_blocking(move || metrics.render(&registry))
                    .await
                    .unwrap_or_default();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    body,
                )
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_config_parses_triton_keys() {
        let o = MetricsOptions::parse(&[
            "summary_latencies=true".into(),
            "summary_quantiles=0.5:0.05,0.99:0.001".into(),
        ])
        .unwrap();
        assert!(o.summary_latencies);
        assert_eq!(o.quantiles, vec![0.5, 0.99]);
        assert!(MetricsOptions::parse(&["nope=1".into()]).is_err());
        assert!(MetricsOptions::parse(&["summary_latencies=maybe".into()]).is_err());
        assert!(!MetricsOptions::default().histogram_latencies);
        let o = MetricsOptions::parse(&["histogram_latencies=true".into()]).unwrap();
        assert!(o.histogram_latencies);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
