//! Settings resolution: command line, then environment variables (both through clap), then the
//! config file, then defaults, merged into one [`EngineConfig`].
//!
//! The config file is sectioned. The sections follow what each setting governs, which is also
//! where the engine keeps it and where the next settings will go:
//!
//! | section | holds | grows into |
//! |---|---|---|
//! | `[server]` | the data directory, runs at once, the largest stdio message, the audit writer's queue | the serve lifecycle |
//! | `[python]` | default interpreter version, the uv binary | interpreter choice per profile |
//! | `[sandbox]` | the backend, the bwrap binary, the docker runtime | the docker engine's socket |
//! | `[network]` | what runs and installs may reach, the run proxy's caps | egress policies |
//! | `[limits]` | what one run may use: time, output, memory, processes, CPU, scratch, script size | `[profiles]` (limit sets) |
//! | `[pool]` | warm sandboxes and the fork server | |
//! | `[cache]` | the environment cache: warming, builds, size and age | |
//! | `[sessions]` | persistent sessions: idle times, count, disk, interpreters | per-tenant quotas |
//! | `[artifacts]` | the artifact store: age and size | |
//! | `[tenants]` | what one tenant may take: runs at once, runs per minute, sessions; what it may keep in the shared stores (runs table, audit log, artifacts); its share of the sessions' disk | |
//! | `[tenants.NAME]` | the same for one tenant set apart, and the profiles it may name and its default profile | tenants' own budgets |
//! | `[profiles.NAME]` | a named policy bundle (network, subprocesses, writable /work, limits, packages, imports, tenants); built-ins `standard`, `basic`, `data_science`, `network`, `filesystem` | |
//! | `[http]` | `serve --http`: address, public URL, allowed hosts and origins, download links' lifetime | |
//! | `[front]` | `serve --agents`: a front's engine agents and the key it signs their calls with | the Kubernetes directory |
//!
//! `[limits]` holds only per-run bounds; server-wide capacity (`max_concurrent_runs`) is in
//! `[server]`, and each store's retention is in the store's own section, so a per-tenant or
//! per-profile `[limits]` can later be a copy of one table. What one tenant may keep in a
//! shared store is a tenant's budget, so it is in `[tenants]` beside its other quotas.
//!
//! One tenant's own settings are `[tenants.NAME]` sub-tables of `[tenants]`, not a
//! `[[tenants]]` array: TOML cannot hold an array and the `[tenants]` table (the defaults,
//! written by every earlier file) under one name. [`file::sectioned`] takes the sub-tables out of
//! `[tenants]` (checking their names and keys), and a tenant's `profiles` grant what the
//! profiles' own `tenants` lists grant: either list lets the tenant name a profile.
//!
//! One mechanism reads the file ([`file`]): the TOML table is normalised into the sectioned
//! form ([`file::sectioned`]): every flat key of earlier versions (`max_timeout = 120`, the long
//! flag with `_`) is moved to its place in its section by the one table [`file::FLAT_KEYS`]; a
//! flat key and its sectioned twin both set is an error naming both; an unknown key is an
//! error with a did-you-mean hint. Then serde reads one struct per section
//! (`deny_unknown_fields`), and [`resolve`] runs one step per section, each taking that
//! section's flags (a flattened clap struct, [`crate::cli`]) and that section of the file:
//! flag or environment, else file, else default.
//!
//! One module per section (`server`, `python`, `sandbox`, `network`, `limits`, `pool`,
//! `cache`, `sessions`, `artifacts`, `tenants`, `profiles`, `http`, `front`) holds that section's
//! struct and its resolve step; [`values`] how sizes, cores and counts are written. A new
//! section is a module, a row in [`file::SECTIONS`] (and its keys in
//! [`file::SECTION_KEYS`]), a field of [`file::FileSettings`] and a step in [`resolve`].

use std::path::PathBuf;

use snakebox_engine::EngineConfig;
use snakebox_sandbox::BackendKind;

use crate::cli::{EngineArgs, ServeArgs};

mod artifacts;
mod cache;
mod file;
mod front;
mod http;
mod ibm;
mod limits;
mod network;
mod pool;
mod profiles;
mod python;
mod sandbox;
mod secrets;
mod server;
mod sessions;
mod tenants;
mod values;

use artifacts::resolve_artifacts;
use cache::resolve_cache;
use file::{FileSettings, load_file};
use front::resolve_front;
pub(crate) use front::{DirectorySettings, FrontSettings};
use http::resolve_http;
use limits::resolve_limits;
use network::resolve_network;
use pool::resolve_pool;
use profiles::resolve_profiles;
use python::resolve_python;
use sandbox::resolve_sandbox;
use server::{resolve_audit_queue, resolve_frame, resolve_server};
use sessions::resolve_sessions;
use tenants::{resolve_tenant_tables, resolve_tenants, several_tenants};
use values::text_or;

