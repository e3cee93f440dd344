//! The rustls connector a connection string's TLS settings call for: which roots are trusted,
//! how much of the server's certificate is checked, and the client's own certificate.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// The connector for one connection string, with what it was made from, for log lines.
#[derive(Clone)]
pub struct Tls {
    connector: MakeRustlsConnect,
    mode: SslMode,
    root_cert: Option<String>,
}

impl Tls {
    pub(crate) fn from_settings(settings: &TlsSettings) -> Result<Self, ConnectionStringError> {
        let mode = settings.mode.unwrap_or_default();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // libpq's default root file, used when the string names none.
        let root_cert = settings.root_cert.clone().or_else(|| {
            let home = std::env::var_os("HOME")?;
            let default = Path::new(&home).join(".postgresql/root.crt");
            default.exists().then(|| default.display().to_string())
        });
        let verifier: Arc<dyn ServerCertVerifier> = match &root_cert {
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
        Ok(Self { connector: MakeRustlsConnect::new(config), mode, root_cert })
    }
}

impl fmt::Display for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sslmode={}", self.mode)?;
        match &self.root_cert {
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
        self.connector.make_tls_connect(domain)
    }
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
