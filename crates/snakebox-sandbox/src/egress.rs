//! The egress proxy: the only way out of a sandbox that keeps its own network namespace.
//!
//! A sandbox whose network namespace is its own (loopback only) cannot reach anything, the
//! host's loopback included. When it must fetch something (the installer downloading wheels),
//! it gets an HTTP proxy instead of the host network: [`EgressProxy`] listens on a Unix socket
//! mounted into the sandbox at [`SOCKET_INSIDE`], a small bridge inside ([`bridged_command`]) forwards
//! `127.0.0.1:`[`BRIDGE_PORT`] to that socket, and the command is told `HTTP(S)_PROXY`.
//!
//! The proxy decides each connection by [`EgressRules`], in order: the destination
//! `(host, port)` is one the operator configured (a package index, even on a private or
//! loopback address): allowed; otherwise the port must be 80 or 443, the proxy resolves the
//! name itself and connects only to public addresses (never loopback, RFC 1918, CGNAT,
//! link-local/metadata, ULA, multicast, unspecified, or an IPv6 form of one of these).
//! It speaks `CONNECT` (TLS passes through untouched) and plain-HTTP forwarding (absolute-form
//! requests, rewritten to origin-form, one request per connection). When the operator has an
//! HTTP proxy of their own ([`Upstream`]), allowed connections are chained through it (after
//! the same checks), except for `NO_PROXY` hosts.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixListener, UnixStream};

use crate::SandboxCommand;

/// The port the bridge listens on inside the sandbox's own network namespace.
pub const BRIDGE_PORT: u16 = 3128;
/// Where the proxy's socket is mounted inside a sandbox.
pub const SOCKET_INSIDE: &str = "/run/snakebox/egress.sock";

/// Largest request head the proxy reads.
const MAX_HEAD: usize = 32 * 1024;
/// Time to send a request head, and to connect upstream.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Where a sandbox may connect through the proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRules {
    /// Destinations always allowed, as `(host, port)` (the configured package indexes).
    pub allowed: Vec<(String, u16)>,
    /// Whether other destinations on ports 80 and 443 that resolve to public addresses only
    /// are allowed.
    pub public: bool,
    /// The operator's own HTTP proxy: allowed connections go through it (chained), except
    /// for hosts in `no_proxy`.
    pub upstream: Option<Upstream>,
    /// Hosts reached directly although there is an upstream proxy (`NO_PROXY` entries:
    /// `host`, `.domain` or `domain` for the domain and its subdomains, `*` for all).
    pub no_proxy: Vec<String>,
}

/// An upstream HTTP proxy (`http://[user:password@]host[:port]`).
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

impl EgressRules {
    /// Whether `host:port` is a configured destination.
    fn is_configured(&self, host: &str, port: u16) -> bool {
        self.allowed
            .iter()
            .any(|(h, p)| h.eq_ignore_ascii_case(host) && *p == port)
    }

    /// Whether `host` is reached without the upstream proxy.
    fn bypasses_upstream(&self, host: &str) -> bool {
        self.no_proxy.iter().any(|entry| {
            let entry = entry.trim().trim_start_matches('.');
            entry == "*"
                || host.eq_ignore_ascii_case(entry)
                || host
                    .to_ascii_lowercase()
                    .ends_with(&format!(".{}", entry.to_ascii_lowercase()))
        })
    }

    /// Rules allowing `urls`' hosts and ports (`scheme://[user@]host[:port]/…`) and, with
    /// `public`, any public address on ports 80 and 443.
    #[must_use]
    pub fn for_urls(urls: &[String], public: bool) -> Self {
        Self {
            allowed: urls.iter().filter_map(|url| url_host_port(url)).collect(),
            public,
            upstream: None,
            no_proxy: Vec::new(),
        }
    }
}

