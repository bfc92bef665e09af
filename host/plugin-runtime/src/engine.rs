//! The shared wasmtime engines, the epoch ticker that enforces deadlines, and compilation with
//! an on-disk cache of precompiled components.

use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig,
    ProfilingStrategy,
};
use wisp_core::{Error, Result};

/// Set (to anything) to have wasmtime write `/tmp/perf-<pid>.map`, so `perf record` names the
/// plugins' own functions. For profiling a plugin; costs a little at every compile.
pub const PERFMAP_ENV: &str = "WISP_WASM_PERFMAP";

/// How often the epoch advances; deadlines are rounded up to whole ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Ticks in `timeout`, at least one, plus one so a deadline is never shorter than asked.
pub fn deadline_ticks(timeout: Duration) -> u64 {
    (timeout.as_nanos() / EPOCH_TICK.as_nanos()).max(1) as u64 + 1
}

/// What turns a plugin's WebAssembly into code the host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WasmCompiler {
    /// Cranelift, compiling to the host CPU's machine code.
    Native,
    /// Pulley: Cranelift compiling to wasmtime's portable bytecode, which an interpreter runs.
    /// Several times slower than native code, but it asks nothing of the CPU. The default on
    /// riscv64, where Cranelift 48's native backend fails to compile our demo plugins for CPUs
    /// without the V extension (most boards sold today).
    Pulley,
}

impl WasmCompiler {
    /// Whether this build can run Pulley (the `pulley` feature; always on riscv64).
    pub const PULLEY_BUILT: bool = cfg!(any(feature = "pulley", target_arch = "riscv64"));

    /// The compiler used when none is asked for: Pulley on riscv64, native code elsewhere.
    pub fn host_default() -> Self {
        if cfg!(target_arch = "riscv64") {
            WasmCompiler::Pulley
        } else {
            WasmCompiler::Native
        }
    }

    /// Its name in logs and settings.
    pub fn as_str(self) -> &'static str {
        match self {
            WasmCompiler::Native => "native",
            WasmCompiler::Pulley => "pulley",
        }
    }
}

/// Where a compiled component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileSource {
    /// Compiled by Cranelift now (and written to the cache, if there is one).
    Compiled,
    /// Loaded from the on-disk cache.
    Cache,
}

/// The two engines (with and without fuel metering: a precompiled artifact only loads into an
/// engine with the same settings), created on first use and ticked by one thread.
pub struct Engines {
    plain: OnceLock<Engine>,
    fueled: OnceLock<Engine>,
    /// Held while an engine is built, so that two loads never reserve two pools for one engine
    /// at once (the address space holds only the pools [`pool_slots`] sizes).
    building: std::sync::Mutex<()>,
    cache_dir: Option<PathBuf>,
    pooling: bool,
    perfmap: bool,
    compiler: WasmCompiler,
}

impl Engines {
    /// Engines caching precompiled components under `cache_dir` (none: always compile), using
    /// the pooling instance allocator when `pooling` (falling back to on-demand allocation if
    /// the pool cannot be reserved), and writing a perf map when `perfmap` (see
    /// `PERFMAP_ENV`: `WISP_WASM_PERFMAP`), with `compiler` making the code.
    pub fn new(
        cache_dir: Option<PathBuf>,
        pooling: bool,
        perfmap: bool,
        compiler: WasmCompiler,
    ) -> Arc<Self> {
        Arc::new(Engines {
            plain: OnceLock::new(),
            fueled: OnceLock::new(),
            building: std::sync::Mutex::new(()),
            cache_dir,
            pooling,
            perfmap,
            compiler,
        })
    }

    /// The engine for models with (`fuel`) or without fuel metering.
    pub fn get(self: &Arc<Self>, fuel: bool) -> Result<&Engine> {
        let cell = if fuel { &self.fueled } else { &self.plain };
        if let Some(e) = cell.get() {
            return Ok(e);
        }
        let _building = self.building.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = cell.get() {
            return Ok(e);
        }
        let engine = build_engine(fuel, self.pooling, self.perfmap, self.compiler)?;
        if cell.set(engine.clone()).is_ok() {
            spawn_ticker(engine.weak());
        }
        Ok(cell.get().expect("just set"))
    }

