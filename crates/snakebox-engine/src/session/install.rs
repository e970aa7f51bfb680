//! A session's virtual environment and its package installs.
//!
//! Installs have two steps, as environment builds do (SECURITY.md, "Installs and builds"):
//! `uv pip install` downloads and unpacks wheels into the session's venv through the installer
//! sandbox (the installer's uid, uv's shared cache, network only through the egress proxy),
//! running no package code; then the venv is byte-compiled as package code, sandboxed like a
//! run. The session's code sees the venv read-only. An install runs in its own task so that one
//! that outlasts the client's patience is not lost: it finishes, and `list_packages` reports
//! it. Kept apart because it is the only part of sessions that uses the network and uv. The
//! steps themselves are the environment cache's ([`snakebox_env::InstallPipeline`]); what is
//! here is what only a session does: install into its existing venv incrementally, stream
//! uv's progress, repair what it can in place, and tell failures in a session's terms.

use crate::Caller;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use snakebox_env::{
    DownloadTarget, EnvError, InstallPipeline, Interpreter, Uv, UvEnvironment, UvRunner,
};
use snakebox_sandbox::{Identity, OutputChunk, Sandbox};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::SessionService;
use super::manager::SessionPaths;
use super::{
    InstallState, InstallStatus, PackageList, io_error, make_dir, no_session, now_secs,
    packages_of, unavailable,
};
use crate::result::Package;
use crate::{EngineError, ErrorKind};