/// One decision of the installer's egress proxy (for logs; runs have their own proxy and log:
/// [`crate::RunProxy`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EgressDecision {
    /// Host as asked.
    pub host: String,
    /// Port as asked.
    pub port: u16,
    /// Whether the connection was made.
    pub allowed: bool,
    /// Why.
    pub reason: String,
}

/// A running proxy on a Unix socket. Dropping it stops it and removes the socket.
#[derive(Debug)]
pub struct EgressProxy {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
    decisions: Arc<Mutex<Vec<EgressDecision>>>,
}

impl EgressProxy {
    /// Listen on a new socket in a private directory of its own under the system's temporary
    /// directory (a socket path must be short: data directories can be long), and serve
    /// connections by `rules`. Mount [`EgressProxy::path`] at [`SOCKET_INSIDE`].
    ///
    /// # Errors
    /// When the directory or the socket cannot be created.
    pub fn start(rules: EgressRules) -> std::io::Result<EgressProxy> {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "snakebox-egress-{}-{nanos:x}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o711)
            .create(&dir)
            .map_err(|err| std::io::Error::new(err.kind(), format!("{}: {err}", dir.display())))?;
        let path = dir.join("egress.sock");
        let listener = match UnixListener::bind(&path) {
            Ok(listener) => listener,
            Err(err) => {
                let _ = fs_err::remove_dir(&dir);
                return Err(err);
            }
        };
        // Any sandbox uid may connect; the directory (0711, random name) is not listable.
        fs_err::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
        let rules = Arc::new(rules);
        let decisions: Arc<Mutex<Vec<EgressDecision>>> = Arc::default();
        let log = Arc::clone(&decisions);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let rules = Arc::clone(&rules);
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    if let Some(decision) = serve(stream, &rules).await {
                        if decision.allowed {
                            tracing::debug!(?decision, "egress allowed");
                        } else {
                            tracing::warn!(?decision, "egress refused");
                        }
                        log.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(decision);
                    }
                });
            }
        });
        Ok(EgressProxy {
            path,
            task,
            decisions,
        })
    }

    /// Remove the socket directories of proxies whose server is gone (killed before it could
    /// clean up): `snakebox-egress-<pid>-…` in the temporary directory with no process `<pid>`.
    pub fn remove_stale() {
        let Ok(entries) = fs_err::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("snakebox-egress-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if Path::new("/proc").join(pid.to_string()).exists() {
                continue;
            }
            let _ = fs_err::remove_file(entry.path().join("egress.sock"));
            let _ = fs_err::remove_dir(entry.path());
        }
    }

    /// The socket's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every decision so far.
    #[must_use]
    pub fn decisions(&self) -> Vec<EgressDecision> {
        self.decisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The proxy variables a command inside needs (`http://127.0.0.1:BRIDGE_PORT`, both
    /// spellings, and an empty `NO_PROXY` so nothing bypasses it).
    #[must_use]
    pub fn proxy_env() -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{BRIDGE_PORT}");
        let mut env: Vec<(String, String)> = [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ]
        .iter()
        .map(|name| ((*name).to_owned(), url.clone()))
        .collect();
        env.push(("NO_PROXY".to_owned(), String::new()));
        env.push(("no_proxy".to_owned(), String::new()));
        env
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = fs_err::remove_file(&self.path);
        if let Some(dir) = self.path.parent() {
            let _ = fs_err::remove_dir(dir);
        }
    }
}

/// The bridge: listens on `127.0.0.1:BRIDGE_PORT` inside the sandbox, forwards each connection
/// to the proxy's socket, and puts itself in the background only once it listens (so the
/// command never races it). Runs with `-I -S`: no site, no environment variables, no `.pth`.
const BRIDGE: &str = r"
import os, socket, sys, threading
port, path = int(sys.argv[1]), sys.argv[2]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', port))
srv.listen(256)
if os.fork():
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(c):
    u = socket.socket(socket.AF_UNIX)
    try:
        u.connect(path)
    except OSError:
        c.close()
        return
    t = threading.Thread(target=pipe, args=(u, c), daemon=True)
    t.start()
    pipe(c, u)
    t.join()
    c.close()
    u.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
