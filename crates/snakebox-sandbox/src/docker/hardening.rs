//! A run's container as one list of decisions ([`container_body`]), and the check that the
//! engine applied every one of them ([`verify`]).
//!
//! Why a check: the engine is another program with its own defaults, versions and
//! configuration (a daemon.json can add capabilities or change the default runtime), and an
//! engine that does not know a field ignores it silently. So after the create, the container
//! is inspected and each hardening field compared with what was asked; any difference, or a
//! field missing from the answer, fails the run closed before it starts.
//!
//! Pure functions: what is asked comes in as a [`ContainerSpec`], what the engine answered as
//! its inspect response, so both are tested without an engine.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, HostConfig, HostConfigCgroupnsModeEnum,
    HostConfigLogConfig, Mount, MountType, ResourcesUlimits,
};

use super::{CONTROL_DIR_INSIDE, REQUEST_FIFO};
use crate::error::DockerError;
use crate::native::policy::{HOSTNAME, SystemView};
use crate::{Policy, SandboxCommand};

/// The smallest pids limit of a gVisor container: under `runsc` the pids cgroup counts the
/// sandbox's own host threads (its kernel and file proxy, ~40 at start), not the run's
/// processes, and a smaller limit keeps the sandbox from starting at all.
pub(crate) const RUNSC_MIN_PIDS: u64 = 256;

/// Size of `/tmp` when the policy caps no scratch space (it is memory: always capped).
const DEFAULT_TMP_BYTES: u64 = 256 << 20;

/// What one container is made of.
pub(crate) struct ContainerSpec<'a> {
    /// The run image's tag.
    pub(crate) image: &'a str,
    pub(crate) policy: &'a Policy,
    pub(crate) command: &'a SandboxCommand,
    /// The uid and gid the command runs as (inside = on the host).
    pub(crate) user: (u32, u32),
    /// The host's system view (what is bound read-only from the host).
    pub(crate) view: &'a SystemView,
    /// The host directory of the run's control FIFO, when it has a control channel.
    pub(crate) control_dir: Option<&'a Path>,
    /// A pooled container: its stdin is the request FIFO in `control_dir` (see
    /// `super::pooled`).
    pub(crate) request_fifo: bool,
    /// `runsc`, or the engine's default.
    pub(crate) runtime: Option<&'a str>,
    /// The server's label value (see [`super::SERVER_LABEL`]).
    pub(crate) server: &'a str,
}

