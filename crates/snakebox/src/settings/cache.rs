//! `[cache]`: the environment cache: warming, builds, size and age.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{SizeOrNumber, parse_size, text_or};
use crate::cli::CacheArgs;

/// `[cache]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CacheFile {
    pub(super) no_warm: Option<bool>,
    pub(super) allow_sdist_builds: Option<bool>,
    pub(super) install_timeout: Option<u64>,
    pub(super) max_size: Option<SizeOrNumber>,
    pub(super) max_age_days: Option<u64>,
    /// Requirements to build an environment of each at start-up (after the default one).
    pub(super) warm: Option<Vec<String>>,
    /// The package index (a mirror of PyPI).
    pub(super) index_url: Option<String>,
}

/// The most `[cache] warm` entries: each is an environment built at every start.
pub(super) const MAX_WARM_PACKAGES: usize = 32;

pub(super) fn resolve_cache(
    args: &CacheArgs,
    file: CacheFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    config.warm_cache = !(args.no_warm_cache || file.no_warm.unwrap_or(false));
    config.allow_sdist_builds = args.allow_sdist_builds || file.allow_sdist_builds.unwrap_or(false);
    if let Some(text) = args.index_url.clone().or(file.index_url) {
        config.index_url = Some(index_url(&text)?);
    }
    if let Some(seconds) = args.install_timeout.or(file.install_timeout) {
        if seconds == 0 {
            bail!("--install-timeout must be at least 1 second\nhint: the default is 600");
        }
        config.install_timeout = Duration::from_secs(seconds);
    }
    if let Some(text) = text_or(args.cache_max_size.as_ref(), file.max_size) {
        config.cache_max_bytes =
            parse_size(&text).with_context(|| "invalid --cache-max-size (`[cache] max_size`)")?;
    }
    if let Some(days) = args.cache_max_age_days.or(file.max_age_days) {
        config.cache_max_age = Duration::from_secs(days.saturating_mul(86_400));
    }
    let warm = file.warm.unwrap_or_default();
    if warm.len() > MAX_WARM_PACKAGES {
        bail!(
            "`[cache] warm` lists {} requirements, more than {MAX_WARM_PACKAGES}\nhint: each is an environment built at every start; list the packages your scripts declare most",
            warm.len()
        );
    }
    config.warm_packages = warm
        .iter()
        .map(|text| {
            snakebox_script::parse_requirement(text).map_err(|err| {
                anyhow::anyhow!(
                    "`[cache] warm`: `{text}` is not a requirement: {err}\nhint: one PEP 508 requirement per entry, such as \"pandas>=2.2\""
                )
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(())
}

/// `--index-url` (`[cache] index_url`): an `http`, `https` or `file` URL with a host (a file
/// URL: a directory), as uv's `--default-index` takes it.
fn index_url(text: &str) -> anyhow::Result<String> {
    let hint = "hint: give the index's simple API URL, such as https://pypi.example.org/simple (or leave it out for PyPI)";
    let url = url::Url::parse(text.trim()).map_err(|err| {
        anyhow::anyhow!("invalid --index-url (`[cache] index_url`) `{text}`: {err}\n{hint}")
    })?;
    match url.scheme() {
        "http" | "https" if url.host_str().is_some_and(|h| !h.is_empty()) => Ok(url.to_string()),
        "file" => Ok(url.to_string()),
        other => bail!(
            "invalid --index-url (`[cache] index_url`) `{text}`: {} \n{hint}",
            if matches!(other, "http" | "https") {
                "it names no host".to_owned()
            } else {
                format!("`{other}` is not http, https or file")
            }
        ),
    }
}
