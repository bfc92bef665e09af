//! `/proc/meminfo`, read once and asked for fields: the metrics exporter's memory gauges and
//! the plugin runtime's pool sizing both read it.

/// A snapshot of `/proc/meminfo`.
pub struct MemInfo(String);

impl MemInfo {
    /// The current snapshot, `None` off Linux.
    pub fn read() -> Option<MemInfo> {
        std::fs::read_to_string("/proc/meminfo").ok().map(MemInfo)
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
}