fn bind(host: &Path, dest: &Path, writable: bool) -> Mount {
    Mount {
        target: Some(dest.to_string_lossy().into_owned()),
        source: Some(host.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(!writable),
        ..Mount::default()
    }
}

/// The body of the create request: every hardening decision, in order.
pub(crate) fn container_body(spec: &ContainerSpec<'_>) -> Result<ContainerCreateBody, DockerError> {
    let policy = spec.policy;
    let limits = &policy.limits;
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);

    // 1. What is visible: the host's /usr and top-level library directories, the /etc files
    //    the native backend binds, all read-only (the image's own links lead into /usr).
    let mut mounts = vec![bind(Path::new("/usr"), Path::new("/usr"), false)];
    for dir in &spec.view.dirs {
        mounts.push(bind(dir, dir, false));
    }
    for file in &spec.view.etc {
        mounts.push(bind(file, file, false));
    }
    // 2. The policy's mounts (environment, interpreter, the run's input and working
    //    directory). One already visible through a read-only system mount is not bound
    //    again (the engine refuses a mount point twice; /usr covers a system interpreter).
    for m in &policy.mounts {
        let covered = !m.writable
            && mounts.iter().any(|s| {
                s.read_only == Some(true)
                    && s.target.as_deref().is_some_and(|t| m.dest.starts_with(t))
            });
        if !covered {
            mounts.push(bind(&m.host, &m.dest, m.writable));
        }
    }
    // 3. The control channel: the run's own directory, bound writable because gVisor opens
    //    a FIFO for writing only on a writable mount; the directory is root's, mode 0711,
    //    so the run can write to the FIFO (0622) and create, remove or rename nothing.
    if let Some(dir) = spec.control_dir {
        mounts.push(bind(dir, Path::new(CONTROL_DIR_INSIDE), true));
    }

    // 4. The command: `/bin/sh` (the host's, read-only) drops the `HOSTNAME` the engine adds
    //    to every container's environment (the run's environment is the policy's alone, I-01),
    //    opens the FIFO as descriptor 3 and execs the command with its arguments untouched.
    let program = spec.command.program.to_string_lossy().into_owned();
    let args = spec
        .command
        .args
        .iter()
        .map(|a| a.to_string_lossy().into_owned());
    //    A pooled container's stdin is the request FIFO, opened first (the server holds it
    //    open for reading and writing, so neither open blocks).
    let script = if spec.control_dir.is_some() {
        let stdin = if spec.request_fifo {
            format!("0<{CONTROL_DIR_INSIDE}/{REQUEST_FIFO} ")
        } else {
            String::new()
        };
        format!("unset HOSTNAME; exec {stdin}3>{CONTROL_DIR_INSIDE}/control && exec \"$@\"")
    } else {
        "unset HOSTNAME; exec \"$@\"".to_owned()
    };
    let cmd: Vec<String> = ["/bin/sh".into(), "-c".into(), script, "sh".into(), program]
        .into_iter()
        .chain(args)
        .collect();

    // 5. Limits. Memory = memory + swap (no swap); /tmp is a size-capped tmpfs.
    let tmp_bytes = limits.scratch_bytes.unwrap_or(DEFAULT_TMP_BYTES);
    let mut ulimits = Vec::new();
    let mut ulimit = |name: &str, soft: u64, hard: u64| {
        ulimits.push(ResourcesUlimits {
            name: Some(name.into()),
            soft: Some(as_i64(soft)),
            hard: Some(as_i64(hard)),
        });
    };
    // No core dumps (a dump of a run's memory is written where the run cannot reach it).
    ulimit("core", 0, 0);
    if let Some(cpu) = limits.cpu_time {
        // SIGXCPU at the limit, SIGKILL a second later (as the native backend's rlimits).
        ulimit("cpu", cpu.as_secs().max(1), cpu.as_secs().max(1) + 1);
    }
    if let Some(fsize) = limits.file_size_bytes {
        ulimit("fsize", fsize, fsize);
    }
    if let Some(nofile) = limits.open_files {
        ulimit("nofile", nofile, nofile);
    }
    let gvisor = spec.runtime == Some("runsc");
    let seccomp = super::seccomp::profile().map_err(|e| DockerError::Unsupported {
        reason: e.to_string(),
    })?;
    let mut pids_limit = limits.max_processes;
    if gvisor && let Some(processes) = limits.max_processes {
        // gVisor's own kernel counts the run's processes against RLIMIT_NPROC; the cgroup
        // only bounds the sandbox's host threads (see [`RUNSC_MIN_PIDS`]).
        ulimit("nproc", processes, processes);
        pids_limit = Some(processes.max(RUNSC_MIN_PIDS));
    }

    let host_config = HostConfig {
        // 6. Isolation: no network at all, nothing shared with the host's namespaces.
        network_mode: Some("none".into()),
        ipc_mode: Some("private".into()),
        // Its own cgroup namespace: /proc/self/cgroup shows `/`, not the engine's
        // `/docker/<id>` (F-13, I-04).
        cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
        // 7. Privilege: no capabilities, no way to gain any, the native backend's seccomp
        //    program as a profile (see [`super::seccomp`]), a read-only root.
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into(), seccomp.security_opt()]),
        privileged: Some(false),
        readonly_rootfs: Some(true),
        // 8. An init as pid 1 reaps what the run leaves behind and passes the command's
        //    end on (a death by signal N as 128 + N): docker's, unless the command is one
        //    (the runner, whose reaper must be out of the run's reach: the kernel drops the
        //    signals a run sends its init, R-18).
        init: Some(!spec.command.init),
        // 9. Resources. First in line for the kernel's OOM killer (P-07), as native runs: a
        //    global OOM must take a run, not the server or the engine.
        oom_score_adj: Some(1000),
        memory: limits.memory_bytes.map(as_i64),
        memory_swap: limits.memory_bytes.map(as_i64),
        pids_limit: pids_limit.map(as_i64),
        nano_cpus: limits
            .cpu_millicores
            .map(|m| as_i64(m.saturating_mul(1_000_000))),
        ulimits: Some(ulimits),
        // /dev/shm: the container's own (private IPC), capped like /tmp.
        shm_size: Some(as_i64(tmp_bytes)),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_owned(),
            // `exec` as the native backend's /tmp (the engine's default is noexec).
            format!("rw,nosuid,nodev,exec,size={tmp_bytes},mode=1777"),
        )])),
        // 10. Output only through the attach stream: nothing on the daemon's disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: Some(HashMap::new()),
        }),
        mounts: Some(mounts),
        runtime: spec.runtime.map(str::to_owned),
        auto_remove: Some(false),
        ..HostConfig::default()
    };
    let (uid, gid) = spec.user;
    if uid == 0 {
        return Err(DockerError::Unsupported {
            reason: "a container never runs as root".into(),
        });
    }
    Ok(ContainerCreateBody {
        image: Some(spec.image.to_owned()),
        cmd: Some(cmd),
        entrypoint: Some(Vec::new()),
        env: Some(policy.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        user: Some(format!("{uid}:{gid}")),
        working_dir: Some(policy.cwd.to_string_lossy().into_owned()),
        hostname: Some(HOSTNAME.into()),
        network_disabled: Some(true),
        attach_stdin: Some(false),
        open_stdin: Some(false),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        labels: Some(HashMap::from([(
            super::SERVER_LABEL.to_owned(),
            spec.server.to_owned(),
        )])),
        host_config: Some(host_config),
        ..ContainerCreateBody::default()
    })
}

