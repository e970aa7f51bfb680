//! The `docker` backend: each run is a container of a Docker engine, driven through the
//! Engine API (bollard), never the CLI.
//!
//! Why it exists: hosts where bubblewrap cannot isolate (user namespaces blocked, Docker
//! Desktop) still have a container engine; and an engine with gVisor's `runsc` gives a second,
//! stronger kernel boundary. The engine is a privileged daemon, so the server only asks it for
//! containers and never lets a run reach it: the socket is not mounted, runs have no network.
//!
//! One run, the cold path: create → inspect (the hardening, verified, see [`hardening`]) →
//! attach → start → wait → inspect (out of memory?) → remove (in the background, once what
//! the run used is read). The container's hardening is
//! decided in one place ([`hardening::container_body`]) and checked field by field after the
//! create: an engine that ignored or changed a field (an older API, a daemon default) fails the
//! run closed before anything started. Output is read from the attach stream only (the logging
//! driver is `none`: nothing is written to the daemon's disk) and capped by the same
//! supervisor as native runs. The control channel (descriptor 3 of the command) is a FIFO in a
//! directory of the run's own, bound into the container; `/bin/sh` (the host's, read-only)
//! opens it as descriptor 3 and execs the command. Timeouts and cancellation kill through the
//! API; the container is removed (with its anonymous volumes) whatever happens, also when the
//! run's future is dropped.
//!
//! The same first half (`start_container`) makes the warm pool's containers, started ahead
//! and fed their one request later ([`pooled`]), and a session's long-lived container
//! ([`live`]); what a run used is read from a cgroup of its own ([`usage`]).
//!
//! Installs go through `run` like any command, so the downloader and package code run in
//! containers too. The seccomp program is the native backend's, as a JSON profile
//! ([`seccomp`]).

pub(crate) mod hardening;
pub(crate) mod image;
mod live;
mod pooled;
pub(crate) mod seccomp;
mod usage;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Instant;

use bollard::Docker;
use bollard::container::LogOutput;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::error::{DockerError, SandboxError, SpawnError};
use crate::native::policy::SystemView;
use crate::supervise::{AbortOnDrop, DirectChild, Teardown, outcome, supervise};
use crate::{
    BackendKind, BackendReport, Identity, LimitReport, Outcome, OutputChunk, Policy, SandboxCommand,
};

pub use self::image::RunImage;

/// The Engine API version every request names. An engine older than this refuses the
/// request instead of silently ignoring fields it does not know (bollard would otherwise
/// send its own, newer default); 1.41 is Docker 20.10, Debian 12's `docker.io`.
pub(crate) const API_VERSION: bollard::ClientVersion = bollard::ClientVersion {
    major_version: 1,
    minor_version: 41,
};

/// The label every container of ours carries: the server that made it, as
/// `<pid namespace inode>.<pid>.<start time in ticks since boot>` (a pid alone may be reused).
pub(crate) const SERVER_LABEL: &str = "snakebox.server";

/// The engine's socket when `DOCKER_HOST` names no unix socket.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// Seconds a request may wait for the engine's response headers.
const REQUEST_TIMEOUT_SECS: u64 = 60;

/// Where the control channel's directory appears inside the container.
pub(crate) const CONTROL_DIR_INSIDE: &str = "/.snakebox-control";
/// The FIFO's name in it.
const CONTROL_FIFO: &str = "control";
/// A pooled container's request FIFO in the same directory (its stdin).
pub(crate) const REQUEST_FIFO: &str = "request";

/// The engine's socket: `DOCKER_HOST` when it is a `unix://` address, else the default.
#[must_use]
pub fn socket_path() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(str::to_owned))
        .unwrap_or_else(|| DEFAULT_SOCKET.to_owned())
}

/// A client of the engine at `socket`, pinned to [`API_VERSION`].
pub(crate) fn connect(socket: &str) -> Result<Docker, DockerError> {
    Docker::connect_with_unix(socket, REQUEST_TIMEOUT_SECS, &API_VERSION).map_err(|source| {
        DockerError::Unreachable {
            socket: socket.to_owned(),
            source,
        }
    })
}

/// What the probe learnt about the engine (for the report).
#[derive(Debug, Clone)]
struct EngineFacts {
    /// The runtime's arguments as registered with the engine (runsc: its platform).
    runtime_args: Vec<String>,
    version: String,
    api_version: String,
    cgroup: String,
    /// `cgroupfs` or `systemd`.
    cgroup_driver: String,
    storage_driver: String,
}

