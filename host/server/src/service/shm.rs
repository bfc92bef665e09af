//! Triton's system shared memory extension: a client creates a POSIX shared-memory object
//! (`shm_open`), registers a window of it under a name, and then names that region instead of
//! sending tensor bytes: inputs are read from it, outputs written into it.
//!
//! A region is mapped once, at registration, and shared by `Arc`: unregistering removes the
//! name at once, and the mapping lives until the last request using it finishes. Every offset
//! and size is checked against the window with checked arithmetic before anything is copied.
//! Keys are shm object names (`/name`, no other `/`), so a region can only ever be an object
//! of the shared-memory file system, never an ordinary file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wisp_core::{Error, Result};

/// Regions registered at once, at most.
pub const MAX_REGIONS: usize = 1024;
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

/// The registered regions.
#[derive(Default)]
pub struct SharedMemory {
    regions: Mutex<BTreeMap<String, Arc<Region>>>,
}

impl super::Service {
    /// Registers a shared memory region ([`SharedMemory::register`]) off the async workers:
    /// mapping it is a blocking system call.
    pub async fn register_shm(
        self: Arc<Self>,
        name: String,
        key: String,
        offset: usize,
        byte_size: usize,
    ) -> Result<()> {
        tokio::task::spawn_blocking(move || self.shm.register(&name, &key, offset, byte_size))
            .await
            .map_err(|_| Error::internal("shared memory registration panicked"))?
    }
}

impl SharedMemory {
    /// Maps `byte_size` bytes at `offset` of the shm object `key` and registers them as `name`.
    pub fn register(&self, name: &str, key: &str, offset: usize, byte_size: usize) -> Result<()> {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(Error::invalid(format!(
                "shared memory region name must have 1 to {MAX_NAME_BYTES} bytes"
            )));
        }
        check_key(key)?;
        if byte_size == 0 {
            return Err(Error::invalid(format!(
                "shared memory region '{name}': byte_size must be positive"
            )));
        }
        {
            let regions = self.regions.lock().expect("shm lock");
            if regions.contains_key(name) {
                return Err(Error::new(
                    wisp_core::ErrorKind::AlreadyExists,
                    format!("shared memory region '{name}' already in manager"),
                ));
            }
            if regions.len() >= MAX_REGIONS {
                return Err(Error::exhausted(format!(
                    "{MAX_REGIONS} shared memory regions are registered already"
                )));
            }
        }
        let map = Mapping::open(key, offset, byte_size)
            .map_err(|e| e.context(format!("shared memory region '{name}'")))?;
        let mut regions = self.regions.lock().expect("shm lock");
        if regions.contains_key(name) {
            return Err(Error::new(
                wisp_core::ErrorKind::AlreadyExists,
                format!("shared memory region '{name}' already in manager"),
            ));
        }
        regions.insert(
            name.to_string(),
            Arc::new(Region {
                status: RegionStatus {
                    name: name.to_string(),
                    key: key.to_string(),
                    offset,
                    byte_size,
                },
                map,
            }),
        );
        tracing::info!(
            region = name,
            key,
            offset,
            byte_size,
            "shared memory registered"
        );
        Ok(())
    }

    /// Unregisters `name`, or every region when `None`. Requests already using a region keep
    /// its mapping until they finish. Unknown names are not an error (as in Triton).
    pub fn unregister(&self, name: Option<&str>) {
        let mut regions = self.regions.lock().expect("shm lock");
        match name {
            Some(n) => {
                regions.remove(n);
            }
            None => regions.clear(),
        }
    }

    /// The status of `name` (NOT_FOUND when it is not registered), or of every region.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>> {
        let regions = self.regions.lock().expect("shm lock");
        match name {
            Some(n) => regions
                .get(n)
                .map(|r| vec![r.status.clone()])
                .ok_or_else(|| unknown(n)),
            None => Ok(regions.values().map(|r| r.status.clone()).collect()),
        }
    }

    fn get(&self, name: &str) -> Result<Arc<Region>> {
        self.regions
            .lock()
            .expect("shm lock")
            .get(name)
            .cloned()
            .ok_or_else(|| unknown(name))
    }

    /// Whether `r` names a registered region and lies within it (before anything is read).
    pub fn check(&self, r: &ShmRef) -> Result<()> {
        let region = self.get(&r.region)?;
        window(&region.status, r.offset, r.byte_size).map(|_| ())
    }

    /// A copy of the bytes `r` names.
    pub fn read(&self, r: &ShmRef) -> Result<Bytes> {
        let region = self.get(&r.region)?;
        let range = window(&region.status, r.offset, r.byte_size)?;
        Ok(Bytes::from(region.map.read(range)))
    }

    /// Writes `data` where `r` names; it must fit in `r.byte_size`.
    pub fn write(&self, r: &ShmRef, data: &[u8]) -> Result<()> {
        let region = self.get(&r.region)?;
        if data.len() > r.byte_size {
            return Err(Error::invalid(format!(
                "shared memory region '{}': the output has {} bytes, more than the {} requested",
                r.region,
                data.len(),
                r.byte_size
            )));
        }
        let range = window(&region.status, r.offset, data.len())?;
        region.map.write(range.start, data);
        Ok(())
    }
}

