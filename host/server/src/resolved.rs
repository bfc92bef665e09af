//! Every setting that needs parsing beyond clap's, parsed once at start-up.

use super::*;

/// Every setting that needs parsing beyond clap's, parsed in one pass.
pub(crate) struct Resolved {
    pub(crate) metrics: Option<metrics::MetricsOptions>,
    pub(crate) cache_size: Option<usize>,
    pub(crate) host_policies: host_policy::HostPolicies,
    pub(crate) verify_key: Option<ed25519_dalek::VerifyingKey>,
    pub(crate) http_restricted: restricted::Restrictions,
    pub(crate) grpc_restricted: restricted::Restrictions,
    pub(crate) http_tls: Option<tokio_rustls::TlsAcceptor>,
    pub(crate) grpc_tls: Option<tokio_rustls::TlsAcceptor>,
    pub(crate) trace: service::trace::TraceConfig,
    pub(crate) wasm_compiler: WasmCompiler,
    pub(crate) rate_limiter: Option<Arc<wisp_scheduler::rate_limit::RateLimiter>>,
}

/// The value, or `None` with its error noted.
pub(super) fn take<T>(errors: &mut Vec<String>, r: Result<T, String>) -> Option<T> {
    r.map_err(|e| errors.push(e)).ok()
}

impl Resolved {
    /// Parses every setting, collecting every error rather than stopping at the first.
    pub(crate) fn from(s: &Settings) -> anyhow::Result<Self> {
        let mut errors: Vec<String> = Vec::new();
        let metrics = if s.allow_metrics {
            take(
                &mut errors,
                metrics::MetricsOptions::parse(&s.metrics_config),
            )
        } else {
            None
        };
        let cache_size = take(&mut errors, cache::parse_cache_config(&s.cache_config));
        let trace = take(
            &mut errors,
            service::trace::parse_trace_config(&s.trace_config),
        );
        let host_policies = take(
            &mut errors,
            host_policy::HostPolicies::parse(&s.host_policy),
        );
        let verify_key = match &s.model_verify_key {
            Some(path) => take(
                &mut errors,
                signing::read_public_key(path).map_err(|e| format!("--model-verify-key: {e}")),
            ),
            None if s.require_signed_models => {
                take(
                    &mut errors,
                    Err::<(), _>("--require-signed-models needs --model-verify-key".into()),
                );
                None
            }
            None => None,
        };
        let http_restricted = take(
            &mut errors,
            restricted::Restrictions::parse(&s.http_restricted_api, "--http-restricted-api", ""),
        );
        let grpc_restricted = take(
            &mut errors,
            restricted::Restrictions::parse(
                &s.grpc_restricted_protocol,
                "--grpc-restricted-protocol",
                restricted::GRPC_HEADER_PREFIX,
            ),
        );
        let http_tls = if s.http_use_ssl {
            take(
                &mut errors,
                tls::acceptor(&s.http_tls_files(), "--http", &[b"h2", b"http/1.1"]),
            )
        } else {
            None
        };
        let grpc_tls = if s.grpc_use_ssl {
            take(
                &mut errors,
                tls::acceptor(&s.grpc_tls_files(), "--grpc", &[b"h2"]),
            )
        } else {
            None
        };
        let wasm_compiler = take(&mut errors, wasm_compiler(s.wasm_compiler));
        let rate_limiter = take(&mut errors, rate_limiter(s)).flatten();
        if !errors.is_empty() {
            anyhow::bail!("invalid settings:\n  - {}", errors.join("\n  - "));
        }
        Ok(Resolved {
            metrics,
            cache_size: cache_size.flatten(),
            host_policies: host_policies.unwrap_or_default(),
            verify_key,
            http_restricted: http_restricted.unwrap_or_default(),
            grpc_restricted: grpc_restricted.unwrap_or_default(),
            http_tls,
            grpc_tls,
            trace: trace.unwrap_or_default(),
            rate_limiter,
            wasm_compiler: wasm_compiler.unwrap_or(WasmCompiler::Native),
        })
    }
}

/// The plugin compiler `--wasm-compiler` asks for, if this build has it.
pub(super) fn wasm_compiler(choice: settings::WasmCompilerChoice) -> Result<WasmCompiler, String> {
    use settings::WasmCompilerChoice as Choice;
    match choice {
        Choice::Auto => Ok(WasmCompiler::host_default()),
        Choice::Native => Ok(WasmCompiler::Native),
        Choice::Pulley if WasmCompiler::PULLEY_BUILT => Ok(WasmCompiler::Pulley),
        Choice::Pulley => Err(
            "--wasm-compiler pulley: this build has no Pulley interpreter (the edge build has it only on riscv64)".into(),
        ),
    }
}

/// `--rate-limit` and `--rate-limit-resource`: the server's resource pool, when it is on.
fn rate_limiter(
    s: &Settings,
) -> Result<Option<Arc<wisp_scheduler::rate_limit::RateLimiter>>, String> {
    use wisp_scheduler::rate_limit::{parse_resource_flag, RateLimiter};
    let mut fixed = std::collections::HashMap::new();
    for v in &s.rate_limit_resource {
        let (name, count) = parse_resource_flag(v).map_err(|e| e.message().to_string())?;
        fixed.insert(name, count);
    }
    match s.rate_limit.as_str() {
        "off" => Ok(None),
        "execution_count" => Ok(Some(RateLimiter::new(fixed))),
        other => Err(format!(
            "--rate-limit '{other}': expected 'off' or 'execution_count'"
        )),
    }
}
