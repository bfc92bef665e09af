//! Triton's system shared memory extension: a client creates a POSIX shared-memory object
//! (`shm_open`), registers a window of it under a name, and then names that region instead of
//! sending tensor bytes: inputs are read from it, outputs written into it.
//!
//! A region's object is opened once, at registration, and shared by `Arc`: unregistering
//! removes the name at once, and the descriptor lives until the last request using it
//! finishes. Copies go through the descriptor (`pread`/`pwrite`), never through a mapping: the
//! client may shrink the object at any time, and a mapping past its end would raise SIGBUS. Every offset
//! and size is checked against the window with checked arithmetic before anything is copied.
//! Keys are shm object names (`/name`, no other `/`), so a region can only ever be an object
//! of the shared-memory file system, never an ordinary file.
//!
//! Client shared memory is off unless the server was started with `--allow-client-shm` (as in
//! Triton since 26.05): any local process that can create a shm object can otherwise hand the
//! server its bytes. When on, a key belongs to the [`Scope`] that registered it first, until
//! that scope's last region over it is unregistered: another scope registering the same key
//! gets the very answer a missing key gets, so it learns neither the bytes nor that the key
//! exists. Each scope has its own quota of regions and bytes, and the number of scopes is
//! capped, so that one token cannot take the registrations of every other.

#[cfg(all(test, unix))]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wisp_core::{Error, Result};

/// Regions registered at once, at most.
pub const MAX_REGIONS: usize = 1024;
/// Regions one scope may have registered at once.
pub const MAX_REGIONS_PER_SCOPE: usize = 64;
/// Scopes (tokens) with regions registered at once.
pub const MAX_SCOPES: usize = 64;
/// The longest region name and shm key.
pub const MAX_NAME_BYTES: usize = 255;

/// Where a tensor lives in a registered region (Triton's `shared_memory_region`,
/// `shared_memory_offset`, `shared_memory_byte_size` parameters).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShmRef {
    /// The region's registered name.
    pub region: String,
    /// Offset into the region.
    pub offset: usize,
    /// Bytes from the offset.
    pub byte_size: usize,
}

/// One registered region, as the status call reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    /// Its registered name.
    pub name: String,
    /// The shm object's key.
    pub key: String,
    /// Where the window starts in the object.
    pub offset: usize,
    /// The window's size.
    pub byte_size: usize,
}

/// A mapped window of a shm object.
struct Region {
    status: RegionStatus,
    map: Mapping,
}

/// The header (HTTP) or metadata key (gRPC) that names a client's shared memory scope.
pub const TOKEN_HEADER: &str = "wisp-shm-token";
/// The longest scope token.
pub const MAX_TOKEN_BYTES: usize = 128;

/// Whose regions a call sees: the token a client presents in [`TOKEN_HEADER`], or none. A
/// region belongs to the scope that registered it; only calls in that scope can use it in a
/// request, list it, or unregister it. Clients without a token share one scope, as every
/// client does in Triton (unless `--shm-require-token`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Scope(String);

impl Scope {
    /// The scope of a call that sent `token` (the header's value), checked: 1 to
    /// [`MAX_TOKEN_BYTES`] visible ASCII characters.
    pub fn from_token(token: Option<&[u8]>) -> Result<Scope> {
        let Some(t) = token else {
            return Ok(Scope::default());
        };
        if t.is_empty() || t.len() > MAX_TOKEN_BYTES || !t.iter().all(|b| b.is_ascii_graphic()) {
            return Err(Error::invalid(format!(
                "header '{TOKEN_HEADER}' must have 1 to {MAX_TOKEN_BYTES} visible ASCII characters"
            )));
        }
        Ok(Scope(String::from_utf8_lossy(t).into_owned()))
    }

    /// Whether this is the shared scope of clients without a token.
    pub fn is_shared(&self) -> bool {
        self.0.is_empty()
    }
}

/// The registered regions, by scope and name, and who owns each key.
#[derive(Default)]
struct Registry {
    regions: BTreeMap<(Scope, String), Arc<Region>>,
    /// Each registered key's scope, and how many of its regions use the key.
    keys: BTreeMap<String, (Scope, usize)>,
}

impl Registry {
    fn insert(&mut self, id: (Scope, String), region: Region) {
        let owner = self
            .keys
            .entry(region.status.key.clone())
            .or_insert_with(|| (id.0.clone(), 0));
        owner.1 += 1;
        self.regions.insert(id, Arc::new(region));
    }