";

/// `command`, preceded by the bridge to the proxy at `socket` (a path visible inside), started
/// with `python` (an interpreter visible inside; run isolated, so nothing of any environment
/// is imported). The command starts only once the bridge listens; the bridge dies with the
/// sandbox's PID namespace.
#[must_use]
pub fn bridged_command(python: &Path, socket: &Path, command: &SandboxCommand) -> SandboxCommand {
    let mut args: Vec<std::ffi::OsString> = vec![
        "-c".into(),
        "py=$1 code=$2 port=$3 sock=$4; shift 4; \"$py\" -I -S -c \"$code\" \"$port\" \"$sock\" || exit 97; exec \"$@\"".into(),
        "sh".into(),
        python.as_os_str().to_owned(),
        BRIDGE.into(),
        BRIDGE_PORT.to_string().into(),
        socket.as_os_str().to_owned(),
        command.program.as_os_str().to_owned(),
    ];
    args.extend(command.args.iter().cloned());
    SandboxCommand {
        program: PathBuf::from("/bin/sh"),
        args,
        control_channel: command.control_channel,
    }
}

/// Serve one connection; returns the decision taken (none for an unreadable request).
async fn serve(mut client: UnixStream, rules: &EgressRules) -> Option<EgressDecision> {
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Some(parts)) => parts,
        _ => {
            let _ = client
                .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                .await;
            return None;
        }
    };
    let Some(request) = Request::parse(&head) else {
        let _ = client
            .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
            .await;
        return None;
    };
    let decision = |allowed: bool, reason: String| EgressDecision {
        host: request.host.clone(),
        port: request.port,
        allowed,
        reason,
    };
    let chained = rules
        .upstream
        .as_ref()
        .filter(|_| !rules.bypasses_upstream(&request.host));
    // A configured index reached through the upstream proxy need not resolve here.
    let resolved = if chained.is_some() && rules.is_configured(&request.host, request.port) {
        Ok(Vec::new())
    } else {
        resolve(&request.host, request.port, rules).await
    };
    let addresses = match resolved {
        Ok(addresses) => addresses,
        Err(reason) => {
            let body = format!("snakebox egress proxy: {reason}\n");
            let reply = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(reply.as_bytes()).await;
            return Some(decision(false, reason));
        }
    };
    let connected = match chained {
        Some(proxy) => connect_through(proxy, &request).await,
        None => connect_any(&addresses).await.ok_or("no address answered"),
    };
    let mut upstream = match connected {
        Ok(stream) => stream,
        Err(reason) => {
            let _ = client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
                .await;
            return Some(decision(false, reason.to_owned()));
        }
    };
    let sent = match (request.connect, chained) {
        (true, _) => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
        }
        (false, Some(proxy)) => {
            upstream
                .write_all(request.proxy_form(proxy).as_bytes())
                .await
        }
        (false, None) => upstream.write_all(request.origin_form.as_bytes()).await,
    };
    if sent.is_err() || upstream.write_all(&rest).await.is_err() {
        return Some(decision(true, "connection closed early".to_owned()));
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Some(decision(true, "allowed".to_owned()))
}

