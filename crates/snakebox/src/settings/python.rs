//! `[python]`: the default interpreter version, the uv binary, downloads of missing versions,
//! dependencies inferred from imports.

use std::path::PathBuf;

use serde::Deserialize;
use snakebox_engine::EngineConfig;

use crate::cli::{PythonArgs, PythonDownloadsArg};

/// `[python]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PythonFile {
    pub(super) version: Option<String>,
    pub(super) uv_path: Option<PathBuf>,
    pub(super) downloads: Option<PythonDownloadsArg>,
    pub(super) infer_dependencies: Option<bool>,
}

pub(super) fn resolve_python(args: &PythonArgs, file: PythonFile, config: &mut EngineConfig) {
    config.python_version = args.python_version.clone().or(file.version);
    config.uv_path = args.uv_path.clone().or(file.uv_path);
    config.python_downloads = match args.python_downloads.or(file.downloads) {
        Some(PythonDownloadsArg::Automatic) => snakebox_engine::PythonDownloads::Automatic,
        Some(PythonDownloadsArg::Never) | None => snakebox_engine::PythonDownloads::Never,
    };
    // The compatibility tool sets' users ran servers that ship or infer their packages
    // (issue 36): on for them unless turned off; opt-in otherwise. Read after `[server]`.
    config.infer_dependencies = args
        .infer_dependencies
        .or(file.infer_dependencies)
        .unwrap_or(!config.compat_tools.is_empty());
}
