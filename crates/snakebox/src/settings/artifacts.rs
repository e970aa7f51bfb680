//! `[artifacts]`: the artifact store's age and size.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{SizeOrNumber, parse_size, text_or};
use crate::cli::ArtifactsArgs;

/// `[artifacts]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ArtifactsFile {
    pub(super) max_age_hours: Option<u64>,
    pub(super) max_size: Option<SizeOrNumber>,
}

pub(super) fn resolve_artifacts(
    args: &ArtifactsArgs,
    file: ArtifactsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    if let Some(hours) = args.artifact_max_age_hours.or(file.max_age_hours) {
        if hours == 0 {
            bail!("--artifact-max-age-hours must be at least 1");
        }
        config.artifact_max_age = Duration::from_secs(hours.saturating_mul(3600));
    }
    if let Some(text) = text_or(args.artifact_max_size.as_ref(), file.max_size) {
        config.artifact_max_bytes = parse_size(&text)
            .with_context(|| "invalid --artifact-max-size (`[artifacts] max_size`)")?;
    }
    Ok(())
}
