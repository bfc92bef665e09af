//! Restricted APIs, as Triton does them: `--http-restricted-api` and
//! `--grpc-restricted-protocol`, each `<group>[,<group>...]:<header>=<value>`, gate whole API
//! groups behind a header a client must send with the exact value.
//!
//! The groups are Triton's (`src/restricted_features.h`): `health`, `metadata`, `inference`,
//! `shared-memory`, `model-config`, `model-repository`, `statistics`, `trace`, `logging`. A
//! refused HTTP request gets 403 and `This API is restricted, expecting header '<header>'`; a
//! refused gRPC call gets UNAVAILABLE and `This protocol is restricted, expecting header
//! '<header>'`, where the gRPC header carries Triton's `triton-grpc-protocol-` prefix. An HTTP
//! route's group is a column of the route table ([`crate::http::route::TABLE`]); a gRPC method's
//! is [`ApiGroup::of_grpc`].

use std::fmt;

/// The prefix Triton puts before a restricted gRPC header's name.
pub const GRPC_HEADER_PREFIX: &str = "triton-grpc-protocol-";

/// An API group that can be restricted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiGroup {
    /// Liveness and readiness of the server and of models.
    Health,
    /// Server and model metadata.
    Metadata,
    /// Inference.
    Inference,
    /// Shared-memory registration.
    SharedMemory,
    /// Model configuration.
    ModelConfig,
    /// Repository index, load and unload.
    ModelRepository,
    /// Statistics.
    Statistics,
    /// Trace settings.
    Trace,
    /// Log settings.
    Logging,
}

impl ApiGroup {
    /// Every group, in Triton's order.
    pub const ALL: [ApiGroup; 9] = [
        ApiGroup::Health,
        ApiGroup::Metadata,
        ApiGroup::Inference,
        ApiGroup::SharedMemory,
        ApiGroup::ModelConfig,
        ApiGroup::ModelRepository,
        ApiGroup::Statistics,
        ApiGroup::Trace,
        ApiGroup::Logging,
    ];

    /// Triton's name for the group.
    pub fn name(self) -> &'static str {
        match self {
            ApiGroup::Health => "health",
            ApiGroup::Metadata => "metadata",
            ApiGroup::Inference => "inference",
            ApiGroup::SharedMemory => "shared-memory",
            ApiGroup::ModelConfig => "model-config",
            ApiGroup::ModelRepository => "model-repository",
            ApiGroup::Statistics => "statistics",
            ApiGroup::Trace => "trace",
            ApiGroup::Logging => "logging",
        }
    }

    fn parse(s: &str) -> Option<ApiGroup> {
        ApiGroup::ALL.into_iter().find(|g| g.name() == s)
    }

    /// The group of a gRPC method path (`/inference.GRPCInferenceService/ModelInfer`).
    pub fn of_grpc(path: &str) -> Option<ApiGroup> {
        let (service, method) = path.trim_start_matches('/').split_once('/')?;
        if service == "grpc.health.v1.Health" {
            return Some(ApiGroup::Health);
        }
        if service != "inference.GRPCInferenceService" {
            return None;
        }
        Some(match method {
            "ServerLive" | "ServerReady" | "ModelReady" => ApiGroup::Health,
            "ServerMetadata" | "ModelMetadata" => ApiGroup::Metadata,
            "ModelInfer" | "ModelStreamInfer" => ApiGroup::Inference,
            "ModelConfig" => ApiGroup::ModelConfig,
            "ModelStatistics" => ApiGroup::Statistics,
            "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => {
                ApiGroup::ModelRepository
            }
            "TraceSetting" => ApiGroup::Trace,
            "LogSettings" => ApiGroup::Logging,
            m if m.starts_with("SystemSharedMemory") || m.starts_with("CudaSharedMemory") => {
                ApiGroup::SharedMemory
            }
            _ => return None,
        })
    }
}

impl fmt::Display for ApiGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The header (lower-case name) and value a group requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// Header name, lower case, with any protocol prefix.
    pub header: String,
    /// The exact value.
    pub value: String,
}

/// Which groups need which header, for one protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restrictions {
    rules: Vec<(ApiGroup, Requirement)>,
}