/// Reads Triton's `shared_memory_region`, `shared_memory_byte_size` and `shared_memory_offset`
/// from a tensor's parameters (`what` names the tensor in errors); `None` without a region.
pub fn shm_ref(
    params: &serde_json::Map<String, serde_json::Value>,
    what: &str,
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

#[cfg(unix)]
mod mapping {
    use std::ffi::CString;

    use wisp_core::{Error, Result};

    /// A shared, writable mapping of part of a shm object.
    pub struct Mapping {
        base: *mut u8,
        /// Bytes mapped (from the page boundary at or before the window's start).
        len: usize,
        /// Where the window starts within the mapping.
        skip: usize,
    }

    // SAFETY: the mapping is plain shared memory owned by this value until drop; it is only
    // touched through byte copies, from any thread.
    #[expect(
        unsafe_code,
        reason = "a raw mapping is shared between request threads"
    )]
    unsafe impl Send for Mapping {}
    #[expect(
        unsafe_code,
        reason = "a raw mapping is shared between request threads"
    )]
    unsafe impl Sync for Mapping {}

    fn os_error(what: &str) -> Error {
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::NotFound => Error::not_found(format!("{what}: {e}")),
            _ => Error::invalid(format!("{what}: {e}")),
        }
    }

    impl Mapping {
        /// Maps `byte_size` bytes at `offset` of shm object `key`, read-write and shared.
        #[expect(unsafe_code, reason = "shm_open, fstat, mmap and close are C calls")]
        pub fn open(key: &str, offset: usize, byte_size: usize) -> Result<Mapping> {
            let c_key = CString::new(key).map_err(|_| Error::invalid("key has a NUL byte"))?;
            // SAFETY: a valid C string; the returned descriptor is closed below.
            let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0) };
            if fd < 0 {
                return Err(os_error(&format!(
                    "Unable to open shared memory region '{key}'"
                )));
            }
            let result = (|| {
                // SAFETY: fstat fills the zeroed struct for a descriptor we own.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                if unsafe { libc::fstat(fd, &mut st) } != 0 {
                    return Err(os_error("fstat"));
                }
                let size = usize::try_from(st.st_size).unwrap_or(0);
                if offset.checked_add(byte_size).is_none_or(|end| end > size) {
                    return Err(Error::invalid(format!(
                        "offset {offset} + byte_size {byte_size} is past the end of '{key}' ({size} bytes)"
                    )));
                }
                // SAFETY: sysconf has no preconditions.
                let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                    .unwrap_or(4096)
                    .max(1);
                let start = offset - offset % page;
                let skip = offset - start;
                let len = skip + byte_size;
                let file_offset = libc::off_t::try_from(start)
                    .map_err(|_| Error::invalid("offset is too large"))?;
                // SAFETY: a fresh mapping of a range checked to lie within the object.
                let base = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        fd,
                        file_offset,
                    )
                };
                if base == libc::MAP_FAILED {
                    return Err(os_error("mmap"));
                }
                Ok(Mapping {
                    base: base.cast(),
                    len,
                    skip,
                })
            })();
            // SAFETY: closing our own descriptor; the mapping stays valid without it.
            unsafe { libc::close(fd) };
            result
        }

        /// A copy of `range` of the window (checked by the caller to lie within it).
        #[expect(unsafe_code, reason = "copying out of the mapping")]
        pub fn read(&self, range: std::ops::Range<usize>) -> Vec<u8> {
            assert!(
                self.skip + range.end <= self.len,
                "range within the mapping"
            );
            let mut out = vec![0u8; range.len()];
            // SAFETY: the range lies within the live mapping (asserted), and `out` is a separate
            // allocation of the same length. Another process may write the shared bytes at the
            // same time; a byte copy then reads some mix, which is the client's own doing.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.add(self.skip + range.start),
                    out.as_mut_ptr(),
                    range.len(),
                );
            }
            out
        }

        /// Copies `data` into the window at `at` (checked by the caller to fit).
        #[expect(unsafe_code, reason = "copying into the mapping")]
        pub fn write(&self, at: usize, data: &[u8]) {
            assert!(
                self.skip + at + data.len() <= self.len,
                "range within the mapping"
            );
            // SAFETY: the destination lies within the live, writable mapping (asserted).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.base.add(self.skip + at),
                    data.len(),
                );
            }
        }
    }

    impl Drop for Mapping {
        #[expect(unsafe_code, reason = "munmap of our own mapping")]
        fn drop(&mut self) {
            // SAFETY: unmapping exactly what open mapped; nothing refers to it any more.
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
    }
}

