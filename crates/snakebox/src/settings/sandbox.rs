//! `[sandbox]`: the backend, the bwrap binary, the docker runtime.

use std::path::PathBuf;

use serde::Deserialize;
use snakebox_engine::EngineConfig;
use snakebox_sandbox::BackendKind;

use crate::cli::{BackendArg, SandboxArgs};

/// `[sandbox]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SandboxFile {
    pub(super) backend: Option<BackendArg>,
    pub(super) bwrap_path: Option<PathBuf>,
    pub(super) docker_runtime: Option<String>,
}

pub(super) fn resolve_sandbox(args: &SandboxArgs, file: SandboxFile, config: &mut EngineConfig) {
    config.backend = match args.sandbox_backend.or(file.backend) {
        Some(BackendArg::None) => BackendKind::None,
        Some(BackendArg::Docker) => BackendKind::Docker,
        Some(BackendArg::Native) | None => BackendKind::Native,
    };
    config.bwrap_path = args.bwrap_path.clone().or(file.bwrap_path);
    config.docker_runtime = args.docker_runtime.clone().or(file.docker_runtime);
}
