//! One plugin instance: a store, its sandbox, `init`, `execute`, and replacement after a trap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, ComponentExportIndex, Func, InstancePre, ResourceTable};
use wasmtime::{Store, Trap};
use wasmtime_wasi::{FsPerms, HostMonotonicClock, HostWallClock, WasiCtxBuilder};
use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::config::{ModelConfig, Signature};
use wisp_core::{Error, InferRequest, InferResponse, Result};

use crate::engine::deadline_ticks;
use crate::host::{self, wit, State};
use crate::limits::{Limits, GUEST_DATA_DIR};
use crate::stdio::PluginOutput;
use crate::ModelCaller;

/// What every instance of one model version shares.
pub(crate) struct Shared {
    /// Whether a short call may run on the thread that received the request (see
    /// `Instance::runs_on_caller`): not a decoupled model, and not kept off by
    /// `wasm.on_caller: false`.
    pub on_caller: bool,
    pub name: Arc<str>,
    pub version: String,
    pub config: Arc<ModelConfig>,
    pub signature: Arc<Signature>,
    pub limits: Limits,
    pub pre: Pre,
    pub caller: Option<Arc<dyn ModelCaller>>,
    pub failures: Arc<crate::FailureCounts>,
}

/// Why a call failed, as the `reason` label of `wisp_plugin_failure_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Failure {
    /// The guest trapped (a Rust panic, `unreachable`, a bad memory access, ...).
    Trap,
    /// It ran past `wasm.timeout_ms`.
    Deadline,
    /// It tried to grow its memory past `wasm.memory_limit_mb`.
    Memory,
    /// It used up `wasm.fuel`.
    Fuel,
    /// It returned results inconsistent with the config or the batch.
    BadOutput,
    /// `init` failed or trapped.
    Init,
}

impl Failure {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Trap => "trap",
            Failure::Deadline => "deadline",
            Failure::Memory => "memory",
            Failure::Fuel => "fuel",
            Failure::BadOutput => "bad_output",
            Failure::Init => "init",
        }
    }
}

fn count_failure(shared: &Shared, why: Failure) {
    shared.failures.add(&shared.name, &shared.version, why);
}

/// Sorts a wasmtime error into a failure kind and a message for clients.
fn classify(err: &wasmtime::Error, limits: &Limits, output: &PluginOutput) -> (Failure, String) {
    let text = format!("{err:#}");
    let memory = err.downcast_ref::<crate::limits::MemoryDenied>().is_some();
    let (why, mut message) = match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => (
            Failure::Deadline,
            format!(
                "exceeded its deadline of {} ms",
                limits.sandbox.timeout.as_millis()
            ),
        ),
        Some(Trap::OutOfFuel) => (
            Failure::Fuel,
            format!(
                "ran out of fuel ({} units per call)",
                limits.sandbox.fuel.unwrap_or(0)
            ),
        ),
        _ if memory => (
            Failure::Memory,
            format!(
                "exceeded its memory limit of {} MiB",
                limits.sandbox.memory_bytes >> 20
            ),
        ),
        Some(trap) => (Failure::Trap, format!("trapped: {trap}")),
        None => (Failure::Trap, format!("failed: {}", first_line(&text))),
    };
    let printed = output.tail();
    if !printed.is_empty() {
        let last: Vec<&str> = printed.lines().rev().take(3).collect();
        let last: Vec<&str> = last.into_iter().rev().collect();
        message.push_str(&format!(" (plugin output: {})", last.join(" | ")));
    }
    (why, message)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

struct FrozenWallClock;
impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

struct FrozenMonotonicClock;
impl HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// How a component is instantiated and called: a 0.3.0 component through its generated
/// bindings; a 0.2.0 or 0.1.0 one through its exports, typed with the 0.3.0 types (the same
/// structure: component types match by structure, not by package version).
pub(crate) enum Pre {
    /// `wisp:plugin@0.3.0`.
    Current(host::ModelPre<State>),
    /// `wisp:plugin@0.2.0` or `0.1.0`.
    Older {
        pre: InstancePre<State>,
        init: ComponentExportIndex,
        execute: ComponentExportIndex,
        /// 0.2.0's `describe` (0.1.0 has none).
        describe: Option<ComponentExportIndex>,
    },
}

/// The `wisp:plugin` versions whose components load, newest first.
pub(crate) const WORLDS: [&str; 3] = ["0.3.0", "0.2.0", "0.1.0"];

