//! The config file: read, normalised to the sectioned form (flat keys of earlier versions moved
//! into their sections, `[tenants.NAME]` taken out of `[tenants]`), every key checked with a
//! did-you-mean hint, then read by serde one struct per section; a value of the wrong type
//! named with what it takes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

use super::artifacts::ArtifactsFile;
use super::cache::CacheFile;
use super::front::FrontFile;
use super::http::HttpFile;
use super::limits::LimitsFile;
use super::network::NetworkFile;
use super::pool::PoolFile;
use super::profiles::ProfileFile;
use super::python::PythonFile;
use super::sandbox::SandboxFile;
use super::server::ServerFile;
use super::sessions::SessionsFile;
use super::tenants::{TENANT_TABLE_KEYS, TenantFile, TenantsFile};

/// `(flat key, section, key in the section)`.
pub(super) type FlatKey = (&'static str, &'static str, &'static str);

/// Every flat key of earlier versions and its place in the sectioned file:
/// `(flat key, section, key in the section)`. The flat key is the long flag with `_`.
/// This is the one list of file keys: the section structs below must accept exactly these
/// (a test checks it).
pub(super) const FLAT_KEYS: &[FlatKey] = &[
    ("data_dir", "server", "data_dir"),
    ("max_concurrent_runs", "server", "max_concurrent_runs"),
    ("max_frame_bytes", "server", "max_frame_bytes"),
    ("python_version", "python", "version"),
    ("uv_path", "python", "uv_path"),
    ("python_downloads", "python", "downloads"),
    ("sandbox_backend", "sandbox", "backend"),
    ("bwrap_path", "sandbox", "bwrap_path"),
    ("network", "network", "mode"),
    ("network_resolvers", "network", "resolvers"),
    ("network_ports", "network", "ports"),
    ("network_allow_ip_literals", "network", "allow_ip_literals"),
    ("network_exceptions", "network", "exceptions"),
    ("network_install_hosts", "network", "install_hosts"),
    ("network_max_connections", "network", "max_connections"),
    ("network_max_bytes", "network", "max_bytes"),
    (
        "network_max_connection_seconds",
        "network",
        "max_connection_seconds",
    ),
    ("default_timeout", "limits", "default_timeout"),
    ("max_timeout", "limits", "max_timeout"),
    ("max_output_bytes", "limits", "max_output_bytes"),
    ("memory_limit", "limits", "memory"),
    ("max_processes", "limits", "processes"),
    ("cpu_limit", "limits", "cpu_seconds"),
    ("cpu_cores", "limits", "cpu_cores"),
    ("scratch_limit", "limits", "scratch"),
    ("max_script_bytes", "limits", "max_script_bytes"),
    ("warm_pool", "pool", "size"),
    ("fork_server", "pool", "fork_server"),
    ("preload_packages", "pool", "preload_packages"),
    ("prefork", "pool", "prefork"),
    ("no_warm_cache", "cache", "no_warm"),
    ("allow_sdist_builds", "cache", "allow_sdist_builds"),
    ("install_timeout", "cache", "install_timeout"),
    ("cache_max_size", "cache", "max_size"),
    ("cache_max_age_days", "cache", "max_age_days"),
    ("session_idle_stop", "sessions", "idle_stop"),
    ("session_idle_delete", "sessions", "idle_delete"),
    ("max_sessions", "sessions", "max_sessions"),
    ("sessions_max_disk", "sessions", "max_disk"),
    ("session_max_interpreters", "sessions", "max_interpreters"),
    ("artifact_max_age_hours", "artifacts", "max_age_hours"),
    ("artifact_max_size", "artifacts", "max_size"),
];

/// Keys that exist only in their section (added after the file became sectioned, so they
/// have no flat form): `(section, key)`.
pub(super) const SECTION_KEYS: &[(&str, &str)] = &[
    ("server", "profile"),
    ("sandbox", "docker_runtime"),
    ("server", "compat_tools"),
    ("server", "upload_dirs"),
    ("http", "addr"),
    ("network", "upstream_ca_file"),
    ("http", "public_url"),
    ("http", "allowed_hosts"),
    ("http", "allowed_origins"),
    ("http", "insecure_no_auth"),
    ("http", "link_ttl"),
    ("http", "max_body_bytes"),
    ("front", "agents"),
    ("front", "front_key"),
    ("front", "directory"),
    ("front", "namespace"),
    ("front", "agent_port"),
    ("front", "claim_ready_timeout"),
    ("front", "runner_idle_ttl"),
    ("front", "claim_max_age"),
    ("tenants", "max_concurrent_runs"),
    ("tenants", "runs_per_minute"),
    ("tenants", "max_sessions"),
    ("tenants", "history_max_runs"),
    ("tenants", "history_max_size"),
    ("tenants", "audit_max_size"),
    ("tenants", "artifacts_max_size"),
    ("tenants", "sessions_max_disk"),
    ("server", "audit_queue_size"),
    ("server", "database"),
    ("cache", "warm"),
    ("python", "infer_dependencies"),
    ("cache", "index_url"),
];

/// The sections, in the order docs/src/configuration.md documents them.
pub(super) const SECTIONS: &[&str] = &[
    "server",
    "python",
    "sandbox",
    "network",
    "limits",
    "pool",
    "cache",
    "sessions",
    "artifacts",
    "tenants",
    "http",
    "front",
];

/// The config file, sectioned (after [`sectioned`] has moved any flat keys in).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct FileSettings {
    pub(super) server: ServerFile,
    pub(super) python: PythonFile,
    pub(super) sandbox: SandboxFile,
    pub(super) network: NetworkFile,
    pub(super) limits: LimitsFile,
    pub(super) pool: PoolFile,
    pub(super) cache: CacheFile,
    pub(super) sessions: SessionsFile,
    pub(super) artifacts: ArtifactsFile,
    pub(super) tenants: TenantsFile,
    pub(super) http: HttpFile,
    pub(super) front: FrontFile,
    /// `[profiles.NAME]`: one table per profile (names are the operator's, so the section's
    /// keys are not checked against a list; each table's keys are).
    pub(super) profiles: BTreeMap<String, ProfileFile>,
    /// `[secrets.NAME]`: one table per secret (names are the operator's; each table's keys
    /// are checked by serde).
    pub(super) secrets: BTreeMap<String, super::secrets::SecretFile>,
    /// `[tenants.NAME]`: one table per tenant set apart, moved out of `[tenants]` by
    /// [`sectioned`] (under a name no file can write: see [`TENANT_TABLES`]).
    #[serde(rename = "tenants.NAME")]
    pub(super) tenant_tables: BTreeMap<String, TenantFile>,
}