/// A probed, ready docker backend.
#[derive(Debug)]
pub(crate) struct DockerBackend {
    docker: Docker,
    socket: String,
    image: String,
    view: SystemView,
    scratch_root: PathBuf,
    facts: EngineFacts,
    runtime: Option<String>,
    /// This server's [`SERVER_LABEL`] value.
    server: String,
    /// Where each run's cgroup of ours goes (the engine's cgroup driver is `cgroupfs`);
    /// `None`: what runs use is not measured.
    usage_root: Option<usage::UsageRoot>,
}

impl DockerBackend {
    /// Probe the engine (reachable, API 1.41 or newer, the run image present, the runtime
    /// registered). Fails closed with a hint for each.
    pub(crate) fn new(config: &crate::SandboxConfig) -> Result<DockerBackend, SandboxError> {
        // Each run's directories are owned by its leased uid, which only root can arrange.
        if !nix::unistd::geteuid().is_root() {
            return Err(DockerError::Unsupported {
                reason: "it needs a server running as root for now (each run's directories belong to the run's own uid)".into(),
            }
            .into());
        }
        let socket = socket_path();
        let view = crate::native::policy::probe_system_view();
        let image = RunImage::for_view(&view).tag().to_owned();
        let runtime = config.docker_runtime.clone();
        // The probe is async; the constructor is not, and may be called on a runtime thread.
        let facts = {
            let (socket, image, runtime) = (socket.clone(), image.clone(), runtime.clone());
            std::thread::spawn(move || -> Result<EngineFacts, DockerError> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| DockerError::Unreachable {
                        socket: socket.clone(),
                        source: bollard::errors::Error::IOError { err: source },
                    })?;
                rt.block_on(probe(&socket, &image, runtime.as_deref()))
            })
            .join()
            .map_err(|_| DockerError::Unsupported {
                reason: "the engine probe panicked".into(),
            })??
        };
        Ok(DockerBackend {
            docker: connect(&socket)?,
            socket,
            image,
            view,
            scratch_root: config.scratch_root.clone(),
            usage_root: usage::UsageRoot::for_engine(&facts.cgroup_driver),
            facts,
            runtime,
            server: server_identity(),
        })
    }

    fn gvisor(&self) -> bool {
        self.runtime.as_deref() == Some("runsc")
    }

    /// What differs under gVisor (for the report).
    fn gvisor_details(&self) -> Vec<String> {
        if !self.gvisor() {
            return Vec::new();
        }
        let platform = self
            .facts
            .runtime_args
            .iter()
            .find_map(|a| a.strip_prefix("--platform="))
            .unwrap_or("runsc's default");
        vec![
            format!("gVisor platform: {platform} (runtime arguments: {})", self.facts.runtime_args.join(" ")),
            "gVisor: the run's system calls reach gVisor's own kernel, not the host's; runsc applies the container's seccomp profile only when registered with --oci-seccomp".into(),
            "gVisor known gaps: nested user namespaces are allowed inside gVisor's kernel (the host kernel never sees them); the pids cgroup counts gVisor's threads, so processes are capped by RLIMIT_NPROC inside it".into(),
        ]
    }

    fn limit_reports(&self) -> Vec<LimitReport> {
        let r = |name: &str, enforced: bool, mechanism: String| LimitReport {
            name: name.into(),
            enforced,
            mechanism,
        };
        let cgroup = &self.facts.cgroup;
        vec![
            r(
                "wall_time",
                true,
                "supervisor timer, container killed through the Engine API".into(),
            ),
            r(
                "cpu_time",
                true,
                "RLIMIT_CPU per process (HostConfig.Ulimits `cpu`)".into(),
            ),
            r(
                "cpu_bandwidth",
                true,
                format!("HostConfig.NanoCpus (the engine's cpu cgroup, {cgroup})"),
            ),
            r(
                "cpu_weight",
                false,
                "not set: every container keeps the engine's default CPU weight, whoever it works for".into(),
            ),
            r(
                "memory",
                true,
                format!("HostConfig.Memory = MemorySwap (no swap; memory cgroup, {cgroup}); OOM read from State.OOMKilled"),
            ),
            if self.gvisor() {
                r(
                    "max_processes",
                    true,
                    format!("RLIMIT_NPROC inside gVisor's kernel (HostConfig.Ulimits `nproc`); the pids cgroup ({cgroup}) bounds gVisor's own host threads, at least {}", hardening::RUNSC_MIN_PIDS),
                )
            } else {
                r(
                    "max_processes",
                    true,
                    format!("HostConfig.PidsLimit (pids cgroup, {cgroup})"),
                )
            },
            r(
                "max_output_bytes",
                true,
                "supervisor capture of the attach stream, head and tail, shared budget; logging driver `none`".into(),
            ),
            r(
                "scratch_bytes",
                true,
                "/tmp: HostConfig.Tmpfs `size=`; /dev/shm: HostConfig.ShmSize; the working directory: the server's size-capped tmpfs, bound".into(),
            ),
            r(
                "file_size_bytes",
                true,
                "RLIMIT_FSIZE (HostConfig.Ulimits `fsize`)".into(),
            ),
            r(
                "open_files",
                true,
                "RLIMIT_NOFILE (HostConfig.Ulimits `nofile`)".into(),
            ),
            r(
                "network",
                true,
                "NetworkMode `none` (loopback only; a run with network reaches its proxy through a socket in its input directory)".into(),
            ),
            r(
                "filesystem",
                true,
                "read-only root (the run image), host /usr and the environment bound read-only; writable: /tmp and the policy's writable mounts (a run's working directory)".into(),
            ),
        ]
    }

    /// A fresh directory for one run's control FIFO, readable and writable by the run's uid
    /// only through the FIFO (mode 0622 in a 0711 directory of ours); for a pooled container
    /// also its request FIFO (0644: the run reads its one request from it).
    fn control_dir(&self, name: &str, request: bool) -> Result<ControlDir, SpawnError> {
        let dir = self.scratch_root.join(format!("docker-{name}"));
        let path_err = |path: &Path, source| SpawnError::Path {
            path: path.to_path_buf(),
            source,
        };
        fs_err::create_dir_all(&self.scratch_root).map_err(|e| path_err(&self.scratch_root, e))?;
        fs_err::create_dir(&dir).map_err(|e| path_err(&dir, e))?;
        let guard = ControlDir { dir: dir.clone() };
        use std::os::unix::fs::PermissionsExt;
        fs_err::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| path_err(&dir, e))?;
        let fifos: &[(&str, u32)] = if request {
            &[(CONTROL_FIFO, 0o622), (REQUEST_FIFO, 0o644)]
        } else {
            &[(CONTROL_FIFO, 0o622)]
        };
        for &(name, mode) in fifos {
            let fifo = dir.join(name);
            nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .map_err(|errno| path_err(&fifo, errno.into()))?;
            // mkfifo's mode is masked by the umask: set it exactly.
            fs_err::set_permissions(&fifo, std::fs::Permissions::from_mode(mode))
                .map_err(|e| path_err(&fifo, e))?;
        }
        Ok(guard)
    }

    /// Run one command in a fresh container (see the module documentation).
    async fn run_container(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        let t0 = Instant::now();
        let prepared = self.start_container(policy, command, false).await?;
        prepared.finish(&policy.limits, cancel, output, t0).await
    }

    /// Create a container for `command`, verify its hardening, attach to its output and
    /// start it. `pooled`: its stdin is a request FIFO the returned [`Prepared`] holds (the
    /// warm pool's container, see [`pooled`]).
    pub(crate) async fn start_container(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        pooled: bool,
    ) -> Result<Prepared, SandboxError> {
        if policy.network {
            return Err(DockerError::Unsupported {
                reason: "runs have no host network here (network mode `none`); a run with network uses its proxy".into(),
            }
            .into());
        }
        let name = format!("snakebox-{}", random_hex());
        // A pooled container needs the control directory for its request FIFO.
        let control = if command.control_channel || pooled {
            Some(self.control_dir(&name, pooled)?)
        } else {
            None
        };
        let ids = host_ids(policy.identity);
        let spec = hardening::ContainerSpec {
            image: &self.image,
            policy,
            command,
            user: ids,
            view: &self.view,
            control_dir: control.as_ref().map(|c| c.dir.as_path()),
            request_fifo: pooled,
            runtime: self.runtime.as_deref(),
            server: &self.server,
        };
        let mut body = hardening::container_body(&spec)?;
        // What the run used is read from a cgroup of its own above the container's (the
        // container's is gone when it ends), see [`usage`].
        let cgroup = self.usage_root.as_ref().map(|root| root.for_run(&name));
        if let (Some(cgroup), Some(host)) = (&cgroup, body.host_config.as_mut()) {
            host.cgroup_parent = Some(cgroup.parent());
        }
        let handle = tokio::runtime::Handle::current();
        let container = Container {
            docker: self.docker.clone(),
            name: name.clone(),
            handle: handle.clone(),
        };
        let options = bollard::query_parameters::CreateContainerOptionsBuilder::default()
            .name(&name)
            .build();
        let t0 = Instant::now();
        self.docker
            .create_container(Some(options), body.clone())
            .await
            .map_err(|source| DockerError::Request {
                what: "create the container",
                source,
            })?;
        // From here on the container is removed, whatever happens: by `finish`, or in the
        // background when this is dropped (cancellation by the caller, a pooled container
        // never used).
        let guard = RemoveOnDrop {
            container: container.clone(),
            cgroup,
            armed: true,
        };
        let created = t0.elapsed();
        let inspected = self
            .docker
            .inspect_container(&name, None)
            .await
            .map_err(|source| DockerError::Request {
                what: "inspect the container",
                source,
            })?;
        verify(&body, &inspected)?;

        // Our end of the control FIFO, opened before the container can open its end: read
        // without blocking, and a writer of ours held open until the run is over, so that
        // the reader sees end of file only after the container's writer is gone too.
        let (control_read, control_hold, request) = match &control {
            Some(dir) => {
                let (read, hold) = dir.open()?;
                let request = if pooled {
                    Some(dir.open_request()?)
                } else {
                    None
                };
                (Some(read), Some(hold), request)
            }
            None => (None, None, None),
        };
        let attach = self
            .docker
            .attach_container(
                &name,
                Some(
                    bollard::query_parameters::AttachContainerOptionsBuilder::default()
                        .stream(true)
                        .stdout(true)
                        .stderr(true)
                        .build(),
                ),
            )
            .await
            .map_err(|source| DockerError::Request {
                what: "attach to the container",
                source,
            })?;
        // Buffers for what the run prints before it is supervised (a pooled container's
        // interpreter prints nothing while it waits; a run's output is drained at once).
        let (stdout_r, stdout_w) = tokio::io::simplex(64 * 1024);
        let (stderr_r, stderr_w) = tokio::io::simplex(64 * 1024);
        let pump = AbortOnDrop(tokio::spawn(pump(attach.output, stdout_w, stderr_w)));
        drop(attach.input);

        let started = Instant::now();
        self.docker
            .start_container(&name, None)
            .await
            .map_err(|source| DockerError::Request {
                what: "start the container",
                source,
            })?;
        let wait = tokio::spawn(wait_exit(self.docker.clone(), name.clone()));
        tracing::debug!(
            container = %name,
            create_ms = created.as_millis(),
            verify_attach_ms = (started - t0 - created).as_millis(),
            start_ms = started.elapsed().as_millis(),
            pooled,
            "docker container started"
        );
        Ok(Prepared {
            container,
            body,
            control,
            control_read,
            control_hold,
            request,
            stdout: stdout_r,
            stderr: stderr_r,
            pump,
            wait,
            guard,
        })
    }
}

