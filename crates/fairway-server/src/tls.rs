//! HTTPS for the broker: its certificate and key from PEM files, read again when either file
//! changes or on SIGHUP, so that a rotated certificate (cert-manager's, say) needs no restart.
//! A reload that fails keeps the certificate in use and logs why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use thiserror::Error;

use crate::config::TlsArgs;

/// How often the files are checked for a change, besides SIGHUP.
const CHECK_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read --tls-cert {}: {reason}", path.display())]
    Certificate { path: PathBuf, reason: String },
    #[error("--tls-cert {} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("cannot read --tls-key {}: {reason}", path.display())]
    Key { path: PathBuf, reason: String },
    #[error(
        "--tls-key {} does not go with --tls-cert {}: {reason}",
        key.display(),
        certificate.display()
    )]
    Mismatch { certificate: PathBuf, key: PathBuf, reason: String },
    #[error("the TLS settings cannot be used: {0}")]
    Config(String),
}

/// The broker's certificate, as its files say now.
#[derive(Debug)]
pub struct ServerCertificate {
    certificate_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times when last read, to notice a change.
    read_at: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
}

impl ServerCertificate {
    /// The certificate `args` names, read now; None when it names none (plain HTTP).
    pub fn load(args: &TlsArgs) -> Result<Option<Arc<Self>>, TlsError> {
        let (Some(certificate_path), Some(key_path)) = (&args.tls_cert, &args.tls_key) else {
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let read_at = (modified(certificate_path), modified(key_path));
        let current = read(certificate_path, key_path, &provider)?;
        Ok(Some(Arc::new(Self {
            certificate_path: certificate_path.clone(),
            key_path: key_path.clone(),
            provider,
            current: RwLock::new(Arc::new(current)),
            read_at: Mutex::new(read_at),
        })))
    }

    /// The server configuration that answers every handshake with the current certificate.
    pub fn server_config(self: &Arc<Self>) -> Result<ServerConfig, TlsError> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Reads the files again; the certificate in use stays if they cannot be used.
    pub fn reload(&self) -> Result<(), TlsError> {
        let read_at = (modified(&self.certificate_path), modified(&self.key_path));
        let fresh = read(&self.certificate_path, &self.key_path, &self.provider)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        *self.read_at.lock().unwrap_or_else(PoisonError::into_inner) = read_at;
        Ok(())
    }

    fn changed(&self) -> bool {
        let now = (modified(&self.certificate_path), modified(&self.key_path));
        *self.read_at.lock().unwrap_or_else(PoisonError::into_inner) != now
    }

    /// Reloads on SIGHUP, and whenever a check finds either file changed, until the broker
    /// stops.
    pub async fn watch(self: Arc<Self>) {
        let mut hangups = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::hangup(),
        ) {
            Ok(hangups) => Some(hangups),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP; the certificate files are still checked for changes");
                None
            }
        };
        let mut checks = tokio::time::interval(CHECK_INTERVAL);
        loop {
            let hangup = async {
                match hangups.as_mut() {
                    Some(hangups) => hangups.recv().await,
                    None => std::future::pending().await,
                }
            };
            let asked = tokio::select! {
                _ = hangup => true,
                _ = checks.tick() => false,
            };
            if !asked && !self.changed() {
                continue;
            }
            match self.reload() {
                Ok(()) => tracing::info!(
                    certificate = %self.certificate_path.display(),
                    "reloaded the TLS certificate"
                ),
                Err(error) => {
                    tracing::error!(%error, "reloading the TLS certificate failed; serving the one loaded before")
                }
            }
        }
    }
}

impl ResolvesServerCert for ServerCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|metadata| metadata.modified()).ok()
}

fn read(
    certificate: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let certificate_error =
        |reason: String| TlsError::Certificate { path: certificate.to_owned(), reason };
    let chain = CertificateDer::pem_file_iter(certificate)
        .map_err(|error| certificate_error(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| certificate_error(error.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: certificate.to_owned() });
    }
    let private_key = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| TlsError::Key { path: key.to_owned(), reason: error.to_string() })?;
    CertifiedKey::from_der(chain, private_key, provider).map_err(|error| TlsError::Mismatch {
        certificate: certificate.to_owned(),
        key: key.to_owned(),
        reason: error.to_string(),
    })
}