/// Everything an install needs, owned, so it can go on after the call that asked for it.
#[derive(Clone)]
pub(super) struct Installer {
    pub(super) sandbox: Arc<Sandbox>,
    /// The session's tenant's claim on the engine's sandbox slots: each uv step holds a slot
    /// while its sandbox runs, in the tenant's name (also when the install goes on after its
    /// call).
    pub(super) share: crate::tenants::Share,
    pub(super) uv: Uv,
    pub(super) uv_env: UvEnvironment,
    pub(super) uv_cache: PathBuf,
    pub(super) interpreter: Interpreter,
    pub(super) env_dir: PathBuf,
    pub(super) venv: PathBuf,
    /// A run's limits, for the package code an install runs (compilation).
    pub(super) limits: snakebox_sandbox::Limits,
}
impl Installer {
    /// The shared install pipeline (the environment cache's too), for this session's
    /// interpreter; its steps' sandboxes weigh on the CPU as the slot they run in says.
    fn pipeline(&self, slot: Option<&crate::tenants::Slot>) -> InstallPipeline<'_> {
        InstallPipeline {
            uv: &self.uv,
            uv_env: &self.uv_env,
            interpreter: &self.interpreter,
            uv_cache: self.uv_cache.clone(),
            timeout: self.limits.wall_time,
            cpu: slot.and_then(crate::tenants::Slot::cpu).cloned(),
        }
    }

    /// Run one uv step in the installer sandbox; uv's stderr goes to `progress`.
    pub(super) async fn uv(
        &self,
        label: &str,
        args: Vec<std::ffi::OsString>,
        network: bool,
        progress: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<(Vec<u8>, String), EngineError> {
        let slot = self.share.slot().await?;
        let step = self
            .pipeline(Some(&slot))
            .downloader(
                label,
                args,
                &self.env_dir,
                vec![self.env_dir.clone(), self.uv_cache.clone()],
                network,
                self.sandbox.report().isolation_active,
            )
            .map_err(|err| {
                EngineError::internal(
                    format!("could not start the egress proxy for `{label}`: {err}"),
                    "check that the temporary directory is writable",
                )
            })?;
        let mut output =
            match snakebox_env::run_sandboxed(&self.sandbox, &step.invocation, progress).await {
                Ok(output) => output,
                Err(EnvError::Timeout { .. }) => {
                    return Err(EngineError {
                        kind: ErrorKind::Failed,
                        message: format!(
                            "`{label}` took longer than {} s and was stopped",
                            self.limits.wall_time.as_secs()
                        ),
                        hint: Some(
                            "install fewer packages at once; the server's operator can allow \
                             longer steps with --install-timeout (`[cache] install_timeout`)"
                                .into(),
                        ),
                    });
                }
                Err(err) => {
                    return Err(could_not_start(&format!("`{label}` could not start"), &err));
                }
            };
        // What the install proxy refused, when the step failed (uv only saw a 403).
        let refused = step.explain_refusals(&mut output);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let full = (!output.success())
            .then(|| self.out_of_space(&stderr))
            .flatten();
        match output.exit_code {
            Some(0) => Ok((output.stdout, stderr)),
            _ if full.is_some() => Err(EngineError {
                kind: ErrorKind::Quota,
                message: format!(
                    "`{label}` failed: {} is out of space ({} left): {}",
                    full.unwrap_or_default(),
                    self.space_left(),
                    stderr.trim()
                ),
                hint: Some(self.space_hint()),
            }),
            _ if refused => Err(EngineError {
                kind: ErrorKind::Failed,
                message: format!("`{label}` failed: {}", stderr.trim()),
                hint: Some(snakebox_env::INSTALL_HOSTS_HINT.into()),
            }),
            _ if snakebox_env::is_missing_wheel(stderr.as_bytes()) => Err(EngineError {
                kind: ErrorKind::Failed,
                message: format!("`{label}` failed: {}", stderr.trim()),
                hint: Some(
                    "a requirement has no wheel for this Python, and sessions install wheels only: building from source runs the package's own build code. Pin a version that publishes a wheel".into(),
                ),
            }),
            _ => Err(EngineError {
                kind: ErrorKind::Failed,
                message: format!("`{label}` failed: {}", stderr.trim()),
                hint: Some(
                    "check the package names and versions (PEP 508, e.g. \"pandas>=2.2\"), and that they exist for this Python version".into(),
                ),
            }),
        }
    }

    /// Which disk a failed step filled, when it failed for lack of space: the step said so
    /// (`ENOSPC`, `EDQUOT`), or the session's disk or the data directory is nearly full.
    fn out_of_space(&self, said: &str) -> Option<&'static str> {
        use snakebox_env::space;
        let session_low = space::is_low_on_space(&self.env_dir);
        let cache_low = space::is_low_on_space(&self.uv_cache);
        if !(space::says_no_space(said) || session_low || cache_low) {
            return None;
        }
        Some(if cache_low && !session_low {
            "the data directory (uv's cache)"
        } else {
            "your share of the sessions' disk"
        })
    }

    fn space_left(&self) -> String {
        snakebox_env::space::available_bytes(&self.env_dir)
            .map_or_else(|| "unknown".into(), snakebox_env::space::human_bytes)
    }

    /// What to do when an install ran out of space.
    fn space_hint(&self) -> String {
        format!(
            "delete files (run_command with `rm`) or whole sessions (delete_session) to free \
             your share of the sessions' disk, whose size the operator sets with \
             --tenant-sessions-max-disk (all tenants' together: --sessions-max-disk); for \
             the data directory: {}",
            snakebox_env::NO_SPACE_HINT
        )
    }

    /// Make the empty venv.
    pub(super) async fn create_venv(&self) -> Result<(), EngineError> {
        self.uv(
            "uv venv",
            self.pipeline(None).venv_args(&self.venv, false),
            false,
            None,
        )
        .await
        .map(|_| ())
    }

    /// Install `requirements`; returns what is installed afterwards, the venv's size and the
    /// end of uv's log.
    ///
    /// Two steps, because a package's code is untrusted (SECURITY.md, "Installs and builds"):
    /// uv downloads and unpacks wheels only, into the venv as the prefix of the *base*
    /// interpreter, so that it queries that interpreter and never the venv's (whose packages'
    /// `.pth` files would run in the installer); then the venv is byte-compiled as package
    /// code, sandboxed like a run. What is installed is read from the `.dist-info` directories.
    pub(super) async fn install(
        &self,
        requirements: &[String],
        progress: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<(Vec<Package>, u64, String), EngineError> {
        let mut log = String::new();
        if !requirements.is_empty() {
            // Never fetch from host loopback, private or metadata addresses (catalogue D-02).
            snakebox_env::check_requirement_strings(requirements, &self.uv_env).await?;
            let args = self.pipeline(None).download_args(
                DownloadTarget::Prefix(&self.venv),
                "copy",
                requirements.iter().map(Into::into),
            );
            self.reclaim_venv().await?;
            // As for a new environment (docs/src/environments.md, "Pinned sets from the cache first"): a pinned
            // install is tried from uv's cache alone first, without the network and without
            // streaming its output (what it lacks is installed online, and that is shown).
            let pinned = snakebox_script::merge_dependencies(None, requirements)
                .is_ok_and(|parsed| parsed.iter().all(snakebox_script::is_exact_pin));
            let mut offline = None;
            if pinned {
                let mut args = args.clone();
                args.push("--offline".into());
                match self.uv("uv pip install --offline", args, false, None).await {
                    Ok((_, stderr)) => offline = Some(stderr),
                    Err(err) => {
                        tracing::debug!(error = %err.message, "not all in uv's cache; installing online");
                    }
                }
            }
            log = match offline {
                Some(stderr) => stderr,
                None => self.uv("uv pip install", args, true, progress).await?.1,
            };
            let (venv, base) = (self.venv.clone(), self.interpreter.executable.clone());
            super::blocking_io("fix the installed scripts", move || {
                snakebox_env::point_scripts_at_venv(&venv, &base)
            })
            .await?;
            self.compile().await?;
            self.verify().await?;
        }
        let mut packages: Vec<Package> = snakebox_env::installed_packages(&self.venv)
            .into_iter()
            .map(|p| Package {
                name: p.name,
                version: p.version,
            })
            .collect();
        packages.sort_by(|a, b| a.name.cmp(&b.name));
        let venv = self.venv.clone();
        let bytes = tokio::task::spawn_blocking(move || make_readable(&venv))
            .await
            .unwrap_or(0);
        Ok((packages, bytes, tail(&log, 2000)))
    }

    /// Check every installed file against its distribution's `RECORD` (host code reading
    /// files beneath the venv, executing nothing): a short write (a full disk) or a damaged
    /// file in uv's cache is reported now, not by an import later.
    async fn verify(&self) -> Result<(), EngineError> {
        let mismatches = InstallPipeline::verify(&self.venv).await?;
        if mismatches.is_empty() {
            return Ok(());
        }
        let shown: Vec<String> = mismatches.iter().take(3).map(ToString::to_string).collect();
        let said = shown.join("; ");
        if let Some(full) = self.out_of_space(&said) {
            return Err(EngineError {
                kind: ErrorKind::Quota,
                message: format!(
                    "{} installed file(s) are damaged or missing ({full} is out of space, {} left): {said}",
                    mismatches.len(),
                    self.space_left()
                ),
                hint: Some(self.space_hint()),
            });
        }
        // The damaged copies leave uv's cache, so that installing again downloads them.
        let names = InstallPipeline::damaged_distributions(&mismatches);
        let args = InstallPipeline::cache_clean_args(&names);
        let cleaned = self.uv("uv cache clean", args, false, None).await.is_ok();
        Err(EngineError {
            kind: ErrorKind::Failed,
            message: format!(
                "{} installed file(s) are damaged or missing{}: {said}",
                mismatches.len(),
                if cleaned {
                    " (their packages' copies in uv's cache were removed)"
                } else {
                    ""
                }
            ),
            hint: Some(
                "the session's packages are incomplete: reset_session rebuilds its venv with the packages it was created with (install the others again afterwards), or start a new session; if it keeps failing, check the disk for errors and free space"
                    .into(),
            ),
        })
    }

    /// Give the venv back to the installer uid if an earlier compile never did: a server
    /// killed while package code compiled the venv left it owned by that run's uid, and uv
    /// could then write nothing new into it (issue 12). Only what differs is changed.
    async fn reclaim_venv(&self) -> Result<(), EngineError> {
        let Some(ids) = self.sandbox.host_ids(Identity::Installer) else {
            return Ok(());
        };
        let venv = self.venv.clone();
        super::blocking_io("give the venv back to the installer", move || {
            snakebox_env::take_back_from_package_code(&venv, ids)
        })
        .await
    }

    /// Byte-compile the venv as package code: a leased run uid (the venv's directories are
    /// handed to it, its files are not writable by it), the run limits, no network, no
    /// credentials, `HOME=/tmp`, uv's cache not mounted. Afterwards everything is the
    /// installer's again. A file that does not compile is not an error; a limit is.
    async fn compile(&self) -> Result<(), EngineError> {
        let identity = UvRunner::package_identity(self.sandbox.as_ref());
        let installer = self.sandbox.host_ids(Identity::Installer);
        // Package code in a sandbox of its own: a slot of the concurrency cap (V-01).
        let slot = self.share.slot().await?;
        let compiled = self
            .pipeline(Some(&slot))
            .compile(
                self.sandbox.as_ref(),
                &self.venv,
                &identity,
                self.limits.clone(),
                installer,
            )
            .await;
        drop(identity);
        let limit = match compiled {
            Ok(None) => return Ok(()),
            Err(EnvError::Timeout { .. }) => "time",
            Err(EnvError::LimitReached { limit, .. }) => limit,
            Err(err @ EnvError::Sandbox { .. }) => {
                return Err(could_not_start(
                    "compiling the packages could not start",
                    &err,
                ));
            }
            Err(err) => return Err(err.into()),
            Ok(Some(output)) => match output.exit_code {
                // A file that does not compile is not an error; a full disk (short writes
                // leave truncated `.pyc` files, which the compile step reports) is.
                code if code != Some(0) => {
                    let said = String::from_utf8_lossy(&output.stderr).into_owned();
                    // Compiled files cut short (a full disk) are removed: the packages then
                    // import, compiled in memory, instead of failing.
                    let damaged = snakebox_env::damaged_compile(code, &said);
                    let removed = match (&damaged, snakebox_env::site_packages(&self.venv)) {
                        (Some(files), Some(site)) => {
                            let files = files.clone();
                            super::blocking_io("remove damaged compiled files", move || {
                                Ok(snakebox_env::remove_damaged_pycs(&site, &files))
                            })
                            .await?
                        }
                        _ => 0,
                    };
                    let note = if removed > 0 {
                        format!(
                            "; {removed} damaged compiled file(s) were removed (imports compile those modules in memory)"
                        )
                    } else {
                        String::new()
                    };
                    if let Some(full) = self.out_of_space(&said) {
                        return Err(EngineError {
                            kind: ErrorKind::Quota,
                            message: format!(
                                "compiling the installed packages failed: {full} is out of space ({} left){note}: {}",
                                self.space_left(),
                                said.trim()
                            ),
                            hint: Some(self.space_hint()),
                        });
                    }
                    if damaged.is_some() {
                        return Err(EngineError {
                            kind: ErrorKind::Failed,
                            message: format!(
                                "compiling the installed packages left damaged files{note}: {}",
                                said.trim()
                            ),
                            hint: Some("install the packages again; if it keeps failing, check the disk for errors and free space".into()),
                        });
                    }
                    return Ok(());
                }
                _ => return Ok(()),
            },
        };
        Err(EngineError {
            kind: ErrorKind::Failed,
            message: format!(
                "compiling the installed packages (which runs their code) reached the {limit} limit and was stopped"
            ),
            hint: Some(
                "a package's own code ran while it was compiled and used more than a run may; the run limits apply to it too"
                    .into(),
            ),
        })
    }
}
/// A step whose sandbox could not start, told as the sandbox's own error (its kind: internal,
/// unavailable or invalid), as when the session ran the sandbox itself.
fn could_not_start(context: &str, err: &EnvError) -> EngineError {
    if let EnvError::Sandbox { source, .. } = err
        && let Some(sandbox) = source.downcast_ref::<snakebox_sandbox::SandboxError>()
    {
        return EngineError::context(context, sandbox);
    }
    EngineError::context(context, err)
}