    fn remove(&mut self, id: &(Scope, String)) {
        if let Some(r) = self.regions.remove(id) {
            if let Some(owner) = self.keys.get_mut(&r.status.key) {
                owner.1 -= 1;
                if owner.1 == 0 {
                    self.keys.remove(&r.status.key);
                }
            }
        }
    }

    /// `scope`'s regions and the bytes they window.
    fn usage(&self, scope: &Scope) -> (usize, u64) {
        self.regions
            .iter()
            .filter(|((s, _), _)| s == scope)
            .fold((0, 0u64), |(n, bytes), (_, r)| {
                (n + 1, bytes.saturating_add(r.status.byte_size as u64))
            })
    }

    fn scopes(&self) -> usize {
        let mut scopes: Vec<&Scope> = self.regions.keys().map(|(s, _)| s).collect();
        scopes.dedup();
        scopes.len()
    }
}

/// The registered regions, by scope and name.
pub struct SharedMemory {
    regions: Mutex<Registry>,
    /// Clients may register regions at all (`--allow-client-shm`).
    allowed: bool,
    /// Registration needs a token (`--shm-require-token`).
    require_token: bool,
    /// What every key must start with after its `/`.
    key_prefix: String,
    /// The most bytes one scope's regions may window together.
    max_bytes: u64,
}

/// The shared memory a server lets each scope register by default (`--shm-max-bytes`): 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

impl Default for SharedMemory {
    /// Any shm object, and at most the default 1 GiB registered per scope.
    fn default() -> Self {
        SharedMemory::new("", DEFAULT_MAX_BYTES)
    }
}

/// Copies larger than this run on the blocking pool, not on an async worker.
pub const INLINE_COPY_BYTES: usize = 64 * 1024;

impl super::Service {
    /// Registers a shared memory region ([`SharedMemory::register`]) off the async workers:
    /// mapping it is a blocking system call.
    pub async fn register_shm(
        self: Arc<Self>,
        scope: Scope,
        name: String,
        key: String,
        offset: usize,
        byte_size: usize,
    ) -> Result<()> {
        tokio::task::spawn_blocking(move || {
            self.shm.register(&scope, &name, &key, offset, byte_size)
        })
        .await
        .map_err(|_| Error::internal("shared memory registration panicked"))?
    }
}

impl SharedMemory {
    /// No regions yet, client registrations allowed; keys must start with `/` then
    /// `key_prefix`, and one scope's regions may window at most `max_bytes` together.
    pub fn new(key_prefix: &str, max_bytes: u64) -> Self {
        SharedMemory {
            regions: Mutex::default(),
            allowed: true,
            key_prefix: key_prefix.to_string(),
            max_bytes,
            require_token: false,
        }
    }

    /// Whether clients may register regions at all (`--allow-client-shm`).
    pub fn allowing_clients(mut self, allowed: bool) -> Self {
        self.allowed = allowed;
        self
    }

    /// Refuse registrations without a token ([`TOKEN_HEADER`]).
    pub fn requiring_token(mut self, require: bool) -> Self {
        self.require_token = require;
        self
    }

    /// Opens the shm object `key`, checks that `byte_size` bytes at `offset` lie within it, and
    /// registers that window as `name` in `scope`.
    pub fn register(
        &self,
        scope: &Scope,
        name: &str,
        key: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<()> {
        if !self.allowed {
            return Err(Error::forbidden(
                "client shared memory is disabled on this server: start it with --allow-client-shm=true to let clients register regions",
            ));
        }
        if self.require_token && scope.is_shared() {
            return Err(Error::forbidden(format!(
                "shared memory registration needs a '{TOKEN_HEADER}' header on this server (--shm-require-token): regions belong to the token that registered them"
            )));
        }
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(Error::invalid(format!(
                "shared memory region name must have 1 to {MAX_NAME_BYTES} bytes"
            )));
        }
        check_key(key)?;
        if !key[1..].starts_with(&self.key_prefix) {
            return Err(Error::invalid(format!(
                "shared memory key '{}' does not start with '/{}', the prefix this server allows (--shm-key-prefix)",
                key.escape_debug(),
                self.key_prefix.escape_debug()
            )));
        }
        if byte_size == 0 {
            return Err(Error::invalid(format!(
                "shared memory region '{name}': byte_size must be positive"
            )));
        }
        self.admissible(
            &self.regions.lock().expect("shm lock"),
            scope,
            name,
            key,
            byte_size,
        )?;
        let map = Mapping::open(key, offset, byte_size)
            .map_err(|e| e.context(format!("shared memory region '{name}'")))?;
        let mut regions = self.regions.lock().expect("shm lock");
        // Checked again: another registration may have come in while the object was opened.
        self.admissible(&regions, scope, name, key, byte_size)?;
        regions.insert(
            (scope.clone(), name.to_string()),
            Region {
                status: RegionStatus {
                    name: name.to_string(),
                    key: key.to_string(),
                    offset,
                    byte_size,
                },
                map,
            },
        );
        tracing::info!(
            region = name,
            scoped = !scope.is_shared(),
            key,
            offset,
            byte_size,
            "shared memory registered"
        );
        Ok(())
    }

