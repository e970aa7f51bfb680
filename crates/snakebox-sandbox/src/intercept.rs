//! Secrets through the run proxy: the code of a run holds only a placeholder, and the proxy
//! puts the real value into requests to the secret's own hosts.
//!
//! Why it lives in the proxy: the proxy is the one place every byte of a run's traffic passes
//! and the one piece that holds what the sandbox must not. A run granted secrets
//! ([`RunSecrets`], set on its proxy with [`crate::RunProxy::grant`]) is served thus:
//! - a connection to a secret's host on port 443 is *terminated* here: the proxy answers the
//!   run's TLS with a certificate for that name, signed by the server's own CA ([`EgressCa`],
//!   which only sandboxes are told to trust), makes its own TLS connection upstream (rustls,
//!   verified against the host's trust store plus the operator's extra CA file), and reads
//!   each HTTP/1.1 request: a placeholder in a header becomes the value (or the secret's
//!   header is set), a placeholder in the URL or a header of another secret is refused;
//! - every other connection keeps end-to-end TLS, as without secrets; a destination name that
//!   holds a placeholder is refused before it is resolved (no DNS query carries it), and the
//!   clear-text bytes a run sends anywhere else are scanned: a placeholder cuts the
//!   connection. Each refusal is an entry of the run's `network_log`.
//!
//! The real value is substituted only after the upstream certificate was verified for the
//! secret's host; it never enters the sandbox, a log line or a decision.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{Either, Full};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::UnixStream;

use crate::netproxy::{
    CONNECT_TIMEOUT, HEAD_TIMEOUT, NetDecision, Shared, Target, connect_direct, connect_through,
    denied, http_reply, name_matches, split_host_port,
};

/// File names of the CA in its directory.
const CA_KEY: &str = "ca-key.pem";
const CA_CERT: &str = "ca.pem";
/// The CA's subject: a leaf signed by the key chains to any certificate with this name and key.
const CA_NAME: &str = "snakebox egress proxy CA (this server's sandboxes only)";
/// How long a leaf certificate made for a host is served before a new one is made.
const LEAF_LIFE: Duration = Duration::from_secs(24 * 3600);

/// A secret's value: never printed (its `Debug` is `***`).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Arc<str>);

impl SecretValue {
    /// Wrap a value (the operator's, read from an environment variable or a file).
    #[must_use]
    pub fn new(value: &str) -> SecretValue {
        SecretValue(Arc::from(value))
    }

    /// The value itself: for the proxy's substitution only.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// One secret granted to one run: its name, the run's placeholder, the value, the hosts it
/// may be sent to and the header it goes in (if any).
#[derive(Debug, Clone)]
pub struct SecretGrant {
    /// Its name (the environment variable the run sees the placeholder in).
    pub name: String,
    /// The run's placeholder: random, this run's only.
    pub placeholder: String,
    /// The value.
    pub value: SecretValue,
    /// Where it may be sent: `name` or `*.suffix` patterns.
    pub hosts: Vec<String>,
    /// A header set on every request to its hosts: `(name, template)`, `{}` in the template
    /// standing for the value (`("Authorization", "Bearer {}")`). `None`: only placeholders
    /// in headers are replaced.
    pub header: Option<(String, String)>,
}

impl SecretGrant {
    /// Whether the secret may be sent to `host`.
    #[must_use]
    pub fn allows(&self, host: &str) -> bool {
        self.hosts.iter().any(|pattern| name_matches(pattern, host))
    }
}

/// The secrets of one run, and the interceptor that serves them.
#[derive(Debug, Clone)]
pub struct RunSecrets {
    /// The interceptor (the server's CA and upstream trust).
    pub interceptor: Arc<Interceptor>,
    /// The secrets granted.
    pub grants: Vec<SecretGrant>,
}

impl RunSecrets {
    /// Whether a connection to `target` is terminated here: port 443 of a secret's host.
    pub(crate) fn intercepts(&self, target: &Target) -> bool {
        target.port == 443 && self.grants.iter().any(|g| g.allows(&target.host))
    }

