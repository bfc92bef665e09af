//! `wisp --version`: the version, the commit it was built from, and what this build can run
//! (its ONNX engines, whether ONNX Runtime is found here, its plugin compilers).

use wisp_core::env::EnvSource;
use wisp_plugin_runtime::WasmCompiler;

/// The report `wisp --version` prints, one fact per line.
pub fn report(env: &dyn EnvSource) -> String {
    let mut out = format!(
        "wisp {} (commit {}, {})\n",
        env!("CARGO_PKG_VERSION"),
        env!("WISP_COMMIT"),
        env!("WISP_TARGET")
    );
    out.push_str("onnx engines: tract (built in)");
    out.push_str(&onnxruntime(env));
    out.push('\n');
    let default = WasmCompiler::host_default().as_str();
    out.push_str(&format!(
        "plugins: wasmtime {}, component model; compilers: native (Cranelift){}; default {default}\n",
        env!("WISP_WASMTIME"),
        if WasmCompiler::PULLEY_BUILT {
            ", pulley (interpreter)"
        } else {
            ""
        },
    ));
    out.push_str(&format!(
        "model repositories: local directories{}\n",
        if cfg!(feature = "object-store") {
            ", s3:// gs:// as:// (object stores)"
        } else {
            ""
        }
    ));
    out
}

#[cfg(feature = "onnxruntime")]
fn onnxruntime(env: &dyn EnvSource) -> String {
    match wisp_backend_onnx::find_onnxruntime(None, env) {
        Some(lib) if lib.is_file() => format!(", onnxruntime (found: {})", lib.display()),
        Some(lib) => format!(
            ", onnxruntime (named but missing: {}; ONNX models run on tract)",
            lib.display()
        ),
        None => ", onnxruntime (not found: set ORT_DYLIB_PATH or `pip install onnxruntime`; \
                 ONNX models run on tract)"
            .to_string(),
    }
}

#[cfg(not(feature = "onnxruntime"))]
fn onnxruntime(_env: &dyn EnvSource) -> String {
    "; onnxruntime is not in this build (the edge build)".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Debug)]
    struct Env(HashMap<String, String>);
    impl EnvSource for Env {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).cloned()
        }
    }

    #[test]
    fn names_the_commit_and_what_runs() {
        let env = Env(HashMap::from([(
            "ORT_DYLIB_PATH".to_string(),
            "/nonexistent/libonnxruntime.so".to_string(),
        )]));
        let text = report(&env);
        let first = text.lines().next().unwrap();
        assert!(first.starts_with(&format!("wisp {} (commit ", env!("CARGO_PKG_VERSION"))));
        assert!(!env!("WISP_COMMIT").is_empty());
        assert!(text.contains("tract (built in)"), "{text}");
        assert!(text.contains("wasmtime 48."), "{text}");
        if cfg!(feature = "onnxruntime") {
            assert!(
                text.contains("named but missing: /nonexistent/libonnxruntime.so"),
                "{text}"
            );
        }
    }
}