impl Pre {
    /// Which world `component` implements, from its exports.
    pub fn new(component: &Component, pre: InstancePre<State>) -> Result<Pre> {
        if component
            .get_export_index(None, "wisp:plugin/plugin@0.3.0")
            .is_some()
        {
            return host::ModelPre::new(pre).map(Pre::Current).map_err(|e| {
                Error::invalid(format!(
                    "its wisp:plugin/plugin@0.3.0 export does not match wit/plugin.wit: {e:#}"
                ))
            });
        }
        let Some((version, plugin)) = WORLDS[1..].iter().find_map(|v| {
            component
                .get_export_index(None, format!("wisp:plugin/plugin@{v}"))
                .map(|i| (v, i))
        }) else {
            return Err(Error::invalid(
                "the component exports no wisp:plugin/plugin (0.3.0, 0.2.0 or 0.1.0): build it with wisp-sdk, or against wit/plugin.wit",
            ));
        };
        let func = |name: &str| {
            component
                .get_export_index(Some(&plugin), name)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "its wisp:plugin/plugin@{version} export has no '{name}' function"
                    ))
                })
        };
        Ok(Pre::Older {
            init: func("init")?,
            execute: func("execute")?,
            describe: if *version == "0.2.0" {
                Some(func("describe")?)
            } else {
                None
            },
            pre,
        })
    }

    fn engine(&self) -> &wasmtime::Engine {
        match self {
            Pre::Current(p) => p.engine(),
            Pre::Older { pre, .. } => pre.engine(),
        }
    }

    fn instantiate(&self, store: &mut Store<State>) -> wasmtime::Result<Bindings> {
        match self {
            Pre::Current(p) => p.instantiate(&mut *store).map(Bindings::Current),
            Pre::Older {
                pre,
                init,
                execute,
                describe,
            } => {
                let instance = pre.instantiate(&mut *store)?;
                let func = |store: &mut Store<State>, index| {
                    instance
                        .get_func(store, index)
                        .ok_or_else(|| wasmtime::Error::msg("a plugin export is not a function"))
                };
                Ok(Bindings::Older {
                    init: func(store, init)?,
                    execute: func(store, execute)?,
                    describe: match describe {
                        Some(d) => Some(func(store, d)?),
                        None => None,
                    },
                })
            }
        }
    }
}

/// An instantiated component's exports.
enum Bindings {
    Current(host::Model),
    Older {
        init: Func,
        execute: Func,
        describe: Option<Func>,
    },
}

/// What `execute` returns.
type Executed = Vec<std::result::Result<wit::Response, wit::Error>>;

impl Bindings {
    fn init(
        &self,
        store: &mut Store<State>,
        params: &[(&str, &str)],
    ) -> wasmtime::Result<std::result::Result<(), wit::Error>> {
        match self {
            Bindings::Current(m) => m.wisp_plugin0_3_0_plugin().call_init(store, params),
            Bindings::Older { init, .. } => {
                let f = init
                    .typed::<(&[(&str, &str)],), (std::result::Result<(), wit::Error>,)>(&*store)?;
                Ok(f.call(store, (params,))?.0)
            }
        }
    }