/// Check that the created container is what `asked` describes, field by field (see the
/// module documentation).
pub(crate) fn verify(
    asked: &ContainerCreateBody,
    found: &ContainerInspectResponse,
) -> Result<(), DockerError> {
    let fail = |field: &str, found: String, expected: String| {
        Err(DockerError::Hardening {
            field: field.into(),
            found,
            expected,
        })
    };
    let show = |v: &dyn std::fmt::Debug| format!("{v:?}");
    let empty = HostConfig::default();
    let want = asked.host_config.as_ref().unwrap_or(&empty);
    let Some(host) = found.host_config.as_ref() else {
        return fail("HostConfig", "missing".into(), "present".into());
    };
    let config = found.config.as_ref();

    // The process: its user, no terminal, no stdin.
    let user = config.and_then(|c| c.user.clone());
    if user != asked.user {
        return fail("Config.User", show(&user), show(&asked.user));
    }
    if config.and_then(|c| c.open_stdin) == Some(true) {
        return fail("Config.OpenStdin", "true".into(), "false".into());
    }

    macro_rules! same {
        ($field:ident, $name:literal) => {
            if host.$field != want.$field {
                return fail($name, show(&host.$field), show(&want.$field));
            }
        };
    }
    same!(network_mode, "HostConfig.NetworkMode");
    same!(readonly_rootfs, "HostConfig.ReadonlyRootfs");
    same!(privileged, "HostConfig.Privileged");
    // The engine may answer `null` for an init that was asked off.
    if host.init.unwrap_or(false) != want.init.unwrap_or(false) {
        return fail("HostConfig.Init", show(&host.init), show(&want.init));
    }
    // A limit not asked for: the engine answers 0 (or -1) for "unlimited".
    let limit = |v: Option<i64>| v.filter(|&n| n > 0);
    for (name, found, asked) in [
        ("HostConfig.Memory", host.memory, want.memory),
        ("HostConfig.MemorySwap", host.memory_swap, want.memory_swap),
        ("HostConfig.PidsLimit", host.pids_limit, want.pids_limit),
        ("HostConfig.NanoCpus", host.nano_cpus, want.nano_cpus),
    ] {
        if limit(found) != limit(asked) || found.is_none() && asked.is_some() {
            return fail(name, show(&found), show(&asked));
        }
    }
    same!(tmpfs, "HostConfig.Tmpfs");
    same!(shm_size, "HostConfig.ShmSize");
    same!(oom_score_adj, "HostConfig.OomScoreAdj");
    same!(cgroupns_mode, "HostConfig.CgroupnsMode");
    same!(ulimits, "HostConfig.Ulimits");

    // Capabilities: all dropped, none added.
    let drops = host.cap_drop.clone().unwrap_or_default();
    if !drops.iter().any(|c| c.eq_ignore_ascii_case("ALL")) {
        return fail("HostConfig.CapDrop", show(&drops), "[\"ALL\"]".into());
    }
    let adds = host.cap_add.clone().unwrap_or_default();
    if !adds.is_empty() {
        return fail("HostConfig.CapAdd", show(&adds), "[]".into());
    }
    // no-new-privileges on; seccomp and AppArmor never switched off.
    let opts = host.security_opt.clone().unwrap_or_default();
    let nnp = opts.iter().any(|o| {
        o == "no-new-privileges" || o == "no-new-privileges:true" || o == "no-new-privileges=true"
    });
    if !nnp {
        return fail(
            "HostConfig.SecurityOpt",
            show(&opts),
            "no-new-privileges".into(),
        );
    }
    // Our seccomp profile, byte for byte (an engine that dropped it would run the default).
    let seccomp = want
        .security_opt
        .iter()
        .flatten()
        .find(|o| o.starts_with("seccomp="));
    if let Some(profile) = seccomp
        && !opts.contains(profile)
    {
        let found = opts.iter().find(|o| o.starts_with("seccomp="));
        return fail(
            "HostConfig.SecurityOpt",
            found.map_or("no seccomp profile".into(), |f| format!("{:.80}...", f)),
            format!("{:.80}...", profile),
        );
    }
    if let Some(off) = opts.iter().find(|o| o.contains("unconfined")) {
        return fail(
            "HostConfig.SecurityOpt",
            off.clone(),
            "no `unconfined` profile".into(),
        );
    }
    // Nothing of the host's namespaces.
    for (name, value) in [
        ("HostConfig.PidMode", &host.pid_mode),
        ("HostConfig.IpcMode", &host.ipc_mode),
        ("HostConfig.UTSMode", &host.uts_mode),
        ("HostConfig.UsernsMode", &host.userns_mode),
    ] {
        if value
            .as_deref()
            .is_some_and(|v| v == "host" || v.starts_with("container:"))
        {
            return fail(name, show(value), "private".into());
        }
    }
    if host.devices.as_ref().is_some_and(|d| !d.is_empty()) {
        return fail("HostConfig.Devices", show(&host.devices), "[]".into());
    }
    let log = host.log_config.as_ref().and_then(|l| l.typ.clone());
    if log.as_deref() != Some("none") {
        return fail("HostConfig.LogConfig.Type", show(&log), "none".into());
    }
    if host.runtime.is_some() && want.runtime.is_some() && host.runtime != want.runtime {
        return fail(
            "HostConfig.Runtime",
            show(&host.runtime),
            show(&want.runtime),
        );
    }
    // Mounts: exactly the binds asked, each with the write access asked.
    let asked_mounts = want.mounts.clone().unwrap_or_default();
    let found_mounts = found.mounts.clone().unwrap_or_default();
    let binds: Vec<_> = found_mounts
        .iter()
        .filter(|m| m.typ.as_deref() != Some("tmpfs"))
        .collect();
    if binds.len() != asked_mounts.len() {
        return fail(
            "Mounts",
            format!("{} mounts", binds.len()),
            format!("{} binds", asked_mounts.len()),
        );
    }
    for m in &asked_mounts {
        let target = m.target.clone().unwrap_or_default();
        let writable = m.read_only != Some(true);
        let hit = binds
            .iter()
            .find(|b| b.destination.as_deref() == Some(target.as_str()));
        match hit {
            Some(b) if b.rw == Some(writable) && b.source == m.source => {}
            other => {
                return fail(
                    "Mounts",
                    show(&other.map(|b| (&b.source, &b.destination, b.rw))),
                    format!("{:?} at {target} rw={writable}", m.source),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bollard::models::{ContainerConfig, MountPoint};

    use super::*;
    use crate::{Identity, Limits, Mount as PolicyMount};

    fn policy() -> Policy {
        Policy {
            mounts: vec![
                PolicyMount {
                    host: "/usr".into(),
                    dest: "/usr".into(),
                    writable: false,
                },
                PolicyMount {
                    host: "/data/env".into(),
                    dest: "/data/env".into(),
                    writable: false,
                },
                PolicyMount {
                    host: "/data/runs/1/work".into(),
                    dest: "/work".into(),
                    writable: true,
                },
            ],
            network: false,
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: "/work".into(),
            limits: Limits {
                wall_time: Duration::from_secs(5),
                cpu_time: Some(Duration::from_secs(30)),
                memory_bytes: Some(256 << 20),
                max_processes: Some(64),
                max_output_bytes: 1000,
                scratch_bytes: Some(64 << 20),
                file_size_bytes: Some(1 << 20),
                open_files: Some(256),
                cpu_millicores: Some(1500),
            },
            identity: Identity::Leased(200_001),
            cpu: None,
        }
    }

    fn body() -> ContainerCreateBody {
        let policy = policy();
        let command = SandboxCommand {
            program: "/data/env/bin/python".into(),
            args: vec!["-c".into(), "print(1)".into()],
            control_channel: true,
            init: true,
        };
        let view = SystemView {
            symlinks: Vec::new(),
            dirs: Vec::new(),
            etc: vec!["/etc/ld.so.cache".into()],
            etc_network: Vec::new(),
        };
        container_body(&ContainerSpec {
            image: "snakebox-run:x",
            policy: &policy,
            command: &command,
            user: (200_001, 200_001),
            view: &view,
            control_dir: Some(Path::new("/data/scratch/docker-a")),
            request_fifo: false,
            runtime: None,
            server: "1.1",
        })
        .unwrap()
    }

    /// What an engine that applied everything answers.
    fn inspected(body: &ContainerCreateBody) -> ContainerInspectResponse {
        let host = body.host_config.clone().unwrap();
        let mounts = host
            .mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| MountPoint {
                typ: Some("bind".into()),
                source: m.source,
                destination: m.target,
                rw: Some(m.read_only != Some(true)),
                ..MountPoint::default()
            })
            .collect();
        ContainerInspectResponse {
            host_config: Some(host),
            config: Some(ContainerConfig {
                user: body.user.clone(),
                ..ContainerConfig::default()
            }),
            mounts: Some(mounts),
            ..ContainerInspectResponse::default()
        }
    }

    #[test]
    fn the_body_has_every_hardening_field() {
        let body = body();
        let host = body.host_config.as_ref().unwrap();
        assert_eq!(body.user.as_deref(), Some("200001:200001"));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        let opts = host.security_opt.as_ref().unwrap();
        assert_eq!(opts[0], "no-new-privileges");
        assert_eq!(
            opts[1],
            super::super::seccomp::profile().unwrap().security_opt()
        );
        assert_eq!(host.memory, Some(256 << 20));
        assert_eq!(host.memory_swap, host.memory);
        assert_eq!(host.pids_limit, Some(64));
        assert_eq!(host.nano_cpus, Some(1_500_000_000));
        assert_eq!(
            host.tmpfs.as_ref().unwrap()["/tmp"],
            format!("rw,nosuid,nodev,exec,size={},mode=1777", 64 << 20)
        );
        let targets: Vec<_> = host
            .mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.target.clone().unwrap(), m.read_only))
            .collect();
        // The policy's /usr is covered by the system's; the work directory and the control
        // directory (root's, 0711) are the only writable binds.
        assert_eq!(
            targets,
            vec![
                ("/usr".into(), Some(true)),
                ("/etc/ld.so.cache".into(), Some(true)),
                ("/data/env".into(), Some(true)),
                ("/work".into(), Some(false)),
                (CONTROL_DIR_INSIDE.into(), Some(false)),
            ]
        );
        let cmd = body.cmd.unwrap();
        assert_eq!(cmd[0], "/bin/sh");
        assert!(cmd[2].starts_with("unset HOSTNAME;"), "{}", cmd[2]);
        assert_eq!(&cmd[4..], ["/data/env/bin/python", "-c", "print(1)"]);
    }

    #[test]
    fn an_engine_that_applied_everything_passes() {
        let body = body();
        verify(&body, &inspected(&body)).unwrap();
    }

    #[test]
    fn every_missing_or_changed_field_fails_closed() {
        type Change = fn(&mut ContainerInspectResponse);
        let cases: &[(&str, Change)] = &[
            ("Config.User", |r| r.config.as_mut().unwrap().user = None),
            ("Config.User", |r| {
                r.config.as_mut().unwrap().user = Some("0:0".into());
            }),
            ("HostConfig", |r| r.host_config = None),
            ("HostConfig.NetworkMode", |r| {
                r.host_config.as_mut().unwrap().network_mode = Some("bridge".into());
            }),
            ("HostConfig.ReadonlyRootfs", |r| {
                r.host_config.as_mut().unwrap().readonly_rootfs = None;
            }),
            ("HostConfig.Privileged", |r| {
                r.host_config.as_mut().unwrap().privileged = Some(true);
            }),
            ("HostConfig.CapDrop", |r| {
                r.host_config.as_mut().unwrap().cap_drop = None;
            }),
            ("HostConfig.CapAdd", |r| {
                r.host_config.as_mut().unwrap().cap_add = Some(vec!["SYS_ADMIN".into()]);
            }),
            ("HostConfig.SecurityOpt", |r| {
                r.host_config.as_mut().unwrap().security_opt = Some(Vec::new());
            }),
            ("HostConfig.SecurityOpt", |r| {
                r.host_config
                    .as_mut()
                    .unwrap()
                    .security_opt
                    .as_mut()
                    .unwrap()
                    .push("seccomp=unconfined".into());
            }),
            ("HostConfig.SecurityOpt", |r| {
                r.host_config.as_mut().unwrap().security_opt =
                    Some(vec!["no-new-privileges".into()]);
            }),
            ("HostConfig.SecurityOpt", |r| {
                let opts = r
                    .host_config
                    .as_mut()
                    .unwrap()
                    .security_opt
                    .as_mut()
                    .unwrap();
                opts[1] = opts[1].replace("SCMP_ACT_ERRNO", "SCMP_ACT_LOG");
            }),
            ("HostConfig.Memory", |r| {
                r.host_config.as_mut().unwrap().memory = Some(0);
            }),
            ("HostConfig.Memory", |r| {
                r.host_config.as_mut().unwrap().memory = None;
            }),
            ("HostConfig.MemorySwap", |r| {
                r.host_config.as_mut().unwrap().memory_swap = Some(-1);
            }),
            ("HostConfig.PidsLimit", |r| {
                r.host_config.as_mut().unwrap().pids_limit = None;
            }),
            ("HostConfig.NanoCpus", |r| {
                r.host_config.as_mut().unwrap().nano_cpus = Some(0);
            }),
            ("HostConfig.Tmpfs", |r| {
                r.host_config.as_mut().unwrap().tmpfs = None;
            }),
            ("HostConfig.ShmSize", |r| {
                r.host_config.as_mut().unwrap().shm_size = Some(32 << 20);
            }),
            ("HostConfig.CgroupnsMode", |r| {
                r.host_config.as_mut().unwrap().cgroupns_mode =
                    Some(HostConfigCgroupnsModeEnum::HOST);
            }),
            ("HostConfig.OomScoreAdj", |r| {
                r.host_config.as_mut().unwrap().oom_score_adj = Some(0);
            }),
            ("HostConfig.Ulimits", |r| {
                r.host_config.as_mut().unwrap().ulimits = Some(Vec::new());
            }),
            ("HostConfig.Init", |r| {
                let host = r.host_config.as_mut().unwrap();
                host.init = Some(!host.init.unwrap_or(false));
            }),
            ("HostConfig.PidMode", |r| {
                r.host_config.as_mut().unwrap().pid_mode = Some("host".into());
            }),
            ("HostConfig.LogConfig.Type", |r| {
                r.host_config.as_mut().unwrap().log_config = Some(HostConfigLogConfig {
                    typ: Some("json-file".into()),
                    config: None,
                });
            }),
            ("Mounts", |r| {
                r.mounts.as_mut().unwrap()[0].rw = Some(true);
            }),
            ("Mounts", |r| {
                r.mounts.as_mut().unwrap().push(MountPoint {
                    typ: Some("bind".into()),
                    source: Some("/var/run/docker.sock".into()),
                    destination: Some("/var/run/docker.sock".into()),
                    rw: Some(true),
                    ..MountPoint::default()
                });
            }),
        ];
        let body = body();
        for (field, change) in cases {
            let mut found = inspected(&body);
            change(&mut found);
            match verify(&body, &found) {
                Err(DockerError::Hardening { field: got, .. }) => {
                    assert_eq!(&got, field, "the change to {field} was caught as {got}");
                }
                other => panic!("a change to {field} passed: {other:?}"),
            }
        }
    }

    #[test]
    fn root_is_refused() {
        let policy = policy();
        let command = SandboxCommand {
            program: "/bin/true".into(),
            args: Vec::new(),
            control_channel: false,
            init: false,
        };
        let view = SystemView {
            symlinks: Vec::new(),
            dirs: Vec::new(),
            etc: Vec::new(),
            etc_network: Vec::new(),
        };
        let refused = container_body(&ContainerSpec {
            image: "i",
            policy: &policy,
            command: &command,
            user: (0, 0),
            view: &view,
            control_dir: None,
            request_fifo: false,
            runtime: None,
            server: "1.1",
        });
        assert!(matches!(refused, Err(DockerError::Unsupported { .. })));
    }
}
