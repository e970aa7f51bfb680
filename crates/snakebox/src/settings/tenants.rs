//! `[tenants]` and `[tenants.NAME]`: what one tenant may take and keep (the defaults, and
//! one tenant set apart with its profiles), and the defaults of a server several tenants
//! share.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{SizeOrNumber, parse_size, text_or};
use crate::cli::TenantsArgs;

/// `[tenants]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TenantsFile {
    pub(super) max_concurrent_runs: Option<usize>,
    pub(super) runs_per_minute: Option<u32>,
    pub(super) max_sessions: Option<usize>,
    pub(super) history_max_runs: Option<u64>,
    pub(super) history_max_size: Option<SizeOrNumber>,
    pub(super) audit_max_size: Option<SizeOrNumber>,
    pub(super) artifacts_max_size: Option<SizeOrNumber>,
    pub(super) sessions_max_disk: Option<SizeOrNumber>,
}

/// `[tenants.NAME]`: what one tenant gets instead of the `[tenants]` defaults, and the
/// profiles it may name. Sub-tables, not an array of `[[tenants]]` tables: TOML cannot hold
/// both an array and the `[tenants]` table under one key, and every file written before
/// keeps its `[tenants]` defaults this way.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TenantFile {
    pub(super) max_concurrent_runs: Option<usize>,
    pub(super) runs_per_minute: Option<u32>,
    pub(super) max_sessions: Option<usize>,
    pub(super) history_max_runs: Option<u64>,
    pub(super) history_max_size: Option<SizeOrNumber>,
    pub(super) audit_max_size: Option<SizeOrNumber>,
    pub(super) artifacts_max_size: Option<SizeOrNumber>,
    pub(super) sessions_max_disk: Option<SizeOrNumber>,
    /// Profiles the tenant may name (as if it were in each one's `tenants` list).
    pub(super) profiles: Option<Vec<String>>,
    /// The profile of its calls that name none.
    pub(super) default_profile: Option<String>,
}

/// The keys of a `[tenants.NAME]` table besides the `[tenants]` ones.
pub(super) const TENANT_TABLE_KEYS: &[&str] = &["profiles", "default_profile"];

pub(super) fn resolve_tenants(
    args: &TenantsArgs,
    file: &mut TenantsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    resolve_store_budgets(args, file, &mut config.store_budgets)?;
    let quotas = &mut config.tenants;
    quotas.max_concurrent_runs = args.tenant_max_concurrent_runs.or(file.max_concurrent_runs);
    quotas.runs_per_minute = args.tenant_runs_per_minute.or(file.runs_per_minute);
    quotas.max_sessions = args.tenant_max_sessions.or(file.max_sessions);
    if let Some(text) = text_or(
        args.tenant_sessions_max_disk.as_ref(),
        file.sessions_max_disk.take(),
    ) {
        let bytes = parse_size(&text).with_context(
            || "invalid --tenant-sessions-max-disk (`[tenants] sessions_max_disk`)",
        )?;
        let total = config.sessions.max_disk_bytes;
        if bytes < snakebox_engine::MIN_SESSIONS_DISK_SHARE {
            bail!(
                "--tenant-sessions-max-disk (`[tenants] sessions_max_disk`) must be at least 32MiB, got `{text}`\nhint: a share is a file-system image, and ext4's own metadata leaves little of less"
            );
        }
        if bytes > total {
            bail!(
                "--tenant-sessions-max-disk (`{text}`) is larger than --sessions-max-disk ({total} bytes)\nhint: a tenant's share is a part of the sessions' disk: raise --sessions-max-disk, or lower the share"
            );
        }
        config.sessions.tenant_max_disk_bytes = Some(bytes);
    }
    for (name, value) in [
        ("--tenant-max-concurrent-runs", quotas.max_concurrent_runs),
        (
            "--tenant-runs-per-minute",
            quotas.runs_per_minute.map(|n| n as usize),
        ),
        ("--tenant-max-sessions", quotas.max_sessions),
    ] {
        if value == Some(0) {
            bail!("{name} must be at least 1\nhint: leave it unset for no per-tenant bound");
        }
    }
    Ok(())
}