    /// The cache directory, if caching is on.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// Compiles `wasm` (a component) for `engine`, or loads it from the cache.
    ///
    /// A cache entry is native code, run as it is, so the cache is used only from a directory
    /// this process's user owns with no access for anyone else (it is created so, and one that
    /// is ours but open to others is closed to mode 0700), and an entry is loaded only if its
    /// digest file binds it to this component and engine: the entry's name is the SHA-256 of
    /// the wasmtime version, the engine's settings and the component, and the digest file
    /// repeats that key beside the SHA-256 of the artifact's bytes. An entry copied over
    /// another's, or changed, is compiled afresh. What was checked is what is loaded: the
    /// artifact is read once, hashed, and deserialized from those bytes.
    pub fn compile(&self, engine: &Engine, wasm: &[u8]) -> Result<(Component, CompileSource)> {
        let fresh = || {
            Component::new(engine, wasm)
                .map_err(|e| Error::invalid(format!("not a valid WebAssembly component: {e:#}")))
        };
        let Some(dir) = &self.cache_dir else {
            return Ok((fresh()?, CompileSource::Compiled));
        };
        if let Err(why) = trusted_dir(dir) {
            tracing::warn!(dir = %dir.display(), "not using the component cache: {why}");
            return Ok((fresh()?, CompileSource::Compiled));
        }
        let key = cache_key(engine, wasm);
        let path = dir.join(format!("{key}.cwasm"));
        let digest_path = dir.join(format!("{key}.digest"));
        if path.exists() {
            match load_verified(engine, &path, &digest_path, &key) {
                Ok(c) => return Ok((c, CompileSource::Cache)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "ignoring unusable cached component: {e}")
                }
            }
        }
        let bytes = engine
            .precompile_component(wasm)
            .map_err(|e| Error::invalid(format!("not a valid WebAssembly component: {e:#}")))?;
        let digest = format!("{key}\n{}\n", hex(&Sha256::digest(&bytes)));
        let written = write_atomically(dir, &path, &bytes)
            .and_then(|()| write_atomically(dir, &digest_path, digest.as_bytes()));
        if let Err(e) = written {
            tracing::warn!(dir = %dir.display(), "cannot write the component cache: {e}");
        }
        let component = load_precompiled(engine, &bytes).map_err(|e| {
            Error::internal(format!("cannot load a just-compiled component: {e:#}"))
        })?;
        Ok((component, CompileSource::Compiled))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `dir` may hold native code this process runs: created with mode 0700 if missing;
/// a directory (not a link), owned by this process's user, with no access for group or
/// others (an own directory with more is closed to 0700).
fn trusted_dir(dir: &Path) -> std::result::Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create it: {e}"))?;
        }
        let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
        if !meta.is_dir() {
            return Err("it is not a directory (or is a symbolic link)".into());
        }
        let me = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .map_err(|e| format!("cannot tell this process's user: {e}"))?;
        if meta.uid() != me {
            return Err(format!(
                "it is owned by user {}, not by this process's user {me}",
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("it is open to other users and cannot be closed: {e}"))?;
        }
    }
    Ok(())
}

/// The cached component at `path`, if `digest_path` names `key` and the SHA-256 of the bytes
/// read (which are then deserialized, not the file again).
fn load_verified(
    engine: &Engine,
    path: &Path,
    digest_path: &Path,
    key: &str,
) -> std::result::Result<Component, String> {
    let digest = wisp_core::repository::read_regular_text(digest_path, 256)
        .map_err(|e| format!("its digest file: {e}"))?;
    let mut lines = digest.lines();
    if lines.next() != Some(key) {
        return Err("its digest file is for another component or engine".into());
    }
    let want = lines.next().unwrap_or_default();
    let bytes =
        wisp_core::repository::read_regular(path, wisp_core::repository::MAX_MODEL_FILE_BYTES)
            .map_err(|e| e.to_string())?;
    if hex(&Sha256::digest(&bytes)) != want {
        return Err("its bytes do not match its digest (changed or copied over)".into());
    }
    load_precompiled(engine, &bytes).map_err(|e| format!("{e:#}"))
}

