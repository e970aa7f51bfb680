//! The run proxy: the only way out of a run whose network policy is `on` or `allow:`.
//!
//! Such a run keeps its own network namespace (loopback only), exactly like a run without
//! network. Its one way out is a Unix socket in its input directory ([`SOCKET_NAME`]), served
//! by a [`RunProxy`] in the server; a bridge the runner starts before any user code forwards
//! `127.0.0.1:`[`crate::BRIDGE_PORT`] inside to that socket, and the run is told
//! `HTTP(S)_PROXY` / `ALL_PROXY` ([`run_proxy_env`]). One proxy serves one run (or one
//! session), so its log ([`RunProxy::log`]) is that run's `network_log`.
//!
//! The proxy speaks HTTP `CONNECT`, plain HTTP in absolute form, and SOCKS5 with remote name
//! resolution (`socks5h://`), told apart by the first byte. Each connection is decided by
//! [`NetRules`] in this order, and every decision is logged with its reason:
//! 1. the destination is a host *name*: IP literals and numeric spellings (`127.1`,
//!    `0x7f000001`, `2130706433`, `[::ffff:127.0.0.1]`) are refused unless the operator
//!    allows raw addresses;
//! 2. the name matches the allowlist (`name` exactly, `*.suffix` for any name below it;
//!    policy `on` allows any name);
//! 3. the port is allowed (80 and 443 unless the operator says otherwise);
//! 4. the proxy resolves the name once (hickory-resolver) and every address must be public:
//!    loopback, link-local (cloud metadata), RFC 1918, CGNAT, ULA, reserved ranges, IPv6
//!    forms of these and the server's own addresses are refused unless the operator lists an
//!    exception; the proxy then connects only to an address it checked (no second lookup, so
//!    a name that rebinds between two lookups gains nothing);
//! 5. on port 443, the TLS ClientHello's server name (SNI) must equal the requested name:
//!    the client's first bytes are read and checked *before* the proxy connects anywhere;
//! 6. per-run caps: connections, bytes (both directions, all connections together), and the
//!    time one connection may stay open.
//!
//! Installs use the same proxy with other rules ([`NetRules::trusted`] for the configured
//! package indexes, which skip steps 1-4, and [`NetRules::upstream`] to chain through the
//! operator's own HTTP proxy): see [`crate::EgressRules`].

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ipnet::IpNet;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixListener, UnixStream};

use crate::intercept::RunSecrets;

/// The proxy socket's file name in the run's input directory (so it appears at
/// `/snakebox/egress.sock` inside on every launch path: cold, pooled, forked, sessions).
pub const SOCKET_NAME: &str = "egress.sock";

/// Largest request head the proxy reads.
const MAX_HEAD: usize = 32 * 1024;
/// Time to send a request head (or a SOCKS request, or a ClientHello).
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Time to resolve a name and to connect.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest TLS record the proxy waits for to read a ClientHello (a record is at most 16 KiB).
const MAX_CLIENT_HELLO: usize = 16 * 1024 + 5;
/// Most decisions kept per run (later ones are counted, not kept).
const MAX_LOG: usize = 500;

/// Which names a run may reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Names {
    /// Any name (policy `on`).
    Any,
    /// Only these: `name` exactly, `*.suffix` for any name below `suffix`.
    Only(Vec<String>),
}

impl Names {
    /// Whether `host` (lower case, no trailing dot) is allowed.
    #[must_use]
    pub fn allows(&self, host: &str) -> bool {
        match self {
            Names::Any => true,
            Names::Only(patterns) => patterns.iter().any(|pattern| name_matches(pattern, host)),
        }
    }
}

/// Whether `host` matches `pattern` (`name` or `*.suffix`), case-insensitively.
#[must_use]
pub fn name_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
        None => host == pattern,
    }
}

/// Per-run caps of the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetCaps {
    /// Connections allowed per run.
    pub connections: u64,
    /// Bytes through the proxy per run, both directions, all connections together.
    pub bytes: u64,
    /// How long one connection may stay open.
    pub connection_time: Duration,
}

impl Default for NetCaps {
    fn default() -> Self {
        Self {
            connections: 256,
            bytes: 1 << 30,
            connection_time: Duration::from_secs(600),
        }
    }
}

/// How a run proxy decides (see the module documentation for the order of the checks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetRules {
    /// Which names may be reached.
    pub names: Names,
    /// Which ports may be reached.
    pub ports: Vec<u16>,
    /// Whether IP literals are accepted as destinations (their address is still checked).
    pub allow_ip_literals: bool,
    /// Address ranges reachable although not public (the operator's exceptions).
    pub exceptions: Vec<IpNet>,
    /// Per-run caps.
    pub caps: NetCaps,
    /// Destinations the operator configured, as `(host, port)` (the package indexes of an
    /// install): allowed on their own port whatever their name, spelling or address (an index
    /// may be on loopback or a private range). Steps 1-4 do not apply to them.
    pub trusted: Vec<(String, u16)>,
    /// The operator's own HTTP proxy: allowed connections are chained through it (after the
    /// same checks), except to hosts in [`NetRules::no_proxy`]. Never serialised (it may hold
    /// a credential).
    #[serde(skip)]
    pub upstream: Option<Upstream>,
    /// Hosts reached directly although there is an upstream proxy (`NO_PROXY` entries:
    /// `host`, `.domain` or `domain` for the domain and its subdomains, `*` for all).
    pub no_proxy: Vec<String>,
    /// Whom the proxy serves, for its messages.
    pub purpose: Purpose,
}

/// Whom a proxy serves: a run (or session), or an install (the downloader).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// A run or a session: its allowlist is the network policy, narrowed by the call.
    #[default]
    Run,
    /// An install: its allowlist is `[network] install_hosts` (besides the indexes).
    Install,
}

impl Purpose {
    fn allowlist(self) -> &'static str {
        match self {
            Purpose::Run => "this run's allowlist",
            Purpose::Install => "the install hosts (`[network] install_hosts`)",
        }
    }

    fn who(self) -> &'static str {
        match self {
            Purpose::Run => "runs",
            Purpose::Install => "installs",
        }
    }

    fn whose(self) -> &'static str {
        match self {
            Purpose::Run => "the run's",
            Purpose::Install => "the install's",
        }
    }
}

impl NetRules {
    /// The rules of policy `on` (`Names::Any`) or `allow:` with the defaults: ports 80 and
    /// 443, names only, no exceptions, default caps, nothing trusted, no upstream proxy.
    #[must_use]
    pub fn new(names: Names) -> Self {
        Self {
            names,
            ports: vec![80, 443],
            allow_ip_literals: false,
            exceptions: Vec::new(),
            caps: NetCaps::default(),
            trusted: Vec::new(),
            upstream: None,
            no_proxy: Vec::new(),
            purpose: Purpose::Run,
        }
    }

    /// Whether `host:port` is one of the operator's configured destinations.
    #[must_use]
    pub fn is_trusted(&self, host: &str, port: u16) -> bool {
        let host = normalize_host(host);
        self.trusted
            .iter()
            .any(|(h, p)| normalize_host(h) == host && *p == port)
    }

    /// The upstream proxy a connection to `host` goes through, if any (`NO_PROXY` honoured).
    #[must_use]
    pub fn upstream_for(&self, host: &str) -> Option<&Upstream> {
        let bypass = self.no_proxy.iter().any(|entry| {
            let entry = entry.trim().trim_start_matches('.').to_ascii_lowercase();
            entry == "*" || name_matches(&entry, host) || name_matches(&format!("*.{entry}"), host)
        });
        self.upstream.as_ref().filter(|_| !bypass)
    }
}

