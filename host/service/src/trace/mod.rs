//! Triton's trace extension: which requests are traced (`trace_level`, `trace_rate`,
//! `trace_count`, globally and per model) and where finished traces go (`trace_file`, written
//! in Triton's trace-file JSON every `log_frequency` traces, or at shutdown and on a settings
//! change when it is 0).
//!
//! With `--trace-config mode=opentelemetry` finished traces are exported as spans to an
//! OTLP/HTTP collector instead ([`super::otel`]), and a request carrying a W3C `traceparent` is
//! traced whatever the rate and count, under the client's span (as Triton does).
//!
//! The trace file, the mode and the collector are the operator's: they are set at start-up
//! (`--trace-config triton,file=PATH`, `mode=…`, `opentelemetry,url=…`) and cannot be changed
//! over the network, so no client can make the server write or send elsewhere. Traces record
//! timestamps (request, queue, compute input/infer/output, each ensemble step as a child);
//! `TENSORS` is refused as not supported.

mod files;
#[cfg(test)]
mod tests;

use files::write_loop;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use wisp_core::trace::{Trace, TraceParent};
use wisp_core::{Error, Result};

use super::otel::OtelConfig;

/// Trace objects kept in memory between writes, at most; past it traces are dropped (and
/// counted in the log) until the next write.
pub const MAX_BUFFERED_TRACES: usize = 100_000;

/// Finished traces handed to the writer thread at once (fewer when `log_frequency` is lower).
const HAND_OVER: usize = 256;

/// The trace settings in effect for the server or for one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    /// `OFF`, or `TIMESTAMPS`.
    pub level: Vec<String>,
    /// Trace one request in this many (0: none, except those carrying a `traceparent` in
    /// OpenTelemetry mode).
    pub rate: u64,
    /// Traces left to take (-1: no limit).
    pub count: i64,
    /// Write the file every this many traces (0: at shutdown and on a settings change).
    pub log_frequency: u64,
    /// The trace file (empty: tracing writes nowhere, so nothing is sampled).
    pub file: String,
    /// `triton` (the trace file) or `opentelemetry` (an OTLP collector).
    pub mode: String,
}

impl Default for TraceSettings {
    fn default() -> Self {
        TraceSettings {
            level: vec!["OFF".into()],
            rate: 1000,
            count: -1,
            log_frequency: 0,
            file: String::new(),
            mode: "triton".into(),
        }
    }
}

impl TraceSettings {
    /// Triton's JSON form: every value a string, `trace_level` a list.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("trace_level".into(), Value::from(self.level.clone()));
        m.insert("trace_rate".into(), Value::from(self.rate.to_string()));
        m.insert("trace_count".into(), Value::from(self.count.to_string()));
        m.insert(
            "log_frequency".into(),
            Value::from(self.log_frequency.to_string()),
        );
        m.insert("trace_file".into(), Value::from(self.file.clone()));
        m.insert("trace_mode".into(), Value::from(self.mode.clone()));
        m
    }

    fn enabled(&self) -> bool {
        (self.otel() || !self.file.is_empty()) && self.level.iter().any(|l| l == "TIMESTAMPS")
    }

    /// Whether traces go to an OpenTelemetry collector.
    pub fn otel(&self) -> bool {
        self.mode == "opentelemetry"
    }

    /// Applies one setting (a `--trace-config` item or an API update). `from_network` refuses
    /// the file and the mode.
    pub fn set(&mut self, key: &str, value: &Value, from_network: bool) -> Result<()> {
        let text = |v: &Value| -> Result<String> {
            match v {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                Value::Array(a) if a.len() == 1 => match &a[0] {
                    Value::String(s) => Ok(s.clone()),
                    other => Ok(other.to_string()),
                },
                _ => Err(Error::invalid(format!(
                    "trace setting '{key}' must be a string"
                ))),
            }
        };
        let number = |v: &Value| -> Result<i64> {
            text(v)?
                .trim()
                .parse::<i64>()
                .map_err(|_| Error::invalid(format!("trace setting '{key}' must be an integer")))
        };
        match key {
            "trace_level" => {
                let levels: Vec<String> = match value {
                    Value::Array(a) => a
                        .iter()
                        .map(|v| v.as_str().map(str::to_uppercase))
                        .collect::<Option<_>>()
                        .ok_or_else(|| {
                            Error::invalid("trace setting 'trace_level' must be a list of strings")
                        })?,
                    v => vec![text(v)?.to_uppercase()],
                };
                for l in &levels {
                    match l.as_str() {
                        "OFF" | "TIMESTAMPS" => {}
                        "TENSORS" => {
                            return Err(Error::unsupported(
                                "trace_level TENSORS is not supported (TIMESTAMPS is)",
                            ))
                        }
                        other => {
                            return Err(Error::invalid(format!(
                                "trace_level '{other}' is not OFF, TIMESTAMPS or TENSORS"
                            )))
                        }
                    }
                }
                if levels.is_empty() {
                    return Err(Error::invalid("trace setting 'trace_level' is empty"));
                }
                self.level = levels;
            }
            "trace_rate" => {
                let n = number(value)?;
                if n < 0 || (n == 0 && from_network && !self.otel()) {
                    return Err(Error::invalid(
                        "trace_rate must be a positive integer (0 only in opentelemetry mode)",
                    ));
                }
                self.rate = n as u64;
            }
            "trace_count" => {
                let n = number(value)?;
                if n < -1 {
                    return Err(Error::invalid("trace_count must be -1 or more"));
                }
                self.count = n;
            }
            "log_frequency" => {
                let n = number(value)?;
                if n < 0 {
                    return Err(Error::invalid("log_frequency must be 0 or more"));
                }
                self.log_frequency = n as u64;
            }
            "trace_file" if from_network => {
                if text(value)? != self.file {
                    return Err(Error::invalid(
                        "trace_file cannot be changed over the network; start wisp with --trace-config triton,file=PATH",
                    ));
                }
            }
            "trace_file" => self.file = text(value)?,
            "trace_mode" => {
                let mode = text(value)?.to_lowercase();
                if mode != "triton" && mode != "opentelemetry" {
                    return Err(Error::invalid(format!(
                        "trace_mode '{mode}' is not triton or opentelemetry"
                    )));
                }
                if from_network && mode != self.mode {
                    return Err(Error::invalid(format!(
                        "trace_mode cannot be changed from {} to {mode} at run time",
                        self.mode
                    )));
                }
                self.mode = mode;
            }
            other => {
                return Err(Error::invalid(format!("unknown trace setting '{other}'")));
            }
        }
        Ok(())
    }
}