fn build_engine(
    fuel: bool,
    pooling: bool,
    perfmap: bool,
    compiler: WasmCompiler,
) -> Result<Engine> {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .consume_fuel(fuel)
        .cranelift_opt_level(OptLevel::Speed)
        .parallel_compilation(true);
    if compiler == WasmCompiler::Pulley {
        if !WasmCompiler::PULLEY_BUILT {
            return Err(Error::invalid(
                "this build has no Pulley interpreter (built without the `pulley` feature)",
            ));
        }
        let target = match (
            cfg!(target_pointer_width = "64"),
            cfg!(target_endian = "big"),
        ) {
            (true, false) => "pulley64",
            (true, true) => "pulley64be",
            (false, false) => "pulley32",
            (false, true) => "pulley32be",
        };
        config
            .target(target)
            .map_err(|e| Error::internal(format!("cannot target {target}: {e:#}")))?;
    }
    if perfmap {
        config.profiler(ProfilingStrategy::PerfMap);
    }
    if pooling {
        let ram = wisp_core::meminfo::memory_limit();
        let space = address_space();
        let mut slots = pool_slots(ram, space);
        if slots < MIN_POOL_SLOTS {
            tracing::info!(
                slots,
                address_space_gib = space.map(|b| b >> 30),
                "wasm pooling allocator: the address space holds only {slots} memory slots of {} MiB (fewer than {MIN_POOL_SLOTS}); allocating on demand",
                SLOT_RESERVATION >> 20
            );
        }
        while slots >= MIN_POOL_SLOTS {
            // Only memories reserve much address space (SLOT_RESERVATION each); a component
            // instance holds several core instances and tables, which cost little.
            let instances = pool_slots(ram, None)
                .max(slots)
                .saturating_mul(INSTANCES_PER_SLOT);
            let mut pool = PoolingAllocationConfig::default();
            pool.max_memory_size((crate::limits::MAX_MEMORY_MB as usize) << 20)
                .total_component_instances(instances)
                .total_core_instances(instances)
                .total_memories(slots)
                .total_tables(instances);
            let mut pooled = config.clone();
            pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            match Engine::new(&pooled) {
                Ok(e) => {
                    tracing::info!(
                        slots,
                        instances,
                        memory_mib = ram.map(|b| b >> 20),
                        address_space_gib = space.map(|b| b >> 30),
                        fuel,
                        "wasm pooling allocator: {slots} memory slots (one per {} MiB of memory, at most 3/8 of the address space at {} MiB a slot, {MIN_POOL_SLOTS} to {MAX_POOL_SLOTS}), {instances} instances",
                        RAM_PER_POOL_SLOT >> 20,
                        SLOT_RESERVATION >> 20
                    );
                    return Ok(e);
                }
                Err(e) if slots > MIN_POOL_SLOTS => {
                    let fewer = (slots / 4).max(MIN_POOL_SLOTS);
                    tracing::warn!(
                        "wasm pooling allocator: cannot reserve address space for {slots} memory slots ({e:#}); trying {fewer}"
                    );
                    slots = fewer;
                }
                Err(e) => {
                    tracing::warn!("pooling allocator unavailable, allocating on demand: {e:#}");
                    break;
                }
            }
        }
    }
    Engine::new(&config)
        .map_err(|e| Error::internal(format!("cannot create the wasm engine: {e:#}")))
}

/// Core instances, component instances and tables the pool holds for each slot the memory
/// gives: a component instantiates several core modules, most without a memory of their own.
const INSTANCES_PER_SLOT: u32 = 4;
/// Memory that earns the pooling allocator one instance slot.
const RAM_PER_POOL_SLOT: u64 = 16 << 20;
/// The fewest slots a pool is tried with before allocating on demand.
const MIN_POOL_SLOTS: u32 = 16;
/// The most slots (wasmtime's own default).
const MAX_POOL_SLOTS: u32 = 1000;