/// An upstream HTTP proxy (`http://[user:password@]host[:port]`): the operator's own, which
/// installs are chained through.
#[derive(Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Its host.
    pub host: String,
    /// Its port (default 80).
    pub port: u16,
    /// `Proxy-Authorization` value, from the URL's user information.
    authorization: Option<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the credential.
        f.debug_struct("Upstream")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("authorization", &self.authorization.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Upstream {
    /// Parse a proxy URL. Only `http://` proxies can be chained.
    ///
    /// # Errors
    /// A text naming what is wrong with the URL (never the URL itself: it may hold a password).
    pub fn parse(url: &str) -> Result<Upstream, String> {
        use base64::Engine as _;
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| "only an http:// upstream proxy can be chained".to_owned())?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport)
            .ok_or_else(|| "the proxy URL has no valid host".to_owned())?;
        Ok(Upstream {
            host,
            port: port.unwrap_or(80),
            authorization: userinfo.map(|info| {
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(info)
                )
            }),
        })
    }
}

/// One decision of a run proxy: an entry of the run's `network_log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetDecision {
    /// The destination as asked (a name, or an address when one was given).
    pub host: String,
    /// The port as asked.
    pub port: u16,
    /// Whether the connection was made.
    pub allowed: bool,
    /// Why: `allowed`, or what the policy refused, or the network error.
    pub reason: String,
    /// The address connected to, when one was.
    pub address: Option<String>,
    /// Bytes from the run to the destination.
    pub bytes_sent: u64,
    /// Bytes from the destination to the run.
    pub bytes_received: u64,
}

/// The name server(s) a run proxy resolves with.
#[derive(Clone)]
pub struct NetResolver {
    inner: Arc<hickory_resolver::TokioResolver>,
    description: String,
}

impl std::fmt::Debug for NetResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

impl NetResolver {
    /// A resolver asking `servers` (`ip` or `ip:port`, UDP and TCP), or the host's
    /// `/etc/resolv.conf` when `servers` is empty. Answers are not cached: each connection
    /// resolves anew and connects to what it checked.
    ///
    /// # Errors
    /// When the host's resolver configuration cannot be read.
    pub fn new(servers: &[SocketAddr]) -> Result<NetResolver, String> {
        use hickory_resolver::config::{
            ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts,
        };
        use hickory_resolver::net::runtime::TokioRuntimeProvider;
        let (mut builder, description) = if servers.is_empty() {
            (
                hickory_resolver::TokioResolver::builder_tokio().map_err(|err| {
                    format!("could not read the host's resolver configuration: {err}")
                })?,
                "the host's resolv.conf".to_owned(),
            )
        } else {
            let name_servers = servers
                .iter()
                .map(|server| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = server.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = server.port();
                    let mut config = NameServerConfig::udp_and_tcp(server.ip());
                    config.connections = vec![udp, tcp];
                    config
                })
                .collect();
            let shown: Vec<String> = servers.iter().map(ToString::to_string).collect();
            (
                hickory_resolver::Resolver::builder_with_config(
                    ResolverConfig::from_name_servers(name_servers),
                    TokioRuntimeProvider::default(),
                ),
                format!("name servers {}", shown.join(", ")),
            )
        };
        let options: &mut ResolverOpts = builder.options_mut();
        options.cache_size = 0;
        options.timeout = Duration::from_secs(5);
        options.attempts = 2;
        let inner = builder
            .build()
            .map_err(|err| format!("could not build the resolver: {err}"))?;
        Ok(NetResolver {
            inner: Arc::new(inner),
            description,
        })
    }

    /// What it asks, for `check_environment`.
    #[must_use]
    pub fn description(&self) -> &str {
        &self.description
    }

    async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        // A fully qualified name: no search domains appended.
        let fqdn = format!("{host}.");
        match tokio::time::timeout(CONNECT_TIMEOUT, self.inner.lookup_ip(fqdn.as_str())).await {
            Err(_) => Err(format!("resolving `{host}` timed out")),
            Ok(Err(err)) => Err(format!("`{host}` does not resolve: {err}")),
            Ok(Ok(found)) => Ok(found.iter().collect()),
        }
    }
}

/// What one run proxy shares with its connections.
pub(crate) struct Shared {
    pub(crate) rules: NetRules,
    resolver: NetResolver,
    own_addresses: Vec<IpAddr>,
    log: Mutex<Log>,
    connections: AtomicU64,
    bytes: AtomicU64,
    /// The secrets granted to the run (see [`crate::intercept`]); set after start, as a
    /// pre-started sandbox's proxy learns its run only when the run comes.
    secrets: Mutex<Option<Arc<RunSecrets>>>,
}

#[derive(Default)]
struct Log {
    entries: Vec<Entry>,
    dropped: u64,
}

struct Entry {
    decision: NetDecision,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

/// A run proxy listening on `<dir>/egress.sock`. Dropping it stops it, closes every
/// connection it holds and removes the socket.
pub struct RunProxy {
    path: PathBuf,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RunProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunProxy")
            .field("path", &self.path)
            .finish()
    }
}

impl RunProxy {
    /// Listen on [`SOCKET_NAME`] in `dir` (the run's input directory; any length of path) and
    /// serve the run by `rules`. Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// When the socket cannot be created.
    pub fn start(dir: &Path, rules: NetRules, resolver: NetResolver) -> std::io::Result<RunProxy> {
        let path = dir.join(SOCKET_NAME);
        // A socket path is limited to 107 bytes and data directories can be longer: bind
        // through a descriptor of the directory.
        let handle = fs_err::File::open(dir)?;
        // A socket left by an earlier server (a session's input directory outlives it).
        let _ = fs_err::remove_file(&path);
        let short = PathBuf::from(format!(
            "/proc/self/fd/{}/{SOCKET_NAME}",
            handle.as_raw_fd()
        ));
        let std_listener = std::os::unix::net::UnixListener::bind(&short)
            .map_err(|err| std::io::Error::new(err.kind(), format!("{}: {err}", path.display())))?;
        // The run's uid connects to it; the directory decides who can reach it.
        fs_err::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
        std_listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(std_listener)?;
        drop(handle);
        let shared = Arc::new(Shared {
            rules,
            resolver,
            own_addresses: own_addresses(),
            log: Mutex::default(),
            connections: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            secrets: Mutex::new(None),
        });
        let serving = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            // Connections live in this set: aborting the task drops it, which ends them all.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            let shared = Arc::clone(&serving);
                            connections.spawn(async move { serve(stream, &shared).await });
                        }
                        Err(_) => break,
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(RunProxy { path, shared, task })
    }

    /// The socket's path on the host.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every decision so far, with the bytes counted up to now.
    #[must_use]
    pub fn log(&self) -> Vec<NetDecision> {
        let log = self
            .shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut entries: Vec<NetDecision> = log
            .entries
            .iter()
            .map(|entry| NetDecision {
                bytes_sent: entry.sent.load(Ordering::Relaxed),
                bytes_received: entry.received.load(Ordering::Relaxed),
                ..entry.decision.clone()
            })
            .collect();
        if log.dropped > 0 {
            entries.push(NetDecision {
                host: String::new(),
                port: 0,
                allowed: false,
                reason: format!("{} more decisions not kept", log.dropped),
                address: None,
                bytes_sent: 0,
                bytes_received: 0,
            });
        }
        entries
    }

    /// Grant the run `secrets` (or none): from now on its connections are served with them
    /// (see [`RunSecrets`]).
    pub fn grant(&self, secrets: Option<RunSecrets>) {
        *self
            .shared
            .secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = secrets.map(Arc::new);
    }

    /// [`RunProxy::log`], then forget it (a session's next call starts a new log).
    #[must_use]
    pub fn take_log(&self) -> Vec<NetDecision> {
        let entries = self.log();
        let mut log = self
            .shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        log.entries.clear();
        log.dropped = 0;
        entries
    }
}

impl Drop for RunProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = fs_err::remove_file(&self.path);
    }
}