/// What `--trace-config` sets: the trace settings and the OpenTelemetry exporter's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceConfig {
    /// The global trace settings.
    pub settings: TraceSettings,
    /// The collector and batching, used in `opentelemetry` mode.
    pub otel: OtelConfig,
}

/// The settings `--trace-config` gives, in Triton's syntax: `level=…`, `rate=…`, `count=…`,
/// `log-frequency=…`, `mode=triton|opentelemetry`, `triton,file=PATH`, and
/// `opentelemetry,url=…` / `resource=K=V` / `bsp_max_queue_size=…` / `bsp_schedule_delay=…`
/// / `bsp_max_export_batch_size=…`.
pub fn parse_trace_config(items: &[String]) -> std::result::Result<TraceConfig, String> {
    let mut s = TraceSettings::default();
    let mut otel = OtelConfig::default();
    for item in items {
        let (mode, kv) = match item.split_once(',') {
            Some((m, kv)) if !m.contains('=') => (Some(m), kv),
            _ => (None, item.as_str()),
        };
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--trace-config {item}: expected KEY=VALUE"))?;
        match mode {
            None | Some("triton") => {}
            Some("opentelemetry") => {
                otel.set(k, v)
                    .map_err(|e| format!("--trace-config {item}: {e}"))?;
                continue;
            }
            Some(m) => {
                return Err(format!(
                    "--trace-config {item}: mode '{m}' is not triton or opentelemetry"
                ))
            }
        }
        let key = match k {
            "level" => "trace_level",
            "rate" => "trace_rate",
            "count" => "trace_count",
            "log-frequency" | "log_frequency" => "log_frequency",
            "file" => "trace_file",
            "mode" => "trace_mode",
            other => return Err(format!("--trace-config {item}: unknown setting '{other}'")),
        };
        s.set(key, &Value::from(v), false)
            .map_err(|e| format!("--trace-config {item}: {}", e.message()))?;
    }
    if s.rate == 0 && !s.otel() {
        return Err("--trace-config rate=0 is only allowed with mode=opentelemetry".into());
    }
    Ok(TraceConfig { settings: s, otel })
}

#[derive(Default)]
struct State {
    global: TraceSettings,
    /// Per-model settings, each key overriding the global one.
    models: HashMap<String, Map<String, Value>>,
    /// Requests seen, and traces left, per model (reset when its settings change).
    counters: HashMap<String, (u64, i64)>,
}

