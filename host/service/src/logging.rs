//! Logging settings and Triton's logging extension (`GET/POST /v2/logging`).
//!
//! `main` installs the `tracing` subscriber with a reloadable filter and registers a setter
//! here ([`install_filter_setter`]); the HTTP (and gRPC) handlers change verbosity at run time
//! through [`LogControl`]. Without a registered setter (embedding, tests) the settings are
//! still tracked and reported.

use std::sync::{Mutex, OnceLock};

use serde_json::{json, Map, Value};
use wisp_core::{Error, Result};

type FilterSetter = Box<dyn Fn(&str) + Send + Sync>;

static SETTER: OnceLock<FilterSetter> = OnceLock::new();

/// Registers the function that applies a new `tracing` filter (called once by `main`).
pub fn install_filter_setter(f: FilterSetter) {
    let _ = SETTER.set(f);
}

/// Triton's logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// `--log-file` ("" = standard error).
    pub log_file: String,
    /// Informational messages.
    pub log_info: bool,
    /// Warnings.
    pub log_warning: bool,
    /// Errors.
    pub log_error: bool,
    /// 0 = off, 1 = debug, 2+ = trace.
    pub log_verbose_level: u64,
    /// `default` or `ISO8601`.
    pub log_format: String,
}

impl Default for LogSettings {
    /// `wisp serve`'s defaults: standard error, info and above, Triton's line format.
    fn default() -> Self {
        LogSettings {
            log_file: String::new(),
            log_info: true,
            log_warning: true,
            log_error: true,
            log_verbose_level: 0,
            log_format: "default".into(),
        }
    }
}

impl LogSettings {
    /// The `tracing` filter directive for these settings.
    pub fn filter(&self) -> String {
        let level = match (
            self.log_verbose_level,
            self.log_info,
            self.log_warning,
            self.log_error,
        ) {
            (v, _, _, _) if v >= 2 => "trace",
            (1, _, _, _) => "debug",
            (_, true, _, _) => "info",
            (_, _, true, _) => "warn",
            (_, _, _, true) => "error",
            _ => "off",
        };
        let crates = [
            "wisp",
            "wisp_server",
            "wisp_core",
            "wisp_scheduler",
            "wisp_backend_onnx",
            "wisp_plugin_runtime",
            "wisp_models",
            "wisp_service",
            "wisp_remote",
            "wisp_python",
        ];
        let mut f = String::from("warn");
        for c in crates {
            f.push_str(&format!(",{c}={level}"));
        }
        f
    }

    /// The extension's JSON form.
    pub fn to_json(&self) -> Value {
        json!({
            "log_file": self.log_file,
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
            "log_verbose_level": self.log_verbose_level,
            "log_format": self.log_format,
        })
    }
}

/// The server's current logging settings.
pub struct LogControl {
    settings: Mutex<LogSettings>,
}

impl LogControl {
    /// Starts from the command-line settings.
    pub fn new(settings: LogSettings) -> Self {
        LogControl {
            settings: Mutex::new(settings),
        }
    }

    /// Current settings.
    pub fn get(&self) -> LogSettings {
        self.settings.lock().expect("log settings").clone()
    }

    /// Applies a partial update (the fields present in `body`), all or nothing.
    pub fn update(&self, body: &Map<String, Value>) -> Result<LogSettings> {
        let mut next = self.get();
        for (k, v) in body {
            let bad = |want: &str| {
                Error::invalid(format!("logging setting '{k}' must be {want}, got {v}"))
            };
            match k.as_str() {
                "log_info" => next.log_info = v.as_bool().ok_or_else(|| bad("a boolean"))?,
                "log_warning" => next.log_warning = v.as_bool().ok_or_else(|| bad("a boolean"))?,
                "log_error" => next.log_error = v.as_bool().ok_or_else(|| bad("a boolean"))?,
                "log_verbose_level" => {
                    next.log_verbose_level =
                        v.as_u64().ok_or_else(|| bad("a non-negative integer"))?
                }
                "log_format" => match v.as_str() {
                    Some(f @ ("default" | "ISO8601")) => next.log_format = f.to_string(),
                    _ => return Err(bad("\"default\" or \"ISO8601\"")),
                },
                "log_file" => {
                    let f = v.as_str().ok_or_else(|| bad("a string"))?;
                    if f != next.log_file {
                        return Err(Error::unsupported(
                            "log file location can not be updated through network protocol (restart with --log-file)",
                        ));
                    }
                }
                other => return Err(Error::invalid(format!("unknown logging setting '{other}'"))),
            }
        }
        if let Some(set) = SETTER.get() {
            set(&next.filter());
        }
        *self.settings.lock().expect("log settings") = next.clone();
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> LogSettings {
        LogSettings::default()
    }

    #[test]
    fn updates_are_validated_and_all_or_nothing() {
        let c = LogControl::new(base());
        let s = c
            .update(json!({"log_verbose_level": 1}).as_object().unwrap())
            .unwrap();
        assert_eq!(s.log_verbose_level, 1);
        assert!(s.filter().contains("wisp_server=debug"));
        let e = c
            .update(
                json!({"log_info": false, "log_verbose_level": "loud"})
                    .as_object()
                    .unwrap(),
            )
            .unwrap_err();
        assert!(e.message().contains("log_verbose_level"));
        assert!(c.get().log_info, "a rejected update changes nothing");
        assert!(c.update(json!({"bogus": 1}).as_object().unwrap()).is_err());
        let s = c
            .update(
                json!({"log_verbose_level": 0, "log_info": false})
                    .as_object()
                    .unwrap(),
            )
            .unwrap();
        assert!(s.filter().contains("wisp_server=warn"));
    }
}