/// The proxy variables a run needs: `HTTP(S)_PROXY` and `ALL_PROXY` (both spellings) at the
/// bridge, and an empty `NO_PROXY`. The same port also speaks SOCKS5 (`socks5h://`). The
/// bridge is the installer's too, so these are [`crate::EgressProxy::proxy_env`]'s.
#[must_use]
pub fn run_proxy_env() -> Vec<(String, String)> {
    crate::EgressProxy::proxy_env()
}

/// The host's own interface addresses (refused as destinations: a service bound to one of
/// them is the host's, whatever range it is in).
fn own_addresses() -> Vec<IpAddr> {
    let Ok(addresses) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addresses
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            if let Some(v4) = address.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

impl Shared {
    /// The run's secrets, if it has any.
    pub(crate) fn secrets(&self) -> Option<Arc<RunSecrets>> {
        self.secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn record(&self, decision: NetDecision) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        if decision.allowed {
            tracing::debug!(?decision, "run network allowed");
        } else {
            tracing::info!(?decision, "run network refused");
        }
        let sent = Arc::new(AtomicU64::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log.entries.len() < MAX_LOG {
            log.entries.push(Entry {
                decision,
                sent: Arc::clone(&sent),
                received: Arc::clone(&received),
            });
        } else {
            log.dropped += 1;
        }
        (sent, received)
    }
}

/// How the client asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Connect,
    PlainHttp,
    Socks5,
}

/// A destination as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// Why a destination is refused, or the addresses to connect to.
pub(crate) type Verdict = Result<Vec<SocketAddr>, String>;

async fn serve(mut client: UnixStream, shared: &Arc<Shared>) {
    let mut first = [0_u8; 1];
    let Ok(Ok(1)) = tokio::time::timeout(HEAD_TIMEOUT, client.read(&mut first)).await else {
        return;
    };
    if first[0] == 5 {
        serve_socks(client, shared).await;
    } else {
        serve_http(client, shared, first[0]).await;
    }
}

async fn serve_http(mut client: UnixStream, shared: &Arc<Shared>, first: u8) {
    let Some((head, rest)) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client, first))
        .await
        .ok()
        .flatten()
    else {
        let _ = client
            .write_all(&http_reply(400, "unreadable request"))
            .await;
        return;
    };
    let request = match parse_http_request(&head) {
        Ok(request) => request,
        Err(reason) => {
            let _ = client.write_all(&http_reply(400, &reason)).await;
            return;
        }
    };
    let protocol = if request.connect {
        Protocol::Connect
    } else {
        Protocol::PlainHttp
    };
    let target = request.target.clone();
    let secrets = shared.secrets();
    if let Some(secrets) = &secrets {
        let refused = secrets.refuses_name(&target.host).or_else(|| {
            (protocol == Protocol::PlainHttp)
                .then(|| secrets.refuses_clear_text(&target.host, &head))
                .flatten()
        });
        if let Some(reason) = refused {
            let _ = client.write_all(&http_reply(403, &reason)).await;
            shared.record(denied(&target, reason));
            return;
        }
    }
    let addresses = match decide(shared, &target).await {
        Ok(addresses) => addresses,
        Err(reason) => {
            let _ = client.write_all(&http_reply(403, &reason)).await;
            shared.record(denied(&target, reason));
            return;
        }
    };
    let mut early = rest;
    if protocol == Protocol::Connect {
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        if let Some(secrets) = secrets.filter(|s| s.intercepts(&target)) {
            crate::intercept::serve_intercepted(
                client, early, shared, secrets, &target, &addresses,
            )
            .await;
            return;
        }
        if target.port == 443 {
            match check_client_hello(&mut client, &target.host, early).await {
                Ok(bytes) => early = bytes,
                Err(reason) => {
                    shared.record(denied(&target, reason));
                    return;
                }
            }
        }
    } else {
        let head = match shared.rules.upstream_for(&target.host) {
            Some(upstream) => request.proxy_form(upstream),
            None => request.origin_form.clone(),
        };
        early = [head.as_bytes(), &early].concat();
    }
    tunnel(client, shared, &target, &addresses, &early, protocol).await;
}

async fn serve_socks(mut client: UnixStream, shared: &Arc<Shared>) {
    let Some(target) = tokio::time::timeout(HEAD_TIMEOUT, socks_handshake(&mut client))
        .await
        .ok()
        .flatten()
    else {
        return;
    };
    let target = match target {
        Ok(target) => target,
        Err((target, reason)) => {
            // Command not supported (7) or address type not supported (8).
            let _ = client.write_all(&socks_reply(7)).await;
            shared.record(denied(&target, reason));
            return;
        }
    };
    let secrets = shared.secrets();
    if let Some(reason) = secrets.as_ref().and_then(|s| s.refuses_name(&target.host)) {
        let _ = client.write_all(&socks_reply(2)).await;
        shared.record(denied(&target, reason));
        return;
    }
    let addresses = match decide(shared, &target).await {
        Ok(addresses) => addresses,
        Err(reason) => {
            // Connection not allowed by ruleset.
            let _ = client.write_all(&socks_reply(2)).await;
            shared.record(denied(&target, reason));
            return;
        }
    };
    if client.write_all(&socks_reply(0)).await.is_err() {
        return;
    }
    if let Some(secrets) = secrets.filter(|s| s.intercepts(&target)) {
        crate::intercept::serve_intercepted(
            client,
            Vec::new(),
            shared,
            secrets,
            &target,
            &addresses,
        )
        .await;
        return;
    }
    let mut early = Vec::new();
    if target.port == 443 {
        match check_client_hello(&mut client, &target.host, early).await {
            Ok(bytes) => early = bytes,
            Err(reason) => {
                shared.record(denied(&target, reason));
                return;
            }
        }
    }
    tunnel(
        client,
        shared,
        &target,
        &addresses,
        &early,
        Protocol::Socks5,
    )
    .await;
}

pub(crate) fn denied(target: &Target, reason: String) -> NetDecision {
    NetDecision {
        host: target.host.clone(),
        port: target.port,
        allowed: false,
        reason,
        address: None,
        bytes_sent: 0,
        bytes_received: 0,
    }
}

/// Connect to the first checked address that answers and copy both ways under the caps.
async fn tunnel(
    mut client: UnixStream,
    shared: &Shared,
    target: &Target,
    addresses: &[SocketAddr],
    early: &[u8],
    protocol: Protocol,
) {
    // A run with secrets: what it sends here in clear text must hold no placeholder (this is
    // not a secret's host, or not over TLS): refused before connecting when its first bytes
    // hold one, cut before forwarding when later bytes do.
    let placeholders = shared
        .secrets()
        .map(|s| s.placeholders())
        .unwrap_or_default();
    if let Some(found) = scan(early, &placeholders, &[]) {
        let reason = placeholder_refusal(shared, &found, target);
        if protocol == Protocol::PlainHttp {
            let _ = client.write_all(&http_reply(403, &reason)).await;
        }
        shared.record(denied(target, reason));
        return;
    }
    let connected = match shared.rules.upstream_for(&target.host) {
        Some(proxy) => connect_through(proxy, target, protocol != Protocol::PlainHttp).await,
        None => connect_direct(target, addresses).await,
    };
    let (upstream, address, reason) = match connected {
        Ok(connected) => connected,
        Err(reason) => {
            if protocol == Protocol::PlainHttp {
                let _ = client.write_all(&http_reply(502, &reason)).await;
            }
            shared.record(denied(target, reason));
            return;
        }
    };
    let (sent, received) = shared.record(NetDecision {
        host: target.host.clone(),
        port: target.port,
        allowed: true,
        reason: reason.to_owned(),
        address: Some(address),
        bytes_sent: 0,
        bytes_received: 0,
    });
    let (mut up_read, mut up_write) = upstream.into_split();
    let (mut client_read, mut client_write) = client.split();
    if !early.is_empty() {
        if !within_cap(shared, early.len()) || up_write.write_all(early).await.is_err() {
            return;
        }
        sent.fetch_add(early.len() as u64, Ordering::Relaxed);
    }
    let cut = tokio::sync::Notify::new();
    let outgoing = async {
        if let Some(found) = copy_counted(
            &mut client_read,
            &mut up_write,
            shared,
            &sent,
            &placeholders,
            early,
        )
        .await
        {
            shared.record(denied(target, placeholder_refusal(shared, &found, target)));
            cut.notify_one();
        }
    };
    let incoming = copy_counted(&mut up_read, &mut client_write, shared, &received, &[], &[]);
    let both = async {
        tokio::select! {
            _ = async { tokio::join!(outgoing, incoming) } => {}
            () = cut.notified() => {}
        }
    };
    let _ = tokio::time::timeout(shared.rules.caps.connection_time, both).await;
}

