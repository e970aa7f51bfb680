//! `[sessions]`: persistent sessions: idle times, count, disk, interpreters.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{SizeOrNumber, parse_size, text_or};
use crate::cli::SessionsArgs;

/// `[sessions]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SessionsFile {
    pub(super) idle_stop: Option<u64>,
    pub(super) idle_delete: Option<u64>,
    pub(super) max_sessions: Option<usize>,
    pub(super) max_disk: Option<SizeOrNumber>,
    pub(super) max_interpreters: Option<usize>,
}

pub(super) fn resolve_sessions(
    args: &SessionsArgs,
    file: SessionsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    let sessions = &mut config.sessions;
    if let Some(seconds) = args.session_idle_stop.or(file.idle_stop) {
        if seconds == 0 {
            bail!("--session-idle-stop must be at least 1 second");
        }
        sessions.idle_stop = Duration::from_secs(seconds);
    }
    if let Some(seconds) = args.session_idle_delete.or(file.idle_delete) {
        if seconds == 0 {
            bail!("--session-idle-delete must be at least 1 second");
        }
        sessions.idle_delete = Duration::from_secs(seconds);
    }
    if let Some(count) = args.max_sessions.or(file.max_sessions) {
        sessions.max_sessions = count;
    }
    if let Some(text) = text_or(args.sessions_max_disk.as_ref(), file.max_disk) {
        sessions.max_disk_bytes = parse_size(&text)
            .with_context(|| "invalid --sessions-max-disk (`[sessions] max_disk`)")?;
    }
    if let Some(count) = args.session_max_interpreters.or(file.max_interpreters) {
        if count == 0 {
            bail!("--session-max-interpreters must be at least 1");
        }
        sessions.max_interpreters = count;
    }
    Ok(())
}