    /// The secret whose placeholder `bytes` hold (case-insensitively: host names are).
    pub(crate) fn placeholder_in(&self, bytes: &[u8]) -> Option<&SecretGrant> {
        self.grants.iter().find(|g| {
            let needle = g.placeholder.as_bytes();
            bytes
                .windows(needle.len())
                .any(|w| w.eq_ignore_ascii_case(needle))
        })
    }

    /// Why a request head in clear text to `host` (plain HTTP) is refused, if it is.
    pub(crate) fn refuses_clear_text(&self, host: &str, head: &[u8]) -> Option<String> {
        let grant = self.placeholder_in(head)?;
        Some(if grant.allows(host) {
            format!(
                "the request carries the placeholder of secret `{}` over plain HTTP: secrets are sent over HTTPS only (use https://{host}/…)",
                grant.name
            )
        } else {
            foreign(grant, host)
        })
    }

    /// Why a destination name is refused: it holds a placeholder (a DNS query would carry it).
    pub(crate) fn refuses_name(&self, host: &str) -> Option<String> {
        self.placeholder_in(host.as_bytes()).map(|grant| {
            format!(
                "the destination name holds the placeholder of secret `{}`: refused before any name was resolved",
                grant.name
            )
        })
    }

    /// Every placeholder, for the scan of clear-text streams.
    pub(crate) fn placeholders(&self) -> Vec<Vec<u8>> {
        self.grants
            .iter()
            .map(|g| g.placeholder.as_bytes().to_vec())
            .collect()
    }
}

/// The refusal of a placeholder sent to a host that is not its secret's.
fn foreign(grant: &SecretGrant, host: &str) -> String {
    format!(
        "the request carries the placeholder of secret `{}` to `{host}`, which is not among its hosts ({})",
        grant.name,
        grant.hosts.join(", ")
    )
}

/// The server's own CA for the proxy's TLS: an ECDSA key (P-256) and a self-signed CA
/// certificate, kept in a directory only the server can read.
pub struct EgressCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
}

impl std::fmt::Debug for EgressCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EgressCa")
    }
}

/// The CA's parameters (the same at every start: a leaf chains to the kept certificate by
/// name and key).
fn ca_params() -> Result<rcgen::CertificateParams, String> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|err| format!("could not describe the CA: {err}"))?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, CA_NAME);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