/// A stream to the destination: the first checked address that answers. Returns the stream,
/// the address and the reason logged.
pub(crate) async fn connect_direct(
    target: &Target,
    addresses: &[SocketAddr],
) -> Result<(TcpStream, String, &'static str), String> {
    for address in addresses {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await
        {
            return Ok((stream, address.to_string(), "allowed"));
        }
    }
    let shown: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    Err(format!(
        "network error: no address of `{}` answered ({})",
        target.host,
        shown.join(", ")
    ))
}

/// A stream to the destination through the operator's proxy: for a tunnel (`CONNECT`,
/// SOCKS5) the proxy is asked to `CONNECT` (with its credential) and must answer 200; for
/// plain HTTP the caller sends the request in proxy form. The operator's proxy is resolved
/// by the system's resolver and not checked: it is the operator's choice.
pub(crate) async fn connect_through(
    proxy: &Upstream,
    target: &Target,
    tunnel: bool,
) -> Result<(TcpStream, String, &'static str), String> {
    let shown = format!("the operator's proxy {}:{}", proxy.host, proxy.port);
    let addresses: Vec<SocketAddr> = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::lookup_host((proxy.host.as_str(), proxy.port)),
    )
    .await
    .map_err(|_| format!("network error: resolving {shown} timed out"))?
    .map_err(|err| format!("network error: {shown} does not resolve: {err}"))?
    .collect();
    let mut connected = None;
    for address in &addresses {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await
        {
            connected = Some(stream);
            break;
        }
    }
    let mut stream = connected.ok_or_else(|| format!("network error: {shown} did not answer"))?;
    let reason = "allowed (through the operator's proxy)";
    if !tunnel {
        return Ok((stream, shown, reason));
    }
    let authority = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port)
    } else {
        format!("{}:{}", target.host, target.port)
    };
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(authorization) = &proxy.authorization {
        head.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|err| format!("network error: {shown} closed the connection: {err}"))?;
    // Read the answer byte by byte up to its end: nothing after it may be lost.
    let mut answer = Vec::new();
    let read = async {
        let mut byte = [0_u8; 1];
        while !answer.ends_with(b"\r\n\r\n") && answer.len() < MAX_HEAD {
            if stream.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            answer.push(byte[0]);
        }
        Some(())
    };
    if tokio::time::timeout(HEAD_TIMEOUT, read)
        .await
        .ok()
        .flatten()
        .is_none()
    {
        return Err(format!("network error: {shown} did not answer the CONNECT"));
    }
    let status = String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    if status == "200" {
        Ok((stream, shown, reason))
    } else {
        Err(format!(
            "network error: {shown} refused the CONNECT (status {status})"
        ))
    }
}

/// Whether `n` more bytes fit in the run's byte cap (and count them).
pub(crate) fn within_cap(shared: &Shared, n: usize) -> bool {
    let n = n as u64;
    let before = shared.bytes.fetch_add(n, Ordering::Relaxed);
    before + n <= shared.rules.caps.bytes
}

/// Copy under the byte cap; with `placeholders`, stop before forwarding a chunk that holds
/// one (across chunk boundaries too, `before` being what was forwarded just before) and
/// return it.
async fn copy_counted<R, W>(
    reader: &mut R,
    writer: &mut W,
    shared: &Shared,
    counter: &AtomicU64,
    placeholders: &[Vec<u8>],
    before: &[u8],
) -> Option<Vec<u8>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0_u8; 16 * 1024];
    let longest = placeholders.iter().map(Vec::len).max().unwrap_or(0);
    let mut tail: Vec<u8> = before[before.len().saturating_sub(longest)..].to_vec();
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if longest > 0 {
            if let Some(found) = scan(&buf[..n], placeholders, &tail) {
                return Some(found);
            }
            tail.extend_from_slice(&buf[..n]);
            let keep = tail.len().saturating_sub(longest);
            tail.drain(..keep);
        }
        if !within_cap(shared, n) || writer.write_all(&buf[..n]).await.is_err() {
            break;
        }
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = writer.shutdown().await;
    None
}

/// The placeholder `chunk` holds (with the end of what came before, `tail`), if any.
fn scan(chunk: &[u8], placeholders: &[Vec<u8>], tail: &[u8]) -> Option<Vec<u8>> {
    if placeholders.is_empty() {
        return None;
    }
    let joined = [tail, chunk].concat();
    placeholders
        .iter()
        .find(|p| !p.is_empty() && joined.windows(p.len()).any(|w| w.eq_ignore_ascii_case(p)))
        .cloned()
}

/// The refusal of a connection cut for carrying `placeholder` to `target`.
fn placeholder_refusal(shared: &Shared, placeholder: &[u8], target: &Target) -> String {
    let name = shared
        .secrets()
        .and_then(|s| {
            s.grants
                .iter()
                .find(|g| g.placeholder.as_bytes().eq_ignore_ascii_case(placeholder))
                .map(|g| g.name.clone())
        })
        .unwrap_or_default();
    format!(
        "the run sent the placeholder of secret `{name}` to `{}` in clear text, where the secret does not go: those bytes were not forwarded and the connection was closed",
        target.host
    )
}

/// The checks of the module documentation, steps 1-4 and the connection cap: the addresses
/// to connect to, or why not. A trusted destination (a configured index) skips steps 1-4;
/// one reached through the upstream proxy is not even resolved here (empty addresses).
async fn decide(shared: &Shared, target: &Target) -> Verdict {
    let rules = &shared.rules;
    let purpose = rules.purpose;
    let host = target.host.as_str();
    let trusted = rules.is_trusted(host, target.port);
    let literal = ip_literal(host);
    if !trusted {
        if literal.is_some() && !rules.allow_ip_literals {
            return Err(format!(
                "`{host}` is an IP address: only host names are allowed (this server does not allow raw addresses)"
            ));
        }
        if literal.is_none() && !is_host_name(host) {
            return Err(format!("`{host}` is not a valid host name"));
        }
        // An address is held to the allowlist as a name is: only listed, unless any name is.
        if !rules.names.allows(host) {
            return Err(format!("`{host}` is not in {}", purpose.allowlist()));
        }
        if !rules.ports.contains(&target.port) {
            let ports: Vec<String> = rules.ports.iter().map(ToString::to_string).collect();
            return Err(format!(
                "port {} is not allowed (allowed: {})",
                target.port,
                ports.join(", ")
            ));
        }
    }
    if shared.connections.fetch_add(1, Ordering::Relaxed) >= rules.caps.connections {
        return Err(format!(
            "{} cap of {} connections is reached",
            purpose.whose(),
            rules.caps.connections
        ));
    }
    if shared.bytes.load(Ordering::Relaxed) >= rules.caps.bytes {
        return Err(format!(
            "{} cap of {} bytes through the proxy is reached",
            purpose.whose(),
            rules.caps.bytes
        ));
    }
    // A configured index behind the operator's proxy need not resolve here.
    if trusted && rules.upstream_for(host).is_some() {
        return Ok(Vec::new());
    }
    let found = match literal {
        Some(ip) => vec![ip],
        None => shared.resolver.lookup(host).await?,
    };
    if found.is_empty() {
        return Err(format!("network error: `{host}` has no address"));
    }
    // Every address must pass: a name that answers with a private address besides public
    // ones is refused whole.
    for ip in found.iter().filter(|_| !trusted) {
        if let Some(class) = refused_class(*ip, &shared.own_addresses, &rules.exceptions) {
            return Err(format!(
                "`{host}` resolves to {ip} ({class}), which {} may not reach",
                purpose.who()
            ));
        }
    }
    Ok(found
        .into_iter()
        .map(|ip| SocketAddr::new(ip, target.port))
        .collect())
}

