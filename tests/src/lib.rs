//! `wisp-tests`: helpers shared by the integration tests (`it/`) and the benchmark
//! (`src/bench.rs`): a minimal keep-alive HTTP/1.1 client, KServe v2 request builders, and
//! fixture-repository handling.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The committed fixture repository.
pub fn fixture_repo() -> PathBuf {
    workspace_root().join("tests/fixtures/repo")
}

/// A compiled example plugin (`plugins/<crate>` → `plugin_<name>.wasm`). `./dev test` builds
/// them first; panics with the build command when one is missing.
pub fn plugin_wasm(name: &str) -> PathBuf {
    let file = format!("plugin_{}.wasm", name.replace('-', "_"));
    let path = workspace_root()
        .join("plugins/target/wasm32-wasip2/release")
        .join(&file);
    assert!(
        path.is_file(),
        "{} is missing: build the plugins with `./dev plugins` (cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml)",
        path.display()
    );
    path
}

/// Adds a plugin model to `repo`: `<repo>/<model>/config.pbtxt` and `<version>/model.wasm`.
pub fn add_plugin_model(repo: &Path, model: &str, version: u64, plugin: &str, config: &str) {
    let dir = repo.join(model);
    std::fs::create_dir_all(dir.join(version.to_string())).expect("create model dir");
    std::fs::write(dir.join("config.pbtxt"), config).expect("write config");
    std::fs::copy(
        plugin_wasm(plugin),
        dir.join(version.to_string()).join("model.wasm"),
    )
    .expect("copy plugin");
}

/// Copies a directory tree (fixtures are copied to a tempdir before tests change them).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// An HTTP response.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: hyper::HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (panics with the body text if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One keep-alive HTTP/1.1 connection.
pub struct Client {
    sender: SendRequest<Full<Bytes>>,
}

impl Client {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect {addr}"))?;
        stream.set_nodelay(true)?;
        Self::over(stream).await
    }

    /// An HTTP/1.1 client over an established connection (a TLS stream, say).
    pub async fn over<I>(io: I) -> anyhow::Result<Self>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Client { sender })
    }

    /// Sends a request and reads the whole response.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: impl Into<Bytes>,
    ) -> anyhow::Result<Reply> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1");
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req.body(Full::new(body.into()))?;
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> anyhow::Result<Reply> {
        self.send("GET", path, &[], Bytes::new()).await
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<Reply> {
        self.send(
            "POST",
            path,
            &[("content-type", "application/json".into())],
            serde_json::to_vec(body)?,
        )
        .await
    }
}

/// A `parameters { key: ... value { string_value: ... } }` line of a `config.pbtxt`.
pub fn config_param(key: &str, value: &str) -> String {
    format!("parameters {{ key: \"{key}\" value {{ string_value: \"{value}\" }} }}\n")
}

/// Sends one BYTES element (an encoded image, a file) as input `input`, shape `[1, 1]`, with the
/// binary tensor extension, to `model`.
pub async fn infer_one_bytes(
    c: &mut Client,
    model: &str,
    input: &str,
    bytes: &[u8],
) -> anyhow::Result<Reply> {
    let (body, n) = binary_request(&[(input, "BYTES", vec![1, 1], bytes_element(bytes))], false);
    c.send(
        "POST",
        &format!("/v2/models/{model}/infer"),
        &[("inference-header-content-length", n.to_string())],
        body,
    )
    .await
}

/// A binary-tensor-extension request body: JSON header + raw tensors, and the header length.
pub fn binary_request(
    inputs: &[(&str, &str, Vec<i64>, Vec<u8>)],
    binary_outputs: bool,
) -> (Vec<u8>, usize) {
    let ins: Vec<serde_json::Value> = inputs
        .iter()
        .map(|(name, dt, shape, data)| {
            serde_json::json!({
                "name": name, "datatype": dt, "shape": shape,
                "parameters": { "binary_data_size": data.len() }
            })
        })
        .collect();
    let header = serde_json::json!({
        "inputs": ins,
        "parameters": { "binary_data_output": binary_outputs }
    });
    let mut body = serde_json::to_vec(&header).expect("json");
    let n = body.len();
    for (_, _, _, data) in inputs {
        body.extend_from_slice(data);
    }
    (body, n)
}

