//! Starting servers for tests.

use std::path::Path;

use wisp_server::settings::{OnnxEngine, Settings};
use wisp_server::Server;

/// The engines every numeric test runs on.
pub const ENGINES: [OnnxEngine; 2] = [OnnxEngine::Tract, OnnxEngine::Onnxruntime];

/// Starts a server for `repo` on 127.0.0.1:0 with `engine`.
pub async fn start(repo: &Path, engine: OnnxEngine) -> Server {
    start_with(repo, engine, |_| {}).await
}

/// Starts a server after letting `tweak` change the settings.
pub async fn start_with(
    repo: &Path,
    engine: OnnxEngine,
    tweak: impl FnOnce(&mut Settings),
) -> Server {
    let mut s = Settings::for_repository(repo);
    s.http_address = "127.0.0.1".parse().unwrap();
    s.http_port = 0;
    s.metrics_port = 0;
    s.grpc_port = 0;
    s.onnx_engine = engine;
    tweak(&mut s);
    if engine == OnnxEngine::Onnxruntime && std::env::var_os("ORT_DYLIB_PATH").is_none() {
        panic!("ORT_DYLIB_PATH is not set: run the tests with `./dev test`, which installs ONNX Runtime");
    }
    Server::start(s).await.expect("server starts")
}