impl Restrictions {
    /// Parses the flag values; `flag` names the flag in errors and `prefix` is put before each
    /// header name (empty for HTTP, [`GRPC_HEADER_PREFIX`] for gRPC).
    pub fn parse(specs: &[String], flag: &str, prefix: &str) -> Result<Self, String> {
        let mut rules: Vec<(ApiGroup, Requirement)> = Vec::new();
        for spec in specs {
            let bad = |why: &str| {
                format!("{flag} '{spec}': {why} (expected <group>[,<group>...]:<header>=<value>)")
            };
            let (groups, kv) = spec.split_once(':').ok_or_else(|| bad("missing ':'"))?;
            let (header, value) = kv.split_once('=').ok_or_else(|| bad("missing '='"))?;
            let header = header.trim().to_ascii_lowercase();
            if header.is_empty()
                || !header
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(bad("the header name must be a non-empty token"));
            }
            if value.is_empty() {
                return Err(bad("the header value must not be empty"));
            }
            for g in groups.split(',').map(str::trim) {
                let group = ApiGroup::parse(g).ok_or_else(|| {
                    let names: Vec<&str> = ApiGroup::ALL.iter().map(|g| g.name()).collect();
                    bad(&format!(
                        "unknown group '{g}', groups are {}",
                        names.join(", ")
                    ))
                })?;
                if rules.iter().any(|(have, _)| *have == group) {
                    return Err(bad(&format!("group '{g}' is restricted more than once")));
                }
                rules.push((
                    group,
                    Requirement {
                        header: format!("{prefix}{header}"),
                        value: value.to_string(),
                    },
                ));
            }
        }
        Ok(Restrictions { rules })
    }

    /// Whether `group` is behind a header.
    pub fn restricts(&self, group: ApiGroup) -> bool {
        self.rules.iter().any(|(g, _)| *g == group)
    }

    /// Whether nothing is restricted.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// `Err(header)` when `group` is restricted and `header_value(header)` is not the required
    /// value.
    pub fn check<'a>(
        &'a self,
        group: ApiGroup,
        header_value: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> Result<(), &'a str> {
        let Some((_, req)) = self.rules.iter().find(|(g, _)| *g == group) else {
            return Ok(());
        };
        // Constant-time comparison: the value is a shared secret.
        let ok = header_value(&req.header).is_some_and(|got| {
            got.len() == req.value.len()
                && got
                    .iter()
                    .zip(req.value.as_bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        });
        if ok {
            Ok(())
        } else {
            Err(&req.header)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_triton_syntax_and_checks_headers() {
        let r = Restrictions::parse(
            &specs(&[
                "model-repository,logging:Admin-Key=s3cret",
                "inference:infer-key=i",
            ]),
            "--http-restricted-api",
            "",
        )
        .unwrap();
        let none = |_: &str| None;
        assert_eq!(r.check(ApiGroup::Health, none), Ok(()));
        assert_eq!(r.check(ApiGroup::Logging, none), Err("admin-key"));
        let good = |h: &str| (h == "admin-key").then_some(&b"s3cret"[..]);
        assert_eq!(r.check(ApiGroup::ModelRepository, good), Ok(()));
        let wrong = |h: &str| (h == "admin-key").then_some(&b"s3cre"[..]);
        assert_eq!(r.check(ApiGroup::ModelRepository, wrong), Err("admin-key"));
        assert_eq!(r.check(ApiGroup::Inference, good), Err("infer-key"));

        let g = Restrictions::parse(
            &specs(&["health:k=v"]),
            "--grpc-restricted-protocol",
            GRPC_HEADER_PREFIX,
        )
        .unwrap();
        assert_eq!(
            g.check(ApiGroup::Health, none),
            Err("triton-grpc-protocol-k")
        );
    }

    #[test]
    fn bad_specs_name_the_problem() {
        for (spec, needle) in [
            ("inference", "missing ':'"),
            ("inference:key", "missing '='"),
            ("inference:=v", "header name"),
            ("inference:k=", "value"),
            ("nope:k=v", "unknown group 'nope'"),
            ("health,health:k=v", "more than once"),
        ] {
            let e = Restrictions::parse(&specs(&[spec]), "--http-restricted-api", "").unwrap_err();
            assert!(
                e.contains(needle) && e.contains("--http-restricted-api"),
                "{spec}: {e}"
            );
        }
    }

    #[test]
    fn grpc_methods_map_to_triton_groups() {
        use ApiGroup::*;
        assert_eq!(
            ApiGroup::of_grpc("/inference.GRPCInferenceService/ModelInfer"),
            Some(Inference)
        );
        assert_eq!(
            ApiGroup::of_grpc("/inference.GRPCInferenceService/RepositoryModelLoad"),
            Some(ModelRepository)
        );
        assert_eq!(
            ApiGroup::of_grpc("/grpc.health.v1.Health/Check"),
            Some(Health)
        );
        assert_eq!(ApiGroup::of_grpc("/other.Service/X"), None);
    }
}
