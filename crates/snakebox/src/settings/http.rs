//! `[http]`: `serve --http`'s address, public URL, allowed hosts and origins, link lifetime
//! and body limit.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::values::{SizeOrNumber, parse_size, text_or};
use crate::cli::HttpArgs;

/// `[http]`: read by `serve --http` only.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HttpFile {
    pub(super) addr: Option<String>,
    pub(super) public_url: Option<String>,
    #[serde(default)]
    pub(super) allowed_hosts: Vec<String>,
    #[serde(default)]
    pub(super) allowed_origins: Vec<String>,
    pub(super) insecure_no_auth: Option<bool>,
    pub(super) link_ttl: Option<u64>,
    pub(super) max_body_bytes: Option<SizeOrNumber>,
}

/// Shortest and longest validity of a download link, in seconds.
pub(super) const LINK_TTL_MIN: u64 = 10;

pub(super) const LINK_TTL_MAX: u64 = 30 * 86_400;

/// The default address of `serve --http`.
pub(super) const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8000";

pub(super) fn resolve_http(
    args: &HttpArgs,
    file: HttpFile,
    max_script_bytes: usize,
) -> anyhow::Result<Option<snakebox_http::HttpConfig>> {
    let Some(flag) = &args.http else {
        return Ok(None);
    };
    let addr = Some(flag.as_str())
        .filter(|addr| !addr.is_empty())
        .map(str::to_owned)
        .or(file.addr)
        .unwrap_or_else(|| DEFAULT_HTTP_ADDR.to_owned());
    let addr = addr.parse().with_context(|| {
        format!("invalid --http address `{addr}`\nhint: write an IP address and a port, e.g. `127.0.0.1:8000` or `0.0.0.0:8000`")
    })?;
    let mut allowed_hosts = file.allowed_hosts;
    allowed_hosts.extend(args.allowed_hosts.iter().cloned());
    let mut allowed_origins = file.allowed_origins;
    allowed_origins.extend(args.allowed_origins.iter().cloned());
    let link_ttl = match args.link_ttl.or(file.link_ttl) {
        None => snakebox_http::DEFAULT_LINK_TTL,
        Some(seconds) if (LINK_TTL_MIN..=LINK_TTL_MAX).contains(&seconds) => {
            Duration::from_secs(seconds)
        }
        Some(seconds) => anyhow::bail!(
            "invalid --link-ttl `{seconds}`\nhint: give the seconds a download link stays valid, from {LINK_TTL_MIN} to {LINK_TTL_MAX} (30 days), e.g. 3600"
        ),
    };
    let max_body_bytes = resolve_body_limit(
        text_or(args.max_body_bytes.as_ref(), file.max_body_bytes).as_deref(),
        max_script_bytes,
    )?;
    Ok(Some(snakebox_http::HttpConfig {
        addr,
        public_url: args.public_url.clone().or(file.public_url),
        allowed_hosts,
        allowed_origins,
        insecure_no_auth: args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false),
        conformance_fixtures: args.conformance_fixtures,
        link_ttl,
        max_body_bytes,
    }))
}

/// The largest HTTP request body: at least 64 KiB and at most 1 GiB (a body is held whole
/// while it is read), and room for a script at the script limit. By default 64 MiB.
pub(super) fn resolve_body_limit(
    text: Option<&str>,
    max_script_bytes: usize,
) -> anyhow::Result<usize> {
    let Some(text) = text else {
        return Ok(snakebox_http::DEFAULT_MAX_BODY_BYTES.max(max_script_bytes.saturating_mul(2)));
    };
    let bytes =
        parse_size(text).with_context(|| "invalid --max-body-bytes (`[http] max_body_bytes`)")?;
    if !(64 << 10..=1 << 30).contains(&bytes) {
        bail!(
            "--max-body-bytes must be between 64KiB and 1GiB, got `{text}`\nhint: the default is 64MiB"
        );
    }
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if bytes <= max_script_bytes {
        bail!(
            "--max-body-bytes (`{text}`) leaves no room for a script of --max-script-bytes ({max_script_bytes} bytes)\nhint: make --max-body-bytes larger than --max-script-bytes (twice it leaves room for JSON escapes), or lower --max-script-bytes"
        );
    }
    Ok(bytes)
}