impl EgressCa {
    /// The CA kept in `dir` (made, mode 0700, with the key at mode 0600, when absent).
    ///
    /// # Errors
    /// When the directory or the files cannot be made or read, or the key is not a PEM key.
    pub fn load_or_create(dir: &Path) -> Result<EgressCa, String> {
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
        let key_path = dir.join(CA_KEY);
        let cert_path = dir.join(CA_CERT);
        let io = |what: &str, path: &Path, err: std::io::Error| {
            format!("could not {what} `{}`: {err}", path.display())
        };
        if !key_path.exists() || !cert_path.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|err| io("create", dir, err))?;
            let key = rcgen::KeyPair::generate()
                .map_err(|err| format!("could not make the CA key: {err}"))?;
            let mut params = ca_params()?;
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::days(1);
            params.not_after = now + time::Duration::days(3650);
            let cert = params
                .self_signed(&key)
                .map_err(|err| format!("could not sign the CA certificate: {err}"))?;
            // Written under temporary names, then renamed: a crash leaves no half CA.
            let tmp_key = dir.join(format!("{CA_KEY}.tmp"));
            let tmp_cert = dir.join(format!("{CA_CERT}.tmp"));
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp_key)
                .map_err(|err| io("create", &tmp_key, err))?;
            std::io::Write::write_all(&mut file, key.serialize_pem().as_bytes())
                .map_err(|err| io("write", &tmp_key, err))?;
            fs_err::write(&tmp_cert, cert.pem()).map_err(|err| err.to_string())?;
            fs_err::rename(&tmp_cert, &cert_path).map_err(|err| err.to_string())?;
            fs_err::rename(&tmp_key, &key_path).map_err(|err| err.to_string())?;
        }
        // Whatever made them, only the server reads the key.
        let _ = fs_err::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        let _ = fs_err::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600));
        let key_pem = fs_err::read_to_string(&key_path).map_err(|err| err.to_string())?;
        let cert_pem = fs_err::read_to_string(&cert_path).map_err(|err| err.to_string())?;
        let key = rcgen::KeyPair::from_pem(&key_pem)
            .map_err(|err| format!("`{}` is not a PEM key: {err}", key_path.display()))?;
        let cert_der = {
            use rustls::pki_types::pem::PemObject as _;
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|err| {
                format!("`{}` is not a PEM certificate: {err}", cert_path.display())
            })?
        };
        Ok(EgressCa {
            issuer: rcgen::Issuer::new(ca_params()?, key),
            cert_pem,
            cert_der,
        })
    }

    /// The CA certificate (PEM), for the sandboxes' trust bundle.
    #[must_use]
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A leaf certificate and key for `host`, signed by the CA.
    fn leaf(
        &self,
        host: &str,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let key = rcgen::KeyPair::generate()
            .map_err(|err| format!("could not make a key for `{host}`: {err}"))?;
        let mut params = rcgen::CertificateParams::new(vec![host.to_owned()])
            .map_err(|err| format!("could not make a certificate for `{host}`: {err}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(7);
        params.use_authority_key_identifier_extension = true;
        params
            .extended_key_usages
            .push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|err| format!("could not sign a certificate for `{host}`: {err}"))?;
        Ok((
            vec![cert.der().clone(), self.cert_der.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        ))
    }
}

/// The server's interception: its CA, the upstream trust, and the leaf certificates made so
/// far (one per host, renewed daily).
pub struct Interceptor {
    ca: EgressCa,
    client: Arc<rustls::ClientConfig>,
    roots_pem: String,
    leaves: Mutex<HashMap<String, (Instant, Arc<rustls::ServerConfig>)>>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interceptor")
    }
}

/// rustls on *ring* (already in the tree; no C build of aws-lc): its key exchanges are the
/// classic ones, without the post-quantum hybrid.
#[expect(
    deprecated,
    reason = "ring is the provider chosen for the build; it lacks only post-quantum key exchange"
)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Interceptor {
    /// An interceptor signing with `ca`, trusting upstream the host's certificates (and
    /// those of `extra_ca_file`, PEM, when given).
    ///
    /// # Errors
    /// When no trusted certificate could be read, or the extra file is unreadable.
    pub fn new(ca: EgressCa, extra_ca_file: Option<&Path>) -> Result<Interceptor, String> {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        let mut pem = String::new();
        let native = rustls_native_certs::load_native_certs();
        let mut certs = native.certs;
        if let Some(path) = extra_ca_file {
            let extra: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(Iterator::collect)
                .map_err(|err| {
                    format!(
                        "could not read the extra CA file `{}`: {err}",
                        path.display()
                    )
                })?;
            if extra.is_empty() {
                return Err(format!(
                    "the extra CA file `{}` holds no PEM certificate",
                    path.display()
                ));
            }
            certs.extend(extra);
        }
        for cert in certs {
            if roots.add(cert.clone()).is_ok() {
                pem.push_str(&pem_of(&cert));
            }
        }
        if roots.is_empty() {
            return Err("no trusted CA certificate was found on this host (the system's certificate store is empty)".to_owned());
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|err| format!("could not set up TLS: {err}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interceptor {
            ca,
            client: Arc::new(client),
            roots_pem: pem,
            leaves: Mutex::default(),
        })
    }

    /// The bundle a sandbox trusts when it has secrets: the certificates the proxy trusts
    /// upstream, then the server's CA (PEM).
    #[must_use]
    pub fn sandbox_bundle(&self) -> String {
        format!("{}{}", self.roots_pem, self.ca.cert_pem())
    }

    /// The TLS configuration the proxy answers a run with for `host`.
    fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((made, config)) = leaves.get(host)
            && made.elapsed() < LEAF_LIFE
        {
            return Ok(Arc::clone(config));
        }
        let (chain, key) = self.ca.leaf(host)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|err| format!("could not set up TLS: {err}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|err| format!("could not use the certificate for `{host}`: {err}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() > 1024 {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), (Instant::now(), Arc::clone(&config)));
        Ok(config)
    }
}

