//! Where Wisp reads its environment variables from: one injectable source for every crate, so
//! that tests and embedders pass a map instead of changing the process environment.

use std::collections::HashMap;

/// A source of environment variables.
pub trait EnvSource: Send + Sync + std::fmt::Debug {
    /// The variable's value, if set (and valid Unicode).
    fn var(&self, key: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

/// A fixed set of variables (tests, embedders).
impl EnvSource for HashMap<String, String> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_an_environment() {
        let env = HashMap::from([("A".to_string(), "1".to_string())]);
        assert_eq!(env.var("A").as_deref(), Some("1"));
        assert_eq!(env.var("B"), None);
    }
}
