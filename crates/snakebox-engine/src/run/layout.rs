//! Run directories on the host: `<data>/runs/<server pid>/<execution id>/{input,work,tmp}`,
//! made for the host uid the run's sandbox runs as, with the working directory capped in
//! size, and removed when dropped. Also the sweeps of what servers left: the directories of
//! servers that are gone (at start) and this server's own (at stop).

use std::path::{Path, PathBuf};

use snakebox_sandbox::{HostDirStaging, Staging};

use super::spec::SCRIPT_NAME;

/// The host side of one run: `input/` (the script, read-only inside), `work/` (the writable
/// working directory) and `tmp/` (used by the `none` backend). Removed when dropped.
pub(crate) struct RunDir {
    root: PathBuf,
    pub(crate) input: PathBuf,
    pub(crate) work: PathBuf,
    pub(crate) tmp: PathBuf,
    /// The size cap on `work`, when one is in force.
    scratch: Option<snakebox_sandbox::ScratchDir>,
    /// Whose host uid the run's sandbox runs as (none: the sandbox's default).
    runs_as: Option<RunsAs>,
}

/// The host uid a run directory is made for.
enum RunsAs {
    /// A uid of the run's own, released after the directory is removed.
    Leased(snakebox_sandbox::IdentityLease),
    /// Another's, held elsewhere: a forked run has its fork server's.
    Borrowed(snakebox_sandbox::Identity, Option<(u32, u32)>),
}

impl RunsAs {
    fn identity(&self) -> snakebox_sandbox::Identity {
        match self {
            RunsAs::Leased(lease) => lease.identity(),
            RunsAs::Borrowed(identity, _) => *identity,
        }
    }

    fn host_ids(&self) -> Option<(u32, u32)> {
        match self {
            RunsAs::Leased(lease) => lease.host_ids(),
            RunsAs::Borrowed(_, ids) => *ids,
        }
    }
}

impl RunDir {
    /// `owner` is the host uid/gid the sandbox runs as, when it differs from ours: it gets the
    /// writable directories. Without `script` (a warm-pool run directory), the script is
    /// written later by [`RunDir::write_script`].
    pub(crate) fn create(
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<RunDir> {
        RunDir::create_with(data_dir, id, script, owner, true)
    }

    /// [`RunDir::create`]; `runner`: write the runner beside the script (a forked run has
    /// it imported already, from its fork server).
    fn create_with(
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        owner: Option<(u32, u32)>,
        runner: bool,
    ) -> std::io::Result<RunDir> {
        use std::os::unix::fs::PermissionsExt;
        let root = server_runs_dir(data_dir).join(id);
        let dir = RunDir {
            input: root.join("input"),
            work: root.join("work"),
            tmp: root.join("tmp"),
            root,
            scratch: None,
            runs_as: None,
        };
        for path in [&dir.input, &dir.work, &dir.tmp] {
            fs_err::create_dir_all(path)?;
        }
        if runner {
            dir.write_runner()?;
        }
        // The sandboxed user is unprivileged: it may read the inputs and write the working
        // directory, nothing else of ours. (The run directory itself is private to the server
        // user; only the sandbox's bind mounts expose these.)
        fs_err::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o711))?;
        fs_err::set_permissions(&dir.input, std::fs::Permissions::from_mode(0o755))?;
        if let Some(script) = script {
            dir.write_script(script)?;
        }
        for writable in [&dir.work, &dir.tmp] {
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(writable, Some(uid), Some(gid))?;
            }
            fs_err::set_permissions(writable, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(dir)
    }

    /// Write the runner into the input directory (read-only inside the sandbox): a run
    /// directory made for a forked run has none, and gets it when its run starts cold after
    /// all.
    pub(crate) fn write_runner(&self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.input.join(crate::runner::FILE_NAME);
        fs_err::write(&path, crate::runner::SOURCE)?;
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
    }