/// Where [`sectioned`] puts the `[tenants.NAME]` tables (a key no file can hold at the top
/// level: every top-level key is checked before).
pub(super) const TENANT_TABLES: &str = "tenants.NAME";

pub(super) fn load_file(explicit: Option<&Path>) -> anyhow::Result<FileSettings> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => match default_config_path() {
            Some(path) if path.is_file() => path,
            _ => return Ok(FileSettings::default()),
        },
    };
    let text = fs_err::read_to_string(&path)
        .with_context(|| "could not read the config file\nhint: check the --config path")?;
    parse_file(&text).with_context(|| format!("invalid config file `{}`", path.display()))
}

/// Parse a config file's text: TOML, normalised to the sectioned form, then the sections.
pub(super) fn parse_file(text: &str) -> anyhow::Result<FileSettings> {
    let table: toml::Table = text.parse().map_err(|err: toml::de::Error| {
        let message = err.to_string();
        let message = message.trim_end();
        // TOML itself refuses the one flat key that is also a section's name.
        if message.contains("duplicate key") && message.contains("network") {
            anyhow::anyhow!(
                "{message}\nhint: the flat `network = ...` and the `[network]` section cannot both be written; write it in the section as `mode = ...`"
            )
        } else {
            anyhow::anyhow!("{message}")
        }
    })?;
    let (table, moved) = sectioned(table)?;
    // The name a key was written under: its flat form when it was moved into its section.
    let written = |section: &str, name: &str| {
        moved
            .iter()
            .find(|(_, s, n)| *s == section && *n == name)
            .map_or_else(
                || format!("`[{section}] {name}`"),
                |(flat, _, _)| format!("`{flat}` (`[{section}] {name}`)"),
            )
    };
    match FileSettings::deserialize(toml::Value::Table(table.clone())) {
        Ok(settings) => Ok(settings),
        // Serde does not always say which key it was reading (untagged values, numbers):
        // find it by reading each key alone, and say what that key takes.
        Err(err) => match first_bad_key(&table) {
            Some((section, name, message)) => bail!(
                "{}: {message}\nhint: {}",
                written(&section, &name),
                type_hint(&message)
            ),
            None => bail!(
                "{}\nhint: {}",
                err.to_string().trim_end(),
                type_hint(&err.to_string())
            ),
        },
    }
}

