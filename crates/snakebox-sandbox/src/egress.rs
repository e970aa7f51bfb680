//! The install proxy: how the downloader (uv) reaches the network, as a configuration of the
//! run proxy ([`crate::RunProxy`]): one proxy implementation, two rule sets.
//!
//! The downloader's sandbox keeps its own network namespace (loopback only). Its one way out
//! is a [`crate::RunProxy`] serving [`EgressRules::net_rules`] on a Unix socket in a private
//! directory, mounted inside at [`SOCKET_INSIDE`]; a small bridge ([`bridged_command`])
//! forwards `127.0.0.1:`[`BRIDGE_PORT`] to it, and uv is told `HTTP(S)_PROXY`.
//!
//! The install rules, in order: a configured index (`host:port` from uv's settings) is
//! allowed wherever it is (loopback and private ranges included: the operator configured it);
//! otherwise, with `install_hosts` set, only those hosts (names, `*.suffix` patterns or
//! addresses), else any host, on ports 80 and 443, and then only to public addresses (the
//! run proxy's address checks, the operator's `exceptions` honoured; TLS server names checked
//! on 443). Names are resolved with the host's resolver, as uv's own would be. Allowed connections are chained through the operator's own `http://` proxy when
//! one is set ([`Upstream`]), except for `NO_PROXY` hosts. Installs are not capped by the run
//! caps (their wall time is the install timeout).

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use crate::netproxy::{ip_literal, split_host_port};
use crate::{
    Names, NetCaps, NetDecision, NetResolver, NetRules, Purpose, RunProxy, SandboxCommand, Upstream,
};

/// The port the bridge listens on inside the sandbox's own network namespace.
pub const BRIDGE_PORT: u16 = 3128;
/// Where the proxy's socket is mounted inside a sandbox.
pub const SOCKET_INSIDE: &str = "/run/snakebox/egress.sock";

/// The caps of an install's proxy: none but the time one connection may stay open (a large
/// wheel on a slow link); the install's own wall time bounds it all.
const INSTALL_CAPS: NetCaps = NetCaps {
    connections: u64::MAX,
    bytes: u64::MAX,
    connection_time: Duration::from_secs(3600),
};

/// Where an install may connect through the proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRules {
    /// The configured package indexes (and find-links URLs), as `(host, port)`: always
    /// allowed, wherever they are.
    pub allowed: Vec<(String, u16)>,
    /// The operator's `install_hosts`: only these hosts besides the indexes (`name`,
    /// `*.suffix`, or an address). `None`: any host on ports 80 and 443 whose addresses are
    /// public (the default index's files may be served from hosts code cannot name).
    pub hosts: Option<Vec<String>>,
    /// Address ranges installs may reach although they are not public.
    pub exceptions: Vec<IpNet>,
    /// The operator's own HTTP proxy: allowed connections go through it (chained), except
    /// for hosts in `no_proxy`.
    pub upstream: Option<Upstream>,
    /// Hosts reached directly although there is an upstream proxy (`NO_PROXY` entries).
    pub no_proxy: Vec<String>,
}

impl EgressRules {
    /// Rules allowing `urls`' hosts and ports (`scheme://[user@]host[:port]/…`) and `hosts`
    /// (see [`EgressRules::hosts`]).
    #[must_use]
    pub fn for_urls(urls: &[String], hosts: Option<Vec<String>>) -> Self {
        Self {
            allowed: urls.iter().filter_map(|url| url_host_port(url)).collect(),
            hosts,
            ..Self::default()
        }
    }

    /// The run proxy's rules that enforce these.
    #[must_use]
    pub fn net_rules(&self) -> NetRules {
        NetRules {
            names: self.hosts.clone().map_or(Names::Any, Names::Only),
            ports: vec![80, 443],
            // A direct URL may name an address; its class is still checked.
            allow_ip_literals: true,
            exceptions: self.exceptions.clone(),
            caps: INSTALL_CAPS,
            trusted: self.allowed.clone(),
            upstream: self.upstream.clone(),
            no_proxy: self.no_proxy.clone(),
            purpose: Purpose::Install,
        }
    }