/// The address space one instance slot reserves: a linear memory of up to `MAX_MEMORY_MB`
/// (wasmtime's 4 GiB reservation on 64-bit hosts) and its guard regions before and after
/// (32 MiB each).
pub const SLOT_RESERVATION: u64 = (crate::limits::MAX_MEMORY_MB << 20) + (64 << 20);

/// Memory slots of one engine's pooling allocator for `memory` bytes of usable memory and
/// `space` bytes of address space: one per [`RAM_PER_POOL_SLOT`] within
/// [`MIN_POOL_SLOTS`]..=[`MAX_POOL_SLOTS`] (the most when the memory is unknown), and no more
/// than 3/8 of the address space holds at [`SLOT_RESERVATION`] each, so that both engines
/// (with and without fuel) fit with room for the rest of the process. A riscv64 board with
/// Sv39 paging has 256 GiB of user address space (23 slots), an aarch64 kernel with 39-bit
/// addresses 512 GiB (47); an x86-64 host 128 TiB. Fewer than [`MIN_POOL_SLOTS`] means no
/// pool: instances are then allocated on demand.
pub fn pool_slots(memory: Option<u64>, space: Option<u64>) -> u32 {
    let by_memory = match memory {
        None => MAX_POOL_SLOTS as u64,
        Some(b) => (b / RAM_PER_POOL_SLOT).clamp(MIN_POOL_SLOTS as u64, MAX_POOL_SLOTS as u64),
    };
    let by_space = space.map_or(u64::MAX, |a| a / 8 * 3 / SLOT_RESERVATION);
    by_memory.min(by_space) as u32
}

/// The address space this process may map: its `RLIMIT_AS` (`ulimit -v`, `prlimit --as`) or
/// the user address space the kernel gives, whichever is less. The latter is read from where
/// the stack sits, at the top of user space: below 2^38 under Sv39, 2^39 with 39-bit aarch64
/// addresses, 2^47 on x86-64. `None` off Linux.
pub fn address_space() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok();
    let maps = std::fs::read_to_string("/proc/self/maps").ok();
    address_space_of(limits.as_deref(), maps.as_deref())
}

/// [`address_space`] from the text of `/proc/self/limits` and `/proc/self/maps`.
fn address_space_of(limits: Option<&str>, maps: Option<&str>) -> Option<u64> {
    let limit = limits.and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("Max address space"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|soft| soft.parse::<u64>().ok())
    });
    let user = maps.and_then(|t| {
        t.lines()
            .filter(|l| l.ends_with("[stack]"))
            .find_map(|l| l.split(['-', ' ']).nth(1))
            .and_then(|end| u64::from_str_radix(end, 16).ok())
            .filter(|&end| end > 0)
            .map(|end| 1u64 << (64 - (end - 1).leading_zeros()).min(63))
    });
    match (limit, user) {
        (Some(l), Some(u)) => Some(l.min(u)),
        (l, u) => l.or(u),
    }
}