/// `cert` as PEM.
fn pem_of(cert: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// A stream that first yields bytes already read from it.
struct Prefixed<S> {
    prefix: Vec<u8>,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let rest = self.prefix.split_off(n);
            buf.put_slice(&self.prefix);
            self.prefix = rest;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The upstream stream, counting bytes into the run's log entry and its byte cap.
struct Counted<S> {
    inner: S,
    shared: Arc<Shared>,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

impl<S> Counted<S> {
    fn count(&self, n: usize, counter: &AtomicU64) -> std::io::Result<()> {
        counter.fetch_add(n as u64, Ordering::Relaxed);
        if crate::netproxy::within_cap(&self.shared, n) {
            Ok(())
        } else {
            Err(std::io::Error::other(
                "the run's cap of bytes through the proxy is reached",
            ))
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let n = buf.filled().len() - before;
            let received = Arc::clone(&self.received);
            self.count(n, &received)?;
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            let sent = Arc::clone(&self.sent);
            self.count(n, &sent)?;
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type Answer = hyper::Response<Either<hyper::body::Incoming, Full<Bytes>>>;

/// A refusal or error answered to the run (inside its TLS).
fn answer(status: u16, reason: &str) -> Answer {
    let mut response = hyper::Response::new(Either::Right(Full::new(Bytes::from(format!(
        "snakebox network policy: {reason}\n"
    )))));
    *response.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response
}

/// Serve a connection to a secret's host: TLS with the run (`early`: bytes it sent already),
/// TLS upstream (verified), and each request's headers rewritten by [`rewrite`].
pub(crate) async fn serve_intercepted(
    client: UnixStream,
    early: Vec<u8>,
    shared: &Arc<Shared>,
    secrets: Arc<RunSecrets>,
    target: &Target,
    addresses: &[SocketAddr],
) {
    let config = match secrets.interceptor.server_config(&target.host) {
        Ok(config) => config,
        Err(reason) => {
            shared.record(denied(target, reason));
            return;
        }
    };
    let accepted = tokio::time::timeout(
        HEAD_TIMEOUT,
        tokio_rustls::TlsAcceptor::from(config).accept(Prefixed {
            prefix: early,
            inner: client,
        }),
    )
    .await;
    let mut tls = match accepted {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            shared.record(denied(
                target,
                format!(
                    "the run's TLS handshake with the proxy failed ({err}): a run with secrets trusts the bundle in SSL_CERT_FILE, which holds snakebox's CA"
                ),
            ));
            return;
        }
        Err(_) => {
            shared.record(denied(target, "no TLS handshake came in time".to_owned()));
            return;
        }
    };
    let connected = match shared.rules.upstream_for(&target.host) {
        Some(proxy) => connect_through(proxy, target, true).await,
        None => connect_direct(target, addresses).await,
    };
    let upstream = match connected {
        Ok((tcp, address, _)) => {
            let name = ServerName::try_from(target.host.clone())
                .map_err(|err| format!("`{}` is no TLS server name: {err}", target.host));
            let connector =
                tokio_rustls::TlsConnector::from(Arc::clone(&secrets.interceptor.client));
            match name {
                Ok(name) => {
                    match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp)).await
                    {
                        Ok(Ok(stream)) => Ok((stream, address)),
                        Ok(Err(err)) => Err(format!(
                            "network error: the TLS certificate of `{}` could not be verified ({err}); no secret was sent",
                            target.host
                        )),
                        Err(_) => Err(format!(
                            "network error: the TLS handshake with `{}` timed out",
                            target.host
                        )),
                    }
                }
                Err(reason) => Err(reason),
            }
        }
        Err(reason) => Err(reason),
    };
    let (upstream, address) = match upstream {
        Ok(connected) => connected,
        Err(reason) => {
            let _ = tls.write_all(&http_reply(502, &reason)).await;
            let _ = tls.shutdown().await;
            shared.record(denied(target, reason));
            return;
        }
    };
    let names: Vec<&str> = secrets
        .grants
        .iter()
        .filter(|g| g.allows(&target.host))
        .map(|g| g.name.as_str())
        .collect();
    let (sent, received) = shared.record(NetDecision {
        host: target.host.clone(),
        port: target.port,
        allowed: true,
        reason: format!(
            "allowed (TLS terminated by the proxy for secret {}; upstream certificate verified)",
            names.join(", ")
        ),
        address: Some(address),
        bytes_sent: 0,
        bytes_received: 0,
    });
    let upstream = Counted {
        inner: upstream,
        shared: Arc::clone(shared),
        sent,
        received,
    };
    let Ok((sender, connection)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(upstream)).await
    else {
        return;
    };
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let host = target.host.clone();
    let port = target.port;
    let shared_for_service = Arc::clone(shared);
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let sender = Arc::clone(&sender);
            let secrets = Arc::clone(&secrets);
            let shared = Arc::clone(&shared_for_service);
            let host = host.clone();
            async move {
                let (mut parts, body) = request.into_parts();
                if let Err(reason) = rewrite(&mut parts, &secrets, &host) {
                    shared.record(denied(
                        &Target {
                            host: host.clone(),
                            port,
                        },
                        reason.clone(),
                    ));
                    return Ok::<Answer, std::convert::Infallible>(answer(403, &reason));
                }
                let request = hyper::Request::from_parts(parts, body);
                let mut sender = sender.lock().await;
                if sender.ready().await.is_err() {
                    return Ok(answer(
                        502,
                        &format!("network error: `{host}` closed the connection"),
                    ));
                }
                match sender.send_request(request).await {
                    Ok(response) => {
                        let (mut parts, body) = response.into_parts();
                        scrub(&mut parts.headers, &secrets);
                        Ok(hyper::Response::from_parts(parts, Either::Left(body)))
                    }
                    Err(err) => Ok(answer(502, &format!("network error: {err}"))),
                }
            }
        });
    let served = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
    let both = async {
        let _ = tokio::join!(served, connection);
    };
    let _ = tokio::time::timeout(shared.rules.caps.connection_time, both).await;
}

/// Put the secrets into one request to `host` (a secret's host): a placeholder in a header
/// of a secret for `host` becomes its value, a secret's header is set; a placeholder in the
/// URL, or of a secret for other hosts, refuses the request (the reason is returned).
pub(crate) fn rewrite(
    parts: &mut http::request::Parts,
    secrets: &RunSecrets,
    host: &str,
) -> Result<(), String> {
    // The request must be for the host the connection was checked and verified for: a
    // secret is never put into a request naming another virtual host of the same server.
    let named = parts.uri.host().map(str::to_owned).or_else(|| {
        parts
            .headers
            .get(http::header::HOST)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| split_host_port(value).map(|(host, _)| host))
    });
    if let Some(named) = named
        && !named.trim_end_matches('.').eq_ignore_ascii_case(host)
    {
        return Err(format!(
            "the request names the host `{named}` on a connection to `{host}`: refused, as a secret is sent only to the host the connection was verified for"
        ));
    }
    if let Some(grant) = secrets.placeholder_in(parts.uri.to_string().as_bytes()) {
        return Err(format!(
            "the URL carries the placeholder of secret `{}`: secrets are put in headers only, never in a URL",
            grant.name
        ));
    }
    for (name, value) in &mut parts.headers {
        let mut bytes = value.as_bytes().to_vec();
        let mut changed = false;
        while let Some(grant) = secrets.placeholder_in(&bytes) {
            if !grant.allows(host) {
                return Err(format!("{} (in header `{name}`)", foreign(grant, host)));
            }
            bytes = replace_ignore_case(
                &bytes,
                grant.placeholder.as_bytes(),
                grant.value.expose().as_bytes(),
            );
            changed = true;
        }
        if changed {
            let mut new = http::HeaderValue::from_bytes(&bytes)
                .map_err(|_| format!("header `{name}` is not a valid header value once filled"))?;
            new.set_sensitive(true);
            *value = new;
        }
    }
    for grant in secrets.grants.iter().filter(|g| g.allows(host)) {
        if let Some((name, template)) = &grant.header {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("secret `{}` names an invalid header", grant.name))?;
            let mut value =
                http::HeaderValue::from_str(&template.replace("{}", grant.value.expose()))
                    .map_err(|_| {
                        format!("secret `{}` makes an invalid header value", grant.name)
                    })?;
            value.set_sensitive(true);
            parts.headers.insert(name, value);
        }
    }
    Ok(())
}

