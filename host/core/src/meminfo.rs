//! `/proc/meminfo`, read once and asked for fields, and the memory this process may use: the
//! metrics exporter's memory gauges, the in-flight budget and the plugin pool's sizing read
//! them.

use std::path::Path;

use crate::repository::read_regular_text;

/// The most of a `/proc` or cgroup file read (`/proc/meminfo` is about 1.5 KB).
const MAX_READ: u64 = 64 << 10;

/// A snapshot of `/proc/meminfo`.
pub struct MemInfo(String);

impl MemInfo {
    /// The current snapshot, `None` off Linux.
    pub fn read() -> Option<MemInfo> {
        read_regular_text(Path::new("/proc/meminfo"), MAX_READ)
            .ok()
            .map(MemInfo)
    }

    /// Field `name` (such as `MemTotal`) in bytes.
    pub fn bytes(&self, name: &str) -> Option<u64> {
        self.0.lines().find_map(|l| {
            let value = l.strip_prefix(name)?.strip_prefix(':')?;
            let kb: u64 = value.split_whitespace().next()?.parse().ok()?;
            kb.checked_mul(1024)
        })
    }
}

/// The memory this process may use: the host's `MemTotal`, or the cgroup's `memory.max` when
/// that is less (so that on a 1 GiB board, or in a 1 GiB container, it is 1 GiB). `None` off
/// Linux.
pub fn memory_limit() -> Option<u64> {
    let total = MemInfo::read()?.bytes("MemTotal")?;
    Some(cgroup_memory_max().map_or(total, |limit| limit.min(total)))
}

/// The cgroup's `memory.max` (cgroup v2), when it is a number (not `max`).
pub fn cgroup_memory_max() -> Option<u64> {
    read_regular_text(Path::new("/sys/fs/cgroup/memory.max"), MAX_READ)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_in_bytes() {
        let m = MemInfo(
            "MemTotal:       24576000 kB\nMemFree: 1 kB\nMemAvailable:    2048 kB\n".into(),
        );
        assert_eq!(m.bytes("MemTotal"), Some(24576000 * 1024));
        assert_eq!(m.bytes("MemAvailable"), Some(2048 * 1024));
        assert_eq!(m.bytes("Mem"), None);
        assert_eq!(m.bytes("SwapTotal"), None);
    }

    #[test]
    fn the_limit_is_at_most_the_host_memory() {
        let host = MemInfo::read().and_then(|m| m.bytes("MemTotal")).unwrap();
        let limit = memory_limit().unwrap();
        assert!(limit > 0 && limit <= host, "{limit} of {host}");
        if cgroup_memory_max().is_none() {
            assert_eq!(limit, host);
        }
    }
}