/// The first `(section, key, serde's message)` whose value alone does not deserialize
/// (`[profiles.NAME]` keys are one level deeper: their section is `profiles.NAME`).
pub(super) fn first_bad_key(table: &toml::Table) -> Option<(String, String, String)> {
    for (section, keys) in table {
        let toml::Value::Table(keys) = keys else {
            continue;
        };
        for (name, value) in keys {
            match value {
                toml::Value::Table(profile) if section == "profiles" => {
                    for (key, value) in profile {
                        if let Some(message) = fails_alone(&[section, name, key], value) {
                            return Some((format!("profiles.{name}"), key.clone(), message));
                        }
                    }
                }
                toml::Value::Table(tenant) if section == TENANT_TABLES => {
                    for (key, value) in tenant {
                        if let Some(message) = fails_alone(&[section, name, key], value) {
                            return Some((format!("tenants.{name}"), key.clone(), message));
                        }
                    }
                }
                _ => {
                    if let Some(message) = fails_alone(&[section, name], value) {
                        return Some((section.clone(), name.clone(), message));
                    }
                }
            }
        }
    }
    None
}

/// Serde's message when `value`, alone at `path` in an otherwise empty file, is refused.
pub(super) fn fails_alone(path: &[&String], value: &toml::Value) -> Option<String> {
    let file = path.iter().rev().fold(value.clone(), |inner, key| {
        toml::Value::Table(toml::Table::from_iter([((*key).clone(), inner)]))
    });
    let err = FileSettings::deserialize(file).err()?;
    let message = err.to_string();
    // Serde may name the place itself (`in `cache.no_warm``): the caller names it already.
    let message = message.trim_end();
    let message = message.split(['\n', ' ']).collect::<Vec<_>>().join(" ");
    let message = readable(message.split(" in `").next().unwrap_or(&message));
    // An untagged value's message is only what it expects (`a whole number ...`).
    Some(if message.starts_with("a ") {
        format!("expected {message}")
    } else {
        message
    })
}

/// Serde's type names in words a config file's author uses.
pub(super) fn readable(message: &str) -> String {
    let mut message = message.to_owned();
    for (from, to) in [
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected usize", "expected a whole number"),
        ("expected a boolean", "expected `true` or `false`"),
        (
            "invalid type: unit variant, expected string only",
            "expected `\"on\"` or `\"off\"`",
        ),
    ] {
        message = message.replace(from, to);
    }
    message
}