/// Let any uid read (and traverse) the venv; returns its size. Links are never followed
/// (the walk and the mode changes go through [`crate::tree`] and `fchmodat` without
/// following).
pub(super) fn make_readable(root: &Path) -> u64 {
    use crate::tree::{Caps, Kind, Next};
    use nix::sys::stat::{FchmodatFlags, Mode, fchmodat};
    use std::os::unix::fs::PermissionsExt;
    const CAPS: Caps = Caps {
        entries: u64::MAX,
        depth: usize::MAX,
        time: std::time::Duration::from_secs(600),
    };
    fn readable(mode: u32, is_dir: bool) -> u32 {
        if is_dir || mode & 0o111 != 0 {
            mode | 0o555
        } else {
            mode | 0o444
        }
    }
    if let Ok(meta) = fs_err::symlink_metadata(root)
        && meta.is_dir()
    {
        let mode = meta.permissions().mode() & 0o7777;
        let _ =
            fs_err::set_permissions(root, std::fs::Permissions::from_mode(readable(mode, true)));
    }
    let mut total = 0u64;
    let _ = crate::tree::walk(root, &CAPS, &mut |entry| {
        let kind = entry.kind();
        if kind == Kind::Symlink {
            return Next::Skip;
        }
        let mode = entry.stat.st_mode & 0o7777;
        let want = readable(mode, kind == Kind::Directory);
        if want != mode {
            let _ = fchmodat(
                entry.dir,
                entry.name,
                Mode::from_bits_truncate(want),
                FchmodatFlags::NoFollowSymlink,
            );
        }
        if kind != Kind::Directory {
            total = total.saturating_add(u64::try_from(entry.stat.st_size).unwrap_or(0));
        }
        Next::Descend
    });
    total
}
pub(super) fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}
impl SessionService {
    pub(super) fn installer(
        &self,
        caller: &Caller,
        interpreter: &Interpreter,
        paths: &SessionPaths,
    ) -> Result<Installer, EngineError> {
        let sandbox = self.session_sandbox()?;
        let uv = self.planner.uv().as_ref().map_err(unavailable)?;
        let cache = self.cache.as_ref().map_err(unavailable)?;
        Ok(Installer {
            sandbox: Arc::clone(sandbox),
            share: self.calls.share(caller),
            uv: uv.clone(),
            uv_env: cache.uv_environment().clone(),
            uv_cache: cache.uv_cache_dir(),
            interpreter: interpreter.clone(),
            env_dir: paths.env.clone(),
            venv: paths.venv.clone(),
            // What `CallKind::SessionInstall` decides: the server's limits for each step,
            // `install_timeout` its wall time, as an environment build's.
            limits: crate::policy::server_limits(&self.config, self.config.install_timeout),
        })
    }