/// Advances the engine's epoch every tick while the engine lives.
fn spawn_ticker(engine: wasmtime::EngineWeak) {
    let spawned = std::thread::Builder::new()
        .name("wisp-wasm-epoch".into())
        .spawn(move || {
            let mut next = Instant::now();
            loop {
                next += EPOCH_TICK;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                match engine.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => return,
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the wasm epoch thread, plugin deadlines will not fire: {e}");
    }
}

/// sha256 of the wasmtime version, the engine's compatibility settings and the component.
fn cache_key(engine: &Engine, wasm: &[u8]) -> String {
    struct Sha(Sha256);
    impl Hasher for Sha {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut h = Sha(Sha256::new());
    h.write(b"wasmtime-48.0.8\0");
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
    h.write(b"\0");
    h.write(wasm);
    h.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[expect(
    unsafe_code,
    reason = "wasmtime deserialization of artifacts this engine compiled"
)]
fn load_precompiled(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `bytes` came from `engine.precompile_component` on this very engine, moments
    // ago, or from a cache entry whose SHA-256 matches the digest written beside it, under a
    // name derived from the wasmtime version, this engine's compatibility hash and the
    // component, in a directory only this process's user can write (`trusted_dir`); wasmtime
    // also checks the artifact's version and settings header before using it.
    unsafe { Component::deserialize(engine, bytes) }
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("component"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_slots_follow_memory_within_bounds() {
        assert_eq!(pool_slots(None, None), 1000);
        assert_eq!(pool_slots(Some(24 << 30), None), 1000);
        assert_eq!(pool_slots(Some(2 << 30), None), 128);
        assert_eq!(pool_slots(Some(512 << 20), None), 32);
        assert_eq!(pool_slots(Some(64 << 20), None), 16);
        assert!(wisp_core::meminfo::memory_limit().is_some_and(|m| m > 0));
    }

    #[test]
    fn pool_slots_fit_the_address_space() {
        // x86-64's 128 TiB does not limit a large host
        assert_eq!(pool_slots(Some(24 << 30), Some(128 << 40)), 1000);
        // Sv39 (256 GiB) and 39-bit aarch64 (512 GiB): 3/8 of it, at 4160 MiB a slot
        assert_eq!(pool_slots(Some(24 << 30), Some(256 << 30)), 23);
        assert_eq!(pool_slots(Some(24 << 30), Some(512 << 30)), 47);
        // a 1 GiB board under Sv39: memory would give 64, the address space 23
        assert_eq!(pool_slots(Some(1 << 30), Some(256 << 30)), 23);
        // too little for the fewest slots: none (allocated on demand)
        assert!(pool_slots(Some(24 << 30), Some(64 << 30)) < MIN_POOL_SLOTS);
        assert!(address_space().is_some_and(|a| a >= 1 << 30));
    }

    #[test]
    fn the_address_space_is_the_lesser_of_the_limit_and_the_stack_top() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
            Max stack size            8388608              unlimited            bytes\n\
            Max address space         274877906944         unlimited            bytes\n";
        let unlimited = limits.replace("274877906944", "unlimited");
        let x86 =
            "7ffd1c0a1000-7ffd1c0c2000 rw-p 00000000 00:00 0                          [stack]\n";
        let sv39 = "3fffd4e000-3fffd6f000 rw-p 00000000 00:00 0                          [stack]\n";
        assert_eq!(
            address_space_of(Some(&unlimited), Some(x86)),
            Some(128 << 40)
        );
        assert_eq!(
            address_space_of(Some(&unlimited), Some(sv39)),
            Some(256 << 30)
        );
        assert_eq!(address_space_of(Some(limits), Some(x86)), Some(256 << 30));
        assert_eq!(address_space_of(Some(limits), None), Some(256 << 30));
        assert_eq!(address_space_of(None, None), None);
    }

    /// Native engines caching under `dir`, without pooling or a perf map.
    fn native_cached(dir: &Path) -> Arc<Engines> {
        Engines::new(Some(dir.to_path_buf()), false, false, WasmCompiler::Native)
    }

    #[test]
    fn deadlines_round_up() {
        assert_eq!(deadline_ticks(Duration::ZERO), 2);
        assert_eq!(deadline_ticks(EPOCH_TICK * 10), 11);
    }

    #[test]
    fn rejects_bytes_that_are_not_a_component() {
        let dir = tempfile::tempdir().unwrap();
        let engines = native_cached(dir.path());
        let engine = engines.get(false).unwrap().clone();
        let e = engines.compile(&engine, b"not wasm").unwrap_err();
        assert!(e.message().contains("not a valid WebAssembly component"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// The smallest valid component: the preamble of an empty one.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";

    #[test]
    fn caches_then_loads_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let engines = native_cached(dir.path());
        let engine = engines.get(false).unwrap().clone();
        let (_, first) = engines.compile(&engine, EMPTY_COMPONENT).unwrap();
        let (_, second) = engines.compile(&engine, EMPTY_COMPONENT).unwrap();
        assert_eq!(
            (first, second),
            (CompileSource::Compiled, CompileSource::Cache)
        );
    }

    #[test]
    fn pulley_compiles_into_its_own_cache_entries() {
        if !WasmCompiler::PULLEY_BUILT {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let native = Engines::new(
            Some(dir.path().to_path_buf()),
            false,
            false,
            WasmCompiler::Native,
        );
        let pulley = Engines::new(
            Some(dir.path().to_path_buf()),
            false,
            false,
            WasmCompiler::Pulley,
        );
        let (n, p) = (native.get(false).unwrap(), pulley.get(false).unwrap());
        assert!(p.is_pulley());
        assert!(!n.is_pulley());
        assert_ne!(cache_key(n, EMPTY_COMPONENT), cache_key(p, EMPTY_COMPONENT));
        let (_, source) = pulley.compile(p, EMPTY_COMPONENT).unwrap();
        assert_eq!(source, CompileSource::Compiled);
        let (_, source) = native.compile(n, EMPTY_COMPONENT).unwrap();
        assert_eq!(source, CompileSource::Compiled);
    }

    #[test]
    fn a_cache_entry_copied_over_another_is_not_loaded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let engines = native_cached(dir.path());
        // Two components holding a core module whose one function returns 1, or 2: two
        // entries of native code for the same engine, which wasmtime alone would both accept.
        let returning = |n: u8| -> Vec<u8> {
            let mut module = b"\0asm\x01\0\0\0".to_vec();
            module.extend([1, 5, 1, 0x60, 0, 1, 0x7f]); // type: () -> i32
            module.extend([3, 2, 1, 0]); // one function of that type
            module.extend([10, 6, 1, 4, 0, 0x41, n, 0x0b]); // i32.const n
            let mut component = EMPTY_COMPONENT.to_vec();
            component.extend([1, module.len() as u8]);
            component.extend(module);
            component
        };
        let (one, two) = (returning(1), returning(2));
        let engine = engines.get(false).unwrap().clone();
        engines.compile(&engine, &one).unwrap();
        engines.compile(&engine, &two).unwrap();
        let (a, b) = (cache_key(&engine, &one), cache_key(&engine, &two));
        let entry = |key: &str, ext: &str| dir.path().join(format!("{key}.{ext}"));
        assert_ne!(
            std::fs::read(entry(&a, "cwasm")).unwrap(),
            std::fs::read(entry(&b, "cwasm")).unwrap()
        );
        // The artifact copied over the other's: its digest no longer matches.
        std::fs::copy(entry(&a, "cwasm"), entry(&b, "cwasm")).unwrap();
        let (_, source) = engines.compile(&engine, &two).unwrap();
        assert_eq!(source, CompileSource::Compiled);
        let (_, source) = engines.compile(&engine, &two).unwrap();
        assert_eq!(source, CompileSource::Cache, "recompiled and cached again");
        // Artifact and digest both copied: the digest names another component.
        std::fs::copy(entry(&a, "cwasm"), entry(&b, "cwasm")).unwrap();
        std::fs::copy(entry(&a, "digest"), entry(&b, "digest")).unwrap();
        let (_, source) = engines.compile(&engine, &two).unwrap();
        assert_eq!(source, CompileSource::Compiled);
        // A cache directory of ours that others may write is closed before it is used.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (_, source) = engines.compile(&engine, &one).unwrap();
        assert_eq!(source, CompileSource::Cache);
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn an_unwritable_cache_still_compiles() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let engines = Engines::new(Some(not_a_dir), false, false, WasmCompiler::Native);
        let engine = engines.get(false).unwrap().clone();
        let (_, source) = engines.compile(&engine, EMPTY_COMPONENT).unwrap();
        assert_eq!(source, CompileSource::Compiled);
    }
}