/// `[tenants.NAME]`: each tenant set apart, checked as the `[tenants]` defaults are, with
/// profiles that exist. The profiles it names are granted as the profiles' own `tenants`
/// lists grant them (the engine takes the union: either way lets the tenant name it).
pub(super) fn resolve_tenant_tables(
    file: BTreeMap<String, TenantFile>,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    for (name, table) in file {
        let what = |key: &str| format!("`[tenants.{name}] {key}`");
        for (key, value) in [
            ("max_concurrent_runs", table.max_concurrent_runs),
            ("runs_per_minute", table.runs_per_minute.map(|n| n as usize)),
            ("max_sessions", table.max_sessions),
            (
                "history_max_runs",
                table
                    .history_max_runs
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            ),
        ] {
            if value == Some(0) {
                bail!(
                    "{} must be at least 1\nhint: leave it out for the `[tenants]` default",
                    what(key)
                );
            }
        }
        let size = |key: &str, value: Option<SizeOrNumber>, least: u64| {
            let Some(text) = text_or(None, value) else {
                return Ok(None);
            };
            let bytes = parse_size(&text).with_context(|| format!("invalid {}", what(key)))?;
            if bytes < least {
                bail!(
                    "{} must be at least {least} bytes, got `{text}`\nhint: give a larger size, or leave it out for the `[tenants]` default",
                    what(key)
                );
            }
            anyhow::Ok(Some(bytes))
        };
        let sessions_max_disk = size(
            "sessions_max_disk",
            table.sessions_max_disk,
            snakebox_engine::MIN_SESSIONS_DISK_SHARE,
        )?;
        let total = config.sessions.max_disk_bytes;
        if let Some(bytes) = sessions_max_disk.filter(|bytes| *bytes > total) {
            bail!(
                "{} ({bytes} bytes) is larger than --sessions-max-disk ({total} bytes)\nhint: a tenant's share is a part of the sessions' disk: raise --sessions-max-disk, or lower the share",
                what("sessions_max_disk")
            );
        }
        let profiles = table.profiles.unwrap_or_default();
        for profile in profiles.iter().chain(&table.default_profile) {
            if !config.profiles.all.contains_key(profile) {
                bail!(
                    "{} names `{profile}`, which is not a profile\nhint: name one of {}, or define it with `[profiles.{profile}]`",
                    what(if table.default_profile.as_ref() == Some(profile) {
                        "default_profile"
                    } else {
                        "profiles"
                    }),
                    config.profiles.names().join(", ")
                );
            }
        }
        let over = snakebox_engine::TenantOverride {
            max_concurrent_runs: table.max_concurrent_runs,
            runs_per_minute: table.runs_per_minute,
            max_sessions: table.max_sessions,
            history_max_runs: table.history_max_runs,
            history_max_bytes: size("history_max_size", table.history_max_size, 64 << 10)?,
            audit_max_bytes: size(
                "audit_max_size",
                table.audit_max_size,
                snakebox_engine::MIN_AUDIT_BYTES,
            )?,
            artifacts_max_bytes: size("artifacts_max_size", table.artifacts_max_size, 1)?,
            sessions_max_disk_bytes: sessions_max_disk,
            profiles,
            default_profile: table.default_profile,
        };
        config.tenant_overrides.insert(name, over);
    }
    Ok(())
}

/// What one tenant may keep in each shared store (`[tenants]` `history_max_runs`,
/// `history_max_size`, `audit_max_size`, `artifacts_max_size`).
pub(super) fn resolve_store_budgets(
    args: &TenantsArgs,
    file: &mut TenantsFile,
    budgets: &mut snakebox_engine::StoreBudgets,
) -> anyhow::Result<()> {
    if let Some(runs) = args.tenant_history_max_runs.or(file.history_max_runs) {
        if runs == 0 {
            bail!(
                "--tenant-history-max-runs must be at least 1\nhint: leave it unset for the default (100000)"
            );
        }
        budgets.history.items = Some(runs);
    }
    let size = |flag: &str,
                key: &str,
                cli: Option<&String>,
                file: Option<SizeOrNumber>,
                least: u64| {
        let Some(text) = text_or(cli, file) else {
            return Ok(None);
        };
        let bytes =
            parse_size(&text).with_context(|| format!("invalid {flag} (`[tenants] {key}`)"))?;
        if bytes < least {
            bail!(
                "{flag} (`[tenants] {key}`) must be at least {least} bytes\nhint: give a size such as `64KiB` or more, or leave it unset for the default"
            );
        }
        Ok(Some(bytes))
    };
    if let Some(bytes) = size(
        "--tenant-history-max-size",
        "history_max_size",
        args.tenant_history_max_size.as_ref(),
        file.history_max_size.take(),
        64 << 10,
    )? {
        budgets.history.bytes = Some(bytes);
    }
    if let Some(bytes) = size(
        "--tenant-audit-max-size",
        "audit_max_size",
        args.tenant_audit_max_size.as_ref(),
        file.audit_max_size.take(),
        snakebox_engine::MIN_AUDIT_BYTES,
    )? {
        budgets.audit_bytes = bytes;
    }
    if let Some(bytes) = size(
        "--tenant-artifacts-max-size",
        "artifacts_max_size",
        args.tenant_artifacts_max_size.as_ref(),
        file.artifacts_max_size.take(),
        1,
    )? {
        budgets.artifact_bytes = bytes;
    }
    Ok(())
}

/// Defaults for a server several tenants share (`--http`): none may take every slot, nor
/// fill the sessions' disk (each has a share of it, see `TENANTS_PER_SESSIONS_DISK`).
pub(super) fn several_tenants(engine: &mut EngineConfig) {
    if engine.tenants.max_concurrent_runs.is_none() {
        engine.tenants.max_concurrent_runs =
            Some(engine.max_concurrent_runs.saturating_sub(1).max(1));
    }
    let sessions = &mut engine.sessions;
    if sessions.tenant_max_disk_bytes.is_none() {
        let total = sessions.max_disk_bytes;
        sessions.tenant_max_disk_bytes = Some(
            (total / snakebox_engine::TENANTS_PER_SESSIONS_DISK)
                .max(snakebox_engine::MIN_SESSIONS_DISK_SHARE)
                .min(total),
        );
    }
}