/// Why `ip` may not be reached, or `None` when it may: not public (see
/// [`is_public`]) or one of the server's own addresses, unless an exception covers it.
pub(crate) fn refused_class(
    ip: IpAddr,
    own: &[IpAddr],
    exceptions: &[IpNet],
) -> Option<&'static str> {
    if exceptions.iter().any(|net| net.contains(&ip)) {
        return None;
    }
    if is_public(ip) {
        return (own.contains(&ip)).then_some("an address of this server");
    }
    let v4 = match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    if let (IpAddr::V6(_), Some(_)) = (ip, v4) {
        return Some("an IPv4-mapped IPv6 address of a refused range");
    }
    Some(match v4 {
        Some(v4) if v4.is_loopback() => "loopback",
        Some(v4) if v4.is_link_local() => "link-local, where cloud metadata services live",
        Some(v4) if v4.is_private() => "a private RFC 1918 range",
        Some(v4) if v4.octets()[0] == 100 && (64..128).contains(&v4.octets()[1]) => {
            "the CGNAT range"
        }
        Some(_) => "a reserved, unspecified or multicast range",
        None => match ip {
            IpAddr::V6(v6) if v6.is_loopback() => "loopback",
            IpAddr::V6(v6) if (v6.segments()[0] & 0xfe00) == 0xfc00 => "a unique local (ULA) range",
            IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => "link-local",
            _ => "a reserved IPv6 range or an IPv6 form of a refused IPv4 address",
        },
    })
}

/// Whether an address is public: not loopback, unspecified, private (RFC 1918), CGNAT,
/// link-local (metadata services live at 169.254.169.254), multicast, broadcast, reserved
/// (240/4, 198.18/15, 192.0.0/24), ULA, site-local, or an IPv6 form of one of these
/// (IPv4-mapped, -compatible, NAT64, 6to4). Documentation ranges count as public: they reach
/// no host service, and some networks route them to real servers.
#[must_use]
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (b == 18 || b == 19))
                || a >= 240
                || (a == 192 && b == 0))
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let embedded = |hi: u16, lo: u16| {
                let [a, b] = hi.to_be_bytes();
                let [c, d] = lo.to_be_bytes();
                IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d))
            };
            // IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) embed an
            // IPv4 address a gateway may forward to.
            if s[..6] == [0, 0, 0, 0, 0, 0] && !v6.is_loopback() && !v6.is_unspecified() {
                return is_public(embedded(s[6], s[7]));
            }
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return is_public(embedded(s[6], s[7]));
            }
            if s[0] == 0x2002 {
                return is_public(embedded(s[1], s[2]));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0)
        }
    }
}

/// The address `host` spells, in any of the forms resolvers and URL parsers accept:
/// dotted, bracketed or bare IPv6, and the numeric IPv4 forms (`127.1`, `0x7f000001`,
/// `2130706433`, `0177.0.0.1`). A name whose last label is numeric is taken as an address
/// too (no top-level domain is numeric), so its value does not matter: it is never resolved.
pub(crate) fn ip_literal(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let bare = bare.split('%').next().unwrap_or(bare);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(ip);
    }
    let last = bare.trim_end_matches('.').rsplit('.').next().unwrap_or("");
    let numeric = |label: &str| {
        !label.is_empty()
            && (label.chars().all(|c| c.is_ascii_digit())
                || label
                    .strip_prefix("0x")
                    .or_else(|| label.strip_prefix("0X"))
                    .is_some_and(|hex| hex.chars().all(|c| c.is_ascii_hexdigit())))
    };
    if !numeric(last) {
        return None;
    }
    // inet_aton's forms: a, a.b, a.b.c, a.b.c.d, each part decimal, octal (0…) or hex (0x…).
    let parts: Vec<u64> = bare
        .trim_end_matches('.')
        .split('.')
        .map(|part| {
            let (digits, radix) =
                if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                    (hex, 16)
                } else if part.len() > 1 && part.starts_with('0') {
                    (&part[1..], 8)
                } else {
                    (part, 10)
                };
            u64::from_str_radix(digits, radix).ok()
        })
        .collect::<Option<Vec<u64>>>()
        .unwrap_or_default();
    let value = match parts.as_slice() {
        [a] => Some(*a),
        [a, b] if *a < 256 => Some((a << 24) | b),
        [a, b, c] if *a < 256 && *b < 256 => Some((a << 24) | (b << 16) | c),
        [a, b, c, d] if [a, b, c, d].iter().all(|p| **p < 256) => {
            Some((a << 24) | (b << 16) | (c << 8) | d)
        }
        _ => None,
    };
    // A numeric last label that is no valid address is still no name: refuse it as an
    // address (0.0.0.0 stands for it, which every check refuses).
    let value = value.filter(|v| *v <= u64::from(u32::MAX)).unwrap_or(0);
    Some(IpAddr::V4(std::net::Ipv4Addr::from(
        u32::try_from(value).unwrap_or(0),
    )))
}

/// Whether `host` is a DNS host name: 1-253 characters, labels of 1-63 letters, digits,
/// `-` or `_`, not starting or ending with `-`.
pub(crate) fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// Lower case, no trailing dot: the form names are checked and logged in.
fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// A parsed HTTP proxy request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HttpRequest {
    pub(crate) connect: bool,
    pub(crate) target: Target,
    /// For plain HTTP: the head to send to the server (origin form, `Host` set to the checked
    /// authority, `Connection: close`, proxy headers dropped).
    pub(crate) origin_form: String,
    /// For plain HTTP: the request line in absolute form (for an upstream proxy).
    pub(crate) proxy_line: String,
}

impl HttpRequest {
    /// The head for an upstream proxy: the absolute-form request line, its credential, then
    /// the origin form's headers.
    fn proxy_form(&self, upstream: &Upstream) -> String {
        let headers = self
            .origin_form
            .split_once("\r\n")
            .map_or("", |(_, headers)| headers);
        let mut head = self.proxy_line.clone();
        if let Some(authorization) = &upstream.authorization {
            head.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        head.push_str(headers);
        head
    }
}

/// Parse a proxy request head (`CONNECT host:port` or `METHOD http://host[:port]/path`).
pub(crate) fn parse_http_request(head: &[u8]) -> Result<HttpRequest, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("incomplete request head".into()),
        Err(err) => return Err(format!("malformed request: {err}")),
    }
    let method = request.method.unwrap_or_default();
    let path = request.path.unwrap_or_default();
    // A host that is only dots names nothing (found by the fuzzer: `http://.:8080/`).
    let named = |host: &str| {
        let host = normalize_host(host);
        if host.is_empty() {
            Err("the request names no host".to_owned())
        } else {
            Ok(host)
        }
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_host_port(path).ok_or("CONNECT needs host:port")?;
        let port = port.ok_or("CONNECT needs host:port")?;
        return Ok(HttpRequest {
            connect: true,
            target: Target {
                host: named(&host)?,
                port,
            },
            origin_form: String::new(),
            proxy_line: String::new(),
        });
    }
    let rest = path
        .strip_prefix("http://")
        .ok_or("only CONNECT and absolute http:// requests are proxied")?;
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err("user information in a proxied URL is not accepted".into());
    }
    let (host, port) = split_host_port(authority).ok_or("the URL has no valid host")?;
    let tail = if tail.starts_with('?') {
        format!("/{tail}")
    } else {
        tail.to_owned()
    };
    let version = if request.version == Some(0) {
        "1.0"
    } else {
        "1.1"
    };
    let mut origin_form = format!("{method} {tail} HTTP/{version}\r\nHost: {authority}\r\n");
    for header in request.headers.iter() {
        if [
            "host",
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|name| header.name.eq_ignore_ascii_case(name))
        {
            continue;
        }
        let value = String::from_utf8_lossy(header.value);
        origin_form.push_str(&format!("{}: {value}\r\n", header.name));
    }
    origin_form.push_str("Connection: close\r\n\r\n");
    Ok(HttpRequest {
        connect: false,
        target: Target {
            host: named(&host)?,
            port: port.unwrap_or(80),
        },
        origin_form,
        proxy_line: format!("{method} http://{authority}{tail} HTTP/{version}\r\n"),
    })
}