/// One BYTES tensor element in Triton's wire layout: a little-endian u32 length, then the bytes.
pub fn bytes_element(bytes: &[u8]) -> Vec<u8> {
    let mut data = (bytes.len() as u32).to_le_bytes().to_vec();
    data.extend_from_slice(bytes);
    data
}

/// Little-endian f32 bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 values from little-endian bytes.
pub fn f32_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A minimal gRPC client over one HTTP/2 connection (unary calls only): length-prefixed
/// protobuf in, `grpc-status` trailer out. Enough to drive the server without a client stack.
pub struct GrpcClient {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
}

impl GrpcClient {
    /// Connects to `addr` (h2c, prior knowledge).
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Self::over(stream).await
    }

    /// A gRPC client over an established connection (a TLS stream that negotiated `h2`).
    pub async fn over<I>(io: I) -> anyhow::Result<Self>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(io),
        )
        .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(GrpcClient { sender })
    }

    /// Calls `/inference.GRPCInferenceService/<method>` with `msg`; returns the response message
    /// or the gRPC status code and message.
    pub async fn unary<Req: prost::Message, Resp: prost::Message + Default>(
        &mut self,
        method: &str,
        msg: &Req,
    ) -> anyhow::Result<Result<Resp, (i32, String)>> {
        self.unary_with(method, msg, &[]).await
    }

    /// [`GrpcClient::unary`] with extra request headers (metadata).
    pub async fn unary_with<Req: prost::Message, Resp: prost::Message + Default>(
        &mut self,
        method: &str,
        msg: &Req,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Result<Resp, (i32, String)>> {
        let framed = grpc_frame(msg);
        let req = headers
            .iter()
            .fold(grpc_request(method), |r, (k, v)| r.header(*k, *v))
            .body(Full::new(framed))?;
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let headers = resp.headers().clone();
        let collected = resp.into_body().collect().await?;
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let status = trailers
            .get("grpc-status")
            .or_else(|| headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(-1);
        if status != 0 {
            let msg = trailers
                .get("grpc-message")
                .or_else(|| headers.get("grpc-message"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            return Ok(Err((status, percent_decode(msg))));
        }
        let bytes = collected.to_bytes();
        anyhow::ensure!(bytes.len() >= 5, "short gRPC response");
        Ok(Ok(Resp::decode(&bytes[5..])?))
    }
}

/// The repository index row of `model` (at `version`, else its first row), or `Null`.
pub async fn index_row(c: &mut Client, model: &str, version: Option<&str>) -> serde_json::Value {
    let index = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .expect("the repository index answers")
        .json();
    index
        .as_array()
        .expect("the index is a list")
        .iter()
        .find(|r| r["name"] == model && version.is_none_or(|v| r["version"] == v))
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// A KServe JSON body for the fixture `add_sub`: one row of twos and one of ones.
pub fn add_sub_json() -> serde_json::Value {
    serde_json::json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![2.0f32; 16]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
        ]
    })
}

/// A `ModelInferRequest` for the fixture `add_sub`: one row of ones in both inputs.
pub fn add_sub_grpc_request() -> wisp_server::grpc::pb::ModelInferRequest {
    add_sub_grpc(vec![1, 16], 1)
}

/// A `ModelInferRequest` for the fixture `add_sub` with inputs of `shape` holding `rows` rows
/// of ones (the shape may lie about the data, for tests of the check).
pub fn add_sub_grpc(shape: Vec<i64>, rows: usize) -> wisp_server::grpc::pb::ModelInferRequest {
    use wisp_server::grpc::pb;
    let data = f32_bytes(&vec![1.0; rows * 16]);
    let input = |n: &str| pb::model_infer_request::InferInputTensor {
        name: n.into(),
        datatype: "FP32".into(),
        shape: shape.clone(),
        ..Default::default()
    };
    pb::ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![data.clone().into(), data.into()],
        ..Default::default()
    }
}

