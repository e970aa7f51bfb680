//! Helpers shared by the integration tests: a Python interpreter, policies, a marker scan.
#![allow(dead_code, unreachable_pub, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use snakebox_sandbox::{
    BackendKind, Limits, Mount, Outcome, Policy, Sandbox, SandboxCommand, SandboxConfig,
};
use tokio_util::sync::CancellationToken;

/// Candidate interpreters: the real binary, never a pyenv shim.
const PYTHONS: &[&str] = &[
    "/usr/bin/python3.11",
    "/root/.pyenv/versions/3.11.7/bin/python3.11",
];

/// A Python interpreter on the host: (binary, prefix to mount read-only).
pub fn python() -> Option<(PathBuf, PathBuf)> {
    PYTHONS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .map(|p| {
            let prefix = p
                .parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf)
                .unwrap_or_default();
            (p, prefix)
        })
}

pub fn limits() -> Limits {
    Limits {
        wall_time: Duration::from_secs(20),
        cpu_time: None,
        memory_bytes: None,
        max_processes: None,
        max_output_bytes: 100 * 1024,
        scratch_bytes: Some(64 << 20),
        file_size_bytes: None,
        open_files: None,
        cpu_millicores: None,
    }
}

pub fn none_sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        backend: BackendKind::None,
        bwrap_path: None,
        scratch_root: std::env::temp_dir(),
        docker_runtime: None,
    })
    .expect("the none backend always starts")
}

pub fn policy(cwd: &Path, mounts: Vec<Mount>) -> Policy {
    Policy {
        mounts,
        network: false,
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ],
        cwd: cwd.to_path_buf(),
        limits: limits(),
        identity: snakebox_sandbox::Identity::Untrusted,
        cpu: None,
    }
}

pub fn py(program: &Path, code: &str, control: bool) -> SandboxCommand {
    SandboxCommand {
        program: program.to_path_buf(),
        args: vec!["-I".into(), "-c".into(), code.into()],
        control_channel: control,
        init: false,
    }
}

pub async fn run(sandbox: &Sandbox, policy: &Policy, cmd: &SandboxCommand) -> Outcome {
    sandbox
        .run(policy, cmd, CancellationToken::new(), None)
        .await
        .expect("run")
}

/// Host pids whose command line or environment contains `marker`.
pub fn processes_with_marker(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(dir) = fs_err::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        for file in ["cmdline", "environ"] {
            let bytes = fs_err::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
            if bytes.windows(marker.len()).any(|w| w == marker.as_bytes()) {
                found.push(pid);
                break;
            }
        }
    }
    found
}

pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos}", std::process::id())
}