    /// Write the script into the input directory (read-only inside the sandbox).
    pub(crate) fn write_script(&self, script: &str) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.input.join(SCRIPT_NAME);
        fs_err::write(&path, script)?;
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
    }

    /// Write the run's import policy beside the script (`imports.json`: the module names its
    /// own code may import), which the runner reads before the script starts.
    pub(crate) fn write_import_policy(&self, allowed: &[String]) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.input.join(crate::runner::IMPORT_POLICY_FILE);
        let policy = serde_json::json!({ "allowed": allowed });
        fs_err::write(&path, policy.to_string())?;
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
    }

    /// Write the exec-deny seccomp program the runner installs (`--deny-exec`), read-only to
    /// the run.
    pub(crate) fn write_exec_deny(&self, program: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.input.join(super::EXEC_DENY_NAME);
        fs_err::write(&path, program)?;
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o444))
    }

    /// Create the run directory of one run of user code under a host uid of its own (see
    /// [`snakebox_sandbox::Sandbox::lease_identity`]), with its working directory capped at
    /// `scratch_bytes` when set.
    pub(crate) fn for_run(
        sandbox: &snakebox_sandbox::Sandbox,
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        scratch_bytes: Option<u64>,
    ) -> std::io::Result<RunDir> {
        let runs_as = RunsAs::Leased(sandbox.lease_identity());
        let scratch = scratch_bytes.map(|size| (sandbox.staging(), size));
        RunDir::for_uid(runs_as, data_dir, id, script, scratch, true)
    }

    /// Create the run directory of one run forked by `server`: it runs as the fork server's
    /// host uid (see [`snakebox_sandbox::ForkServer`]), which owns its writable directories.
    /// `sandbox`'s staging caps its working directory at `scratch_bytes` when set.
    pub(crate) fn for_fork(
        sandbox: &snakebox_sandbox::Sandbox,
        server: &snakebox_sandbox::ForkServer,
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        scratch_bytes: Option<u64>,
    ) -> std::io::Result<RunDir> {
        let runs_as = RunsAs::Borrowed(server.identity(), server.host_ids());
        let scratch = scratch_bytes.map(|size| (sandbox.staging(), size));
        RunDir::for_uid(runs_as, data_dir, id, script, scratch, false)
    }

    fn for_uid(
        runs_as: RunsAs,
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        scratch: Option<(&dyn Staging, u64)>,
        runner: bool,
    ) -> std::io::Result<RunDir> {
        let owner = runs_as.host_ids();
        let mut dir = RunDir::create_with(data_dir, id, script, owner, runner)?;
        dir.runs_as = Some(runs_as);
        if let Some((staging, size)) = scratch {
            dir.cap_work(staging, size, owner)
                .map_err(std::io::Error::other)?;
        }
        Ok(dir)
    }

    /// The identity the run's sandbox must use.
    pub(crate) fn identity(&self) -> snakebox_sandbox::Identity {
        self.runs_as
            .as_ref()
            .map_or(snakebox_sandbox::Identity::Untrusted, RunsAs::identity)
    }

    /// The host uid/gid that owns the run's writable directories, when not ours.
    pub(crate) fn owner(&self) -> Option<(u32, u32)> {
        self.runs_as.as_ref().and_then(RunsAs::host_ids)
    }

    /// Cap the working directory at `size_bytes` (a tmpfs owned by `owner`), so a run cannot
    /// fill the host disk through it. Without the privilege to mount, it stays a plain
    /// directory; `check_environment` reports whether the cap is enforced.
    pub(crate) fn cap_work(
        &mut self,
        staging: &dyn Staging,
        size_bytes: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<(), snakebox_sandbox::SpawnError> {
        self.scratch = Some(staging.cap(&self.work, size_bytes, owner)?);
        Ok(())
    }
}

/// Where run directories live: `<data>/runs/<server pid>/<execution id>`.
pub(crate) fn runs_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("runs")
}

/// This server's run directories: `<data>/runs/<server pid>`.
pub(crate) fn server_runs_dir(data_dir: &Path) -> PathBuf {
    runs_dir(data_dir).join(std::process::id().to_string())
}

/// Whether another live server (a process other than this one) uses `data_dir`: each keeps
/// `<data>/runs/<its pid>/` while it runs.
pub(crate) fn other_live_servers(data_dir: &Path) -> bool {
    fs_err::read_dir(runs_dir(data_dir))
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
                .is_some_and(|pid| {
                    pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists()
                })
        })
}

/// Remove the run directories of servers that are gone (killed before they could clean up),
/// releasing (through `staging`) any scratch mount left in them. Directories of live servers
/// sharing the data directory are left alone.
pub(crate) fn remove_stale_run_dirs(data_dir: &Path, staging: &dyn Staging) {
    let Ok(entries) = fs_err::read_dir(runs_dir(data_dir)) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(runs) = fs_err::read_dir(entry.path()) {
            for run in runs.filter_map(Result::ok) {
                staging.release_stale(&run.path().join("work"));
            }
        }
        // The fork server's shared mount of the whole directory, if it had one.
        staging.release_stale(&entry.path());
        if let Err(err) = crate::tree::remove(&entry.path()) {
            tracing::warn!(%err, "could not remove a stale run directory");
        }
    }
}

/// Remove this server's run directories (at shutdown, after its runs ended): what a run left
/// (a scratch mount, files) and what `sandbox` got ready for fork servers there (the runs
/// root's mount). Without a sandbox, only what host-directory staging left.
pub(crate) fn remove_own_run_dirs(data_dir: &Path, sandbox: Option<&snakebox_sandbox::Sandbox>) {
    let dir = server_runs_dir(data_dir);
    let staging = sandbox.map_or(&HostDirStaging as &dyn Staging, |s| s.staging());
    if let Ok(runs) = fs_err::read_dir(&dir) {
        for run in runs.filter_map(Result::ok) {
            staging.release_stale(&run.path().join("work"));
        }
    }
    if let Some(sandbox) = sandbox {
        sandbox.release_runs_root(&dir);
    }
    if dir.exists()
        && let Err(err) = crate::tree::remove(&dir)
    {
        tracing::warn!(%err, "could not remove this server's run directories");
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // Unmount the scratch tmpfs first: its mount point cannot be removed while mounted.
        drop(self.scratch.take());
        if let Err(err) = crate::tree::remove(&self.root) {
            tracing::warn!(%err, "could not remove a run directory");
        }
    }
}