#[cfg(not(unix))]
mod mapping {
    use wisp_core::{Error, Result};

    /// System shared memory needs POSIX shm.
    pub struct Mapping;

    impl Mapping {
        pub fn open(_key: &str, _offset: usize, _byte_size: usize) -> Result<Mapping> {
            Err(Error::unsupported(
                "system shared memory needs a POSIX system",
            ))
        }
        pub fn read(&self, _range: std::ops::Range<usize>) -> Vec<u8> {
            Vec::new()
        }
        pub fn write(&self, _at: usize, _data: &[u8]) {}
    }
}

use mapping::Mapping;

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A shm object of `size` bytes for one test, removed on drop.
    struct Object(String);

    impl Object {
        #[expect(unsafe_code, reason = "creating a test shm object")]
        fn new(tag: &str, size: usize) -> Object {
            let key = format!("/wisp-test-{tag}-{}", std::process::id());
            let c = std::ffi::CString::new(key.clone()).unwrap();
            // SAFETY: C calls on a fresh object we own.
            unsafe {
                let fd = libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600);
                assert!(fd >= 0);
                assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
                libc::close(fd);
            }
            Object(key)
        }
    }

    impl Drop for Object {
        #[expect(unsafe_code, reason = "removing a test shm object")]
        fn drop(&mut self) {
            let c = std::ffi::CString::new(self.0.clone()).unwrap();
            // SAFETY: unlinking the object this test created.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }

    fn at(region: &str, offset: usize, byte_size: usize) -> ShmRef {
        ShmRef {
            region: region.into(),
            offset,
            byte_size,
        }
    }

    #[test]
    fn a_region_round_trips_and_is_bounded() {
        let obj = Object::new("rt", 10_000);
        let shm = SharedMemory::default();
        // a window that starts off a page boundary
        shm.register("r", &obj.0, 5000, 4000).unwrap();
        shm.write(&at("r", 10, 8), b"abcdefgh").unwrap();
        assert_eq!(&shm.read(&at("r", 12, 4)).unwrap()[..], b"cdef");
        // a second window over the same bytes sees the write
        shm.register("r2", &obj.0, 5010, 8).unwrap();
        assert_eq!(&shm.read(&at("r2", 0, 8)).unwrap()[..], b"abcdefgh");
        assert!(shm.read(&at("r", 3990, 11)).is_err(), "past the window");
        assert!(shm.read(&at("r", usize::MAX, 2)).is_err(), "overflow");
        assert!(
            shm.write(&at("r", 0, 2), b"abc").is_err(),
            "more than asked"
        );
        let e = shm.register("r", &obj.0, 0, 1).unwrap_err();
        assert!(e.message().contains("already in manager"), "{e}");
        assert!(
            shm.register("big", &obj.0, 9000, 1001).is_err(),
            "past the object"
        );
        assert_eq!(shm.status(None).unwrap().len(), 2);
        shm.unregister(Some("r"));
        assert!(shm.read(&at("r", 0, 1)).is_err());
        assert_eq!(
            shm.status(Some("r")).unwrap_err().kind(),
            wisp_core::ErrorKind::NotFound
        );
        shm.unregister(None);
        assert!(shm.status(None).unwrap().is_empty());
    }

    #[test]
    fn a_region_unregistered_while_in_use_stays_mapped_for_its_user() {
        let obj = Object::new("use", 4096);
        let shm = SharedMemory::default();
        shm.register("r", &obj.0, 0, 4096).unwrap();
        let held = shm.get("r").unwrap();
        shm.unregister(Some("r"));
        held.map.write(0, b"still here");
        assert_eq!(&held.map.read(0..10)[..], b"still here");
    }

    #[test]
    fn keys_must_name_shm_objects() {
        let shm = SharedMemory::default();
        for key in ["", "/", "noslash", "/a/b", "/..", "/etc/passwd"] {
            assert!(shm.register("r", key, 0, 1).is_err(), "{key}");
        }
        let e = shm.register("r", "/wisp-no-such-object", 0, 1).unwrap_err();
        assert!(
            e.message().contains("Unable to open shared memory region"),
            "{e}"
        );
    }
}