    /// Why `host:port` (a direct URL's, checked before anything runs) is not an install
    /// destination by name, or `None` when it may be (a configured index, or any host when
    /// `install_hosts` is unset, or a listed one). Its port and addresses are checked
    /// separately.
    #[must_use]
    pub fn refuses_host(&self, host: &str, port: u16) -> Option<String> {
        let rules = self.net_rules();
        if rules.is_trusted(host, port) {
            return None;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if !rules.names.allows(&host) {
            let listed = self.hosts.as_deref().unwrap_or_default();
            return Some(format!(
                "`{host}`, which is not an install host (`[network] install_hosts`: {})",
                if listed.is_empty() {
                    "none: the configured indexes only".to_owned()
                } else {
                    listed.join(", ")
                }
            ));
        }
        // The port and the addresses are the proxy's to check (the caller checks addresses
        // too, to say which one is not public).
        None
    }
}

/// A running install proxy on a Unix socket in a private directory of its own. Dropping it
/// stops it and removes the socket and the directory.
#[derive(Debug)]
pub struct EgressProxy {
    proxy: Option<RunProxy>,
    dir: PathBuf,
}

impl EgressProxy {
    /// Listen on a new socket in a private directory under the system's temporary directory
    /// and serve connections by `rules` (through [`crate::RunProxy`]). Mount
    /// [`EgressProxy::path`] at [`SOCKET_INSIDE`]. Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// When the directory or the socket cannot be created, or the resolver configuration
    /// cannot be read.
    pub fn start(rules: &EgressRules) -> std::io::Result<EgressProxy> {
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
        // The host's resolver, as uv's own would be: `[network] resolvers` are the runs'
        // (an operator may point runs at a filtering name server that knows no index).
        let started = NetResolver::new(&[])
            .map_err(std::io::Error::other)
            .and_then(|resolver| RunProxy::start(&dir, rules.net_rules(), resolver));
        match started {
            Ok(proxy) => Ok(EgressProxy {
                proxy: Some(proxy),
                dir,
            }),
            Err(err) => {
                let _ = fs_err::remove_dir(&dir);
                Err(err)
            }
        }
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
            let _ = fs_err::remove_file(entry.path().join(crate::SOCKET_NAME));
            let _ = fs_err::remove_dir(entry.path());
        }
    }

    /// The socket's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.proxy.as_ref().map_or(&self.dir, RunProxy::path)
    }

    /// The connections refused so far (by the rules, or a network error).
    #[must_use]
    pub fn refusals(&self) -> Vec<NetDecision> {
        self.proxy
            .as_ref()
            .map(|proxy| proxy.log().into_iter().filter(|d| !d.allowed).collect())
            .unwrap_or_default()
    }

    /// The refusals as lines for an install's error (`snakebox's install proxy refused
    /// `host:port`: reason`), or `None` when nothing was refused.
    #[must_use]
    pub fn explain(&self) -> Option<String> {
        let lines: Vec<String> = self
            .refusals()
            .iter()
            .map(|d| {
                if d.host.is_empty() {
                    format!("snakebox's install proxy: {}", d.reason)
                } else {
                    format!(
                        "snakebox's install proxy refused `{}:{}`: {}",
                        d.host, d.port, d.reason
                    )
                }
            })
            .collect();
        (!lines.is_empty()).then(|| lines.join("\n"))
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
        // The proxy removes its socket; then the directory is empty.
        drop(self.proxy.take());
        let _ = fs_err::remove_dir(&self.dir);
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
        init: command.init,
    }
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