/// What to write instead, from what the key expected.
pub(super) fn type_hint(message: &str) -> &'static str {
    if message.contains("unknown field") {
        "check the key's spelling against the keys the message lists"
    } else if message.contains("`true` or `false`") || message.contains("a boolean") {
        "a switch of this key is written bare: `true` or `false`"
    } else if message.contains("`\"on\"` or `\"off\"`") || message.contains("unit variant") {
        "write `\"on\"` or `\"off\"`, in quotes"
    } else if message.contains("size in quotes") {
        "write a size in quotes (`\"1GiB\"`) or a whole number of bytes (`1073741824`)"
    } else if message.contains("number of cores") {
        "write a number of cores bare (`1.5`), or `\"unlimited\"` in quotes"
    } else if message.contains("invalid value: integer") {
        "this key takes a whole number, 0 or more"
    } else if message.contains("whole number") {
        "numbers are written bare: `120`, not `\"120\"`"
    } else {
        "numbers are written bare (`120`), text in quotes (`\"512MiB\"`), switches bare (`true`)"
    }
}

/// Move every flat key into its section. A flat key whose sectioned twin is also set, an
/// unknown key, or a section that is not a table is an error with a hint. Also returns the
/// flat keys moved, `(flat key, section, key)`, so later errors can name what was written.
pub(super) fn sectioned(table: toml::Table) -> anyhow::Result<(toml::Table, Vec<FlatKey>)> {
    let mut sections: BTreeMap<String, toml::Table> = BTreeMap::new();
    let mut flat = Vec::new();
    for (key, value) in table {
        let flat_place = FLAT_KEYS.iter().find(|(flat_key, _, _)| *flat_key == key);
        match (value, flat_place) {
            // A section; `network` is also a flat key, but only a table is the section.
            // Profiles are named by the operator: each `[profiles.NAME]` is checked by serde.
            (toml::Value::Table(section), _) if key == "profiles" || key == "secrets" => {
                sections.insert(key, section);
            }
            // `[tenants]` holds the defaults and, as sub-tables, `[tenants.NAME]`.
            (toml::Value::Table(mut section), _) if key == "tenants" => {
                let named: Vec<String> = section
                    .iter()
                    .filter(|(_, value)| value.is_table())
                    .map(|(name, _)| name.clone())
                    .collect();
                let mut tables = toml::Table::new();
                for name in named {
                    if let Some(table) = section.remove(&name) {
                        check_tenant_table(&name, &table)?;
                        tables.insert(name, table);
                    }
                }
                for name in section.keys() {
                    check_section_key(&key, name)?;
                }
                sections.insert(key, section);
                if !tables.is_empty() {
                    sections.insert(TENANT_TABLES.to_owned(), tables);
                }
            }
            (toml::Value::Table(section), _) if SECTIONS.contains(&key.as_str()) => {
                for name in section.keys() {
                    check_section_key(&key, name)?;
                }
                sections.insert(key, section);
            }
            (value, Some(&place)) => flat.push((place, value)),
            _ if SECTIONS.contains(&key.as_str()) => bail!(
                "`{key}` must be a section\nhint: write `[{key}]` on a line of its own, then its keys"
            ),
            _ => bail!("unknown key `{key}`\nhint: {}", top_level_hint(&key)),
        }
    }
    let mut moved = Vec::with_capacity(flat.len());
    for (place, value) in flat {
        moved.push(place);
        let (key, section, name) = place;
        let entry = sections.entry(section.to_owned()).or_default();
        if entry.contains_key(name) {
            bail!(
                "`{key}` and `[{section}] {name}` are the same setting, and both are set\nhint: keep `[{section}] {name}` and remove the flat `{key}`"
            );
        }
        entry.insert(name.to_owned(), value);
    }
    let table = sections
        .into_iter()
        .map(|(name, section)| (name, toml::Value::Table(section)))
        .collect();
    Ok((table, moved))
}