/// Check the created container against what was asked: every hardening field
/// ([`hardening::verify`]) and the cgroup the run's usage is read from.
fn verify(
    body: &bollard::models::ContainerCreateBody,
    inspected: &bollard::models::ContainerInspectResponse,
) -> Result<(), DockerError> {
    hardening::verify(body, inspected)?;
    let asked = body
        .host_config
        .as_ref()
        .and_then(|h| h.cgroup_parent.clone())
        .filter(|p| !p.is_empty());
    let found = inspected
        .host_config
        .as_ref()
        .and_then(|h| h.cgroup_parent.clone())
        .filter(|p| !p.is_empty());
    if asked != found {
        return Err(DockerError::Hardening {
            field: "HostConfig.CgroupParent".into(),
            found: format!("{found:?}"),
            expected: format!("{asked:?}"),
        });
    }
    Ok(())
}

/// A container created, verified, attached and started; its command runs (a pooled one
/// waits for its request). Supervised to its end by [`Prepared::finish`]; removed when
/// dropped unfinished.
pub(crate) struct Prepared {
    container: Container,
    /// What was asked at create (verified again before a pooled container is used).
    body: bollard::models::ContainerCreateBody,
    control: Option<ControlDir>,
    control_read: Option<OwnedFd>,
    control_hold: Option<OwnedFd>,
    /// A pooled container's request FIFO, opened for reading and writing (see [`pooled`]).
    request: Option<OwnedFd>,
    stdout: tokio::io::ReadHalf<tokio::io::SimplexStream>,
    stderr: tokio::io::ReadHalf<tokio::io::SimplexStream>,
    pump: AbortOnDrop,
    wait: tokio::task::JoinHandle<std::io::Result<ExitStatus>>,
    guard: RemoveOnDrop,
}