/// What the writer thread is told.
enum Msg {
    /// Finished traces, with the file and log frequency in effect.
    Traces(Vec<Arc<Trace>>, String, u64),
    /// Write what is waiting, then answer.
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// Traces waiting to be written, kept by the writer thread.
#[derive(Default)]
struct Pending {
    traces: Vec<Arc<Trace>>,
    /// The file they go to.
    file: String,
    /// The next `{file}.{index}`.
    index: u64,
    /// Writes so far with log_frequency 0.
    flushes: u64,
    log_frequency: u64,
    /// The files written and still kept, oldest first, with their sizes.
    kept: std::collections::VecDeque<(String, u64)>,
}

/// Trace files one server keeps at most: a client may set `log_frequency` to 1 and make one
/// file per request, so the oldest files are removed as new ones are written.
pub const MAX_TRACE_FILES: usize = 64;

/// Bytes of trace files one server keeps at most (the newest file is always kept).
pub const MAX_TRACE_FILE_BYTES: u64 = 256 << 20;

/// Where finished traces go in `opentelemetry` mode, instead of trace files: the OTLP/HTTP
/// exporter ([`crate::otel::Exporter`]) in the server, or whatever an embedder or a test
/// collects them with. Called from the trace writer thread, never on the request path.
pub trait TraceExport: Send + Sync {
    /// Takes one finished trace (and its ensemble steps).
    fn export(&self, trace: &Arc<Trace>);
    /// Sends what is waiting and returns when it is sent (or has failed, logged).
    fn flush(&self);
    /// Sends what is left and stops (at shutdown).
    fn shutdown(&self);
}

/// The server's trace settings and the traces waiting to be written or exported.
#[derive(Default)]
pub struct TraceControl {
    /// Where traces go in `opentelemetry` mode.
    exporter: Option<Arc<dyn TraceExport>>,
    state: Mutex<State>,
    /// Whether any setting could trace a request: when not, requests skip the lock.
    armed: std::sync::atomic::AtomicBool,
    /// The writer thread's queue, started with the first finished trace: building the JSON and
    /// writing files happen there, off the request path.
    writer: Mutex<Option<std::sync::mpsc::SyncSender<Msg>>>,
    /// Traces dropped because the writer's queue was full.
    dropped: std::sync::atomic::AtomicUsize,
    /// Finished traces not yet handed to the writer: they go in batches, so the writer thread
    /// wakes once per batch rather than once per request.
    batch: Mutex<Vec<Arc<Trace>>>,
}

impl TraceControl {
    /// Tracing with `global` settings (from `--trace-config`); `exporter` receives the traces
    /// in `opentelemetry` mode.
    pub fn new(global: TraceSettings, exporter: Option<Arc<dyn TraceExport>>) -> Self {
        let armed = global.enabled();
        TraceControl {
            exporter,
            state: Mutex::new(State {
                global,
                ..Default::default()
            }),
            armed: armed.into(),
            writer: Mutex::new(None),
            dropped: Default::default(),
            batch: Mutex::new(Vec::new()),
        }
    }

    /// Re-arms the fast path after a settings change.
    fn rearm(&self, state: &State) {
        let armed = state.global.enabled()
            || state
                .models
                .keys()
                .any(|m| Self::effective(state, Some(m)).enabled());
        self.armed
            .store(armed, std::sync::atomic::Ordering::Relaxed);
    }

    /// What sampling needs of `model`'s settings, without copying them: (enabled, rate,
    /// count).
    fn sampling(state: &State, model: &str) -> (bool, u64, i64) {
        match state.models.get(model) {
            None => {
                let g = &state.global;
                (g.enabled(), g.rate, g.count)
            }
            Some(_) => {
                let s = Self::effective(state, Some(model));
                (s.enabled(), s.rate, s.count)
            }
        }
    }

    fn effective(state: &State, model: Option<&str>) -> TraceSettings {
        let mut s = state.global.clone();
        if let Some(over) = model.and_then(|m| state.models.get(m)) {
            for (k, v) in over {
                // checked when stored
                let _ = s.set(k, v, false);
            }
        }
        s
    }

    /// The settings in effect for `model` (or the global ones).
    pub fn settings(&self, model: Option<&str>) -> TraceSettings {
        Self::effective(&self.state.lock().expect("trace lock"), model)
    }

    /// Applies `update` (all or nothing) to `model`'s settings or the global ones; a `null`
    /// value clears a model's own setting. Buffered traces are written first, as Triton does.
    pub fn update(
        &self,
        model: Option<&str>,
        update: &Map<String, Value>,
    ) -> Result<TraceSettings> {
        let mut state = self.state.lock().expect("trace lock");
        let mut global = state.global.clone();
        let mut over = model
            .and_then(|m| state.models.get(m).cloned())
            .unwrap_or_default();
        for (k, v) in update {
            match model {
                None => global.set(k, v, true)?,
                Some(_) if v.is_null() => {
                    over.remove(k);
                }
                Some(_) => {
                    // checked against a copy, stored as given
                    Self::effective(&state, model).set(k, v, true)?;
                    over.insert(k.clone(), v.clone());
                }
            }
        }
        match model {
            None => {
                state.global = global;
                state.counters.clear();
            }
            Some(m) => {
                state.models.insert(m.to_string(), over);
                state.counters.remove(m);
            }
        }
        self.rearm(&state);
        let settings = Self::effective(&state, model);
        drop(state);
        // Triton writes the waiting traces when settings change.
        self.flush();
        Ok(settings)
    }