    pub(super) fn parse_requirements(packages: &[String]) -> Result<Vec<String>, EngineError> {
        snakebox_script::merge_dependencies(None, packages)
            .map(|reqs| reqs.iter().map(ToString::to_string).collect())
            .map_err(EngineError::from)
    }

    /// Directories and venv of a new (or reset) session; the create-time requirements
    /// installed. Returns what is installed and the venv's size.
    pub(super) async fn build_session(
        &self,
        caller: &Caller,
        paths: &SessionPaths,
        interpreter: &Interpreter,
        requirements: &[String],
    ) -> Result<(Vec<Package>, u64), EngineError> {
        let sandbox = self.session_sandbox()?;
        let user = sandbox.host_ids(Identity::Untrusted);
        let installer = sandbox.host_ids(Identity::Installer);
        (|| -> std::io::Result<()> {
            make_dir(&paths.root, 0o711, None)?;
            make_dir(&paths.work, 0o700, user)?;
            make_dir(&paths.tmp, 0o700, user)?;
            make_dir(&paths.input, 0o755, None)?;
            make_dir(&paths.env, 0o755, installer)?;
            Ok(())
        })()
        .map_err(|err| io_error("create the session's directories", &err))?;
        let installer = self.installer(caller, interpreter, paths)?;
        installer.create_venv().await?;
        let (packages, bytes, _) = installer.install(requirements, None).await?;
        Ok((packages, bytes))
    }

