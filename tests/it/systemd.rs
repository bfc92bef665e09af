//! systemd integration, from outside: the real `wisp` process with `NOTIFY_SOCKET` pointing at a
//! datagram socket the test owns (as systemd's is) and `WATCHDOG_USEC` set, as a `Type=notify`
//! unit with `WatchdogSec=` would run it. The watchdog's refusal to ping over a stuck instance
//! is tested in-process (`wisp_server::systemd` and the scheduler's unit tests).

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use crate::common::{free_port, Child};
use wisp_tests::workspace_root;

/// Messages received on `sock` until `until` returns true for one of them or `within` passes.
fn receive_until(
    sock: &UnixDatagram,
    within: Duration,
    until: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => {
                let m = String::from_utf8_lossy(&buf[..n]).trim_end().to_string();
                let done = until(&m);
                got.push(m);
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    got
}

/// `wisp serve` on the fixture repository (tract, loopback, HTTP on `http`), as systemd would
/// start it: `NOTIFY_SOCKET` and `WATCHDOG_USEC` set.
fn spawn_under(socket: &std::path::Path, watchdog_usec: &str, http: u16) -> Child {
    let repo = workspace_root().join("tests/fixtures/repo");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_wisp-test-serve"))
        .args(["serve", "--model-repository"])
        .arg(&repo)
        .args(["--http-address", "127.0.0.1", "--onnx-engine", "tract"])
        .args(["--http-port", &http.to_string()])
        .args(["--grpc-port", &free_port().to_string()])
        .args(["--metrics-port", &free_port().to_string()])
        .args(["--log-info", "false"])
        .env("NOTIFY_SOCKET", socket)
        .env("WATCHDOG_USEC", watchdog_usec)
        .spawn()
        .expect("wisp-test-serve starts");
    Child(child)
}

#[test]
fn notifies_ready_pings_the_watchdog_and_says_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&socket).unwrap();
    let http = free_port();
    let mut child = spawn_under(&socket, "200000", http);

    let got = receive_until(&sock, Duration::from_secs(60), |m| m.contains("READY=1"));
    let ready = got.iter().find(|m| m.contains("READY=1"));
    let ready = ready.unwrap_or_else(|| panic!("no READY=1 within 60 s: {got:?}"));
    assert!(ready.contains("STATUS="), "{ready}");
    // Ready means serving: the health endpoint answers at once.
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", http)).expect("HTTP is up when READY=1 arrives");
    use std::io::{Read, Write};
    stream
        .write_all(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // A 200 ms watchdog: pings every 100 ms.
    let started = Instant::now();
    let pings = receive_until(&sock, Duration::from_secs(2), |_| false);
    let count = pings.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(
        count >= 5,
        "{count} watchdog pings in {:?}: {pings:?}",
        started.elapsed()
    );

    // SIGTERM: STOPPING=1, then a clean exit.
    let pid = child.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let got = receive_until(&sock, Duration::from_secs(30), |m| m.contains("STOPPING=1"));
    assert!(
        got.iter().any(|m| m.contains("STOPPING=1")),
        "no STOPPING=1: {got:?}"
    );
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn without_systemd_nothing_is_sent_and_nothing_fails() {
    // NOTIFY_SOCKET naming a socket nobody listens on: the server still starts and serves.
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    let _child = spawn_under(&dir.path().join("nobody.sock"), "100000", http);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", http)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}