    /// Whether to trace the next request to `model` (request id `request_id`, with the
    /// client's trace context `parent`): `None`, or its trace. In OpenTelemetry mode a request
    /// with a trace context is traced whatever the rate and count, as Triton does.
    pub fn sample(
        &self,
        model: &str,
        version: u64,
        request_id: &str,
        parent: Option<TraceParent>,
    ) -> Option<Arc<Trace>> {
        if !self.armed.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let mut state = self.state.lock().expect("trace lock");
        let (enabled, rate, count) = Self::sampling(&state, model);
        if !enabled {
            return None;
        }
        let propagated = parent.filter(|_| self.exporter.is_some());
        if propagated.is_some() {
            drop(state);
            return Some(Trace::with_context(
                model,
                version,
                request_id.to_string(),
                propagated,
            ));
        }
        let (seen, left) = match state.counters.get_mut(model) {
            Some(c) => c,
            None => state
                .counters
                .entry(model.to_string())
                .or_insert((0, count)),
        };
        *seen += 1;
        if *left == 0 || rate == 0 || *seen % rate != 0 {
            return None;
        }
        if *left > 0 {
            *left -= 1;
        }
        drop(state);
        Some(Trace::with_context(
            model,
            version,
            request_id.to_string(),
            None,
        ))
    }

    /// Hands a finished trace to the writer thread, which writes the file every
    /// `log_frequency` traces. When the writer is behind by [`MAX_BUFFERED_TRACES`], the trace
    /// is dropped (and counted in the log).
    pub fn finish(&self, trace: &Arc<Trace>) {
        let (file, frequency) = {
            let state = self.state.lock().expect("trace lock");
            (state.global.file.clone(), state.global.log_frequency)
        };
        let full = {
            let mut batch = self.batch.lock().expect("trace batch");
            if batch.len() >= MAX_BUFFERED_TRACES {
                self.dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return;
            }
            batch.push(trace.clone());
            // spans go to the batch processor at once: it does its own batching
            let hand_over = if self.exporter.is_some() {
                1
            } else if frequency > 0 {
                frequency.min(HAND_OVER as u64) as usize
            } else {
                HAND_OVER
            };
            (batch.len() >= hand_over).then(|| std::mem::take(&mut *batch))
        };
        if let Some(traces) = full {
            self.hand_over(traces, file, frequency);
        }
    }

    fn hand_over(&self, traces: Vec<Arc<Trace>>, file: String, frequency: u64) {
        let n = traces.len();
        if self
            .sender()
            .try_send(Msg::Traces(traces, file, frequency))
            .is_err()
        {
            self.dropped
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Writes whatever traces are waiting, and returns once they are written (at shutdown and
    /// on a settings change).
    pub fn flush(&self) {
        let traces = std::mem::take(&mut *self.batch.lock().expect("trace batch"));
        if !traces.is_empty() {
            let (file, frequency) = {
                let state = self.state.lock().expect("trace lock");
                (state.global.file.clone(), state.global.log_frequency)
            };
            self.hand_over(traces, file, frequency);
        }
        let Some(tx) = self.writer.lock().expect("trace writer").clone() else {
            return;
        };
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if tx.send(Msg::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(std::time::Duration::from_secs(30));
        }
    }

    /// Writes or exports what is waiting and stops the OpenTelemetry pipeline (at shutdown).
    pub fn shutdown(&self) {
        self.flush();
        if let Some(e) = &self.exporter {
            e.shutdown();
        }
    }

    fn sender(&self) -> std::sync::mpsc::SyncSender<Msg> {
        let mut writer = self.writer.lock().expect("trace writer");
        if let Some(tx) = writer.as_ref() {
            return tx.clone();
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(MAX_BUFFERED_TRACES / HAND_OVER);
        let exporter = self.exporter.clone();
        let spawned = std::thread::Builder::new()
            .name("wisp-trace-writer".into())
            .spawn(move || write_loop(rx, exporter));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the trace writer");
        }
        *writer = Some(tx.clone());
        tx
    }
}

impl Drop for TraceControl {
    fn drop(&mut self) {
        let dropped = self.dropped.load(std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(dropped, "traces dropped: the trace writer fell behind");
        }
    }
}