/// Put the placeholders back where a response's headers echo a value (a host that reflects
/// request headers would otherwise hand it to the run). Bodies are not rewritten.
fn scrub(headers: &mut http::HeaderMap, secrets: &RunSecrets) {
    for value in headers.values_mut() {
        let mut bytes = value.as_bytes().to_vec();
        let mut changed = false;
        for grant in &secrets.grants {
            let secret = grant.value.expose().as_bytes();
            if !secret.is_empty() && bytes.windows(secret.len()).any(|w| w == secret) {
                bytes = replace_ignore_case(&bytes, secret, grant.placeholder.as_bytes());
                changed = true;
            }
        }
        if changed && let Ok(new) = http::HeaderValue::from_bytes(&bytes) {
            *value = new;
        }
    }
}

/// `haystack` with every `needle` (ASCII case-insensitively) replaced by `with`.
fn replace_ignore_case(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if !needle.is_empty()
            && haystack.len() - i >= needle.len()
            && haystack[i..i + needle.len()].eq_ignore_ascii_case(needle)
        {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(interceptor: Arc<Interceptor>) -> RunSecrets {
        RunSecrets {
            interceptor,
            grants: vec![
                SecretGrant {
                    name: "API_TOKEN".into(),
                    placeholder: "sbx-ph-aaaa".into(),
                    value: SecretValue::new("real-value-1"),
                    hosts: vec!["api.test".into()],
                    header: None,
                },
                SecretGrant {
                    name: "OTHER".into(),
                    placeholder: "sbx-ph-bbbb".into(),
                    value: SecretValue::new("real-value-2"),
                    hosts: vec!["*.other.test".into()],
                    header: Some(("X-Key".into(), "key {}".into())),
                },
            ],
        }
    }

    fn interceptor() -> (tempfile::TempDir, Arc<Interceptor>) {
        let dir = tempfile::tempdir().unwrap();
        let ca = EgressCa::load_or_create(&dir.path().join("ca")).unwrap();
        (dir, Arc::new(Interceptor::new(ca, None).unwrap()))
    }

    fn parts(uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut request = http::Request::builder().uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_ca_is_kept_private_and_reused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let first = EgressCa::load_or_create(&ca_dir).unwrap();
        let second = EgressCa::load_or_create(&ca_dir).unwrap();
        assert_eq!(first.cert_pem(), second.cert_pem());
        let mode = |p: &Path| fs_err::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&ca_dir), 0o700);
        assert_eq!(mode(&ca_dir.join(CA_KEY)), 0o600);
        // A leaf for a host chains to the kept certificate.
        let (chain, _) = second.leaf("api.test").unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], first.cert_der);
    }

    #[test]
    fn placeholders_become_values_only_for_their_hosts() {
        let (_dir, interceptor) = interceptor();
        let secrets = secrets(interceptor);
        let mut request = parts(
            "/v1?q=1",
            &[("Authorization", "Bearer SBX-PH-AAAA"), ("Accept", "*/*")],
        );
        rewrite(&mut request, &secrets, "api.test").unwrap();
        assert_eq!(request.headers["authorization"], "Bearer real-value-1");
        assert!(request.headers["authorization"].is_sensitive());
        assert!(request.headers.get("x-key").is_none());
        // Another secret's placeholder to this host: refused.
        let mut request = parts("/", &[("X-Other", "sbx-ph-bbbb")]);
        let refused = rewrite(&mut request, &secrets, "api.test").unwrap_err();
        assert!(
            refused.contains("secret `OTHER`") && refused.contains("*.other.test"),
            "{refused}"
        );
        // In the URL: refused even to its own host.
        let mut request = parts("/x?token=sbx-ph-aaaa", &[]);
        let refused = rewrite(&mut request, &secrets, "api.test").unwrap_err();
        assert!(refused.contains("URL"), "{refused}");
        // A request naming another host on this connection: refused.
        let mut request = parts(
            "/",
            &[("Host", "evil.test"), ("Authorization", "sbx-ph-aaaa")],
        );
        let refused = rewrite(&mut request, &secrets, "api.test").unwrap_err();
        assert!(refused.contains("`evil.test`"), "{refused}");
        let mut request = parts(
            "/",
            &[("Host", "API.test:443"), ("Authorization", "sbx-ph-aaaa")],
        );
        rewrite(&mut request, &secrets, "api.test").unwrap();
        // The header secret is set for its hosts.
        let mut request = parts("/", &[("X-Key", "mine")]);
        rewrite(&mut request, &secrets, "a.other.test").unwrap();
        assert_eq!(request.headers["x-key"], "key real-value-2");
        assert_eq!(request.headers.get_all("x-key").iter().count(), 1);
    }

    #[test]
    fn names_and_clear_text_are_checked() {
        let (_dir, interceptor) = interceptor();
        let secrets = secrets(interceptor);
        assert!(secrets.refuses_name("sbx-ph-aaaa.evil.test").is_some());
        assert!(secrets.refuses_name("api.test").is_none());
        let head = b"GET /?k=sbx-ph-aaaa HTTP/1.1\r\nHost: api.test\r\n\r\n";
        assert!(
            secrets
                .refuses_clear_text("api.test", head)
                .unwrap()
                .contains("HTTPS only")
        );
        assert!(
            secrets
                .refuses_clear_text("evil.test", head)
                .unwrap()
                .contains("not among its hosts")
        );
        assert!(secrets.intercepts(&Target {
            host: "api.test".into(),
            port: 443
        }));
        assert!(!secrets.intercepts(&Target {
            host: "api.test".into(),
            port: 80
        }));
        assert!(!secrets.intercepts(&Target {
            host: "other.test".into(),
            port: 443
        }));
        assert!(secrets.intercepts(&Target {
            host: "x.other.test".into(),
            port: 443
        }));
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "x-echo",
            http::HeaderValue::from_static("Bearer real-value-1"),
        );
        scrub(&mut headers, &secrets);
        assert_eq!(headers["x-echo"], "Bearer sbx-ph-aaaa");
    }

    #[test]
    fn the_bundle_holds_the_host_roots_and_the_ca() {
        let (_dir, interceptor) = interceptor();
        let bundle = interceptor.sandbox_bundle();
        assert!(bundle.ends_with(interceptor.ca.cert_pem()));
        assert!(bundle.matches("BEGIN CERTIFICATE").count() > 1);
        assert!(!bundle.contains("PRIVATE KEY"));
    }
}