    /// Whether `scope` may register `byte_size` bytes of `key` as `name` now: the key is not
    /// another scope's (answered as a missing key is), the name is free, and the scope's
    /// quotas, the cap on scopes and the cap on all regions have room.
    fn admissible(
        &self,
        regions: &Registry,
        scope: &Scope,
        name: &str,
        key: &str,
        byte_size: usize,
    ) -> Result<()> {
        if regions
            .regions
            .contains_key(&(scope.clone(), name.to_string()))
        {
            return Err(Error::new(
                wisp_core::ErrorKind::AlreadyExists,
                format!("shared memory region '{name}' already in manager"),
            ));
        }
        let (count, bytes) = regions.usage(scope);
        if count == 0 && regions.scopes() >= MAX_SCOPES {
            return Err(Error::exhausted(format!(
                "{MAX_SCOPES} shared memory tokens have regions registered already"
            )));
        }
        if count >= MAX_REGIONS_PER_SCOPE {
            return Err(Error::exhausted(format!(
                "{MAX_REGIONS_PER_SCOPE} shared memory regions are registered under this token already"
            )));
        }
        if regions.regions.len() >= MAX_REGIONS {
            return Err(Error::exhausted(format!(
                "{MAX_REGIONS} shared memory regions are registered already"
            )));
        }
        if bytes.saturating_add(byte_size as u64) > self.max_bytes {
            return Err(Error::exhausted(format!(
                "shared memory region '{name}': {byte_size} more bytes would take this token's regions past {} bytes (--shm-max-bytes; {bytes} registered)",
                self.max_bytes
            )));
        }
        // Last, so that every answer before it is the same for a missing key.
        if regions
            .keys
            .get(key)
            .is_some_and(|(owner, _)| owner != scope)
        {
            return Err(mapping::missing(key).context(format!("shared memory region '{name}'")));
        }
        Ok(())
    }

    /// Unregisters `scope`'s region `name`, or every region of `scope` when `None`. Requests
    /// already using a region keep it open until they finish. Unknown names are not an error
    /// (as in Triton).
    pub fn unregister(&self, scope: &Scope, name: Option<&str>) {
        let mut regions = self.regions.lock().expect("shm lock");
        let ids: Vec<(Scope, String)> = match name {
            Some(n) => vec![(scope.clone(), n.to_string())],
            None => regions
                .regions
                .keys()
                .filter(|(s, _)| s == scope)
                .cloned()
                .collect(),
        };
        for id in &ids {
            regions.remove(id);
        }
    }

    /// The status of `scope`'s region `name` (NOT_FOUND when it is not registered), or of
    /// every region of `scope`.
    pub fn status(&self, scope: &Scope, name: Option<&str>) -> Result<Vec<RegionStatus>> {
        let regions = &self.regions.lock().expect("shm lock").regions;
        match name {
            Some(n) => regions
                .get(&(scope.clone(), n.to_string()))
                .map(|r| vec![r.status.clone()])
                .ok_or_else(|| unknown(n)),
            None => Ok(regions
                .iter()
                .filter(|((s, _), _)| s == scope)
                .map(|(_, r)| r.status.clone())
                .collect()),
        }
    }

    fn get(&self, scope: &Scope, name: &str) -> Result<Arc<Region>> {
        self.regions
            .lock()
            .expect("shm lock")
            .regions
            .get(&(scope.clone(), name.to_string()))
            .cloned()
            .ok_or_else(|| unknown(name))
    }

    /// The first `len` bytes of what `r` names (`len` at most `r.byte_size`), checked to lie
    /// within its region; the region stays open while the window is held, even if it is
    /// unregistered meanwhile.
    pub fn window(&self, scope: &Scope, r: &ShmRef, len: usize) -> Result<Window> {
        let region = self.get(scope, &r.region)?;
        if len > r.byte_size {
            return Err(Error::invalid(format!(
                "shared memory region '{}': the output has {len} bytes, more than the {} requested",
                r.region, r.byte_size
            )));
        }
        let range = window(&region.status, r.offset, len)?;
        Ok(Window { region, range })
    }

