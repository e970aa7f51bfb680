//! Network policy of runs: the operator's policy (`off`, `on`, `allow:` names), what one call
//! may ask for (only less), and the per-run proxy that enforces it.
//!
//! A run with network never shares the host's network namespace (when the sandbox isolates):
//! it keeps its own, loopback only, and reaches out only through a
//! [`snakebox_sandbox::RunProxy`] listening in its input directory, bridged inside to
//! `127.0.0.1:3128` by the runner before any user code. The proxy's decisions become the
//! result's `network_log`.

use std::net::SocketAddr;
use std::sync::OnceLock;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_sandbox::{Names, NetCaps, NetDecision, NetResolver, NetRules, RunProxy};

use crate::{EngineError, ErrorKind, Unavailable};

/// The operator's network policy for runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkPolicy {
    /// No network: own namespace, loopback only, no proxy.
    #[default]
    Off,
    /// Any host name (public addresses only), through the proxy.
    On,
    /// Only these names (`name` or `*.suffix`), through the proxy.
    Allow(Vec<String>),
}

impl NetworkPolicy {
    /// Parse `off`, `on` or `allow:NAME[,NAME…]`.
    ///
    /// # Errors
    /// A message naming what is wrong.
    pub fn parse(text: &str) -> Result<NetworkPolicy, String> {
        let text = text.trim();
        match text {
            "off" => return Ok(NetworkPolicy::Off),
            "on" => return Ok(NetworkPolicy::On),
            _ => {}
        }
        let Some(list) = text.strip_prefix("allow:") else {
            return Err(format!(
                "`{text}` is not a network policy: use `off`, `on` or `allow:NAME[,NAME...]`"
            ));
        };
        let names: Vec<String> = list
            .split(',')
            .map(|name| name.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|name| !name.is_empty())
            .collect();
        if names.is_empty() {
            return Err(
                "`allow:` needs at least one name, e.g. `allow:api.example.com,*.example.com`"
                    .into(),
            );
        }
        for name in &names {
            check_pattern(name)?;
        }
        Ok(NetworkPolicy::Allow(names))
    }

    /// Whether runs may have network at all.
    #[must_use]
    pub fn allows_network(&self) -> bool {
        *self != NetworkPolicy::Off
    }

    /// The names it allows (`None` when off).
    #[must_use]
    pub fn names(&self) -> Option<Names> {
        match self {
            NetworkPolicy::Off => None,
            NetworkPolicy::On => Some(Names::Any),
            NetworkPolicy::Allow(names) => Some(Names::Only(names.clone())),
        }
    }

    /// As written in settings: `off`, `on`, `allow:a,b`.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            NetworkPolicy::Off => "off".into(),
            NetworkPolicy::On => "on".into(),
            NetworkPolicy::Allow(names) => format!("allow:{}", names.join(",")),
        }
    }
}

/// A name pattern: a host name, or `*.` and a host name.
pub(crate) fn check_pattern(pattern: &str) -> Result<(), String> {
    let name = pattern.strip_prefix("*.").unwrap_or(pattern);
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
        && name.parse::<std::net::IpAddr>().is_err();
    if valid {
        Ok(())
    } else {
        Err(format!(
            "`{pattern}` is not a host name or `*.domain` pattern"
        ))
    }
}

/// How the proxy checks destinations beyond the names (the operator's `[network]` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySettings {
    /// Ports runs may reach (default 80 and 443).
    pub ports: Vec<u16>,
    /// Accept IP literals as destinations (their address class is still checked).
    pub allow_ip_literals: bool,
    /// Address ranges reachable although not public.
    pub exceptions: Vec<ipnet::IpNet>,
    /// Name servers the proxy asks (`ip` or `ip:port`); empty: the host's resolv.conf.
    pub resolvers: Vec<SocketAddr>,
    /// Per-run caps.
    pub caps: NetCaps,
    /// Hosts installs may reach besides the configured indexes (`name`, `*.suffix`, or an
    /// address); `None`: any host on ports 80 and 443 whose addresses are public.
    pub install_hosts: Option<Vec<String>>,
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            ports: vec![80, 443],
            allow_ip_literals: false,
            exceptions: Vec::new(),
            resolvers: Vec::new(),
            caps: NetCaps::default(),
            install_hosts: None,
        }
    }
}

impl ProxySettings {
    /// What installs may reach beyond the configured indexes, for the environment cache and
    /// session installs (the same exceptions as runs; names are resolved by the host's
    /// resolver, as uv's own would be).
    #[must_use]
    pub fn install_network(&self) -> snakebox_env::InstallNetwork {
        snakebox_env::InstallNetwork {
            hosts: self.install_hosts.clone(),
            exceptions: self.exceptions.clone(),
        }
    }