impl Prepared {
    /// Supervise the run to its end (the limits' wall time from `started`), then read what
    /// it used; the container is removed in the background.
    async fn finish(
        mut self,
        limits: &crate::Limits,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
        started: Instant,
    ) -> Result<Outcome, SandboxError> {
        let container = self.container.clone();
        let name = container.name.clone();
        let teardown = ContainerTeardown {
            container: container.clone(),
            control_hold: std::sync::Mutex::new(self.control_hold.take()),
        };
        let child = ContainerChild {
            wait: Some(self.wait),
            container: container.clone(),
        };
        let raw = supervise(
            child,
            Some(self.stdout),
            Some(self.stderr),
            self.control_read.take(),
            limits,
            cancel,
            output,
            &teardown,
            started,
        )
        .await;
        drop(self.pump);
        let ended = Instant::now();
        let engine_says = match container.docker.inspect_container(&name, None).await {
            Ok(state) => state.state.and_then(|s| s.oom_killed).unwrap_or(false),
            Err(err) => {
                tracing::warn!(%err, container = %name, "could not inspect the ended container");
                false
            }
        };
        // Every process of the container is dead: the totals of its parent cgroup (ours) are
        // final, whether or not the engine removed the container's own cgroup yet.
        let usage = self.guard.cgroup.as_ref().map(usage::RunCgroup::usage);
        let memory_hit = usage::killed_for_memory(
            engine_says,
            raw.as_ref().ok().and_then(|r| r.status.code()),
            memory_limit(&self.body),
            usage.as_ref().and_then(|u| u.peak_memory_bytes),
        );
        // The removal (the container, then our cgroup) need not hold up the result: the
        // guard does it in the background; a stopping server sweeps what is left.
        drop(self.guard);
        drop(self.control);
        tracing::debug!(
            container = %name,
            run_ms = (ended - started).as_millis(),
            after_ms = ended.elapsed().as_millis(),
            "docker run ended"
        );
        let raw = raw?;
        // The container's init (the runner's reaper, or docker-init) reports a death by signal N
        // as 128 + N.
        Ok(outcome(
            raw,
            limits,
            true,
            memory_hit,
            usage.unwrap_or_default(),
        ))
    }
}