/// A key inside `[section]` must be one of that section's keys.
pub(super) fn check_section_key(section: &str, name: &str) -> anyhow::Result<()> {
    let known = FLAT_KEYS
        .iter()
        .map(|&(flat, s, key)| (flat, s, key))
        .chain(SECTION_KEYS.iter().map(|&(s, key)| ("", s, key)))
        .filter(|(_, s, _)| *s == section);
    if known.clone().any(|(_, _, key)| key == name) {
        return Ok(());
    }
    let hint = if let Some((_, s, key)) = FLAT_KEYS.iter().find(|(flat, _, _)| *flat == name) {
        // A flat key written inside a section: say where it lives.
        format!("in a section it is `[{s}] {key}`")
    } else if let Some((_, s, key)) = FLAT_KEYS
        .iter()
        .find(|(_, s, key)| *key == name && *s != section)
    {
        format!("`{key}` belongs in `[{s}]`")
    } else {
        let keys: Vec<&str> = known.map(|(_, _, key)| key).collect();
        match closest(name, keys.iter().copied()) {
            Some(best) => format!("did you mean `{best}`? `[{section}]` has {}", list(&keys)),
            None => format!("`[{section}]` has {}", list(&keys)),
        }
    };
    bail!("unknown key `{name}` in `[{section}]`\nhint: {hint}")
}

/// A `[tenants.NAME]` table: a tenant's name, and only keys such a table has.
pub(super) fn check_tenant_table(name: &str, table: &toml::Value) -> anyhow::Result<()> {
    let defaults: Vec<&str> = SECTION_KEYS
        .iter()
        .filter(|(section, _)| *section == "tenants")
        .map(|(_, key)| *key)
        .collect();
    if defaults.contains(&name) {
        bail!(
            "`[tenants.{name}]` is a table, but `{name}` is a setting of `[tenants]`\nhint: write `{name} = ...` under `[tenants]` for every tenant, or `[tenants.TENANT]` then `{name} = ...` for one"
        );
    }
    if !snakebox_engine::is_plain_name(name) {
        bail!(
            "invalid tenant name `[tenants.{name}]`\nhint: use 1 to 64 characters of lowercase letters, digits, `-` and `_` (the name `snakebox keys add` was given)"
        );
    }
    let keys: Vec<&str> = defaults.iter().chain(TENANT_TABLE_KEYS).copied().collect();
    if let toml::Value::Table(table) = table {
        for key in table.keys() {
            if keys.contains(&key.as_str()) {
                continue;
            }
            let hint = match closest(key, keys.iter().copied()) {
                Some(best) => format!(
                    "did you mean `{best}`? `[tenants.{name}]` has {}",
                    list(&keys)
                ),
                None => format!("`[tenants.{name}]` has {}", list(&keys)),
            };
            bail!("unknown key `{key}` in `[tenants.{name}]`\nhint: {hint}");
        }
    }
    Ok(())
}

/// The hint for an unknown key at the top level.
pub(super) fn top_level_hint(key: &str) -> String {
    let mut sectioned = FLAT_KEYS
        .iter()
        .map(|&(_, section, name)| (section, name))
        .chain(SECTION_KEYS.iter().copied());
    if let Some((section, name)) = sectioned.find(|(_, name)| *name == key) {
        return format!("`{key}` belongs in a section: `[{section}] {name}`");
    }
    let candidates = FLAT_KEYS
        .iter()
        .map(|(flat, _, _)| *flat)
        .chain(SECTIONS.iter().copied());
    match closest(key, candidates) {
        Some(best) if SECTIONS.contains(&best) => format!("did you mean the section `[{best}]`?"),
        Some(best) => format!("did you mean `{best}`?"),
        None => format!("the sections are {}", list(SECTIONS)),
    }
}

/// `` `a`, `b`, `c` ``.
pub(super) fn list(keys: &[&str]) -> String {
    keys.iter()
        .map(|key| format!("`{key}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The candidate nearest to `word` by edit distance, if it is near enough to be a typo.
pub(super) fn closest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|candidate| (edit_distance(word, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= (candidate.len() / 3).max(2))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, by characters.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

pub(super) fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("snakebox").join("config.toml"))
}