    /// A copy of the bytes `r` names in `scope`.
    pub fn read(&self, scope: &Scope, r: &ShmRef) -> Result<Bytes> {
        self.window(scope, r, r.byte_size)?.read()
    }

    /// Writes `data` where `r` names in `scope`; it must fit in `r.byte_size`.
    pub fn write(&self, scope: &Scope, r: &ShmRef, data: &[u8]) -> Result<()> {
        self.window(scope, r, data.len())?.write(data)
    }
}

/// A checked window of a registered region, for one copy in or out.
pub struct Window {
    region: Arc<Region>,
    range: std::ops::Range<usize>,
}

impl Window {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// A copy of its bytes (a blocking system call: large windows belong on the blocking pool).
    pub fn read(&self) -> Result<Bytes> {
        let bytes = self.region.map.read(self.range.clone()).map_err(|e| {
            e.context(format!(
                "shared memory region '{}'",
                self.region.status.name
            ))
        })?;
        Ok(Bytes::from(bytes))
    }

    /// Writes `data` (its length is the window's) at its start.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        debug_assert_eq!(data.len(), self.range.len());
        self.region.map.write(self.range.start, data).map_err(|e| {
            e.context(format!(
                "shared memory region '{}'",
                self.region.status.name
            ))
        })
    }
}

/// Reads Triton's `shared_memory_region`, `shared_memory_byte_size` and `shared_memory_offset`
/// from a tensor's parameters (`what` names the tensor in errors); `None` without a region.
pub fn shm_ref(
    params: &serde_json::Map<String, serde_json::Value>,
    what: impl std::fmt::Display,
) -> Result<Option<ShmRef>> {
    let Some(region) = params.get("shared_memory_region") else {
        return Ok(None);
    };
    let region = region.as_str().filter(|r| !r.is_empty()).ok_or_else(|| {
        Error::invalid(format!(
            "{what}: 'shared_memory_region' must be a non-empty string"
        ))
    })?;
    let number = |key: &str, required: bool| -> Result<usize> {
        match params.get(key) {
            None if !required => Ok(0),
            None => Err(Error::invalid(format!(
                "{what}: '{key}' is required with 'shared_memory_region'"
            ))),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    Error::invalid(format!("{what}: '{key}' must be a non-negative integer"))
                }),
        }
    };
    Ok(Some(ShmRef {
        region: region.to_string(),
        offset: number("shared_memory_offset", false)?,
        byte_size: number("shared_memory_byte_size", true)?,
    }))
}

fn unknown(name: &str) -> Error {
    Error::not_found(format!(
        "Unable to find system shared memory region: '{name}'"
    ))
}

/// `offset..offset + len` if it lies within the region.
fn window(s: &RegionStatus, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(len) {
        Some(end) if end <= s.byte_size => Ok(offset..end),
        _ => Err(Error::invalid(format!(
            "shared memory region '{}': offset {offset} + byte size {len} is past its {} bytes",
            s.name, s.byte_size
        ))),
    }
}

/// A shm key is an object name: `/` then 1 to 254 bytes with no `/` or NUL.
fn check_key(key: &str) -> Result<()> {
    let name = key.strip_prefix('/').unwrap_or("");
    if name.is_empty()
        || key.len() > MAX_NAME_BYTES
        || name.contains(['/', '\0'])
        || name == "."
        || name == ".."
    {
        return Err(Error::invalid(format!(
            "shared memory key '{}' is not a shm object name ('/name', no other '/')",
            key.escape_debug()
        )));
    }
    Ok(())
}

/// CUDA shared memory needs a GPU; Wisp runs models on the CPU.
pub fn cuda_unsupported() -> Error {
    Error::unsupported(
        "CUDA shared memory is not supported: Wisp runs models on the CPU (use system shared memory)",
    )
}

#[cfg(unix)]
mod mapping {
    use std::ffi::CString;
    use std::os::unix::fs::FileExt;

    use wisp_core::{Error, Result};

    /// A window of a shm object, reached through its descriptor: every copy is a `pread` or
    /// `pwrite`, never a load or store through a mapping. The client owns the object and may
    /// shrink it (`ftruncate`) at any time; touching a mapping past its new end would raise
    /// SIGBUS and kill the server, while a read past it is a short read, answered as an error.
    pub struct Mapping {
        file: std::fs::File,
        /// Where the window starts in the object.
        offset: u64,
        /// The window's size.
        len: usize,
    }