/// `serve`'s settings: the engine's, and the HTTP face's when `--http` (or `SNAKEBOX_HTTP`)
/// asks for it (`None`: stdio). One read of the config file for both.
///
/// # Errors
/// As [`resolve`]; also an address that does not parse, or a public URL that is not one.
pub(crate) fn resolve_serve(
    args: &ServeArgs,
) -> anyhow::Result<(
    Settings,
    Option<snakebox_http::HttpConfig>,
    Option<FrontSettings>,
)> {
    let mut file = load_file(args.engine.config.as_deref())?;
    let http_file = std::mem::take(&mut file.http);
    let front_file = std::mem::take(&mut file.front);
    let mut settings = resolve_with(&args.engine, file)?;
    let http = resolve_http(&args.http, http_file, settings.engine.max_script_bytes)?;
    if http.is_some() {
        several_tenants(&mut settings.engine);
    }
    let front = resolve_front(&args.front, front_file)?;
    Ok((settings, http, front))
}

/// The default address of `snakebox agent`'s internal API.
pub(crate) const DEFAULT_AGENT_ADDR: &str = "127.0.0.1:8700";

/// `snakebox agent`'s settings: the engine's (read as `serve --http` reads them: several
/// tenants), the address to listen on and the agent's name.
///
/// # Errors
/// As [`resolve`]; also an address that does not parse.
pub(crate) fn resolve_agent(
    args: &crate::cli::AgentArgs,
) -> anyhow::Result<(Settings, std::net::SocketAddr, String)> {
    let mut settings = resolve(&args.engine)?;
    several_tenants(&mut settings.engine);
    let listen = args.listen.as_deref().unwrap_or(DEFAULT_AGENT_ADDR);
    let addr = listen.parse().map_err(|_| {
        anyhow::anyhow!("invalid --listen address `{listen}`\nhint: write an IP address and a port, e.g. `127.0.0.1:8700` or `0.0.0.0:8700`")
    })?;
    let name = args.name.clone().unwrap_or_else(|| listen.to_owned());
    if name.is_empty() {
        anyhow::bail!(
            "--name is empty\nhint: name the agent as its fronts do (`--agents NAME=URL`)"
        );
    }
    Ok((settings, addr, name))
}

/// The resolved settings: the engine's, and those of `serve`'s stdio face.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) engine: EngineConfig,
    /// Largest message read from stdin (`[server] max_frame_bytes`).
    pub(crate) max_frame_bytes: usize,
}

/// Merge CLI/env arguments with the config file and defaults: one step per section.
///
/// # Errors
/// An unreadable or invalid config file, or a value that does not parse; the message names
/// the setting and says what is accepted.
pub(crate) fn resolve(args: &EngineArgs) -> anyhow::Result<Settings> {
    resolve_with(args, load_file(args.config.as_deref())?)
}

/// [`resolve`] with the file already read.
fn resolve_with(args: &EngineArgs, mut file: FileSettings) -> anyhow::Result<Settings> {
    let mut config = EngineConfig::new(PathBuf::new(), BackendKind::Native);
    let frame = text_or(
        args.server.max_frame_bytes.as_ref(),
        file.server.max_frame_bytes.take(),
    );
    let queue = text_or(
        args.server.audit_queue_size.as_ref(),
        file.server.audit_queue_size.take(),
    );
    let profile_chosen = args.server.profile.is_some() || file.server.profile.is_some();
    resolve_server(&args.server, file.server, &mut config)?;
    // IBM's `SANDBOX_*` variables, when its tool set is served: they fill in what snakebox's
    // own settings leave unset (limits before those are read, the profile after).
    let ibm = if config.serves(snakebox_engine::CompatToolSet::Ibm) {
        ibm::IbmEnvironment::read(&|name| std::env::var(name).ok())?
    } else {
        ibm::IbmEnvironment::default()
    };
    ibm.apply_limits(&mut config);
    resolve_python(&args.python, file.python, &mut config);
    resolve_sandbox(&args.sandbox, file.sandbox, &mut config);
    resolve_network(&args.network, file.network, &mut config)?;
    resolve_limits(&args.limits, file.limits, &mut config)?;
    resolve_pool(&args.pool, &file.pool, &mut config)?;
    resolve_cache(&args.cache, file.cache, &mut config)?;
    resolve_sessions(&args.sessions, file.sessions, &mut config)?;
    resolve_artifacts(&args.artifacts, file.artifacts, &mut config)?;
    resolve_tenants(&args.tenants, &mut file.tenants, &mut config)?;
    resolve_audit_queue(queue.as_deref(), &mut config)?;
    resolve_profiles(
        &args.server,
        std::mem::take(&mut file.profiles),
        &mut config,
    )?;
    ibm.apply_profile(&mut config, profile_chosen);
    resolve_tenant_tables(std::mem::take(&mut file.tenant_tables), &mut config)?;
    let declared = secrets::declared(
        args.network.secrets.as_deref(),
        std::mem::take(&mut file.secrets),
    )?;
    secrets::resolve_secrets(declared, &|name| std::env::var(name).ok(), &mut config)?;
    let max_frame_bytes = resolve_frame(frame.as_deref(), config.max_script_bytes)?;
    Ok(Settings {
        engine: config,
        max_frame_bytes,
    })
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
