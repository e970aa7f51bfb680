//! What the sandbox of one run is: its mounts, environment variables, limits, the runner's
//! command line, and the fork server's sandbox for an environment. One-shot runs (cold,
//! pooled, forked), session interpreters and validation all take their sandboxes from here,
//! so every path sees the same view.

use std::path::{Path, PathBuf};

use snakebox_env::Environment;
use snakebox_sandbox::{ForkRun, ForkServerSpec, Identity, Limits, Mount, Policy, SandboxCommand};

use super::layout::{RunDir, server_runs_dir};
pub(crate) use crate::policy::RunShape;
use crate::{EngineConfig, Unavailable};

/// Where the run's read-only inputs (the script) appear inside the sandbox.
pub(crate) const SANDBOX_INPUT_DIR: &str = "/snakebox";
/// The run's writable working directory inside the sandbox.
pub(crate) const SANDBOX_WORK_DIR: &str = "/work";
/// File name of the script in the input directory.
pub(crate) const SCRIPT_NAME: &str = "script.py";

/// File name, in the input directory, of the exec-deny seccomp program of a run whose profile
/// allows no subprocesses (the runner installs it: `--deny-exec`).
pub(crate) const EXEC_DENY_NAME: &str = "no-exec.bpf";

/// What a sandbox sees, apart from what its call's policy decides (limits, network): its
/// mounts, its environment variables, its working directory and whose it is.
pub(crate) struct View {
    pub(crate) mounts: Vec<Mount>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: PathBuf,
    pub(crate) identity: Identity,
}

/// The one builder of a sandbox [`Policy`], for every sandbox that runs code of a call (a
/// one-shot run, cold or pooled; a fork server; a session's interpreter and commands;
/// validation's compile): what it sees (`view`), held to the `limits` its call's policy
/// decided (see [`crate::policy::CallPolicy`]) and reaching the network as `network` says
/// (its own namespace unless [`RunNetwork::Host`]). Its CPU share is the slot's, attached by
/// the caller once it holds one.
pub(crate) fn sandbox_policy(view: View, limits: &Limits, network: RunNetwork) -> Policy {
    let View {
        mounts,
        env,
        cwd,
        identity,
    } = view;
    Policy {
        mounts,
        network: network == RunNetwork::Host,
        env,
        cwd,
        limits: limits.clone(),
        identity,
        cpu: None,
    }
}

/// How a run reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunNetwork {
    /// Not at all: its own network namespace, loopback only.
    Off,
    /// Through its proxy: its own network namespace, and the runner bridges
    /// `127.0.0.1:3128` to the proxy's socket in the input directory before any user code.
    Proxy,
    /// The host's network (the `none` backend, which isolates nothing).
    Host,
}

/// The runner option that makes it report the modules the run imported (`imported` in its
/// record).
const LEARN_IMPORTS: &str = "--report-imports";

/// The runner's option that starts the bridge to the proxy socket (see `runner.py`).
pub(crate) fn proxy_args() -> [String; 2] {
    [
        "--proxy".to_owned(),
        PathBuf::from(SANDBOX_INPUT_DIR)
            .join(snakebox_sandbox::SOCKET_NAME)
            .to_string_lossy()
            .into_owned(),
    ]
}

/// Sandboxes as a service: what every path that starts a sandbox needs to say what that
/// sandbox is (the settings, the backend, whether runs reach the network through a proxy),
/// so one-shot runs, pooled sandboxes, fork servers and sessions all get the same view.
pub(crate) struct Sandboxes {
    config: std::sync::Arc<EngineConfig>,
    sandbox: Result<std::sync::Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    proxies: std::sync::Arc<crate::network::Proxies>,
}

impl Sandboxes {
    pub(crate) fn new(
        config: std::sync::Arc<EngineConfig>,
        sandbox: Result<std::sync::Arc<snakebox_sandbox::Sandbox>, Unavailable>,
        proxies: std::sync::Arc<crate::network::Proxies>,
    ) -> Sandboxes {
        Sandboxes {
            config,
            sandbox,
            proxies,
        }
    }