/// A connection through the upstream proxy: for `CONNECT`, the tunnel is opened (and its
/// answer checked) here; for plain HTTP, the caller sends the request in proxy form.
async fn connect_through(proxy: &Upstream, request: &Request) -> Result<TcpStream, &'static str> {
    let addresses: Vec<SocketAddr> = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::lookup_host((proxy.host.as_str(), proxy.port)),
    )
    .await
    .map_err(|_| "resolving the upstream proxy timed out")?
    .map_err(|_| "the upstream proxy does not resolve")?
    .collect();
    let mut stream = connect_any(&addresses)
        .await
        .ok_or("the upstream proxy did not answer")?;
    if !request.connect {
        return Ok(stream);
    }
    let target = if request.host.contains(':') {
        format!("[{}]:{}", request.host, request.port)
    } else {
        format!("{}:{}", request.host, request.port)
    };
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(authorization) = &proxy.authorization {
        head.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|_| "the upstream proxy closed the connection")?;
    let (answer, _) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream))
        .await
        .ok()
        .flatten()
        .ok_or("the upstream proxy did not answer the CONNECT")?;
    let status = answer.split(' ').nth(1).unwrap_or_default();
    if status == "200" {
        Ok(stream)
    } else {
        Err("the upstream proxy refused the CONNECT")
    }
}

/// Read up to the end of a request (or response) head; returns (head, bytes after it).
async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0_u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf[..end + 4].to_vec()).ok()?;
            return Some((head, buf[end + 4..].to_vec()));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    connect: bool,
    host: String,
    port: u16,
    /// For plain HTTP: the head to send to the server (origin-form, `Connection: close`).
    origin_form: String,
    /// For plain HTTP: the request line in absolute form (to send to an upstream proxy).
    absolute_line: String,
}

impl Request {
    /// The head for an upstream proxy: absolute form, the same headers, its credential.
    fn proxy_form(&self, upstream: &Upstream) -> String {
        let headers = self
            .origin_form
            .split_once("\r\n")
            .map_or("", |(_, headers)| headers);
        let mut head = self.absolute_line.clone();
        if let Some(authorization) = &upstream.authorization {
            head.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        head.push_str(headers);
        head
    }
}

impl Request {
    fn parse(head: &str) -> Option<Request> {
        let mut lines = head.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let (method, target, version) = (first.next()?, first.next()?, first.next()?);
        if first.next().is_some() || !version.starts_with("HTTP/1.") {
            return None;
        }
        if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) = split_host_port(target)?;
            return Some(Request {
                connect: true,
                host,
                port: port?,
                origin_form: String::new(),
                absolute_line: String::new(),
            });
        }
        let rest = target.strip_prefix("http://")?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.contains('@') {
            return None;
        }
        let (host, port) = split_host_port(authority)?;
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        let mut origin_form = format!("{method} {path} {version}\r\n");
        for line in lines.filter(|line| !line.is_empty()) {
            let name = line.split(':').next().unwrap_or("").trim();
            if [
                "proxy-connection",
                "proxy-authorization",
                "connection",
                "keep-alive",
            ]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
            {
                continue;
            }
            origin_form.push_str(line);
            origin_form.push_str("\r\n");
        }
        origin_form.push_str("Connection: close\r\n\r\n");
        Some(Request {
            connect: false,
            host,
            port: port.unwrap_or(80),
            origin_form,
            absolute_line: format!("{method} {target} {version}\r\n"),
        })
    }
}

/// `host[:port]` or `[v6][:port]`.
fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
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

/// `(host, port)` of `scheme://[user@]host[:port]/…` (port defaulted by scheme).
fn url_host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = split_host_port(authority)?;
    let port = port.or(match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    })?;
    Some((host.to_ascii_lowercase(), port))
}

/// The addresses the proxy may connect to for `host:port`, or why none.
async fn resolve(host: &str, port: u16, rules: &EgressRules) -> Result<Vec<SocketAddr>, String> {
    let configured = rules.is_configured(host, port);
    if !configured {
        if !rules.public {
            return Err(format!("`{host}:{port}` is not a configured destination"));
        }
        if port != 80 && port != 443 {
            return Err(format!(
                "port {port} of `{host}` is not allowed (only 80 and 443, or a configured index)"
            ));
        }
    }
    let found: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| format!("resolving `{host}` timed out"))?
            .map_err(|err| format!("`{host}` does not resolve: {err}"))?
            .collect(),
    };
    if configured {
        return Ok(found);
    }
    let public: Vec<SocketAddr> = found
        .iter()
        .copied()
        .filter(|addr| is_public(addr.ip()))
        .collect();
    if public.is_empty() {
        let shown: Vec<String> = found.iter().map(|a| a.ip().to_string()).collect();
        return Err(format!(
            "`{host}` resolves to non-public addresses only ({})",
            shown.join(", ")
        ));
    }
    Ok(public)
}