/// Whether `host` spells an address (in any form the run proxy recognises).
#[must_use]
pub fn is_ip_literal(host: &str) -> bool {
    ip_literal(host).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[test]
    fn install_rules_are_run_rules_with_the_indexes_trusted() {
        let rules = EgressRules::for_urls(&["http://u:p@127.0.0.1:8000/simple".into()], None);
        assert_eq!(rules.allowed, vec![("127.0.0.1".to_owned(), 8000)]);
        let net = rules.net_rules();
        assert_eq!(net.names, Names::Any);
        assert!(net.is_trusted("127.0.0.1", 8000));
        assert!(!net.is_trusted("127.0.0.1", 8001));
        assert_eq!(net.purpose, Purpose::Install);
        // Unset: any host by name (its addresses are checked when it is reached).
        assert_eq!(rules.refuses_host("files.example", 443), None);
        assert_eq!(rules.refuses_host("127.0.0.1", 8000), None);
        let listed = EgressRules::for_urls(
            &["http://127.0.0.1:8000/simple".into()],
            Some(vec![
                "files.example".into(),
                "*.cdn.example".into(),
                "198.51.100.7".into(),
            ]),
        );
        assert_eq!(listed.refuses_host("127.0.0.1", 8000), None, "an index");
        assert_eq!(listed.refuses_host("FILES.example.", 443), None);
        assert_eq!(listed.refuses_host("a.cdn.example", 80), None);
        assert_eq!(listed.refuses_host("198.51.100.7", 80), None);
        for host in ["other.example", "cdn.example", "198.51.100.8", "127.0.0.1"] {
            let reason = listed.refuses_host(host, 443).unwrap_or_default();
            assert!(reason.contains("install_hosts"), "{host}: {reason}");
            assert!(reason.contains("files.example"), "{reason}");
        }
        let none = EgressRules::for_urls(&[], Some(Vec::new()));
        assert!(
            none.refuses_host("files.example", 443)
                .is_some_and(|r| r.contains("configured indexes only"))
        );
    }

    /// One request through an install proxy on a real socket; returns the answer.
    async fn ask(proxy: &EgressProxy, request: &str) -> String {
        let mut stream = tokio::net::UnixStream::connect(proxy.path()).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer).await;
        answer
    }

    /// A listener on loopback answering every request with `body`.
    async fn listener(body: &'static str) -> u16 {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = server.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0_u8; 4096];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let seen = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}{}",
                        body.len() + seen.len(),
                        seen
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                });
            }
        });
        port
    }

    /// The index on loopback is reached (a trusted destination); any other loopback port,
    /// `localhost`, metadata and a host outside `install_hosts` are refused and explained.
    #[tokio::test]
    async fn an_install_reaches_its_index_and_nothing_else() {
        let port = listener("index").await;
        let rules = EgressRules::for_urls(
            &[format!("http://127.0.0.1:{port}/simple")],
            Some(vec!["files.example".into()]),
        );
        let proxy = EgressProxy::start(&rules).unwrap();
        let answer = ask(
            &proxy,
            &format!("GET http://127.0.0.1:{port}/simple/ HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.contains("index"),
            "{answer}"
        );
        for (request, reason) in [
            (
                format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n\r\n", port ^ 1),
                "install_hosts",
            ),
            (
                "GET http://169.254.169.254/ HTTP/1.1\r\n\r\n".to_owned(),
                "install_hosts",
            ),
            (
                "CONNECT other.example:443 HTTP/1.1\r\n\r\n".to_owned(),
                "install_hosts",
            ),
            (
                "CONNECT files.example:22 HTTP/1.1\r\n\r\n".to_owned(),
                "port 22",
            ),
        ] {
            let answer = ask(&proxy, &request).await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{request}: {answer}");
            assert!(answer.contains(reason), "{request}: {answer}");
        }
        let explained = proxy.explain().unwrap_or_default();
        assert!(
            explained.contains(
                "refused `other.example:443`: `other.example` is not in the install hosts"
            ),
            "{explained}"
        );
        assert_eq!(proxy.refusals().len(), 4);
        let socket = proxy.path().to_path_buf();
        drop(proxy);
        assert!(!socket.exists() && !socket.parent().unwrap().exists());
    }

    /// Without `install_hosts`, public hosts on 80/443 pass by name but loopback by any
    /// spelling does not.
    #[tokio::test]
    async fn without_install_hosts_only_public_addresses_are_reached() {
        let proxy = EgressProxy::start(&EgressRules::for_urls(&[], None)).unwrap();
        for host in [
            "127.0.0.1",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "169.254.169.254",
            "10.0.0.1",
            "127.1",
        ] {
            let answer = ask(&proxy, &format!("GET http://{host}/ HTTP/1.1\r\n\r\n")).await;
            assert!(answer.starts_with("HTTP/1.1 403"), "{host}: {answer}");
            assert!(
                answer.contains("installs may not reach"),
                "{host}: {answer}"
            );
        }
    }

    /// An operator's proxy: allowed requests are chained through it with its credential, in
    /// proxy form; the index (on loopback) is reached through it without being resolved here;
    /// a `NO_PROXY` host is reached directly.
    #[tokio::test]
    async fn allowed_requests_are_chained_through_the_operators_proxy() {
        let upstream_port = listener("upstream").await;
        let direct_port = listener("direct").await;
        let mut rules = EgressRules::for_urls(
            &[
                "http://index.invalid:8000/simple".into(),
                format!("http://localhost:{direct_port}/simple"),
            ],
            None,
        );
        rules.upstream =
            Some(Upstream::parse(&format!("http://u:p@127.0.0.1:{upstream_port}")).unwrap());
        rules.no_proxy = vec!["localhost".into()];
        let proxy = EgressProxy::start(&rules).unwrap();
        let answer = ask(
            &proxy,
            "GET http://index.invalid:8000/simple/six/ HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await;
        assert!(answer.contains("upstream"), "{answer}");
        assert!(
            answer.contains("GET http://index.invalid:8000/simple/six/ HTTP/1.1\r\nProxy-Authorization: Basic dTpw\r\n"),
            "{answer}"
        );
        let answer = ask(
            &proxy,
            &format!("GET http://localhost:{direct_port}/simple/ HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(
            answer.contains("direct") && answer.contains("GET /simple/ HTTP/1.1"),
            "{answer}"
        );
        // A loopback link outside the indexes is refused before the operator's proxy is asked.
        let answer = ask(&proxy, "GET http://127.0.0.1:9/x HTTP/1.1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    }
}