/// The memory limit the container was created with.
fn memory_limit(body: &bollard::models::ContainerCreateBody) -> Option<u64> {
    body.host_config
        .as_ref()
        .and_then(|h| h.memory)
        .and_then(|m| u64::try_from(m).ok())
}

/// Drive `future` to its end on the server's runtime from a synchronous caller (the
/// backend's `prestart` and `spawn`), blocking the caller: on a thread of its own, which may
/// block on the runtime whichever thread called (a worker of the runtime hands its other tasks
/// on meanwhile).
fn block_on<F>(future: F) -> Result<F::Output, DockerError>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    let handle = tokio::runtime::Handle::try_current().map_err(|_| DockerError::Unsupported {
        reason: "a container started ahead needs the server's runtime".into(),
    })?;
    if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
        // Its one thread would wait for itself.
        return Err(DockerError::Unsupported {
            reason: "a container started ahead needs a multi-threaded runtime".into(),
        });
    }
    let run = || {
        std::thread::scope(|scope| scope.spawn(|| handle.block_on(future)).join()).map_err(|_| {
            DockerError::Unsupported {
                reason: "starting a container panicked".into(),
            }
        })
    };
    tokio::task::block_in_place(run)
}

/// Probe the engine once: the API answers at [`API_VERSION`], the image is there, the runtime
/// registered.
async fn probe(
    socket: &str,
    image: &str,
    runtime: Option<&str>,
) -> Result<EngineFacts, DockerError> {
    let docker = connect(socket)?;
    let unreachable = |source| DockerError::Unreachable {
        socket: socket.to_owned(),
        source,
    };
    let version = docker.version().await.map_err(unreachable)?;
    remove_orphans(&docker).await;
    let info = docker.info().await.map_err(unreachable)?;
    let mut runtime_args = Vec::new();
    if let Some(runtime) = runtime {
        let Some(registered) = info.runtimes.as_ref().and_then(|r| r.get(runtime)) else {
            return Err(DockerError::RuntimeMissing {
                runtime: runtime.to_owned(),
            });
        };
        runtime_args = registered.runtime_args.clone().unwrap_or_default();
    }
    if !image::exists(&docker, image).await? {
        return Err(DockerError::ImageMissing {
            tag: image.to_owned(),
        });
    }
    Ok(EngineFacts {
        runtime_args,
        version: version.version.unwrap_or_default(),
        api_version: version.api_version.unwrap_or_default(),
        cgroup: format!(
            "cgroup v{} ({})",
            info.cgroup_version
                .map(|v| v.to_string())
                .unwrap_or_else(|| "?".into()),
            info.cgroup_driver
                .map(|d| d.to_string())
                .unwrap_or_else(|| "?".into())
        ),
        cgroup_driver: info
            .cgroup_driver
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        storage_driver: info.driver.unwrap_or_default(),
    })
}