    /// How installs reach the network, for `check_environment`.
    #[must_use]
    pub fn describe_installs(&self) -> String {
        match &self.install_hosts {
            None => "the configured package indexes (wherever they are) and any host on ports 80 and 443 whose addresses are public ([network] install_hosts unset)".to_owned(),
            Some(hosts) if hosts.is_empty() => "the configured package indexes only ([network] install_hosts is empty)".to_owned(),
            Some(hosts) => format!(
                "the configured package indexes (wherever they are) and only {} on ports 80 and 443, at public addresses ([network] install_hosts)",
                hosts.join(", ")
            ),
        }
    }
}

/// Parse `[network] install_hosts`: comma-separated host names, `*.suffix` patterns or IP
/// addresses (an empty list: the configured indexes only).
///
/// # Errors
/// A message naming the entry that is none of these.
pub fn parse_install_hosts(text: &str) -> Result<Vec<String>, String> {
    text.split(',')
        .map(|item| item.trim().trim_end_matches('.').to_ascii_lowercase())
        .filter(|item| !item.is_empty())
        .map(|item| {
            let bare = item.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
                return Ok(ip.to_string());
            }
            check_pattern(&item).map(|()| item.clone()).map_err(|_| {
                format!("`{item}` is not a host name, `*.domain` pattern or IP address")
            })
        })
        .collect()
}

/// One decision of the run's proxy, as the result reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkLogEntry {
    /// The destination asked for (a name, or an address).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// Whether the connection was made.
    pub allowed: bool,
    /// `allowed`, or why not: a policy refusal, or `network error: …`.
    pub reason: String,
    /// The address connected to (`null` when no connection was made).
    pub address: Option<String>,
    /// Bytes sent by the run.
    pub bytes_sent: u64,
    /// Bytes received by the run.
    pub bytes_received: u64,
}

impl From<NetDecision> for NetworkLogEntry {
    fn from(d: NetDecision) -> Self {
        Self {
            host: d.host,
            port: d.port,
            allowed: d.allowed,
            reason: d.reason,
            address: d.address,
            bytes_sent: d.bytes_sent,
            bytes_received: d.bytes_received,
        }
    }
}

/// The proxy's log as result entries.
pub(crate) fn log_of(proxy: &RunProxy) -> Vec<NetworkLogEntry> {
    proxy.log().into_iter().map(Into::into).collect()
}

/// The log of a session's proxy since the last call, as result entries (the proxy lives on
/// with the session; each call reports only its own decisions). None without a proxy.
pub(crate) fn take_log_of(proxy: Option<&RunProxy>) -> Vec<NetworkLogEntry> {
    proxy.map_or_else(Vec::new, |proxy| {
        proxy.take_log().into_iter().map(Into::into).collect()
    })
}

/// The engine's resolver, made on first use.
#[derive(Default)]
pub(crate) struct ResolverCell(OnceLock<Result<NetResolver, String>>);

/// The run proxies as a service: the operator's network settings, the sandbox (whether it
/// isolates runs' networks) and the resolver, for every path that starts a proxy (one-shot
/// runs, pooled sandboxes, sessions) and for the report that says how the policy is enforced.
pub(crate) struct Proxies {
    /// `[network]` for runs (`config.network`).
    policy: NetworkPolicy,
    /// The proxy's settings (`config.network_proxy`).
    settings: ProxySettings,
    sandbox: Result<std::sync::Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    /// The run proxy's resolver, made on first use.
    resolver: ResolverCell,
}

impl Proxies {
    pub(crate) fn new(
        policy: NetworkPolicy,
        settings: ProxySettings,
        sandbox: Result<std::sync::Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    ) -> Proxies {
        Proxies {
            policy,
            settings,
            sandbox,
            resolver: ResolverCell::default(),
        }
    }

    /// The rules of a run allowed `names`.
    pub(crate) fn net_rules(&self, names: Names) -> NetRules {
        let settings = &self.settings;
        NetRules {
            ports: settings.ports.clone(),
            allow_ip_literals: settings.allow_ip_literals,
            exceptions: settings.exceptions.clone(),
            caps: settings.caps.clone(),
            ..NetRules::new(names)
        }
    }

    /// Whether runs with network go through the proxy (the sandbox isolates: always, except
    /// with the `none` backend, where runs share the host's network).
    pub(crate) fn network_proxied(&self) -> bool {
        self.sandbox
            .as_ref()
            .is_ok_and(|sandbox| sandbox.report().isolation_active)
    }