/// The head of a call to `/inference.GRPCInferenceService/<method>`: a POST with the headers
/// every gRPC call carries. Add metadata headers, then the body.
pub fn grpc_request(method: &str) -> hyper::http::request::Builder {
    hyper::Request::builder()
        .method("POST")
        .uri(format!(
            "http://127.0.0.1/inference.GRPCInferenceService/{method}"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
}

/// Reads the next gRPC message of type `M` from an `h2` response stream, keeping the bytes that
/// follow it in `buf` for the next call. Fails if the stream ends first.
pub async fn next_message<M: prost::Message + Default>(
    body: &mut h2::RecvStream,
    buf: &mut Vec<u8>,
) -> anyhow::Result<M> {
    loop {
        if let Some(head) = buf.get(..5) {
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if let Some(msg) = buf.get(5..5 + len) {
                let msg = M::decode(msg)?;
                buf.drain(..5 + len);
                return Ok(msg);
            }
        }
        let chunk = body
            .data()
            .await
            .context("the stream ended before a whole message")??;
        body.flow_control().release_capacity(chunk.len())?;
        buf.extend_from_slice(&chunk);
    }
}

/// `msg` as one gRPC message on the wire: uncompressed, its length as 4 big-endian bytes,
/// then the protobuf.
pub fn grpc_frame(msg: &impl prost::Message) -> Bytes {
    let len = msg.encoded_len();
    let mut framed = Vec::with_capacity(len + 5);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    msg.encode_raw(&mut framed);
    Bytes::from(framed)
}

/// Decodes gRPC's percent-encoded `grpc-message`.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |k: usize| b.get(k).and_then(|&c| (c as char).to_digit(16));
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// PEM files of a throwaway PKI made at test time: a CA, a server certificate for
/// `localhost` / `127.0.0.1`, and a client certificate, each signed by the CA.
pub struct TestCerts {
    /// CA certificate.
    pub ca: PathBuf,
    /// Server certificate.
    pub server_cert: PathBuf,
    /// Server private key.
    pub server_key: PathBuf,
    /// Client certificate.
    pub client_cert: PathBuf,
    /// Client private key.
    pub client_key: PathBuf,
}

/// Writes a fresh [`TestCerts`] into `dir`.
pub fn make_test_certs(dir: &Path) -> anyhow::Result<TestCerts> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "wisp test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let leaf = |names: Vec<String>, cn: &str| -> anyhow::Result<(String, String)> {
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let (server_cert, server_key) =
        leaf(vec!["localhost".into(), "127.0.0.1".into()], "localhost")?;
    let (client_cert, client_key) = leaf(vec!["wisp-client".into()], "wisp-client")?;
    let certs = TestCerts {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    };
    std::fs::write(&certs.ca, ca.pem())?;
    std::fs::write(&certs.server_cert, server_cert)?;
    std::fs::write(&certs.server_key, server_key)?;
    std::fs::write(&certs.client_cert, client_cert)?;
    std::fs::write(&certs.client_key, client_key)?;
    Ok(certs)
}

/// A TLS client connection to `addr` (server name `localhost`) trusting `certs.ca`, presenting
/// the client certificate when `with_client_cert`, offering `alpn`.
pub async fn tls_connect(
    addr: SocketAddr,
    certs: &TestCerts,
    with_client_cert: bool,
    alpn: &[&[u8]],
) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&certs.ca)? {
        roots.add(c?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = if with_client_cert {
        let chain =
            CertificateDer::pem_file_iter(&certs.client_cert)?.collect::<Result<Vec<_>, _>>()?;
        builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&certs.client_key)?)?
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    Ok(connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?)
}