    fn execute(
        &self,
        store: &mut Store<State>,
        batch: &[wit::RequestParam<'_>],
    ) -> wasmtime::Result<Executed> {
        match self {
            Bindings::Current(m) => m.wisp_plugin0_3_0_plugin().call_execute(store, batch),
            Bindings::Older { execute, .. } => {
                let f = execute.typed::<(&[wit::RequestParam<'_>],), (Executed,)>(&*store)?;
                Ok(f.call(store, (batch,))?.0)
            }
        }
    }

    fn describe(&self, store: &mut Store<State>) -> wasmtime::Result<Option<wit::Signature>> {
        match self {
            Bindings::Current(m) => m.wisp_plugin0_3_0_plugin().call_describe(store),
            Bindings::Older {
                describe: Some(d), ..
            } => {
                let f = d.typed::<(), (Option<wit::Signature>,)>(&*store)?;
                Ok(f.call(store, ())?.0)
            }
            Bindings::Older { describe: None, .. } => Ok(None),
        }
    }
}

/// A live, initialized plugin instance.
struct Live {
    store: Store<State>,
    bindings: Bindings,
    output: PluginOutput,
}

fn instantiate(shared: &Shared) -> std::result::Result<Live, (Failure, Error)> {
    let limits = &shared.limits;
    let (mut store, output) = new_store(
        &shared.name,
        limits,
        shared.caller.clone(),
        &shared.pre,
        Some((&shared.signature, shared.config.decoupled())),
    )?;
    let fail = |e: wasmtime::Error, output: &PluginOutput| {
        let (_, msg) = classify(&e, limits, output);
        (
            Failure::Init,
            Error::unavailable(format!("plugin '{}' init {msg}", shared.name)),
        )
    };
    let bindings = shared
        .pre
        .instantiate(&mut store)
        .map_err(|e| fail(e, &output))?;
    let params: Vec<(&str, &str)> = shared
        .config
        .parameters
        .iter()
        .map(|(k, v)| (k.as_str(), v.string_value.as_str()))
        .collect();
    match bindings.init(&mut store, &params) {
        Ok(Ok(())) => Ok(Live {
            store,
            bindings,
            output,
        }),
        Ok(Err(e)) => Err((
            Failure::Init,
            Error::unavailable(format!(
                "plugin '{}' init failed: {}",
                shared.name, e.message
            )),
        )),
        Err(e) => Err(fail(e, &output)),
    }
}

/// What a 0.2.0 component says it serves (`describe`, on a fresh sandboxed instance with the
/// default limits, before any `init`); `None` when it does not describe itself.
pub(crate) fn describe(name: &str, pre: &Pre) -> Result<Option<wit::Signature>> {
    let limits = Limits::default();
    let (mut store, output) =
        new_store(&Arc::from(name), &limits, None, pre, None).map_err(|(_, e)| e)?;
    let fail = |e: wasmtime::Error| {
        let (_, msg) = classify(&e, &limits, &output);
        Error::invalid(format!("plugin '{name}' describe {msg}"))
    };
    let bindings = pre.instantiate(&mut store).map_err(fail)?;
    bindings.describe(&mut store).map_err(fail)
}

/// A store with `limits`' sandbox, its output captured.
fn new_store(
    name: &Arc<str>,
    limits: &Limits,
    caller: Option<Arc<dyn ModelCaller>>,
    pre: &Pre,
    model: Option<(&Arc<Signature>, bool)>,
) -> std::result::Result<(Store<State>, PluginOutput), (Failure, Error)> {
    let output = PluginOutput::new(name);
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(output.clone())
        .stderr(output.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .envs(&limits.env);
    if !limits.sandbox.clock {
        wasi.wall_clock(FrozenWallClock)
            .monotonic_clock(FrozenMonotonicClock);
    }
    if let Some(dir) = &limits.sandbox.read_dir {
        wasi.preopened_dir(dir, GUEST_DATA_DIR, FsPerms::ReadOnly)
            .map_err(|e| {
                (
                    Failure::Init,
                    Error::invalid(format!(
                        "plugin '{name}': cannot grant {}: {e:#}",
                        dir.display()
                    )),
                )
            })?;
    }
    let state = State {
        wasi: wasi.build(),
        table: ResourceTable::new(),
        limits: crate::limits::Limiter {
            memory_bytes: limits.sandbox.memory_bytes,
        },
        model: name.clone(),
        caller,
        deadline: Instant::now() + limits.sandbox.timeout,
        trace: None,
        call_path: Vec::new(),
        signature: model.map(|(sig, _)| sig.clone()),
        decoupled: model.is_some_and(|(_, decoupled)| decoupled),
        streams: Vec::new(),
    };
    let mut store = Store::new(pre.engine(), state);
    store.limiter(|s| &mut s.limits);
    arm(&mut store, limits).map_err(|e| (Failure::Init, e))?;
    Ok((store, output))
}

/// Sets the deadline (and fuel) for the next call.
fn arm(store: &mut Store<State>, limits: &Limits) -> Result<()> {
    store.set_epoch_deadline(deadline_ticks(limits.sandbox.timeout));
    store.data_mut().deadline = Instant::now() + limits.sandbox.timeout;
    if let Some(fuel) = limits.sandbox.fuel {
        store
            .set_fuel(fuel)
            .map_err(|e| Error::internal(format!("cannot set fuel: {e:#}")))?;
    }
    Ok(())
}

/// A model instance running a plugin.
pub(crate) struct WasmInstance {
    shared: Arc<Shared>,
    live: Option<Live>,
}

impl WasmInstance {
    /// Instantiates and initializes the plugin (an `init` failure fails the load).
    pub fn new(shared: Arc<Shared>) -> Result<Self> {
        let live = instantiate(&shared).map_err(|(why, e)| {
            count_failure(&shared, why);
            e
        })?;
        Ok(WasmInstance {
            shared,
            live: Some(live),
        })
    }
}

impl Instance for WasmInstance {
    fn runs_on_caller(&self) -> bool {
        self.shared.on_caller
    }

    /// Guest code runs until its deadline (`wasm.timeout_ms`) whatever its recent calls took.
    fn may_stall(&self) -> bool {
        true
    }

    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let shared = self.shared.clone();
        let fail_all = |e: Error| batch.iter().map(|_| Err(e.clone())).collect();
        let start = Instant::now();
        let mut live = match self.live.take() {
            Some(l) => l,
            None => match instantiate(&shared) {
                Ok(l) => l,
                Err((why, e)) => {
                    count_failure(&shared, why);
                    return fail_all(e);
                }
            },
        };
        let parts: Vec<host::WitParts> = batch.iter().map(host::WitParts::new).collect();
        let parameters: Vec<_> = parts.iter().map(host::WitParts::parameters).collect();
        let requests: Vec<host::wit::RequestParam> = parts
            .iter()
            .zip(&parameters)
            .map(|(p, params)| p.request(params))
            .collect();
        live.output.clear();
        if let Err(e) = arm(&mut live.store, &shared.limits) {
            return fail_all(e);
        }
        let converted = Instant::now();
        timing.input_ns = (converted - start).as_nanos() as u64;
        // A plugin sees a batch, not which request a wasi-nn call serves: calls are traced
        // under the batch's first traced request (exact for the usual batch of one).
        live.store.data_mut().trace = batch.iter().find_map(|r| r.trace.clone());
        // Models this batch was called from, and this one: calls back into them are refused.
        let state = live.store.data_mut();
        state.call_path.clear();
        for r in batch {
            for m in &r.call_path {
                if !state.call_path.contains(m) {
                    state.call_path.push(m.clone());
                }
            }
        }
        state.call_path.push(shared.name.clone());
        // Where each request's responses go, for a decoupled model's `responses.send`.
        let batched = shared.signature.batches();
        state.streams = batch
            .iter()
            .map(|r| host::Stream {
                sink: r.responses.clone(),
                rows: r.batch_size(batched) as i64,
                finished: false,
            })
            .collect();
        let result = live.bindings.execute(&mut live.store, &requests);
        let state = live.store.data_mut();
        state.trace = None;
        let streams = std::mem::take(&mut state.streams);
        let executed = Instant::now();
        timing.infer_ns = (executed - converted).as_nanos() as u64;
        let results = match result {
            Ok(r) => r,
            Err(e) => {
                // A trapped instance cannot be entered again: drop it; the next batch gets a
                // fresh one.
                let (why, msg) = classify(&e, &shared.limits, &live.output);
                count_failure(&shared, why);
                tracing::warn!(model = %shared.name, reason = why.as_str(), "plugin {msg}; replacing the instance");
                let kind = if why == Failure::Deadline {
                    Error::unavailable
                } else {
                    Error::internal
                };
                return fail_all(kind(format!("plugin '{}' {msg}", shared.name)));
            }
        };
        let out = if results.len() != batch.len() {
            count_failure(&shared, Failure::BadOutput);
            fail_all(Error::internal(format!(
                "plugin '{}' returned {} results for a batch of {}",
                shared.name,
                results.len(),
                batch.len()
            )))
        } else {
            let decoupled = live.store.data().decoupled;
            streams
                .iter()
                .zip(results)
                .enumerate()
                .map(|(i, (stream, r))| match r {
                    // A request whose final response went through `responses` is over.
                    _ if stream.finished => {
                        if let Err(e) = r {
                            tracing::warn!(model = %shared.name, "plugin returned an error for request {i} after its final response: {}", e.message);
                        }
                        Ok(InferResponse::new(Vec::new()))
                    }
                    Ok(resp) => crate::responses::check_response(
                        &shared.signature,
                        stream.rows,
                        resp,
                        decoupled,
                    )
                    .map_err(|e| {
                        count_failure(&shared, Failure::BadOutput);
                        Error::internal(format!("plugin '{}' {}", shared.name, e.message()))
                    }),
                    Err(e) => Err(host::from_wit_error(e)),
                })
                .collect()
        };
        self.live = Some(live);
        timing.output_ns = executed.elapsed().as_nanos() as u64;
        out
    }
}