    /// Start the proxy of one run (or session) in `dir`, its input directory.
    pub(crate) fn start_run_proxy(
        &self,
        dir: &std::path::Path,
        names: Names,
    ) -> Result<RunProxy, EngineError> {
        let resolver = self
            .resolver
            .0
            .get_or_init(|| NetResolver::new(&self.settings.resolvers))
            .clone()
            .map_err(|message| {
                EngineError::new(
                    ErrorKind::Unavailable,
                    format!("The network proxy cannot resolve names: {message}"),
                )
                .with_hint("check /etc/resolv.conf, or set `resolvers` in the `[network]` settings")
            })?;
        RunProxy::start(dir, self.net_rules(names), resolver).map_err(|err| {
            EngineError::internal(
                format!("Failed to start the run's network proxy: {err}"),
                "check that the data directory is writable",
            )
        })
    }

    /// How the policy is enforced, for `check_environment`.
    pub(crate) fn network_enforcement(&self) -> String {
        let policy = &self.policy;
        if !policy.allows_network() {
            return "off: each run has its own network namespace with loopback only".into();
        }
        if !self.network_proxied() {
            return format!(
                "{}: NOT enforced: the `none` backend shares the host's network with runs",
                policy.describe()
            );
        }
        let settings = &self.settings;
        let ports: Vec<String> = settings.ports.iter().map(ToString::to_string).collect();
        let resolver = if settings.resolvers.is_empty() {
            "the host's resolv.conf".to_owned()
        } else {
            let shown: Vec<String> = settings.resolvers.iter().map(ToString::to_string).collect();
            shown.join(", ")
        };
        format!(
            "{}: each run has its own network namespace (loopback only); its one way out is a proxy in the server (HTTP CONNECT, plain HTTP, SOCKS5 with remote DNS) reached through a per-run Unix socket bridged to 127.0.0.1:{} inside, with HTTP(S)_PROXY/ALL_PROXY set; host names only{}, ports {}, names resolved once by the proxy ({resolver}) and loopback, link-local/metadata, private, CGNAT, ULA and this server's own addresses refused{}; TLS server name checked on 443; caps per run ([network] max_connections, max_bytes, max_connection_seconds): {} connections, {} bytes, {} s per connection",
            policy.describe(),
            snakebox_sandbox::BRIDGE_PORT,
            if settings.allow_ip_literals {
                " (IP literals allowed by the operator)"
            } else {
                ""
            },
            ports.join(", "),
            if settings.exceptions.is_empty() {
                String::new()
            } else {
                let shown: Vec<String> = settings
                    .exceptions
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!(" except {}", shown.join(", "))
            },
            settings.caps.connections,
            settings.caps.bytes,
            settings.caps.connection_time.as_secs(),
        )
    }
}

/// Whether the server's `names` cover a requested `pattern` (every name the pattern matches
/// is allowed by the server).
pub(crate) fn covers(server: &Names, pattern: &str) -> bool {
    match server {
        Names::Any => true,
        Names::Only(allowed) => match pattern.strip_prefix("*.") {
            None => allowed
                .iter()
                .any(|a| snakebox_sandbox::name_matches(a, pattern)),
            Some(suffix) => allowed.iter().any(|a| {
                a.strip_prefix("*.")
                    .is_some_and(|own| suffix == own || suffix.ends_with(&format!(".{own}")))
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        assert_eq!(NetworkPolicy::parse("off"), Ok(NetworkPolicy::Off));
        assert_eq!(NetworkPolicy::parse("on"), Ok(NetworkPolicy::On));
        assert_eq!(
            NetworkPolicy::parse("allow:API.Example.com., *.example.com"),
            Ok(NetworkPolicy::Allow(vec![
                "api.example.com".into(),
                "*.example.com".into()
            ]))
        );
        for bad in [
            "maybe",
            "allow:",
            "allow:,",
            "allow:127.0.0.1",
            "allow:a b",
            "allow:*",
        ] {
            assert!(NetworkPolicy::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_call_may_only_narrow() {
        let server = Names::Only(vec!["api.example.com".into(), "*.example.org".into()]);
        assert!(covers(&server, "api.example.com"));
        assert!(covers(&server, "a.example.org"));
        assert!(covers(&server, "*.example.org"));
        assert!(covers(&server, "*.b.example.org"));
        assert!(!covers(&server, "example.org"));
        assert!(!covers(&server, "v2.api.example.com"));
        assert!(!covers(&server, "*.api.example.com"));
        assert!(!covers(&server, "evil.com"));
        assert!(covers(&Names::Any, "anything.test"));
    }
}
