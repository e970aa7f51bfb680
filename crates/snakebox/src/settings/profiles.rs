//! `[profiles.NAME]`: named policy bundles over the built-ins, and the default profile.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{SizeOrNumber, check_process_limit, parse_memory_limit};
use crate::cli::ServerArgs;

/// `[profiles.NAME]`: what the profile changes from the built-in of the same name (or from
/// `standard`, which adds nothing to the server's settings).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProfileFile {
    pub(super) description: Option<String>,
    /// `"off"`, `"server"` or a list of host names (`["api.example.com", "*.example.org"]`).
    pub(super) network: Option<ProfileNetworkFile>,
    pub(super) subprocesses: Option<bool>,
    pub(super) writable_work: Option<bool>,
    pub(super) timeout: Option<u64>,
    pub(super) memory: Option<SizeOrNumber>,
    pub(super) cpu_seconds: Option<u64>,
    pub(super) processes: Option<u64>,
    pub(super) max_output_bytes: Option<u64>,
    pub(super) packages: Option<Vec<String>>,
    pub(super) allowed_imports: Option<Vec<String>>,
    pub(super) tenants: Option<Vec<String>>,
}

/// A profile's `network`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ProfileNetworkFile {
    Mode(String),
    Domains(Vec<String>),
}

/// `[profiles.NAME]` over the built-ins, then the default profile (`--profile`, `[server]
/// profile`, else `standard`).
pub(super) fn resolve_profiles(
    args: &ServerArgs,
    file: BTreeMap<String, ProfileFile>,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    use snakebox_engine::{Profile, ProfileLimits, ProfileNetwork};
    let profiles = &mut config.profiles;
    for (name, table) in file {
        if !snakebox_engine::is_plain_name(&name) {
            bail!(
                "invalid profile name `[profiles.{name}]`\nhint: use 1 to 64 characters of lowercase letters, digits, `-` and `_`"
            );
        }
        let base = profiles.all.get(&name).cloned().unwrap_or_else(|| {
            Profile::unrestricted(&name, &format!("the operator's profile `{name}`"))
        });
        let what = |key: &str| format!("`[profiles.{name}] {key}`");
        let network = match table.network {
            None => base.network,
            Some(ProfileNetworkFile::Mode(mode)) => match mode.as_str() {
                "off" => ProfileNetwork::Off,
                "server" => ProfileNetwork::Server,
                other => bail!(
                    "invalid {} `{other}`\nhint: write \"off\", \"server\" (the [network] policy) or a list of host names such as [\"api.example.com\"]",
                    what("network")
                ),
            },
            Some(ProfileNetworkFile::Domains(names)) if names.is_empty() => ProfileNetwork::Off,
            Some(ProfileNetworkFile::Domains(names)) => ProfileNetwork::Allow(
                names
                    .iter()
                    .map(|n| n.trim().trim_end_matches('.').to_ascii_lowercase())
                    .collect(),
            ),
        };
        let memory_bytes = match table.memory {
            None => base.limits.memory_bytes,
            Some(value) => {
                let bytes = parse_memory_limit(&value.into_text())
                    .with_context(|| format!("invalid {}", what("memory")))?;
                Some(bytes)
            }
        };
        for (key, value) in [
            ("timeout", table.timeout),
            ("cpu_seconds", table.cpu_seconds),
        ] {
            if value == Some(0) {
                bail!(
                    "{} must be at least 1\nhint: leave it out for the server's limit",
                    what(key)
                );
            }
        }
        if table.max_output_bytes.is_some_and(|bytes| bytes < 1024) {
            bail!("{} must be at least 1024", what("max_output_bytes"));
        }
        if let Some(count) = table.processes {
            check_process_limit(count).with_context(|| format!("invalid {}", what("processes")))?;
        }
        let profile = Profile {
            name: name.clone(),
            description: table.description.unwrap_or(base.description),
            network,
            subprocesses: table.subprocesses.unwrap_or(base.subprocesses),
            writable_work: table.writable_work.unwrap_or(base.writable_work),
            limits: ProfileLimits {
                timeout_seconds: table.timeout.or(base.limits.timeout_seconds),
                memory_bytes,
                cpu_seconds: table.cpu_seconds.or(base.limits.cpu_seconds),
                processes: table.processes.or(base.limits.processes),
                output_bytes: table.max_output_bytes.or(base.limits.output_bytes),
            },
            packages: table.packages.or(base.packages),
            allowed_imports: table.allowed_imports.or(base.allowed_imports),
            tenants: table.tenants.unwrap_or(base.tenants),
        };
        profiles.all.insert(name, profile);
    }
    if let Some(name) = args.profile.clone().or(profiles_default_from_file(config)) {
        if !config.profiles.all.contains_key(&name) {
            bail!(
                "--profile (`[server] profile`) names `{name}`, which is not a profile\nhint: name one of {}, or define `[profiles.{name}]` in the config file",
                config.profiles.names().join(", ")
            );
        }
        config.profiles.default = name;
    }
    Ok(())
}

/// The `[server] profile` read by [`resolve_server`] (kept in the config until profiles are
/// resolved).
pub(super) fn profiles_default_from_file(config: &EngineConfig) -> Option<String> {
    Some(config.profiles.default.clone()).filter(|name| name != snakebox_engine::STANDARD_PROFILE)
}