    /// How a run with (`true`) or without network reaches it on this server.
    pub(crate) fn run_network(&self, network: bool) -> crate::run::RunNetwork {
        match (network, self.proxies.network_proxied()) {
            (false, _) => RunNetwork::Off,
            (true, true) => RunNetwork::Proxy,
            (true, false) => RunNetwork::Host,
        }
    }

    /// The sandbox policy and command of one run. Paths differ by backend: the native sandbox
    /// sees fixed paths (`/snakebox/script.py`, `/work`); `none` runs on the host's paths.
    /// `pooled`: the runner waits for the warm pool's request before it reads the script.
    pub(crate) fn sandbox_call(
        &self,
        environment: &Environment,
        run_dir: &RunDir,
        shape: &RunShape,
        network: RunNetwork,
        pooled: bool,
    ) -> (Policy, SandboxCommand) {
        let script = self
            .path_inside(&run_dir.input, SANDBOX_INPUT_DIR)
            .join(SCRIPT_NAME);
        let work = self.path_inside(&run_dir.work, SANDBOX_WORK_DIR);
        let tmp = self.path_inside(&run_dir.tmp, "/tmp");
        let mut mounts = environment.mounts();
        mounts.extend(run_mounts(run_dir, shape.writable_work));
        let view = View {
            mounts,
            env: run_environment(&environment.root, &work, &tmp),
            cwd: work,
            identity: run_dir.identity(),
        };
        let policy = sandbox_policy(view, &shape.limits, network);
        // The runner executes the script and reports on the control channel (fd 3).
        let mut args: Vec<std::ffi::OsString> = vec!["-s".into()];
        if shape.deny_exec {
            // No site at start: the environment's .pth files run only once the runner has
            // denied exec (`--site`), so none of its code runs before that program.
            args.push("-S".into());
        }
        args.extend(runner_argv(&script).into_iter().map(Into::into));
        if shape.deny_exec {
            args.extend(deny_exec_args(&script).into_iter().map(Into::into));
            args.push("--site".into());
        }
        if network == RunNetwork::Proxy {
            args.extend(proxy_args().into_iter().map(Into::into));
        }
        if pooled {
            args.push("--wait".into());
        }
        let command = SandboxCommand {
            program: environment.python.clone(),
            args,
            control_channel: true,
            init: true,
        };
        (policy, command)
    }

    /// The fork server's sandbox for `environment`: what a native run of it sees, except the
    /// run's own directories (each forked run binds those) and the network (never).
    pub(crate) fn fork_server_spec(&self, environment: &Environment) -> ForkServerSpec {
        let work = PathBuf::from(SANDBOX_WORK_DIR);
        ForkServerSpec {
            policy: sandbox_policy(
                View {
                    mounts: environment.mounts(),
                    env: run_environment(&environment.root, &work, Path::new("/tmp")),
                    cwd: work.clone(),
                    identity: snakebox_sandbox::Identity::Untrusted,
                },
                &crate::policy::server_limits(&self.config, self.config.max_timeout),
                RunNetwork::Off,
            ),
            python: environment.python.clone(),
            module_source: crate::runner::SOURCE.to_string(),
            runs_root: server_runs_dir(&self.config.data_dir),
            mount_points: vec![PathBuf::from(SANDBOX_INPUT_DIR), work],
            concurrent_runs: self.config.max_concurrent_runs,
            preload: preload_names(&environment.requirements, self.config.preload_packages),
            // What recent runs imported: the pool adds it (`Pool::start_fork_server`).
            modules: Vec::new(),
            prefork: self.config.prefork,
        }
    }