async fn connect_any(addresses: &[SocketAddr]) -> Option<TcpStream> {
    for address in addresses {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await
        {
            return Some(stream);
        }
    }
    None
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
    fn requests_are_parsed_and_rewritten() {
        let connect = Request::parse("CONNECT files.example:443 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(
            connect,
            Some(Request {
                connect: true,
                host: "files.example".into(),
                port: 443,
                origin_form: String::new(),
                absolute_line: String::new(),
            })
        );
        let get = Request::parse(
            "GET http://127.0.0.1:8000/simple/six/?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nProxy-Connection: keep-alive\r\nAuthorization: Basic abc\r\n\r\n",
        )
        .unwrap();
        assert!(!get.connect);
        assert_eq!((get.host.as_str(), get.port), ("127.0.0.1", 8000));
        assert_eq!(
            get.origin_form,
            "GET /simple/six/?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAuthorization: Basic abc\r\nConnection: close\r\n\r\n"
        );
        let upstream = Upstream::parse("http://u:p@proxy.example:3128").unwrap();
        assert_eq!(
            (upstream.host.as_str(), upstream.port),
            ("proxy.example", 3128)
        );
        assert!(!format!("{upstream:?}").contains("dTpw"));
        assert_eq!(
            get.proxy_form(&upstream),
            "GET http://127.0.0.1:8000/simple/six/?x=1 HTTP/1.1\r\nProxy-Authorization: Basic dTpw\r\nHost: 127.0.0.1:8000\r\nAuthorization: Basic abc\r\nConnection: close\r\n\r\n"
        );
        assert!(Upstream::parse("socks5://proxy:1080").is_err());
        let rules = EgressRules {
            no_proxy: vec![".internal.example".into(), "localhost".into()],
            ..EgressRules::default()
        };
        assert!(rules.bypasses_upstream("pkgs.internal.example"));
        assert!(rules.bypasses_upstream("LOCALHOST"));
        assert!(!rules.bypasses_upstream("files.example"));
        assert_eq!(
            Request::parse("GET http://[::1]/ HTTP/1.1\r\n\r\n").map(|r| (r.host, r.port)),
            Some(("::1".into(), 80))
        );
        for bad in [
            "GET /relative HTTP/1.1\r\n\r\n",
            "GET http://u:p@host/ HTTP/1.1\r\n\r\n",
            "CONNECT host HTTP/1.1\r\n\r\n",
            "GET http://host:99999/ HTTP/1.1\r\n\r\n",
            "GET http://host/ SPDY\r\n\r\n",
        ] {
            assert_eq!(Request::parse(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn only_configured_or_public_destinations_resolve() {
        let rules = EgressRules::for_urls(&["http://u:p@127.0.0.1:8000/simple".into()], true);
        assert_eq!(rules.allowed, vec![("127.0.0.1".to_owned(), 8000)]);
        assert!(resolve("127.0.0.1", 8000, &rules).await.is_ok());
        for (host, port) in [
            ("127.0.0.1", 8001),
            ("127.0.0.1", 80),
            ("localhost", 80),
            ("169.254.169.254", 80),
            ("::ffff:127.0.0.1", 443),
            ("10.0.0.1", 443),
            ("93.184.215.14", 22),
        ] {
            assert!(resolve(host, port, &rules).await.is_err(), "{host}:{port}");
        }
        assert!(resolve("93.184.215.14", 443, &rules).await.is_ok());
        let closed = EgressRules {
            public: false,
            ..rules
        };
        assert!(resolve("93.184.215.14", 443, &closed).await.is_err());
    }
}