/// `<pid namespace>.<pid>.<start time>` of process `pid`, or `None` when it is gone.
fn process_identity(pid: u32) -> Option<String> {
    let stat = fs_err::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) end with `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    // `starttime` is field 22 of the line, the 20th after the command name.
    let start = rest.split(' ').nth(19)?;
    Some(format!("{}.{pid}.{start}", pid_namespace()?))
}

/// The inode of our pid namespace: pids are only comparable within one.
fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs_err::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// This server's value of [`SERVER_LABEL`].
pub(crate) fn server_identity() -> String {
    process_identity(std::process::id()).unwrap_or_else(|| format!("0.{}.0", std::process::id()))
}

/// Remove the containers of servers that are gone (killed before they could remove their
/// runs' containers): a container outlives the process that asked for it. Only servers of
/// our pid namespace are judged (another namespace's pids mean nothing here).
async fn remove_orphans(docker: &Docker) {
    let Some(namespace) = pid_namespace() else {
        return;
    };
    let options = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&HashMap::from([("label", vec![SERVER_LABEL])]))
        .build();
    let Ok(containers) = docker.list_containers(Some(options)).await else {
        return;
    };
    for container in containers {
        let owner = container
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SERVER_LABEL))
            .cloned()
            .unwrap_or_default();
        let mut parts = owner.split('.');
        let (Some(ns), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        if ns.parse::<u64>().ok() != Some(namespace) {
            continue;
        }
        let alive = pid
            .parse::<u32>()
            .ok()
            .and_then(process_identity)
            .is_some_and(|now| now == owner);
        if !alive && let Some(id) = container.id {
            tracing::info!(container = %id, server = %owner, "removing a container left by a server that is gone");
            remove(docker, &id).await;
        }
    }
    // Then the cgroups their usage was read from (see [`usage`]).
    usage::remove_orphans(|owner| {
        let mut parts = owner.split('.');
        let (Some(ns), Some(pid)) = (parts.next(), parts.next()) else {
            return false;
        };
        ns.parse::<u64>().ok() == Some(namespace)
            && pid
                .parse::<u32>()
                .ok()
                .and_then(process_identity)
                .is_none_or(|now| now != owner)
    });
}

/// Remove every container this server made (at shutdown). Blocking, bounded.
fn remove_own_containers(socket: &str) {
    let socket = socket.to_owned();
    let worker = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let Ok(docker) = connect(&socket) else { return };
            let me = format!("{SERVER_LABEL}={}", server_identity());
            let options = bollard::query_parameters::ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&HashMap::from([("label", vec![me.as_str()])]))
                .build();
            let work = async {
                if let Ok(containers) = docker.list_containers(Some(options)).await {
                    for id in containers.into_iter().filter_map(|c| c.id) {
                        remove(&docker, &id).await;
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), work).await;
        });
    });
    let _ = worker.join();
}

/// The host uid and gid a container of `identity` runs as (the engine does not remap users:
/// the uid inside is the uid on the host).
pub(crate) fn host_ids(identity: Identity) -> (u32, u32) {
    match identity {
        Identity::Untrusted => (65534, 65534),
        Identity::Installer => (65533, 65533),
        Identity::Leased(uid) => (uid, uid),
    }
}

fn random_hex() -> String {
    let mut bytes = [0u8; 12];
    if let Err(err) = getrandom_fill(&mut bytes) {
        tracing::warn!(%err, "no randomness for a container name; using the clock");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes[..12].copy_from_slice(&nanos.to_le_bytes()[..12]);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn getrandom_fill(bytes: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    fs_err::File::open("/dev/urandom")?.read_exact(bytes)
}

/// Copy the attach stream into the two pipes the supervisor drains.
async fn pump(
    mut stream: std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    mut stdout: tokio::io::WriteHalf<tokio::io::SimplexStream>,
    mut stderr: tokio::io::WriteHalf<tokio::io::SimplexStream>,
) {
    while let Some(Ok(frame)) = stream.next().await {
        let result = match frame {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                stdout.write_all(&message).await
            }
            LogOutput::StdErr { message } => stderr.write_all(&message).await,
            LogOutput::StdIn { .. } => Ok(()),
        };
        if result.is_err() {
            break;
        }
    }
    let _ = stdout.shutdown().await;
    let _ = stderr.shutdown().await;
}

/// Wait until the started container is no longer running; its exit status as a wait status.
async fn wait_exit(docker: Docker, name: String) -> std::io::Result<ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    // `not-running` (not `next-exit`): the container was started before this request, and a
    // container that already ended must answer at once.
    let options = bollard::query_parameters::WaitContainerOptionsBuilder::default()
        .condition("not-running")
        .build();
    let mut waits = docker.wait_container(&name, Some(options));
    let code = match waits.next().await {
        Some(Ok(response)) => response.status_code,
        Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
        Some(Err(err)) => return Err(std::io::Error::other(err)),
        None => {
            return Err(std::io::Error::other(
                "the engine ended the wait without a status",
            ));
        }
    };
    let code = i32::try_from(code).unwrap_or(255) & 0xff;
    Ok(ExitStatus::from_raw(code << 8))
}

/// One container of ours, by name.
#[derive(Clone)]
struct Container {
    docker: Docker,
    name: String,
    handle: tokio::runtime::Handle,
}

impl Container {
    /// Kill it (SIGKILL to every process: the engine kills the whole container).
    fn kill(&self) {
        let (docker, name) = (self.docker.clone(), self.name.clone());
        self.handle.spawn(async move {
            let options = bollard::query_parameters::KillContainerOptionsBuilder::default()
                .signal("SIGKILL")
                .build();
            // An error is a container that is not running (any more): nothing to kill.
            let _ = docker.kill_container(&name, Some(options)).await;
        });
    }

    /// Remove it, killing it first if it still runs, with its anonymous volumes.
    async fn remove(&self) {
        remove(&self.docker, &self.name).await;
    }
}

async fn remove(docker: &Docker, name: &str) {
    let options = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(name, Some(options)).await {
        // 404: gone already; 409: its removal is under way (the pool's discard and the
        // shutdown's sweep may meet).
        Ok(())
        | Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }) => {}
        Err(err) => tracing::warn!(%err, container = %name, "could not remove a container"),
    }
}

/// Removes the container (then its usage cgroup) if the run's future is dropped before the
/// run removed it.
struct RemoveOnDrop {
    container: Container,
    cgroup: Option<usage::RunCgroup>,
    armed: bool,
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let (docker, name) = (self.container.docker.clone(), self.container.name.clone());
            let cgroup = self.cgroup.take();
            self.container.handle.spawn(async move {
                remove(&docker, &name).await;
                if let Some(cgroup) = cgroup {
                    cgroup.remove();
                }
            });
        }
    }
}

/// The container as the supervisor's direct child.
struct ContainerChild {
    wait: Option<tokio::task::JoinHandle<std::io::Result<ExitStatus>>>,
    container: Container,
}

impl DirectChild for ContainerChild {
    fn pid(&self) -> u32 {
        0
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let Some(task) = self.wait.as_mut() else {
            return Err(std::io::Error::other(
                "the container was already waited for",
            ));
        };
        let result = task.await;
        self.wait = None;
        result.map_err(std::io::Error::other)?
    }

    fn start_kill(&mut self) {
        self.container.kill();
    }
}

/// Kills the container; holds our writer of the control FIFO until then.
struct ContainerTeardown {
    container: Container,
    control_hold: std::sync::Mutex<Option<OwnedFd>>,
}

impl Teardown for ContainerTeardown {
    fn kill_all(&self) {
        self.container.kill();
        // The container is dead or dying: let the control reader see end of file once its
        // writers are gone.
        self.control_hold
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

/// A run's control directory on the host; removed when dropped.
struct ControlDir {
    dir: PathBuf,
}

impl ControlDir {
    /// Our read end (non-blocking) and a write end held open until the run is over.
    fn open(&self) -> Result<(OwnedFd, OwnedFd), SpawnError> {
        use nix::fcntl::{OFlag, open};
        use nix::sys::stat::Mode;
        let fifo = self.dir.join(CONTROL_FIFO);
        let err = |errno: nix::errno::Errno| SpawnError::Descriptor {
            what: "control channel",
            source: errno.into(),
        };
        let read = open(
            &fifo,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        let hold = open(
            &fifo,
            OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        Ok((read, hold))
    }

    /// The request FIFO, opened for reading and writing (without blocking): the container
    /// opens its reading end at start without waiting for a writer, and reads the request
    /// once we write it.
    fn open_request(&self) -> Result<OwnedFd, SpawnError> {
        use nix::fcntl::{OFlag, open};
        use nix::sys::stat::Mode;
        open(
            &self.dir.join(REQUEST_FIFO),
            OFlag::O_RDWR | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| SpawnError::Descriptor {
            what: "request channel",
            source: errno.into(),
        })
    }
}

impl Drop for ControlDir {
    fn drop(&mut self) {
        let _ = fs_err::remove_file(self.dir.join(REQUEST_FIFO));
        let _ = fs_err::remove_file(self.dir.join(CONTROL_FIFO));
        let _ = fs_err::remove_dir(&self.dir);
    }
}

impl crate::backend::Backend for DockerBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }

    fn report(&self) -> BackendReport {
        let facts = &self.facts;
        BackendReport {
            backend: BackendKind::Docker,
            isolation_active: true,
            details: vec![
                format!(
                    "Docker engine {} at `{}` (Engine API {} pinned; the engine speaks {}), storage driver {}",
                    facts.version,
                    self.socket,
                    API_VERSION,
                    facts.api_version,
                    facts.storage_driver
                ),
                format!(
                    "runtime {}",
                    self.runtime.as_deref().unwrap_or("the engine's default (runc)")
                ),
                format!(
                    "run image `{}` (host /usr and the environment bound read-only)",
                    self.image
                ),
                "each container verified after create: non-root uid, network none, read-only root, all capabilities dropped, no-new-privileges, our seccomp profile, limits, logging driver none".into(),
                seccomp::summary(),
                                "one fresh container per run, installs included; with the warm pool, containers started ahead, each used for one run; one long-lived container per session interpreter".into(),
                match &self.usage_root {
                    Some(_) => "resource use (peak memory, CPU time) read from a parent cgroup of each container's own (cgroupfs driver)".into(),
                    None => "resource use not measured (the engine's cgroup driver is not cgroupfs)".into(),
                },
            ]
            .into_iter()
            .chain(self.gvisor_details())
            .collect(),
            limits: self.limit_reports(),
        }
    }

    fn run<'a>(
        &'a self,
        policy: &'a Policy,
        command: &'a SandboxCommand,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> crate::backend::RunFuture<'a> {
        Box::pin(self.run_container(policy, command, cancel, output))
    }

    /// A session's interpreter: one long-lived container (see [`live`]). Blocks until it
    /// runs, like `prestart`.
    fn spawn(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<crate::LiveSandbox, SandboxError> {
        let live = live::spawn(self, policy, command)?;
        Ok(crate::LiveSandbox::new(Box::new(live)))
    }

    /// Create and start a container ahead of its request (see [`pooled`]). Blocks until it
    /// runs; needs a multi-threaded runtime (the requests run on it meanwhile).
    fn prestart(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<crate::PendingRun, SandboxError> {
        let pooled = pooled::prestart(self, policy, command)?;
        Ok(crate::PendingRun::new(Box::new(pooled)))
    }

    fn host_ids(&self, identity: Identity) -> Option<(u32, u32)> {
        Some(host_ids(identity))
    }

    /// At shutdown: remove whatever containers of this server are left, then the cgroups
    /// their usage was read from.
    fn remove_own_cgroups(&self) {
        remove_own_containers(&self.socket);
        if let Some(root) = &self.usage_root {
            root.remove_all();
        }
    }

    fn path_inside(&self, _host: &Path, dest: &Path) -> PathBuf {
        dest.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_named_by_namespace_pid_and_start_time() {
        let me = server_identity();
        let parts: Vec<&str> = me.split('.').collect();
        assert_eq!(parts.len(), 3, "{me}");
        assert_eq!(parts[1], std::process::id().to_string());
        assert!(parts.iter().all(|p| p.parse::<u64>().is_ok()), "{me}");
        assert_eq!(process_identity(std::process::id()), Some(me));
        assert_eq!(
            process_identity(u32::MAX),
            None,
            "a pid that does not exist"
        );
    }

    #[test]
    fn containers_run_as_the_identitys_host_uid() {
        assert_eq!(host_ids(Identity::Untrusted), (65534, 65534));
        assert_eq!(host_ids(Identity::Installer), (65533, 65533));
        assert_eq!(host_ids(Identity::Leased(200_007)), (200_007, 200_007));
    }
}
