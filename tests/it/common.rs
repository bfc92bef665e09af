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

/// Resident memory of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Peak resident memory of process `pid` so far (`VmHWM`), in bytes.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the server process when the test ends, however it ends.
pub struct Child(pub std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client of the server at `addr` once it accepts connections (a separate process starting
/// up); panics after 30 s.
pub async fn connect_when_up(addr: std::net::SocketAddr) -> wisp_tests::Client {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(c) = wisp_tests::Client::connect(addr).await {
            return c;
        }
        assert!(std::time::Instant::now() < deadline, "server did not start");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The `wisp` program in a process of its own (so that its memory is its own).
pub struct Spawned {
    /// Killed when the test ends.
    pub child: Child,
    /// Its HTTP address.
    pub http: std::net::SocketAddr,
    /// Its gRPC address.
    pub grpc: std::net::SocketAddr,
}

impl Spawned {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// Starts `wisp serve` on `repo` with the tract engine, every port a free loopback one, info
/// logs off, and `extra` arguments; with `fd_limit`, under that open-file limit. It may still
/// be starting when this returns: see [`connect_when_up`].
pub fn spawn_wisp(repo: &Path, extra: &[&str], fd_limit: Option<u32>) -> Spawned {
    let bin = env!("CARGO_BIN_EXE_wisp-test-serve");
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let mut cmd = match fd_limit {
        None => std::process::Command::new(bin),
        Some(n) => {
            let mut sh = std::process::Command::new("sh");
            sh.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(bin);
            sh
        }
    };
    cmd.args(["serve", "--model-repository"])
        .arg(repo)
        .args(["--http-address", "127.0.0.1", "--onnx-engine", "tract"])
        .args(["--http-port", &http.to_string()])
        .args(["--grpc-port", &grpc.to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .args(["--log-info", "false"])
        .args(extra);
    let child = Child(cmd.spawn().expect("wisp-test-serve starts"));
    let loopback = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    Spawned {
        child,
        http: loopback(http),
        grpc: loopback(grpc),
    }
}

/// The config of a model served by the testkit plugin (`INPUT` and `OUTPUT`, INT32, two wide,
/// batches of up to 4), with `extra` appended.
pub fn testkit_config(extra: &str) -> String {
    format!(
        r#"backend: "wasm"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
{extra}"#
    )
}
