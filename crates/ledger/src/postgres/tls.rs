//! TLS to PostgreSQL with rustls, following libpq's `sslmode`:
//! `prefer`/`require` encrypt without checking the certificate (unless
//! `sslrootcert` names roots, which makes `require` act as `verify-ca`),
//! `verify-ca` checks the chain against the roots, `verify-full` the chain
//! and the host name. Roots: the `sslrootcert` PEM file, else the system's.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::url::SslMode;

/// Why no TLS connector could be made for a PostgreSQL ledger.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TlsError {
    /// rustls refused its own configuration.
    #[error("TLS set-up: {0}")]
    SetUp(String),
    /// `verify-ca` with the system's roots would trust any public CA.
    #[error(
        "sslmode=verify-ca needs sslrootcert=FILE (the CA that signed the server's certificate); \
         with the system's roots use sslmode=verify-full"
    )]
    VerifyCaWithoutRoot,
    /// The roots could not make a certificate verifier.
    #[error("TLS roots: {0}")]
    Roots(String),
    /// The `sslrootcert` file could not be read, or holds no certificate.
    #[error("sslrootcert {path}: {detail}")]
    RootCert { path: String, detail: String },
    #[error("no system root certificates found; name the server's CA with sslrootcert=FILE")]
    NoSystemRoots,
}

/// The connector for `mode`; `Err` names what is wrong with the roots.
pub fn connector(mode: SslMode, root_cert: Option<&Path>) -> Result<MakeRustlsConnect, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::SetUp(e.to_string()))?;
    if mode == SslMode::VerifyCa && root_cert.is_none() {
        // Any public CA's certificate for any host would pass: anyone who
        // can get one could stand in for the server (libpq refuses this too).
        return Err(TlsError::VerifyCaWithoutRoot);
    }
    let check = match (mode, root_cert) {
        (SslMode::Prefer | SslMode::Require, None) => Check::Nothing,
        (SslMode::Require | SslMode::VerifyCa, _) => Check::Chain,
        (SslMode::VerifyFull, _) => Check::ChainAndName,
        (SslMode::Prefer, Some(_)) => Check::Chain,
        (SslMode::Disable, _) => Check::Nothing,
    };
    let webpki = || -> Result<Arc<WebPkiServerVerifier>, TlsError> {
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots(root_cert)?), provider.clone())
            .build()
            .map_err(|e| TlsError::Roots(e.to_string()))
    };
    let builder = if check == Check::ChainAndName {
        builder.with_webpki_verifier(webpki()?)
    } else {
        let chain = (check == Check::Chain).then(webpki).transpose()?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient {
                chain,
                provider: provider.clone(),
            }))
    };
    Ok(MakeRustlsConnect::new(builder.with_no_client_auth()))
}

#[derive(Clone, Copy, PartialEq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

/// The roots to trust: the PEM file, else the system's store.
fn roots(root_cert: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match root_cert {
        Some(path) => {
            let bad = |detail: &dyn std::fmt::Display| TlsError::RootCert {
                path: path.display().to_string(),
                detail: detail.to_string(),
            };
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))?;
            for cert in certs {
                let cert = cert.map_err(|e| bad(&e))?;
                store.add(cert).map_err(|e| bad(&e))?;
            }
            if store.is_empty() {
                return Err(bad(&"no certificate in it"));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsError::NoSystemRoots);
            }
        }
    }
    Ok(store)
}

/// What `require` without roots and `verify-ca` check of the server's
/// certificate: nothing (`chain` None: encrypted, unauthenticated, as libpq
/// does), or the chain to a trusted root with any host name on it. The
/// handshake's signatures are checked either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
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
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