    /// One run for the fork server: the same mounts, argv and limits as a native cold run.
    /// `proxied`: the run reaches the network through its proxy (see [`RunNetwork::Proxy`]);
    /// `learn`: the runner reports the modules the run imported (its fork server's next start
    /// may preload them, see `WarmPool::learn`).
    pub(crate) fn fork_run(
        &self,
        run_dir: &RunDir,
        shape: &RunShape,
        proxied: bool,
        learn: bool,
        cpu: Option<snakebox_sandbox::CpuShare>,
    ) -> ForkRun {
        let script = PathBuf::from(SANDBOX_INPUT_DIR).join(SCRIPT_NAME);
        let mut argv = runner_argv(&script);
        if shape.deny_exec {
            // The fork server's own site code ran before any run; the forked run installs the
            // program before its bridge and script.
            argv.extend(deny_exec_args(&script));
        }
        if proxied {
            argv.extend(proxy_args());
        }
        if learn {
            argv.push(LEARN_IMPORTS.to_owned());
        }
        ForkRun {
            mounts: run_mounts(run_dir, shape.writable_work),
            limits: shape.limits.clone(),
            argv,
            cwd: PathBuf::from(SANDBOX_WORK_DIR),
            cpu,
        }
    }

    /// Where a sandbox command sees `host`, which its policy mounts (or its backend provides)
    /// at `dest` (see [`snakebox_sandbox::Backend::path_inside`]).
    pub(crate) fn path_inside(&self, host: &Path, dest: &str) -> PathBuf {
        match &self.sandbox {
            Ok(sandbox) => sandbox.path_inside(host, Path::new(dest)),
            Err(_) => host.to_path_buf(),
        }
    }
}

/// The run's own directories, as the native sandbox mounts them: the inputs read-only at
/// `/snakebox`, the working directory at `/work`.
fn run_mounts(run_dir: &RunDir, writable_work: bool) -> Vec<Mount> {
    vec![
        Mount {
            host: run_dir.input.clone(),
            dest: PathBuf::from(SANDBOX_INPUT_DIR),
            writable: false,
        },
        Mount {
            host: run_dir.work.clone(),
            dest: PathBuf::from(SANDBOX_WORK_DIR),
            writable: writable_work,
        },
    ]
}

/// The runner's option that installs the exec-deny program beside `script`.
fn deny_exec_args(script: &Path) -> [String; 2] {
    [
        "--deny-exec".to_owned(),
        script
            .with_file_name(EXEC_DENY_NAME)
            .to_string_lossy()
            .into_owned(),
    ]
}

/// The runner's arguments (after the interpreter's options) for `script`: the runner beside
/// it, the script, the control descriptor.
fn runner_argv(script: &Path) -> Vec<String> {
    let runner = script.with_file_name(crate::runner::FILE_NAME);
    vec![
        runner.to_string_lossy().into_owned(),
        script.to_string_lossy().into_owned(),
        crate::runner::CONTROL_FD.to_string(),
    ]
}

/// The complete environment of a run (one-shot or session) using the virtual environment at
/// `venv`: nothing is inherited from the server.
pub(crate) fn run_environment(venv: &Path, work: &Path, tmp: &Path) -> Vec<(String, String)> {
    let env_bin = venv.join("bin");
    vec![
        (
            "PATH".into(),
            format!("{}:/usr/local/bin:/usr/bin:/bin", env_bin.display()),
        ),
        ("VIRTUAL_ENV".into(), venv.display().to_string()),
        ("HOME".into(), work.display().to_string()),
        ("TMPDIR".into(), tmp.display().to_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("PYTHONIOENCODING".into(), "utf-8".into()),
        ("MPLBACKEND".into(), "Agg".into()),
    ]
}

/// The distribution names of an environment's declared requirements (normalised requirement
/// strings such as `pandas==2.2.3` or `numpy>=2; python_version >= "3.10"`), at most `max`.
pub(crate) fn preload_names(requirements: &[String], max: usize) -> Vec<String> {
    requirements
        .iter()
        .filter_map(|requirement| {
            let name: String = requirement
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .take(max)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::preload_names;

    #[test]
    fn preload_names_are_the_declared_distributions_up_to_the_bound() {
        let requirements = [
            "pandas==2.2.3".to_owned(),
            "numpy>=2; python_version >= \"3.10\"".to_owned(),
            "scikit-learn[alldeps]".to_owned(),
            "zope.interface".to_owned(),
        ];
        assert_eq!(
            preload_names(&requirements, 8),
            ["pandas", "numpy", "scikit-learn", "zope.interface"]
        );
        assert_eq!(preload_names(&requirements, 1), ["pandas"]);
        assert!(preload_names(&requirements, 0).is_empty());
    }
}
