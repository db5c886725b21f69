//! TLS for both of Ferry's PostgreSQL connections (the replication stream and the ordinary SQL
//! connection), with rustls, following libpq's `sslmode` semantics:
//!
//! | sslmode | encrypted | chain verified | host name verified |
//! |---|---|---|---|
//! | `disable` | no | – | – |
//! | `prefer` | if the server offers it | no | no |
//! | `require` | yes | only when `sslrootcert` is given (as libpq) | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! Roots come from `sslrootcert` (a PEM file), or `sslrootcert=system` / by default the
//! operating system's store. A client certificate is used when `sslcert` and `sslkey` are set.
//! SCRAM channel binding is not used (the exchange says so with the `n` flag, as libpq does with
//! `channel_binding=disable`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::config::{ConnectConfig, RootCerts, SslMode};

/// Why TLS could not be set up (before any connection is attempted).
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot read sslrootcert {path}: {source}")]
    RootCertFile { path: String, source: io::Error },
    #[error("sslrootcert {path} holds no PEM certificate")]
    NoRootCerts { path: String },
    #[error("no trusted root certificates in the system store; set sslrootcert=/path/to/ca.pem")]
    NoSystemRoots,
    #[error("cannot read client certificate/key ({what}): {source}")]
    ClientCert { what: String, source: io::Error },
    #[error("sslcert and sslkey must be given together")]
    ClientCertPair,
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Builds the rustls client configuration for `cfg.sslmode`; `None` for `disable`.
pub fn client_config(cfg: &ConnectConfig) -> Result<Option<Arc<ClientConfig>>, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verify_chain = match cfg.sslmode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer => false,
        SslMode::Require => cfg.sslrootcert.is_some(),
        SslMode::VerifyCa | SslMode::VerifyFull => true,
    };
    let verifier: Arc<dyn ServerCertVerifier> = if verify_chain {
        let roots = Arc::new(root_store(
            cfg.sslrootcert.as_ref().unwrap_or(&RootCerts::System),
        )?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        if cfg.sslmode == SslMode::VerifyFull {
            webpki
        } else {
            Arc::new(ChainOnly(webpki))
        }
    } else {
        Arc::new(NoVerification(provider.clone()))
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&cfg.sslcert, &cfg.sslkey) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let certs = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| TlsSetupError::ClientCert {
                    what: cert.display().to_string(),
                    source: io::Error::other(e.to_string()),
                })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsSetupError::ClientCert {
                what: key.display().to_string(),
                source: io::Error::other(e.to_string()),
            })?;
            builder.with_client_auth_cert(certs, key)?
        }
        _ => return Err(TlsSetupError::ClientCertPair),
    };
    Ok(Some(Arc::new(config)))
}

fn root_store(roots: &RootCerts) -> Result<RootCertStore, TlsSetupError> {
    let mut store = RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            let shown = path.display().to_string();
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| TlsSetupError::RootCertFile {
                    path: shown.clone(),
                    source: io::Error::other(e.to_string()),
                })?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsSetupError::NoRootCerts { path: shown });
            }
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsSetupError::NoSystemRoots);
            }
        }
    }
    Ok(store)
}

/// The certificate problem behind a failed handshake, if that is why it failed: the error
/// itself, or an `io::Error` wrapping it (tokio-rustls), anywhere in `err`'s source chain.
pub(crate) fn rejected_certificate<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        let found = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(r @ rustls::Error::InvalidCertificate(_)) = found {
            return Some(r);
        }
        cur = e.source();
    }
    None
}

/// A permanent error for a server certificate that failed verification, saying what to change.
pub(crate) fn certificate_error(
    reason: &rustls::Error,
    cfg: &ConnectConfig,
) -> super::error::ReaderError {
    let fix = match reason {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            "connect with a host name the certificate lists in its subjectAltName, or use \
              sslmode=verify-ca to verify the chain only"
        }
        rustls::Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "renew the server's certificate (or check this machine's clock)",
        _ => {
            "set sslrootcert to the CA certificate that signed the server's certificate \
              (sslrootcert=system for a public CA)"
        }
    };
    let server = match &cfg.host {
        super::config::Host::Tcp(h) if h.contains(':') => format!("[{h}]:{}", cfg.port),
        super::config::Host::Tcp(h) => format!("{h}:{}", cfg.port),
        super::config::Host::Unix(d) => d.display().to_string(),
    };
    super::error::ReaderError::TlsCertificate {
        server,
        sslmode: cfg.sslmode.to_string(),
        reason: reason.to_string(),
        fix: fix.into(),
    }
}

/// The name to verify and send as SNI.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsSetupError> {
    ServerName::try_from(host.to_string()).map_err(|e| {
        rustls::Error::General(format!("host {host:?} is not a valid TLS server name: {e}")).into()
    })
}

/// `verify-ca`: the chain must verify; a name mismatch is accepted.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
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
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer`/`require` without roots: encryption without authentication of the server, exactly
/// libpq's behaviour. The handshake signatures are still checked.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// tokio-postgres TLS connector backed by the same rustls configuration, so the ordinary SQL
/// connection is exactly as protected as the replication stream.
#[derive(Clone, Debug)]
pub struct MakeRustlsConnect {
    config: Arc<ClientConfig>,
}

impl MakeRustlsConnect {
    pub fn new(config: Arc<ClientConfig>) -> Self {
        MakeRustlsConnect { config }
    }
}

impl<S> tokio_postgres::tls::MakeTlsConnect<S> for MakeRustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = TlsSetupError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, TlsSetupError> {
        Ok(RustlsConnect {
            config: self.config.clone(),
            name: server_name(domain)?,
        })
    }
}

/// One TLS handshake for tokio-postgres.
#[derive(Debug)]
pub struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> tokio_postgres::tls::TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(RustlsStream(Box::new(tls)))
        })
    }
}

/// A TLS stream for tokio-postgres.
#[derive(Debug)]
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        tokio_postgres::tls::ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_shutdown(cx)
    }
}
