//! The rustls connector a connection string's TLS settings call for: which roots are trusted,
//! how much of the server's certificate is checked, and the client's own certificate.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::conninfo::{SslMode, TlsSettings};
use crate::ConnectionStringError;

/// `sslrootcert=system`: the system's trusted roots, as libpq reads the word.
const SYSTEM_ROOTS: &str = "system";

/// The connector for one connection string. The certificate files are read again, for the next
/// connection, once any of them changes: a CA or client certificate renewed in place (a
/// Kubernetes Secret's volume, say) needs no restart. A renewal that cannot be read is logged,
/// and the files read before stay in use.
#[derive(Clone)]
pub struct Tls {
    settings: Arc<TlsSettings>,
    mode: SslMode,
    loaded: Arc<Mutex<Loaded>>,
}

struct Loaded {
    connector: MakeRustlsConnect,
    /// The files' modification times when they were read.
    read_at: Vec<Option<SystemTime>>,
}

impl Tls {
    pub(crate) fn from_settings(mut settings: TlsSettings) -> Result<Self, ConnectionStringError> {
        let mode = settings.mode.unwrap_or_default();
        // libpq's default root file, used when the string names none.
        if settings.root_cert.is_none() {
            settings.root_cert = std::env::var_os("HOME")
                .map(|home| Path::new(&home).join(".postgresql/root.crt"))
                .filter(|default| default.exists())
                .map(|default| default.display().to_string());
        }
        let read_at = modification_times(&settings);
        let connector = connector(&settings, mode)?;
        Ok(Self {
            settings: Arc::new(settings),
            mode,
            loaded: Arc::new(Mutex::new(Loaded { connector, read_at })),
        })
    }

    /// The connector for the next connection, made again if a file changed since it was.
    fn current(&self) -> MakeRustlsConnect {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        let now = modification_times(&self.settings);
        if now != loaded.read_at {
            match connector(&self.settings, self.mode) {
                Ok(connector) => loaded.connector = connector,
                Err(error) => tracing::warn!(
                    %error,
                    "the database's TLS files changed but cannot be used; keeping those read before"
                ),
            }
            loaded.read_at = now;
        }
        loaded.connector.clone()
    }
}

impl fmt::Display for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sslmode={}", self.mode)?;
        match &self.settings.root_cert {
            Some(root_cert) => write!(f, " sslrootcert={root_cert}"),
            None => Ok(()),
        }
    }
}

impl<S> MakeTlsConnect<S> for Tls
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        self.current().make_tls_connect(domain)
    }
}

fn modification_times(settings: &TlsSettings) -> Vec<Option<SystemTime>> {
    let files = [&settings.root_cert, &settings.cert, &settings.key];
    let files = files.into_iter().flatten().filter(|path| path.as_str() != SYSTEM_ROOTS);
    files.map(|path| std::fs::metadata(path).and_then(|meta| meta.modified()).ok()).collect()
}

/// The rustls connector the settings call for, the files read now.
fn connector(
    settings: &TlsSettings,
    mode: SslMode,
) -> Result<MakeRustlsConnect, ConnectionStringError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match &settings.root_cert {
        Some(root_cert) => {
            let roots = Arc::new(load_roots(root_cert)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|error| ConnectionStringError::Tls(error.to_string()))?;
            // With a root given, `prefer` and `require` verify as `verify-ca` does (libpq).
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
        None if mode.verifies() => return Err(ConnectionStringError::NoRootCertificate(mode)),
        None => Arc::new(AnyCertificate(provider.clone())),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| ConnectionStringError::Tls(error.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&settings.cert, &settings.key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(load_certificates("sslcert", cert)?, load_key(key)?)
            .map_err(|error| ConnectionStringError::Tls(error.to_string()))?,
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return Err(ConnectionStringError::HalfClientCertificate("sslcert")),
        (None, Some(_)) => return Err(ConnectionStringError::HalfClientCertificate("sslkey")),
    };
    Ok(MakeRustlsConnect::new(config))
}

fn load_roots(root_cert: &str) -> Result<RootCertStore, ConnectionStringError> {
    let mut roots = RootCertStore::empty();
    if root_cert == SYSTEM_ROOTS {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(ConnectionStringError::Tls(format!(
                "sslrootcert=system, but no trusted root was found on this system ({:?})",
                found.errors
            )));
        }
        return Ok(roots);
    }
    let (added, _) = roots.add_parsable_certificates(load_certificates("sslrootcert", root_cert)?);
    if added == 0 {
        let path = PathBuf::from(root_cert);
        return Err(ConnectionStringError::Empty { setting: "sslrootcert", path, what: "CA" });
    }
    Ok(roots)
}

fn load_certificates(
    setting: &'static str,
    path: &str,
) -> Result<Vec<CertificateDer<'static>>, ConnectionStringError> {
    let path = PathBuf::from(path);
    let file_error =
        |reason: String| ConnectionStringError::File { setting, path: path.clone(), reason };
    let certificates = CertificateDer::pem_file_iter(&path)
        .map_err(|error| file_error(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(error.to_string()))?;
    if certificates.is_empty() {
        return Err(ConnectionStringError::Empty { setting, path, what: "certificate" });
    }
    Ok(certificates)
}

fn load_key(path: &str) -> Result<PrivateKeyDer<'static>, ConnectionStringError> {
    PrivateKeyDer::from_pem_file(path).map_err(|error| ConnectionStringError::File {
        setting: "sslkey",
        path: PathBuf::from(path),
        reason: error.to_string(),
    })
}

/// `prefer` and `require` with no root to check against: the channel is encrypted, and the
/// handshake's signatures are still checked, but the certificate is taken as it comes.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, signature, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the certificate must chain to a trusted root, whatever host it names.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The chain is checked before the name, so a name error means the chain held.
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
