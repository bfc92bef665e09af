//! The edge: a server whose address space is that of a small board still pools its plugin
//! instances, in as many slots as the address space holds, and serves the demo's plugins.

use std::path::Path;

use wisp_tests::{workspace_root, Client};

use crate::common::{connect_when_up, free_port, Child};

/// `wisp serve` of the demo repository on tract with its address space limited to `bytes`
/// (`prlimit --as`, as a board's kernel would), logging to `log`; serving once this returns.
async fn serve_within(bytes: u64, log: &Path) -> (Child, Client) {
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let child = std::process::Command::new("prlimit")
        .arg(format!("--as={bytes}"))
        .arg(env!("CARGO_BIN_EXE_wisp-test-serve"))
        .args(["serve", "--model-repository"])
        .arg(workspace_root().join("model_repo"))
        .args(["--http-address", "127.0.0.1", "--onnx-engine", "tract"])
        .args(["--http-port", &http.to_string()])
        .args(["--grpc-port", &grpc.to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .arg("--no-wasm-cache")
        .arg("--log-file")
        .arg(log)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("prlimit starts wisp-test-serve");
    let child = Child(child);
    let mut c = connect_when_up(std::net::SocketAddr::from(([127, 0, 0, 1], http))).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let r = c.get("/v2/models/text_direction/ready").await.unwrap();
        if r.status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "text_direction not ready within 120 s under a {} GiB address space: {}",
            bytes >> 30,
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    (child, c)
}

/// Under Sv39's 256 GiB each engine's pool takes 23 slots (3/8 of the space, 4160 MiB each: no
/// failed reservation first), under 48 GiB none (on demand); both serve the demo's wasm steps
/// with the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_address_space_gets_a_pool_that_fits_it() {
    let repo = workspace_root().join("model_repo");
    for f in [
        "ppocr_cls/1/model.onnx",
        "ppocr_preprocess/1/model.wasm",
        "ppocr_postprocess/1/model.wasm",
    ] {
        assert!(
            repo.join(f).is_file(),
            "model_repo/{f} is missing: run `./dev test` (it fetches the model and installs the plugins)"
        );
    }
    let png =
        std::fs::read(workspace_root().join("tests/fixtures/images/text_rotated.png")).unwrap();
    let logs = tempfile::tempdir().unwrap();
    for (gib, want) in [
        (256u64, "wasm pooling allocator: 23 memory slots"),
        (48, "allocating on demand"),
    ] {
        let log = logs.path().join(format!("{gib}.log"));
        let (child, mut c) = serve_within(gib << 30, &log).await;
        let r = wisp_tests::infer_one_bytes(&mut c, "text_direction", "IMAGE", &png)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(r.status, 200, "{gib} GiB: {body}");
        assert!(body.contains(":180"), "{gib} GiB: {body}");
        drop(child);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains(want),
            "{gib} GiB: no '{want}' in the log:\n{text}"
        );
        assert!(
            !text.contains("cannot reserve address space"),
            "{gib} GiB: a pool was tried that did not fit:\n{text}"
        );
    }
}
