//! `[limits]`: what one run may use (time, output, memory, processes, CPU, scratch, script
//! size).

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use snakebox_engine::EngineConfig;

use super::values::{
    CoresValue, SizeOrNumber, optional, parse_cores, parse_count, parse_memory_limit,
    parse_process_limit, parse_size, text_or,
};
use crate::cli::LimitsArgs;

/// `[limits]`: per run.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsFile {
    pub(super) default_timeout: Option<u64>,
    pub(super) max_timeout: Option<u64>,
    pub(super) max_output_bytes: Option<u64>,
    pub(super) memory: Option<SizeOrNumber>,
    pub(super) processes: Option<SizeOrNumber>,
    pub(super) cpu_seconds: Option<SizeOrNumber>,
    pub(super) cpu_cores: Option<CoresValue>,
    pub(super) scratch: Option<SizeOrNumber>,
    pub(super) max_script_bytes: Option<SizeOrNumber>,
}

pub(super) fn resolve_limits(
    args: &LimitsArgs,
    file: LimitsFile,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    if let Some(seconds) = args.max_timeout.or(file.max_timeout) {
        if seconds == 0 {
            bail!("--max-timeout must be at least 1 second");
        }
        config.max_timeout = Duration::from_secs(seconds);
    }
    if let Some(seconds) = args.default_timeout.or(file.default_timeout) {
        if seconds == 0 {
            bail!("--default-timeout must be at least 1 second");
        }
        config.default_timeout = Duration::from_secs(seconds);
    }
    if config.default_timeout > config.max_timeout {
        bail!(
            "--default-timeout ({} s) is larger than --max-timeout ({} s)\nhint: raise --max-timeout or lower --default-timeout",
            config.default_timeout.as_secs(),
            config.max_timeout.as_secs()
        );
    }
    if let Some(bytes) = args.max_output_bytes.or(file.max_output_bytes) {
        if bytes < 1024 {
            bail!("--max-output-bytes must be at least 1024, got `{bytes}`");
        }
        config.max_output_bytes = bytes;
    }
    if let Some(text) = text_or(args.memory_limit.as_ref(), file.memory) {
        config.memory_bytes = optional(
            &text,
            "--memory-limit (`[limits] memory`)",
            parse_memory_limit,
        )?;
    }
    if let Some(text) = text_or(args.max_processes.as_ref(), file.processes) {
        config.max_processes = optional(
            &text,
            "--max-processes (`[limits] processes`)",
            parse_process_limit,
        )?;
    }
    if let Some(text) = text_or(args.cpu_limit.as_ref(), file.cpu_seconds) {
        config.cpu_time = optional(&text, "--cpu-limit (`[limits] cpu_seconds`)", parse_count)?
            .map(Duration::from_secs);
    }
    let cores = args
        .cpu_cores
        .clone()
        .or(file.cpu_cores.map(CoresValue::into_text));
    if let Some(text) = cores {
        config.cpu_millicores = parse_cores(&text)?;
    }
    if let Some(text) = text_or(args.scratch_limit.as_ref(), file.scratch) {
        config.scratch_bytes = optional(&text, "--scratch-limit (`[limits] scratch`)", parse_size)?;
    }
    if let Some(text) = text_or(args.max_script_bytes.as_ref(), file.max_script_bytes) {
        let bytes = parse_size(&text)
            .with_context(|| "invalid --max-script-bytes (`[limits] max_script_bytes`)")?;
        config.max_script_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    }
    Ok(())
}
