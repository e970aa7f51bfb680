//! `[network]`: what runs and installs may reach, and the run proxy's checks and caps.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{SizeOrNumber, parse_size};
use crate::cli::NetworkArgs;

/// `[network]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NetworkFile {
    pub(super) mode: Option<String>,
    pub(super) resolvers: Option<String>,
    pub(super) ports: Option<String>,
    pub(super) allow_ip_literals: Option<bool>,
    pub(super) exceptions: Option<String>,
    pub(super) install_hosts: Option<String>,
    pub(super) max_connections: Option<u64>,
    pub(super) max_bytes: Option<SizeOrNumber>,
    pub(super) max_connection_seconds: Option<u64>,
    /// A PEM file of CA certificates the proxy trusts, besides the host's, when it connects
    /// to a secret's host.
    pub(super) upstream_ca_file: Option<std::path::PathBuf>,
}

pub(super) fn resolve_network(
    args: &NetworkArgs,
    file: NetworkFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    resolve_network_caps(args, &file, config)?;
    if let Some(path) = &file.upstream_ca_file {
        if !path.is_file() {
            bail!(
                "`[network] upstream_ca_file`: `{}` is not a file\nhint: give a PEM file of the CA certificates a secret's host presents (besides the host's trust store)",
                path.display()
            );
        }
        config.secrets.extra_ca_file = Some(path.clone());
    }
    if let Some(list) = args
        .network_install_hosts
        .as_ref()
        .or(file.install_hosts.as_ref())
    {
        config.network_proxy.install_hosts = Some(
            snakebox_engine::parse_install_hosts(list).map_err(|reason| {
                anyhow::anyhow!(
                    "--network-install-hosts: {reason}\nhint: for example `--network-install-hosts files.example.org,*.cdn.example.org` (the configured package indexes are always allowed)"
                )
            })?,
        );
    }
    if let Some(mode) = args.network.as_ref().or(file.mode.as_ref()) {
        config.network = snakebox_engine::NetworkPolicy::parse(mode).map_err(|reason| {
            anyhow::anyhow!(
                "--network: {reason}\nhint: for example `--network allow:api.example.com,files.example.org`"
            )
        })?;
    }
    if let Some(list) = args.network_resolvers.as_ref().or(file.resolvers.as_ref()) {
        config.network_proxy.resolvers = list
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                item.parse::<std::net::SocketAddr>()
                    .or_else(|_| {
                        item.parse::<std::net::IpAddr>()
                            .map(|ip| std::net::SocketAddr::new(ip, 53))
                    })
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "--network-resolvers: `{item}` is not an IP address or IP:PORT\nhint: for example `--network-resolvers 192.0.2.53,192.0.2.54:5353`"
                        )
                    })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(list) = args.network_ports.as_ref().or(file.ports.as_ref()) {
        config.network_proxy.ports = list
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                item.parse::<u16>().ok().filter(|port| *port > 0).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--network-ports: `{item}` is not a port number\nhint: for example `--network-ports 80,443,8443`"
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    config.network_proxy.allow_ip_literals =
        args.network_allow_ip_literals || file.allow_ip_literals.unwrap_or(false);
    if let Some(list) = args
        .network_exceptions
        .as_ref()
        .or(file.exceptions.as_ref())
    {
        config.network_proxy.exceptions = list
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                item.parse::<ipnet::IpNet>()
                    .or_else(|_| item.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "--network-exceptions: `{item}` is not an address range\nhint: write CIDR ranges such as `10.20.0.0/16,fd00:1::/64`"
                        )
                    })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(())
}

/// The run proxy's caps: connections, bytes and seconds per connection, each at least 1.
pub(super) fn resolve_network_caps(
    args: &NetworkArgs,
    file: &NetworkFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    let caps = &mut config.network_proxy.caps;
    if let Some(n) = args.network_max_connections.or(file.max_connections) {
        if n == 0 {
            bail!(
                "--network-max-connections must be at least 1\nhint: run without network instead (`network: false`), or raise it"
            );
        }
        caps.connections = n;
    }
    let bytes = args
        .network_max_bytes
        .clone()
        .or(file.max_bytes.as_ref().map(|value| match value {
            SizeOrNumber::Number(n) => n.to_string(),
            SizeOrNumber::Text(text) => text.clone(),
        }));
    if let Some(text) = bytes {
        let n = parse_size(&text)
            .with_context(|| "invalid --network-max-bytes (`[network] max_bytes`)")?;
        if n == 0 {
            bail!("--network-max-bytes must be at least 1 byte\nhint: the default is 1GiB");
        }
        caps.bytes = n;
    }
    if let Some(seconds) = args
        .network_max_connection_seconds
        .or(file.max_connection_seconds)
    {
        if seconds == 0 {
            bail!("--network-max-connection-seconds must be at least 1\nhint: the default is 600");
        }
        caps.connection_time = Duration::from_secs(seconds);
    }
    Ok(())
}