/// `host[:port]` or `[v6][:port]` (the brackets are kept off the host).
pub(crate) fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        let port = match rest.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if rest.is_empty() => None,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), Some(port.parse().ok()?))),
        None => Some((authority.to_owned(), None)),
    }
    .filter(|(host, _)| !host.is_empty())
}

/// Read up to the end of a request head; returns (head, bytes after it).
async fn read_head(stream: &mut UnixStream, first: u8) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    buf.push(first);
    let mut chunk = [0_u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

pub(crate) fn http_reply(status: u16, reason: &str) -> Vec<u8> {
    let text = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        _ => "Bad Gateway",
    };
    let body = format!("snakebox network policy: {reason}\n");
    format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn socks_reply(code: u8) -> Vec<u8> {
    vec![5, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// The SOCKS5 greeting and request (no authentication, `CONNECT` only). `None` when the
/// client went away or spoke something else; `Err` with the target and the reason for a
/// request the proxy does not serve.
async fn socks_handshake(client: &mut UnixStream) -> Option<Result<Target, (Target, String)>> {
    // The version byte (5) is read already.
    let mut count = [0_u8; 1];
    client.read_exact(&mut count).await.ok()?;
    let mut methods = vec![0_u8; usize::from(count[0])];
    client.read_exact(&mut methods).await.ok()?;
    if !methods.contains(&0) {
        let _ = client.write_all(&[5, 0xff]).await;
        return None;
    }
    client.write_all(&[5, 0]).await.ok()?;
    let mut request = [0_u8; 4];
    client.read_exact(&mut request).await.ok()?;
    if request[0] != 5 {
        return None;
    }
    let host = match request[3] {
        1 => {
            let mut octets = [0_u8; 4];
            client.read_exact(&mut octets).await.ok()?;
            std::net::Ipv4Addr::from(octets).to_string()
        }
        3 => {
            let mut len = [0_u8; 1];
            client.read_exact(&mut len).await.ok()?;
            let mut name = vec![0_u8; usize::from(len[0])];
            client.read_exact(&mut name).await.ok()?;
            normalize_host(&String::from_utf8_lossy(&name))
        }
        4 => {
            let mut octets = [0_u8; 16];
            client.read_exact(&mut octets).await.ok()?;
            std::net::Ipv6Addr::from(octets).to_string()
        }
        _ => return None,
    };
    let mut port = [0_u8; 2];
    client.read_exact(&mut port).await.ok()?;
    let target = Target {
        host,
        port: u16::from_be_bytes(port),
    };
    if request[1] != 1 {
        return Some(Err((
            target,
            "only SOCKS5 CONNECT is served (no BIND or UDP)".to_owned(),
        )));
    }
    Some(Ok(target))
}

/// Read the client's first TLS record (after `early`, bytes already read) and check that its
/// ClientHello names `host`. Returns the bytes read, to forward once connected.
async fn check_client_hello(
    client: &mut UnixStream,
    host: &str,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let read = async {
        loop {
            match client_hello_sni(&buf) {
                Hello::Incomplete if buf.len() < MAX_CLIENT_HELLO => {}
                Hello::Incomplete => return Err("the TLS ClientHello is too large".to_owned()),
                Hello::NotTls => {
                    return Err(
                        "port 443 carries TLS only: the first bytes were no TLS ClientHello"
                            .to_owned(),
                    );
                }
                // Clients send no server name for an address (RFC 6066): nothing to compare.
                Hello::NoName if ip_literal(host).is_some() => return Ok(()),
                Hello::NoName => {
                    return Err(format!(
                        "the TLS ClientHello names no server (SNI missing); it must name `{host}`"
                    ));
                }
                Hello::Name(name) if normalize_host(&name) == host => return Ok(()),
                Hello::Name(name) => {
                    return Err(format!(
                        "the TLS server name `{name}` differs from the requested `{host}`"
                    ));
                }
            }
            let mut chunk = [0_u8; 4096];
            let n = client
                .read(&mut chunk)
                .await
                .map_err(|err| format!("reading the TLS ClientHello failed: {err}"))?;
            if n == 0 {
                return Err("the client closed before its TLS ClientHello".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    match tokio::time::timeout(HEAD_TIMEOUT, read).await {
        Ok(Ok(())) => Ok(buf),
        Ok(Err(reason)) => Err(reason),
        Err(_) => Err("no TLS ClientHello came in time".to_owned()),
    }
}

/// Every parser of the run proxy on one input, with their invariants (the fuzz target and
/// the stable smoke test call it): the ClientHello reader, the proxy request parser and the
/// IP-literal recogniser are total (no panic on any input) and what they accept is sane.
///
/// # Panics
/// When an invariant does not hold (that is the point: the fuzzer reports it).
pub fn check_parsers(data: &[u8]) {
    if let Hello::Name(name) = client_hello_sni(data) {
        assert_eq!(
            data.first(),
            Some(&0x16),
            "a server name from a non-handshake record"
        );
        assert!(name.len() < 1 << 16);
    }
    if let Ok(request) = parse_http_request(data) {
        assert!(
            !request.target.host.is_empty(),
            "a request with an empty host"
        );
        assert_eq!(request.target.host, normalize_host(&request.target.host));
        if !request.connect {
            assert!(request.origin_form.ends_with("Connection: close\r\n\r\n"));
            assert!(request.origin_form.contains("\r\nHost: "));
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let literal = ip_literal(text);
        if text.parse::<IpAddr>().is_ok() {
            assert!(literal.is_some(), "an address taken for a name");
        }
        // A name whose last label is not a number is never taken for an address.
        let last = text.trim_end_matches('.').rsplit('.').next().unwrap_or("");
        if is_host_name(text)
            && last
                .chars()
                .any(|c| !c.is_ascii_hexdigit() && c != 'x' && c != 'X')
        {
            assert!(literal.is_none(), "a name taken for an address");
        }
    }
}

/// What the first bytes of a TLS connection say about its server name.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed.
    Incomplete,
    /// Not a TLS handshake record holding a ClientHello.
    NotTls,
    /// A ClientHello without a host name.
    NoName,
    /// The ClientHello's host name (SNI).
    Name(String),
}

/// The server name (SNI) of the TLS ClientHello at the start of `data` (parsed with
/// `tls-parser`; total on any input, so it is fuzzed).
#[must_use]
pub fn client_hello_sni(data: &[u8]) -> Hello {
    use tls_parser::{
        SNIType, TlsExtension, TlsMessage, TlsMessageHandshake, parse_tls_extensions,
        parse_tls_plaintext,
    };
    if data.len() < 5 {
        return if data.first().is_some_and(|b| *b != 0x16) {
            Hello::NotTls
        } else {
            Hello::Incomplete
        };
    }
    if data[0] != 0x16 {
        return Hello::NotTls;
    }
    let record_len = usize::from(u16::from_be_bytes([data[3], data[4]]));
    if data.len() < 5 + record_len {
        return Hello::Incomplete;
    }
    let Ok((_, record)) = parse_tls_plaintext(&data[..5 + record_len]) else {
        return Hello::NotTls;
    };
    let Some(TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello))) = record.msg.first()
    else {
        return Hello::NotTls;
    };
    let Some(extensions) = hello.ext else {
        return Hello::NoName;
    };
    let Ok((_, extensions)) = parse_tls_extensions(extensions) else {
        return Hello::NotTls;
    };
    for extension in extensions {
        if let TlsExtension::SNI(names) = extension {
            for (kind, name) in names {
                if kind == SNIType::HostName {
                    return match std::str::from_utf8(name) {
                        Ok(name) => Hello::Name(name.to_owned()),
                        Err(_) => Hello::NotTls,
                    };
                }
            }
        }
    }
    Hello::NoName
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        let cases = [
            ("127.0.0.1", false),
            ("127.1.2.3", false),
            ("10.1.2.3", false),
            ("172.16.0.1", false),
            ("192.168.1.1", false),
            ("169.254.169.254", false),
            ("100.64.0.1", false),
            ("0.0.0.0", false),
            ("224.0.0.1", false),
            ("255.255.255.255", false),
            ("::1", false),
            ("::", false),
            ("::ffff:127.0.0.1", false),
            ("::ffff:169.254.169.254", false),
            ("::127.0.0.1", false),
            ("64:ff9b::a9fe:a9fe", false),
            ("2002:7f00:1::", false),
            ("fd00::1", false),
            ("fe80::1", false),
            ("ff02::1", false),
            ("93.184.215.14", true),
            ("203.0.113.80", true),
            ("151.101.0.223", true),
            ("2a04:4e42::223", true),
            ("::ffff:151.101.0.223", true),
        ];
        for (text, public) in cases {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(is_public(ip), public, "{text}");
        }
    }

    #[test]
    fn ip_literals_in_every_spelling_are_found() {
        let cases = [
            ("127.0.0.1", Some("127.0.0.1")),
            ("127.1", Some("127.0.0.1")),
            ("127.0.1", Some("127.0.0.1")),
            ("0x7f000001", Some("127.0.0.1")),
            ("0X7F.1", Some("127.0.0.1")),
            ("2130706433", Some("127.0.0.1")),
            ("0177.0.0.1", Some("127.0.0.1")),
            ("169.254.169.254.", Some("169.254.169.254")),
            ("[::1]", Some("::1")),
            ("::ffff:127.0.0.1", Some("::ffff:127.0.0.1")),
            ("fe80::1%eth0", Some("fe80::1")),
            // Numeric last label but no valid address: still no name (refused as 0.0.0.0).
            ("host.99999999999", Some("0.0.0.0")),
            ("1.2.3.4.5", Some("0.0.0.0")),
            ("example.com", None),
            ("api.example.com", None),
            ("0x.example", None),
            ("123.example", None),
        ];
        for (host, expected) in cases {
            assert_eq!(
                ip_literal(host).map(|ip| ip.to_string()),
                expected.map(str::to_owned),
                "{host}"
            );
        }
    }

    #[test]
    fn address_classes_are_named() {
        let own: Vec<IpAddr> = vec!["198.51.100.1".parse().unwrap()];
        let exceptions: Vec<IpNet> = vec!["10.9.0.0/16".parse().unwrap()];
        let cases = [
            ("127.0.0.1", Some("loopback")),
            (
                "169.254.169.254",
                Some("link-local, where cloud metadata services live"),
            ),
            ("10.1.2.3", Some("a private RFC 1918 range")),
            ("192.168.0.1", Some("a private RFC 1918 range")),
            ("100.64.0.1", Some("the CGNAT range")),
            (
                "0.0.0.0",
                Some("a reserved, unspecified or multicast range"),
            ),
            ("::1", Some("loopback")),
            ("fd00::1", Some("a unique local (ULA) range")),
            (
                "::ffff:127.0.0.1",
                Some("an IPv4-mapped IPv6 address of a refused range"),
            ),
            ("198.51.100.1", Some("an address of this server")),
            ("10.9.1.1", None),
            ("198.51.100.3", None),
            ("2a04:4e42::223", None),
        ];
        for (ip, expected) in cases {
            assert_eq!(
                refused_class(ip.parse().unwrap(), &own, &exceptions),
                expected,
                "{ip}"
            );
        }
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard() {
        let names = Names::Only(vec!["api.example.com".into(), "*.example.org".into()]);
        for (host, allowed) in [
            ("api.example.com", true),
            ("API.Example.com.", true),
            ("v2.api.example.com", false),
            ("a.example.org", true),
            ("a.b.example.org", true),
            ("example.org", false),
            ("badexample.org", false),
            ("example.org.evil.test", false),
        ] {
            assert_eq!(names.allows(&normalize_host(host)), allowed, "{host}");
        }
        assert!(Names::Any.allows("anything.test"));
        for (host, valid) in [
            ("a.test", true),
            ("under_score.test", true),
            ("-bad.test", false),
            ("a..test", false),
            ("", false),
            ("spa ce.test", false),
            ("x".repeat(64).as_str(), false),
        ] {
            assert_eq!(is_host_name(host), valid, "{host}");
        }
    }

    #[test]
    fn proxy_requests_are_parsed() {
        let connect =
            parse_http_request(b"CONNECT Files.Example.:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(connect.connect);
        assert_eq!(
            connect.target,
            Target {
                host: "files.example".into(),
                port: 443
            }
        );
        let get = parse_http_request(
            b"GET http://api.test:8080/v1?q=1 HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            get.target,
            Target {
                host: "api.test".into(),
                port: 8080
            }
        );
        // The Host header is the checked authority, never the client's.
        assert_eq!(
            get.origin_form,
            "GET /v1?q=1 HTTP/1.1\r\nHost: api.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        // For an upstream proxy: the absolute form, its credential, the same headers.
        let upstream = Upstream::parse("http://u:p@proxy.example:3128").unwrap();
        assert!(
            !format!("{upstream:?}").contains("dTpw"),
            "no credential in Debug"
        );
        assert_eq!(
            get.proxy_form(&upstream),
            "GET http://api.test:8080/v1?q=1 HTTP/1.1\r\nProxy-Authorization: Basic dTpw\r\nHost: api.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        assert!(Upstream::parse("socks5://proxy.example:1080").is_err());
        let bare = parse_http_request(b"GET http://[::1] HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!((bare.target.host.as_str(), bare.target.port), ("::1", 80));
        for bad in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"GET http://u:p@host/ HTTP/1.1\r\n\r\n",
            b"CONNECT host HTTP/1.1\r\n\r\n",
            b"GET http://host:99999/ HTTP/1.1\r\n\r\n",
            b"GET https://host/ HTTP/1.1\r\n\r\n",
            // See: the fuzz target net_parsers (a host that normalises to nothing).
            b"GET http://.:8080/ HTTP/1.1\r\n\r\n",
            b"CONNECT ..:443 HTTP/1.1\r\n\r\n",
            b"\x00\x01 garbage\r\n\r\n",
        ] {
            assert!(
                parse_http_request(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A TLS 1.2-style ClientHello record with an SNI extension for `name` (or none).
    pub(crate) fn client_hello(name: Option<&str>) -> Vec<u8> {
        let mut extensions = Vec::new();
        if let Some(name) = name {
            let name = name.as_bytes();
            let list_len = u16::try_from(name.len() + 3).unwrap();
            extensions.extend_from_slice(&[0, 0]);
            extensions.extend_from_slice(&(list_len + 2).to_be_bytes());
            extensions.extend_from_slice(&list_len.to_be_bytes());
            extensions.push(0);
            extensions.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
            extensions.extend_from_slice(name);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // compression: null
        body.extend_from_slice(&u16::try_from(extensions.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&extensions);
        let mut handshake = vec![1];
        handshake.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        handshake.extend_from_slice(&body);
        let mut record = vec![0x16, 3, 1];
        record.extend_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
        record.extend_from_slice(&handshake);
        record
    }

    #[test]
    fn the_client_hello_server_name_is_read() {
        let hello = client_hello(Some("allowed.test"));
        assert_eq!(client_hello_sni(&hello), Hello::Name("allowed.test".into()));
        assert_eq!(client_hello_sni(&client_hello(None)), Hello::NoName);
        for cut in [0, 3, 5, hello.len() - 1] {
            assert_eq!(client_hello_sni(&hello[..cut]), Hello::Incomplete, "{cut}");
        }
        assert_eq!(client_hello_sni(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        let mut corrupt = hello.clone();
        corrupt[5] = 2; // a ServerHello
        assert_eq!(client_hello_sni(&corrupt), Hello::NotTls);
    }

    #[test]
    fn a_real_client_hello_is_read() {
        // A TLS 1.3 ClientHello as CPython's ssl module sends it (key share, supported
        // versions, ALPN...), for `allowed.test`.
        let hello = include_bytes!("../tests/data/client-hello-tls13.bin");
        assert_eq!(client_hello_sni(hello), Hello::Name("allowed.test".into()));
        check_parsers(hello);
    }

    #[test]
    fn the_client_hello_parser_is_total() {
        // Every truncation and every single-byte change of a real record: no panic.
        let hello = client_hello(Some("allowed.test"));
        for cut in 0..hello.len() {
            let _ = client_hello_sni(&hello[..cut]);
        }
        for at in 0..hello.len() {
            for value in [0_u8, 1, 0x7f, 0xff] {
                let mut changed = hello.clone();
                changed[at] = value;
                check_parsers(&changed);
            }
        }
    }

    /// A real proxy on a real socket, to a real listener on loopback (allowed here only by
    /// the operator's exception and raw-address switch): CONNECT and SOCKS5 tunnels carry
    /// bytes both ways and are logged with their counts; the connection cap refuses the third.
    #[tokio::test]
    async fn tunnels_are_logged_and_capped() {
        let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = target.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = target.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0_u8; 5];
                    if stream.read_exact(&mut buf).await.is_ok() {
                        let _ = stream.write_all(b"pong!").await;
                    }
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let mut rules = NetRules::new(Names::Any);
        rules.ports = vec![port];
        rules.allow_ip_literals = true;
        rules.exceptions = vec!["127.0.0.0/8".parse().unwrap()];
        rules.caps.connections = 2;
        let proxy = RunProxy::start(dir.path(), rules, NetResolver::new(&[]).unwrap()).unwrap();
        let socket = dir.path().join(SOCKET_NAME);

        let mut http = UnixStream::connect(&socket).await.unwrap();
        http.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = [0_u8; 39];
        http.read_exact(&mut head).await.unwrap();
        assert!(head.starts_with(b"HTTP/1.1 200"));
        http.write_all(b"ping!").await.unwrap();
        let mut answer = [0_u8; 5];
        http.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"pong!");

        let mut socks = UnixStream::connect(&socket).await.unwrap();
        let mut request = vec![5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1];
        request.extend_from_slice(&port.to_be_bytes());
        socks.write_all(&request).await.unwrap();
        let mut reply = [0_u8; 12];
        socks.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply[..4], &[5, 0, 5, 0], "greeting and success");
        socks.write_all(b"ping!").await.unwrap();
        socks.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"pong!");

        let mut third = UnixStream::connect(&socket).await.unwrap();
        third
            .write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut refused = String::new();
        third.read_to_string(&mut refused).await.unwrap();
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        assert!(refused.contains("cap of 2 connections"), "{refused}");

        let log = proxy.take_log();
        assert_eq!(log.len(), 3, "{log:?}");
        assert!(log[..2].iter().all(|d| d.allowed
            && d.bytes_sent == 5
            && d.bytes_received == 5
            && d.address.as_deref() == Some(format!("127.0.0.1:{port}").as_str())));
        assert!(!log[2].allowed);
        assert!(proxy.log().is_empty(), "taken");
        drop(proxy);
        assert!(!socket.exists(), "the socket goes with the proxy");
    }

    /// The same loopback target without the operator's exception: refused before any
    /// connection, in both protocols, and a name is never resolved when the port is wrong.
    #[test]
    fn no_proxy_and_trusted_destinations_are_matched() {
        let mut rules = NetRules::new(Names::Any);
        rules.upstream = Some(Upstream::parse("http://proxy.example:3128").unwrap());
        rules.no_proxy = vec![".internal.example".into(), "localhost".into()];
        rules.trusted = vec![("Index.Example".into(), 8000)];
        assert!(rules.upstream_for("pkgs.internal.example").is_none());
        assert!(rules.upstream_for("internal.example").is_none());
        assert!(rules.upstream_for("localhost").is_none());
        assert!(rules.upstream_for("files.example").is_some());
        assert!(rules.upstream_for("notinternal.example").is_some());
        assert!(rules.is_trusted("index.example.", 8000));
        assert!(!rules.is_trusted("index.example", 80));
    }

    /// Under an allowlist an address is held to the list as a name is (raw addresses
    /// allowed): only a listed one passes to the address checks.
    #[tokio::test]
    async fn an_allowlist_holds_addresses_too() {
        let dir = tempfile::tempdir().unwrap();
        let mut rules = NetRules::new(Names::Only(vec!["203.0.113.7".into()]));
        rules.allow_ip_literals = true;
        rules.ports = vec![9];
        let proxy = RunProxy::start(dir.path(), rules, NetResolver::new(&[]).unwrap()).unwrap();
        let socket = dir.path().join(SOCKET_NAME);
        let mut http = UnixStream::connect(&socket).await.unwrap();
        http.write_all(b"CONNECT 203.0.113.8:9 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut refused = String::new();
        http.read_to_string(&mut refused).await.unwrap();
        assert!(
            refused.contains("`203.0.113.8` is not in this run's allowlist"),
            "{refused}"
        );
        drop(proxy);
    }

    #[tokio::test]
    async fn loopback_is_refused_without_an_exception() {
        let dir = tempfile::tempdir().unwrap();
        let mut rules = NetRules::new(Names::Any);
        rules.allow_ip_literals = true;
        let proxy = RunProxy::start(dir.path(), rules, NetResolver::new(&[]).unwrap()).unwrap();
        let socket = dir.path().join(SOCKET_NAME);
        let mut http = UnixStream::connect(&socket).await.unwrap();
        http.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut refused = String::new();
        http.read_to_string(&mut refused).await.unwrap();
        assert!(refused.contains("127.0.0.1 (loopback)"), "{refused}");
        let mut socks = UnixStream::connect(&socket).await.unwrap();
        let mut request = vec![5, 1, 0, 5, 1, 0, 3, 9];
        request.extend_from_slice(b"localhost");
        request.extend_from_slice(&22_u16.to_be_bytes());
        socks.write_all(&request).await.unwrap();
        let mut reply = [0_u8; 12];
        socks.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply[..4], &[5, 0, 5, 2], "not allowed by ruleset");
        let log = proxy.log();
        assert_eq!(log.len(), 2);
        assert_eq!(log[1].host, "localhost");
        assert!(log[1].reason.contains("port 22 is not allowed"), "{log:?}");
    }
}