    /// Install packages into a session. Waits up to `wait` (default: until done) and returns
    /// the install's state; an install still running then goes on, and `list_packages` reports
    /// it. uv's output goes to `progress` while it runs.
    ///
    /// # Errors
    /// No such session, invalid requirements, an install already running, disk full.
    pub(crate) async fn install_packages(
        &self,
        caller: &Caller,
        session_id: &str,
        packages: Vec<String>,
        wait: Option<Duration>,
        progress: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<InstallStatus, EngineError> {
        // In flight until it returns; the install itself ends when the server stops.
        let call = self.calls.enter(&CancellationToken::new())?;
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        if packages.is_empty() {
            return Err(EngineError {
                kind: ErrorKind::Invalid,
                message: "No packages given".into(),
                hint: Some(
                    "pass PEP 508 specifiers, e.g. [\"pandas>=2.2\", \"six==1.16.0\"]".into(),
                ),
            });
        }
        let requirements = Self::parse_requirements(&packages)?;
        // The session's profile's package allowlist, as it is configured now (one removed
        // since: refused).
        let parsed: Vec<pep508_rs::Requirement> = packages
            .iter()
            .filter_map(|spec| spec.parse().ok())
            .collect();
        crate::policy::CallPolicy::decide(
            &self.config,
            crate::policy::CallKind::SessionInstall(&super::interpreter::session_facts(&row)),
            &self.calls.tenant(caller),
            &crate::policy::Asked {
                requirements: &parsed,
                ..crate::policy::Asked::default()
            },
        )
        .map_err(|refusal| refusal.error)?;
        manager.check_disk(&row.owner)?;
        let interpreter = self.session_interpreter(&row)?;
        let installer = self.installer(caller, &interpreter, &manager.paths(&row)?)?;
        let slot = manager.slot(&row);
        if slot.installing.swap(true, Ordering::SeqCst) {
            return Err(EngineError {
                kind: ErrorKind::Conflict,
                message: format!("An install is already running in session `{session_id}`"),
                hint: Some("wait for it: list_packages shows its state".into()),
            });
        }
        {
            let mut status = slot
                .install
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            status.state = InstallState::Running;
            status.requested.clone_from(&requirements);
            status.started_at = Some(now_secs());
            status.finished_at = None;
            status.error = None;
            status.log_tail.clear();
        }
        // uv's output goes to the caller's progress and, as it comes, to the install's log
        // tail, so `list_packages` (and the web UI) show a running install's progress.
        let (relay_tx, mut relay_rx) = tokio::sync::mpsc::unbounded_channel::<OutputChunk>();
        let relay_slot = Arc::clone(&slot);
        tokio::spawn(async move {
            while let Some(chunk) = relay_rx.recv().await {
                {
                    let mut status = relay_slot
                        .install
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if status.state == InstallState::Running {
                        append_tail(&mut status.log_tail, &chunk.text);
                    }
                }
                if let Some(progress) = &progress {
                    let _ = progress.send(chunk);
                }
            }
        });
        let progress = Some(relay_tx);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let task_manager = Arc::clone(manager);
        let task_slot = Arc::clone(&slot);
        let id = row.id.clone();
        let stop = call.token.clone();
        tokio::spawn(async move {
            let state = task_slot.state.lock().await;
            let outcome = if state.deleted {
                Err(no_session(&id))
            } else {
                // Cut short only by the server stopping (the call's own cancel is not
                // forwarded: an install goes on after its call returns). Dropping it kills
                // its sandbox and uv.
                tokio::select! {
                    outcome = installer.install(&requirements, progress) => outcome,
                    () = stop.cancelled() => Err(EngineError {
                        kind: ErrorKind::Cancelled,
                        message: "The install was stopped because the server is stopping; the packages installed before that may be incomplete".into(),
                        hint: Some("install the packages again once the server has been restarted".into()),
                    }),
                }
            };
            let mut all_requirements = task_manager
                .store
                .get(&id)
                .ok()
                .flatten()
                .map(|r| r.requirements)
                .unwrap_or_default();
            {
                let mut status = task_slot
                    .install
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                status.finished_at = Some(now_secs());
                match outcome {
                    Ok((packages, bytes, log)) => {
                        for requirement in &requirements {
                            if !all_requirements.contains(requirement) {
                                all_requirements.push(requirement.clone());
                            }
                        }
                        let pairs: Vec<(String, String)> = packages
                            .iter()
                            .map(|p| (p.name.clone(), p.version.clone()))
                            .collect();
                        let _ =
                            task_manager
                                .store
                                .set_packages(&id, &all_requirements, &pairs, bytes);
                        status.state = InstallState::Succeeded;
                        status.packages = packages;
                        status.log_tail = log;
                    }
                    Err(error) => {
                        status.state = InstallState::Failed;
                        status.error = Some(error.into());
                    }
                }
            }
            drop(state);
            task_slot.installing.store(false, Ordering::SeqCst);
            let _ = done_tx.send(());
        });
        match wait {
            Some(wait) => {
                let _ = tokio::time::timeout(wait, done_rx).await;
            }
            None => {
                let _ = done_rx.await;
            }
        }
        let status = slot
            .install
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(status)
    }

    /// Installed packages and the state of the last install.
    ///
    /// # Errors
    /// No such session.
    pub(crate) async fn list_packages(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<PackageList, EngineError> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, session_id)?;
        let slot = manager.slot(&row);
        let install = slot
            .install
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(PackageList {
            session_id: row.id.clone(),
            python_version: row.python_version.clone(),
            packages: packages_of(&row),
            requested_packages: row.requirements.clone(),
            install,
        })
    }
}

/// Most of a running install's output kept in its status (the end of it).
const LIVE_LOG_TAIL: usize = 16 * 1024;

/// Appends `text` to `tail`, keeping its last [`LIVE_LOG_TAIL`] bytes (cut at a character).
fn append_tail(tail: &mut String, text: &str) {
    tail.push_str(text);
    if tail.len() > LIVE_LOG_TAIL {
        let mut cut = tail.len() - LIVE_LOG_TAIL;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_tail_keeps_the_end_and_whole_characters() {
        let mut tail = String::new();
        append_tail(&mut tail, "Resolved 1 package\n");
        assert_eq!(tail, "Resolved 1 package\n");
        append_tail(&mut tail, &"é".repeat(LIVE_LOG_TAIL));
        assert!(tail.len() <= LIVE_LOG_TAIL && tail.len() >= LIVE_LOG_TAIL - 1);
        assert!(tail.chars().all(|c| c == 'é'));
        append_tail(&mut tail, "Installed\n");
        assert!(tail.ends_with("éInstalled\n"));
    }
}