    /// What registering a key with no shm object behind it answers.
    pub fn missing(key: &str) -> Error {
        Error::not_found(format!(
            "Unable to open shared memory region '{key}': {}",
            std::io::Error::from_raw_os_error(libc::ENOENT)
        ))
    }

    fn os_error(what: &str) -> Error {
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::NotFound => Error::not_found(format!("{what}: {e}")),
            _ => Error::invalid(format!("{what}: {e}")),
        }
    }

    impl Mapping {
        /// Opens shm object `key` read-write and checks that `byte_size` bytes at `offset` lie
        /// within it now.
        #[expect(
            unsafe_code,
            reason = "shm_open is a C call; its descriptor becomes a File"
        )]
        pub fn open(key: &str, offset: usize, byte_size: usize) -> Result<Mapping> {
            let c_key = CString::new(key).map_err(|_| Error::invalid("key has a NUL byte"))?;
            // SAFETY: a valid C string. O_NOFOLLOW: a key is one name, never a link elsewhere.
            let fd = unsafe {
                libc::shm_open(
                    c_key.as_ptr(),
                    libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    0,
                )
            };
            if fd < 0 {
                return Err(os_error(&format!(
                    "Unable to open shared memory region '{key}'"
                )));
            }
            // SAFETY: `fd` is a fresh descriptor that nothing else owns; the File closes it.
            let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let meta = file
                .metadata()
                .map_err(|e| Error::invalid(format!("fstat of '{key}': {e}")))?;
            if !meta.is_file() {
                return Err(Error::invalid(format!(
                    "shared memory key '{key}' is not a shm object"
                )));
            }
            let size = meta.len();
            let end = (offset as u64).checked_add(byte_size as u64);
            if end.is_none_or(|end| end > size) {
                return Err(Error::invalid(format!(
                    "offset {offset} + byte_size {byte_size} is past the end of '{key}' ({size} bytes)"
                )));
            }
            Ok(Mapping {
                file,
                offset: offset as u64,
                len: byte_size,
            })
        }

        /// The object's size now.
        fn size(&self) -> Result<u64> {
            self.file
                .metadata()
                .map(|m| m.len())
                .map_err(|e| Error::internal(format!("fstat of a shared memory object: {e}")))
        }

        fn shrunk(&self, size: u64) -> Error {
            Error::invalid(format!(
                "the shared memory object shrank to {size} bytes, short of the {} registered at offset {}",
                self.len, self.offset
            ))
        }

        /// A copy of `range` of the window (checked by the caller to lie within it); an error
        /// if the object no longer holds it.
        pub fn read(&self, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
            assert!(range.end <= self.len, "range within the window");
            let mut out = vec![0u8; range.len()];
            let at = self.offset + range.start as u64;
            match self.file.read_exact_at(&mut out, at) {
                Ok(()) => Ok(out),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    Err(self.shrunk(self.size()?))
                }
                Err(e) => Err(Error::internal(format!(
                    "reading shared memory failed: {e}"
                ))),
            }
        }

        /// Copies `data` into the window at `at` (checked by the caller to fit); an error if the
        /// object no longer reaches that far (a write past its end would grow it again).
        pub fn write(&self, at: usize, data: &[u8]) -> Result<()> {
            assert!(at + data.len() <= self.len, "range within the window");
            let at = self.offset + at as u64;
            let size = self.size()?;
            if at + data.len() as u64 > size {
                return Err(self.shrunk(size));
            }
            self.file
                .write_all_at(data, at)
                .map_err(|e| Error::internal(format!("writing shared memory failed: {e}")))
        }
    }
}

#[cfg(not(unix))]
mod mapping {
    use wisp_core::{Error, Result};

    /// System shared memory needs POSIX shm.
    pub struct Mapping;

    pub fn missing(key: &str) -> Error {
        Error::not_found(format!("Unable to open shared memory region '{key}'"))
    }

    impl Mapping {
        pub fn open(_key: &str, _offset: usize, _byte_size: usize) -> Result<Mapping> {
            Err(Error::unsupported(
                "system shared memory needs a POSIX system",
            ))
        }
        pub fn read(&self, _range: std::ops::Range<usize>) -> Result<Vec<u8>> {
            Ok(Vec::new())
        }
        pub fn write(&self, _at: usize, _data: &[u8]) -> Result<()> {
            Ok(())
        }
    }
}

use mapping::Mapping;
