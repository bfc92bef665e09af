//! TLS for the listeners, with rustls (ring): a server certificate and key from PEM files, and
//! optionally client certificates required and checked against a root (mutual TLS).
//!
//! gRPC uses Triton's flags (`--grpc-use-ssl`, `--grpc-server-cert`, `--grpc-server-key`,
//! `--grpc-root-cert`, `--grpc-use-ssl-mutual`); HTTP, where Triton has none, the same names
//! with `http-`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// What one listener's TLS is made of.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// Server certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// Server private key (PEM).
    pub key: Option<PathBuf>,
    /// Root certificate(s) client certificates must chain to (PEM), for mutual TLS.
    pub root: Option<PathBuf>,
    /// Require and verify client certificates.
    pub mutual: bool,
}

fn certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no certificate in the file",
            path.display()
        ));
    }
    Ok(certs)
}

/// The acceptor for `files`; `prefix` is the flag prefix (`--grpc` or `--http`) for errors;
/// `alpn` the protocols offered (gRPC clients need `h2`).
pub fn acceptor(files: &TlsFiles, prefix: &str, alpn: &[&[u8]]) -> Result<TlsAcceptor, String> {
    let cert_flag = format!("{prefix}-server-cert");
    let key_flag = format!("{prefix}-server-key");
    let root_flag = format!("{prefix}-root-cert");
    let cert = files
        .cert
        .as_deref()
        .ok_or_else(|| format!("{prefix}-use-ssl needs {cert_flag}"))?;
    let key = files
        .key
        .as_deref()
        .ok_or_else(|| format!("{prefix}-use-ssl needs {key_flag}"))?;
    let chain = certs(cert, &cert_flag)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("{key_flag} {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = if files.mutual {
        let root = files
            .root
            .as_deref()
            .ok_or_else(|| format!("{prefix}-use-ssl-mutual needs {root_flag}"))?;
        let mut roots = RootCertStore::empty();
        for c in certs(root, &root_flag)? {
            roots
                .add(c)
                .map_err(|e| format!("{root_flag} {}: {e}", root.display()))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("{root_flag}: {e}"))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{cert_flag} / {key_flag}: {e}"))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}
