//! The seccomp program handed to bubblewrap (bwrap writes none of its own).
//!
//! Shape: default allow, with an explicit deny list built by `seccompiler`, split in two
//! filters because one seccompiler filter has one match action:
//!
//! 1. **EPERM filter**, preceded by a hand-written guard: other ABIs (i386 `int 0x80`, anything
//!    not the native audit arch) and x32 (`nr >= 0x40000000`) kill the process; syscall numbers
//!    above the newest one we know return ENOSYS, so a syscall added after this list was written
//!    is refused rather than allowed (catalogue K-13). Then the classic kernel attack surface
//!    returns EPERM: keyrings, bpf, perf, userfaultfd, io_uring, the mount family, ptrace and
//!    cross-process memory, modules, kexec, namespace creation (clone/unshare with `CLONE_NEW*`),
//!    TIOCSTI/TIOCLINUX, AF_VSOCK, non-default personalities, ...
//! 2. **ENOSYS filter**: `clone3` (its flags live in memory where BPF cannot see them; ENOSYS
//!    makes glibc fall back to `clone`, which the first filter inspects — K-12) and the new
//!    mount API (ENOSYS, as Flatpak does, so callers fall back to calls that are filtered).
//!
//! The kernel runs every filter and applies the strongest action, so the two compose.
//! New syscalls (numbers ≥ 424) have the same number on every architecture, so they are
//! written as numbers; the older ones come from `libc::SYS_*` for the target architecture.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use crate::error::SeccompError;

/// Newest syscall number this list knows (`file_setattr`, Linux 6.17). Higher → ENOSYS.
pub(crate) const MAX_KNOWN_SYSCALL: u32 = 469;

const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Syscalls numbered ≥ 424 are shared by all architectures (include/uapi/asm-generic/unistd.h).
const IO_URING_SETUP: i64 = 425;
const IO_URING_ENTER: i64 = 426;
const IO_URING_REGISTER: i64 = 427;
const OPEN_TREE: i64 = 428;
const MOVE_MOUNT: i64 = 429;
const FSOPEN: i64 = 430;
const FSCONFIG: i64 = 431;
const FSMOUNT: i64 = 432;
const FSPICK: i64 = 433;
const CLONE3: i64 = 435;
const PIDFD_GETFD: i64 = 438;
const MOUNT_SETATTR: i64 = 442;
const QUOTACTL_FD: i64 = 443;
const STATMOUNT: i64 = 457;
const LISTMOUNT: i64 = 458;
const LSM_SET_SELF_ATTR: i64 = 460;
const SETXATTRAT: i64 = 463;
const GETXATTRAT: i64 = 464;
const LISTXATTRAT: i64 = 465;
const REMOVEXATTRAT: i64 = 466;
const OPEN_TREE_ATTR: i64 = 467;

/// `ioctl` requests that inject input into or control a terminal (U-01).
const REQ_TIOCSTI: u64 = 0x5412;
const REQ_TIOCLINUX: u64 = 0x541C;
/// `socket` families refused: AF_VSOCK reaches the hypervisor's host (N-06).
const VSOCK_FAMILY: u64 = 40;
/// Personalities allowed (as Docker): Linux, Linux32 variants, and the 0xffffffff query.
const PERSONALITIES_ALLOWED: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The only namespace-making `clone` flags a fork server may pass (with [`libc::CLONE_PARENT`]
/// or without, nothing else): a run's pid 1 made straight into a new user and pid namespace,
/// exit signal SIGCHLD. `forkserver.py` has the same values (`CLONE_FLAGS`, `CLONE_PARENT`).
pub(crate) const FORK_SERVER_CLONE: u64 =
    (libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::SIGCHLD) as u64;

/// The only `unshare` flags a fork server (in practice, the pid 1 it cloned) may pass, all at
/// once: the rest of a run's namespaces, made once pid 1 is in its run's cgroup.
/// `forkserver.py` has the same value (`UNSHARE_FLAGS`).
pub(crate) const FORK_SERVER_UNSHARE: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWNET) as u64;

/// Whose programs: a run's, or a fork server's (a run's, with what building a forked run's
/// sandbox needs; each forked run then adds a run's programs on top).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Any sandboxed command: user code, installers, session interpreters.
    Run,
    /// A fork server: may also `clone` with exactly [`FORK_SERVER_CLONE`] (the child has
    /// capabilities only inside the namespaces it makes), `unshare` exactly
    /// [`FORK_SERVER_UNSHARE`], `mount` there, and `move_mount` the detached mounts of a run's
    /// directories the server hands it.
    ForkServer,
}

/// The two compiled programs, in the order bwrap should load them.
#[derive(Debug, Clone)]
pub(crate) struct SeccompPrograms {
    /// Guard + EPERM deny list.
    pub(crate) eperm: BpfProgram,
    /// ENOSYS deny list.
    pub(crate) enosys: BpfProgram,
}

impl SeccompPrograms {
    /// The programs as the raw bytes bwrap reads from `--add-seccomp-fd` (native endianness
    /// `struct sock_filter` array).
    pub(crate) fn to_bytes(program: &[sock_filter]) -> Vec<u8> {
        let mut out = Vec::with_capacity(program.len() * 8);
        for insn in program {
            out.extend_from_slice(&insn.code.to_ne_bytes());
            out.push(insn.jt);
            out.push(insn.jf);
            out.extend_from_slice(&insn.k.to_ne_bytes());
        }
        out
    }
}

fn target_arch() -> Result<(TargetArch, u32, &'static str), SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok((TargetArch::x86_64, 0xC000_003E, "x86_64")), // AUDIT_ARCH_X86_64
        "aarch64" => Ok((TargetArch::aarch64, 0xC000_00B7, "aarch64")), // AUDIT_ARCH_AARCH64
        arch => Err(SeccompError::UnsupportedArch { arch }),
    }
}

/// One argument comparison of a rule, kept as data (seccompiler's own condition type cannot
/// be read back) so that the same table also gives Docker's JSON profile
/// (`crate::docker::seccomp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cond {
    /// Argument index (0..=5).
    pub(crate) arg: u8,
    /// Compare the low 32 bits (`Dword`) or all 64 (`Qword`).
    pub(crate) len: SeccompCmpArgLen,
    pub(crate) op: SeccompCmpOp,
    pub(crate) value: u64,
}

/// A rule: all of its conditions hold (a syscall's rules are ORed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule(pub(crate) Vec<Cond>);

impl Rule {
    fn compile(&self) -> SeccompRule {
        let conditions = self
            .0
            .iter()
            .map(|c| {
                // Only fails for arg > 5, which never happens with the constants below.
                SeccompCondition::new(c.arg, c.len.clone(), c.op.clone(), c.value)
                    .unwrap_or_else(|_| unreachable!("arg index <= 5"))
            })
            .collect();
        SeccompRule::new(conditions).unwrap_or_else(|_| unreachable!("conditions are never empty"))
    }
}

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Cond {
    Cond {
        arg,
        len,
        op,
        value,
    }
}

fn rule(conditions: Vec<Cond>) -> Rule {
    Rule(conditions)
}

/// Syscall number → its rules (empty = always).
pub(crate) type RuleTable = BTreeMap<i64, Vec<Rule>>;

/// "any of these bits set in arg 0" as one rule per bit (rules of a syscall are ORed).
fn any_bit_of_arg0(bits: &[u64]) -> Vec<Rule> {
    bits.iter()
        .map(|&bit| {
            rule(vec![cond(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(bit),
                bit,
            )])
        })
        .collect()
}

/// Syscalls refused with EPERM, with their argument rules (empty = always).
fn eperm_rules(holder: Holder) -> RuleTable {
    use libc::*;
    // clone's low byte is the exit signal, so CLONE_NEWTIME (0x80) cannot be checked there.
    let clone_ns = [
        CLONE_NEWNS,
        CLONE_NEWCGROUP,
        CLONE_NEWUTS,
        CLONE_NEWIPC,
        CLONE_NEWUSER,
        CLONE_NEWPID,
        CLONE_NEWNET,
    ]
    .map(|f| f as u64);
    let mut unshare_ns = clone_ns.to_vec();
    unshare_ns.push(CLONE_NEWTIME as u64);

    let mut rules = RuleTable::new();
    let always = [
        // Keyrings are not namespaced (K-05).
        SYS_keyctl,
        SYS_add_key,
        SYS_request_key,
        // Kernel attack surface for exploits (K-06, K-07, K-09, K-01).
        SYS_bpf,
        SYS_perf_event_open,
        SYS_userfaultfd,
        IO_URING_SETUP,
        IO_URING_ENTER,
        IO_URING_REGISTER,
        // Mounting and changing root (K-04); the new mount API returns ENOSYS (other filter).
        SYS_mount,
        SYS_umount2,
        SYS_pivot_root,
        SYS_chroot,
        // Other namespaces and other processes (K-02, K-14).
        SYS_setns,
        SYS_ptrace,
        SYS_process_vm_readv,
        SYS_process_vm_writev,
        PIDFD_GETFD,
        SYS_kcmp,
        // Modules, kexec, swap, reboot, accounting, quotas, clock (need capabilities anyway).
        SYS_init_module,
        SYS_finit_module,
        SYS_delete_module,
        SYS_kexec_load,
        SYS_kexec_file_load,
        SYS_swapon,
        SYS_swapoff,
        SYS_reboot,
        SYS_acct,
        SYS_quotactl,
        QUOTACTL_FD,
        SYS_settimeofday,
        SYS_clock_settime,
        SYS_clock_adjtime,
        // Host information and terminals.
        SYS_syslog,
        SYS_vhangup,
        // File handles bypass the mount namespace ("shocker", K-01).
        SYS_name_to_handle_at,
        SYS_open_by_handle_at,
        // Mount information without /proc (K-13), LSM attribute changes.
        STATMOUNT,
        LISTMOUNT,
        LSM_SET_SELF_ATTR,
        // Rarely used, historically buggy.
        SYS_fanotify_init,
    ];
    for nr in always {
        rules.insert(nr, vec![]);
    }
    #[cfg(target_arch = "x86_64")]
    for nr in [
        SYS_lookup_dcookie,
        SYS_uselib,
        SYS_ustat,
        SYS_sysfs,
        SYS__sysctl,
        SYS_iopl,
        SYS_ioperm,
        SYS_modify_ldt,
    ] {
        rules.insert(nr, vec![]);
    }
    #[cfg(target_arch = "aarch64")]
    rules.insert(SYS_lookup_dcookie, vec![]);

    match holder {
        Holder::Run => {
            rules.insert(SYS_clone, any_bit_of_arg0(&clone_ns));
            rules.insert(SYS_unshare, any_bit_of_arg0(&unshare_ns));
        }
        Holder::ForkServer => {
            // Mounting is needed (and only possible) inside the namespaces of a run it makes.
            rules.remove(&SYS_mount);
            // Every namespace-making clone but the one that makes a run's pid 1. The kernel
            // reads clone's flags as 32 bits, so the comparison does too.
            let exact = [FORK_SERVER_CLONE, FORK_SERVER_CLONE | CLONE_PARENT as u64];
            let clone_rules = any_bit_of_arg0(&clone_ns)
                .into_iter()
                .map(|Rule(mut conditions)| {
                    conditions
                        .extend(exact.map(|flags| {
                            cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, flags)
                        }));
                    Rule(conditions)
                })
                .collect();
            rules.insert(SYS_clone, clone_rules);
            // Every unshare but the one that makes the rest of a run's namespaces.
            rules.insert(
                SYS_unshare,
                vec![rule(vec![cond(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::Ne,
                    FORK_SERVER_UNSHARE,
                )])],
            );
        }
    }
    // ioctl's request is an `unsigned int` in the kernel: compare the low 32 bits only, so
    // high garbage bits cannot dodge the rule (CVE-2019-10063).
    rules.insert(
        SYS_ioctl,
        [REQ_TIOCSTI, REQ_TIOCLINUX]
            .map(|req| {
                rule(vec![cond(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    req,
                )])
            })
            .to_vec(),
    );
    rules.insert(
        SYS_socket,
        vec![rule(vec![cond(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            VSOCK_FAMILY,
        )])],
    );
    rules.insert(
        SYS_personality,
        vec![rule(
            PERSONALITIES_ALLOWED
                .map(|p| cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, p))
                .to_vec(),
        )],
    );
    rules
}

/// Syscalls refused with ENOSYS (the caller is expected to fall back).
fn enosys_rules(holder: Holder) -> RuleTable {
    let mut rules: RuleTable = [
        CLONE3,
        OPEN_TREE,
        MOVE_MOUNT,
        FSOPEN,
        FSCONFIG,
        FSMOUNT,
        FSPICK,
        MOUNT_SETATTR,
        OPEN_TREE_ATTR,
        SETXATTRAT,
        GETXATTRAT,
        LISTXATTRAT,
        REMOVEXATTRAT,
    ]
    .into_iter()
    .map(|nr| (nr, vec![]))
    .collect();
    if holder == Holder::ForkServer {
        // Attaching a run's directories, which arrive as detached mounts.
        rules.remove(&MOVE_MOUNT);
    }
    rules
}

fn ld_abs(offset: u32) -> sock_filter {
    sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k: offset,
    }
}

fn jump(op: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: (libc::BPF_JMP | op | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

fn ret(k: u32) -> sock_filter {
    sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

/// The guard that runs before the deny list: wrong arch or x32 → kill, unknown nr → ENOSYS.
fn guard(audit_arch: u32) -> BpfProgram {
    vec![
        // seccomp_data.arch: any other ABI (i386 via int 0x80) kills the process.
        ld_abs(4),
        jump(libc::BPF_JEQ, audit_arch, 1, 0),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        // seccomp_data.nr: x32 numbers (bit 30) kill the process (K-11).
        ld_abs(0),
        jump(libc::BPF_JGE, X32_SYSCALL_BIT, 0, 1),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        // Numbers above the newest known syscall: ENOSYS (K-13).
        jump(libc::BPF_JGT, MAX_KNOWN_SYSCALL, 0, 1),
        ret(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
    ]
}

/// Compile one deny list for the architecture we run on: the listed calls answer `errno`,
/// everything else is allowed.
fn compile(rules: RuleTable, errno: i32) -> Result<BpfProgram, SeccompError> {
    let (arch, _, arch_name) = target_arch()?;
    let rules = rules
        .into_iter()
        .map(|(nr, rules)| (nr, rules.iter().map(Rule::compile).collect()))
        .collect();
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .and_then(BpfProgram::try_from)
    .map_err(|source| SeccompError::Compile {
        arch: arch_name,
        source,
    })
}

/// Compile both programs of `holder` for the architecture we run on.
pub(crate) fn programs(holder: Holder) -> Result<SeccompPrograms, SeccompError> {
    assemble(eperm_rules(holder), enosys_rules(holder))
}

/// The guard and an EPERM list, and an ENOSYS list, compiled.
fn assemble(
    eperm_list: RuleTable,
    enosys_list: RuleTable,
) -> Result<SeccompPrograms, SeccompError> {
    let (_, audit_arch, _) = target_arch()?;
    let mut eperm = guard(audit_arch);
    eperm.extend(compile(eperm_list, libc::EPERM)?);
    let enosys = compile(enosys_list, libc::ENOSYS)?;
    Ok(SeccompPrograms { eperm, enosys })
}

/// The calls a forked run's pid 2 makes once its request has come, to attach the run's
/// directories: `move_mount` of the detached mounts and `mount` (to make them nosuid, nodev
/// and read-only, and for a fresh `/tmp` when the run's size differs). A run's programs
/// refuse both.
const ATTACH_CALLS: [i64; 2] = [libc::SYS_mount, MOVE_MOUNT];

/// A run's programs in two parts, for a forked run. Installing a program costs the kernel
/// time in proportion to its length (it checks and compiles it, then runs it for every
/// syscall number to cache what it allows), and a program is inherited across `fork`: so the
/// long part, `before` (a run's programs without [`ATTACH_CALLS`]), is installed once, by
/// pid 1 before it forks pid 2, and `seal`, which refuses just those calls as a run's
/// programs do, is installed by each of the two once it has no more use for them (pid 2
/// after attaching its run's directories, before any code of the run). Together they refuse
/// exactly what a run's programs refuse (`the_forked_run_split_is_a_runs_programs`).
#[derive(Debug, Clone)]
pub(crate) struct ForkedRunPrograms {
    /// A run's programs but for the attaching calls.
    pub(crate) before: SeccompPrograms,
    /// The attaching calls, refused.
    pub(crate) seal: SeccompPrograms,
}

/// Compile [`ForkedRunPrograms`] for the architecture we run on.
pub(crate) fn forked_run_programs() -> Result<ForkedRunPrograms, SeccompError> {
    let [(_, eperm, eperm_seal), (_, enosys, enosys_seal)] = forked_run_lists();
    Ok(ForkedRunPrograms {
        before: assemble(eperm, enosys)?,
        seal: assemble(eperm_seal, enosys_seal)?,
    })
}

/// A run's deny lists, each with its errno, split into what [`ForkedRunPrograms::before`]
/// and [`ForkedRunPrograms::seal`] refuse.
fn forked_run_lists() -> [(i32, RuleTable, RuleTable); 2] {
    deny_lists(Holder::Run).map(|(errno, mut before)| {
        let seal = ATTACH_CALLS
            .iter()
            .filter_map(|nr| before.remove_entry(nr))
            .collect();
        (errno, before, seal)
    })
}

/// The deny lists of `holder` as data, each with the errno it answers (EPERM, then ENOSYS),
/// for an engine that compiles seccomp programs itself (Docker's JSON profile). The guard
/// that runs before them ([`guard`]: other ABIs and x32 killed, numbers above
/// [`MAX_KNOWN_SYSCALL`] ENOSYS) is code, not table: an exporter states its own equivalent.
pub(crate) fn deny_lists(holder: Holder) -> [(i32, RuleTable); 2] {
    [
        (libc::EPERM, eperm_rules(holder)),
        (libc::ENOSYS, enosys_rules(holder)),
    ]
}

/// The second-stage program of a run whose profile denies subprocesses: `execve` and
/// `execveat` return EPERM, everything else is left to the run's programs. It cannot be part of
/// what bwrap loads (bwrap still has to exec the interpreter), so the runner installs it itself
/// before any user or environment code (see SECURITY.md, "Profiles").
///
/// # Errors
/// An architecture seccompiler cannot compile for.
pub fn exec_deny_program() -> Result<Vec<u8>, SeccompError> {
    let rules: RuleTable = [libc::SYS_execve, libc::SYS_execveat]
        .into_iter()
        .map(|nr| (nr, vec![]))
        .collect();
    Ok(SeccompPrograms::to_bytes(&compile(rules, libc::EPERM)?))
}

/// Names of the refused syscalls, for the backend report.
pub(crate) fn summary() -> String {
    "seccomp: x32/i386 ABIs killed; unknown syscalls ENOSYS; clone3 and the new mount API ENOSYS; \
     keyctl/add_key/request_key, bpf, perf_event_open, userfaultfd, io_uring, mount/umount2/pivot_root/chroot, \
     setns, unshare and clone with CLONE_NEW*, ptrace, process_vm_*, pidfd_getfd, kcmp, modules, kexec, \
     swap, reboot, acct, quotactl, clock setting, syslog, vhangup, file handles, statmount/listmount, \
     TIOCSTI/TIOCLINUX ioctls, AF_VSOCK sockets and non-default personalities EPERM"
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_programs_compile_and_fit_the_kernel_limit() {
        let p = programs(Holder::Run).unwrap();
        assert!(!p.eperm.is_empty() && p.eperm.len() < 4096);
        assert!(!p.enosys.is_empty() && p.enosys.len() < 4096);
        assert_eq!(SeccompPrograms::to_bytes(&p.eperm).len(), p.eperm.len() * 8);
    }

    #[test]
    fn the_exec_deny_program_refuses_exec_only() {
        let bytes = exec_deny_program().unwrap();
        assert!(!bytes.is_empty() && bytes.len().is_multiple_of(8));
        let program: Vec<sock_filter> = bytes
            .chunks(8)
            .map(|c| sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        // SAFETY: the child only makes raw system calls and exits with _exit.
        let status = unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || seccompiler::apply_filter(&program).is_err()
                {
                    libc::_exit(199);
                }
                // Proof of life, then an exec whose path does not exist: ENOENT without the
                // filter, EPERM with it.
                let alive = libc::getpid() > 0;
                let r = libc::execve(c"/nonexistent".as_ptr(), std::ptr::null(), std::ptr::null());
                let e = *libc::__errno_location();
                libc::_exit(if alive && r == -1 { e } else { 198 });
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            libc::WEXITSTATUS(status)
        };
        assert_eq!(status, libc::EPERM);
    }

    #[test]
    fn guard_kills_other_abis_first() {
        let (_, audit, _) = target_arch().unwrap();
        let g = guard(audit);
        assert_eq!(g[0].k, 4);
        assert_eq!(g[2].k, libc::SECCOMP_RET_KILL_PROCESS);
        assert_eq!(g[4].k, X32_SYSCALL_BIT);
    }

    /// Fork, install both filters in the child, make one syscall, exit with its errno
    /// (0 when it succeeded, 200 + signal when the child was killed).
    fn errno_in_child(nr: i64, args: [u64; 4]) -> i32 {
        errno_in_child_of(Holder::Run, nr, args)
    }

    fn errno_in_child_of(holder: Holder, nr: i64, args: [u64; 4]) -> i32 {
        let p = programs(holder).unwrap();
        errno_under(&[&p.eperm, &p.enosys], nr, args)
    }

    /// [`errno_in_child`] with `programs` installed in the child, in this order.
    fn errno_under(programs: &[&BpfProgram], nr: i64, args: [u64; 4]) -> i32 {
        // SAFETY: the child only makes raw system calls (prctl/seccomp via seccompiler on
        // programs built before fork) and exits with _exit.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                if programs
                    .iter()
                    .any(|program| seccompiler::apply_filter(program).is_err())
                {
                    libc::_exit(199);
                }
                *libc::__errno_location() = 0;
                let r = libc::syscall(nr, args[0], args[1], args[2], args[3]);
                let e = *libc::__errno_location();
                libc::_exit(if r == -1 { e } else { 0 });
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            if libc::WIFSIGNALED(status) {
                200 + libc::WTERMSIG(status)
            } else {
                libc::WEXITSTATUS(status)
            }
        }
    }

    #[test]
    fn denied_calls_get_distinctive_errnos_in_a_child() {
        // Proof of life: an allowed call still works under the same filters.
        assert_eq!(errno_in_child(libc::SYS_getpid, [0; 4]), 0);
        // Bad-argument probes: without the filter these give EBADF/EFAULT/EINVAL, never EPERM.
        assert_eq!(
            errno_in_child(libc::SYS_keyctl, [0, u64::MAX - 3, 0, 0]),
            libc::EPERM
        );
        assert_eq!(
            errno_in_child(libc::SYS_setns, [u64::MAX, 0, 0, 0]),
            libc::EPERM
        );
        assert_eq!(errno_in_child(libc::SYS_mount, [1, 1, 1, 0]), libc::EPERM);
        assert_eq!(errno_in_child(IO_URING_SETUP, [1, 1, 0, 0]), libc::EPERM);
        assert_eq!(errno_in_child(libc::SYS_bpf, [5, 1, 128, 0]), libc::EPERM);
        assert_eq!(errno_in_child(libc::SYS_ptrace, [16, 1, 0, 0]), libc::EPERM);
        assert_eq!(
            errno_in_child(libc::SYS_unshare, [libc::CLONE_NEWUSER as u64, 0, 0, 0]),
            libc::EPERM
        );
        assert_eq!(
            errno_in_child(libc::SYS_ioctl, [u64::MAX, REQ_TIOCSTI, 1, 0]),
            libc::EPERM
        );
        assert_eq!(
            errno_in_child(
                libc::SYS_ioctl,
                [u64::MAX, (0x123 << 32) | REQ_TIOCSTI, 1, 0]
            ),
            libc::EPERM
        );
        assert_eq!(
            errno_in_child(libc::SYS_socket, [VSOCK_FAMILY, 1, 0, 0]),
            libc::EPERM
        );
        assert_eq!(
            errno_in_child(libc::SYS_personality, [0x0040000, 0, 0, 0]),
            libc::EPERM
        );
        // ENOSYS exactly, so glibc falls back to clone (K-12).
        assert_eq!(errno_in_child(CLONE3, [1, 88, 0, 0]), libc::ENOSYS);
        assert_eq!(errno_in_child(FSOPEN, [1, 0, 0, 0]), libc::ENOSYS);
        // Unknown future syscall number → ENOSYS from the guard.
        assert_eq!(
            errno_in_child(i64::from(MAX_KNOWN_SYSCALL) + 20, [0; 4]),
            libc::ENOSYS
        );
        // Allowed variants still reach the kernel: an ordinary ioctl on a bad fd is EBADF.
        assert_eq!(
            errno_in_child(libc::SYS_ioctl, [u64::MAX, 0x5401, 0, 0]),
            libc::EBADF
        );
        // personality query (0xffffffff) is allowed.
        assert_eq!(
            errno_in_child(libc::SYS_personality, [0xffff_ffff, 0, 0, 0]),
            0
        );
    }

    #[test]
    fn a_fork_server_may_make_a_runs_namespaces_and_nothing_more() {
        use Holder::ForkServer;
        // Its one clone reaches the kernel (which makes the namespaces: the child and its
        // clone both exit at once), with CLONE_PARENT or without.
        for flags in [
            FORK_SERVER_CLONE,
            FORK_SERVER_CLONE | libc::CLONE_PARENT as u64,
        ] {
            assert_eq!(
                errno_in_child_of(ForkServer, libc::SYS_clone, [flags, 0, 0, 0]),
                0,
                "{flags:#x}"
            );
        }
        // Any other namespace-making clone, or one more bit, is refused.
        for flags in [
            libc::CLONE_NEWUSER as u64 | libc::SIGCHLD as u64,
            FORK_SERVER_CLONE | libc::CLONE_NEWCGROUP as u64,
            FORK_SERVER_CLONE | libc::CLONE_NEWNET as u64,
            FORK_SERVER_CLONE | libc::CLONE_VM as u64,
            FORK_SERVER_CLONE | libc::CLONE_PARENT as u64 | libc::CLONE_FILES as u64,
        ] {
            assert_eq!(
                errno_in_child_of(ForkServer, libc::SYS_clone, [flags, 0, 0, 0]),
                libc::EPERM,
                "clone {flags:#x}"
            );
        }
        // Its one unshare is the rest of a run's namespaces, all at once.
        for flags in [
            libc::CLONE_NEWUSER as u64,
            libc::CLONE_NEWNS as u64,
            libc::CLONE_NEWCGROUP as u64,
            FORK_SERVER_UNSHARE | libc::CLONE_NEWTIME as u64,
            FORK_SERVER_UNSHARE | libc::CLONE_NEWUSER as u64,
            FORK_SERVER_UNSHARE | (1 << 32),
        ] {
            assert_eq!(
                errno_in_child_of(ForkServer, libc::SYS_unshare, [flags, 0, 0, 0]),
                libc::EPERM,
                "unshare {flags:#x}"
            );
        }
        assert_eq!(
            errno_in_child_of(
                ForkServer,
                libc::SYS_unshare,
                [FORK_SERVER_UNSHARE, 0, 0, 0]
            ),
            0
        );
        // Mounting reaches the kernel, as does move_mount: the kernel refuses the bad
        // arguments (which argument error it reports first differs between kernel versions:
        // EFAULT or EINVAL for move_mount's null path), never the filter's EPERM/ENOSYS.
        for (nr, args) in [
            (libc::SYS_mount, [1, 1, 1, 0]),
            (MOVE_MOUNT, [u64::MAX, 0, 0, 0]),
        ] {
            let errno = errno_in_child_of(ForkServer, nr, args);
            assert!(
                [libc::EFAULT, libc::EINVAL, libc::EBADF].contains(&errno),
                "syscall {nr}: errno {errno}, expected an argument error from the kernel"
            );
        }
        // The rest of a run's program stands.
        for (nr, args, errno) in [
            (libc::SYS_setns, [u64::MAX, 0, 0, 0], libc::EPERM),
            (libc::SYS_umount2, [1, 0, 0, 0], libc::EPERM),
            (libc::SYS_open_by_handle_at, [0; 4], libc::EPERM),
            (libc::SYS_ptrace, [16, 1, 0, 0], libc::EPERM),
            (libc::SYS_bpf, [5, 1, 128, 0], libc::EPERM),
            (OPEN_TREE, [0; 4], libc::ENOSYS),
            (FSOPEN, [1, 0, 0, 0], libc::ENOSYS),
        ] {
            assert_eq!(
                errno_in_child_of(ForkServer, nr, args),
                errno,
                "syscall {nr}"
            );
        }
        // A run keeps refusing what the fork server may do.
        assert_eq!(
            errno_in_child(libc::SYS_unshare, [FORK_SERVER_UNSHARE, 0, 0, 0]),
            libc::EPERM
        );
        assert_eq!(
            errno_in_child(libc::SYS_clone, [FORK_SERVER_CLONE, 0, 0, 0]),
            libc::EPERM
        );
        assert_eq!(
            errno_in_child(MOVE_MOUNT, [u64::MAX, 0, 0, 0]),
            libc::ENOSYS
        );
    }

    #[test]
    fn the_forked_run_split_is_a_runs_programs() {
        let [eperm, enosys] = forked_run_lists();
        for ((errno, before, seal), (run_errno, run)) in
            [eperm, enosys].into_iter().zip(deny_lists(Holder::Run))
        {
            assert_eq!(errno, run_errno);
            assert!(
                seal.keys()
                    .all(|nr| ATTACH_CALLS.contains(nr) && !before.contains_key(nr))
            );
            let mut joined = before;
            joined.extend(seal);
            assert_eq!(joined, run, "errno {errno}");
        }
        // Each attaching call is sealed (a run's programs refuse both).
        let sealed: Vec<i64> = forked_run_lists()
            .iter()
            .flat_map(|(_, _, seal)| seal.keys().copied())
            .collect();
        assert_eq!(sealed.len(), ATTACH_CALLS.len());
        assert!(ATTACH_CALLS.iter().all(|nr| sealed.contains(nr)));

        // In a child: under `before` alone the attaching calls reach the kernel (an argument
        // error, never the filter's); with the seal on top they get a run's errnos; the rest of
        // a run's programs stands either way.
        let forked = forked_run_programs().unwrap();
        let before = [&forked.before.eperm, &forked.before.enosys];
        let sealed = [
            &forked.before.eperm,
            &forked.before.enosys,
            &forked.seal.eperm,
            &forked.seal.enosys,
        ];
        for (nr, args, run_errno) in [
            (libc::SYS_mount, [1, 1, 1, 0], libc::EPERM),
            (MOVE_MOUNT, [u64::MAX, 0, 0, 0], libc::ENOSYS),
        ] {
            let errno = errno_under(&before, nr, args);
            assert!(
                [libc::EFAULT, libc::EINVAL, libc::EBADF].contains(&errno),
                "syscall {nr}: errno {errno} before the seal"
            );
            assert_eq!(errno_under(&sealed, nr, args), run_errno, "syscall {nr}");
            assert_eq!(errno_in_child(nr, args), run_errno, "syscall {nr}");
        }
        for (nr, args, errno) in [
            (libc::SYS_setns, [u64::MAX, 0, 0, 0], libc::EPERM),
            (libc::SYS_umount2, [1, 0, 0, 0], libc::EPERM),
            (
                libc::SYS_unshare,
                [FORK_SERVER_UNSHARE, 0, 0, 0],
                libc::EPERM,
            ),
            (OPEN_TREE, [0; 4], libc::ENOSYS),
            (CLONE3, [1, 88, 0, 0], libc::ENOSYS),
        ] {
            assert_eq!(errno_under(&before, nr, args), errno, "syscall {nr}");
            assert_eq!(errno_under(&sealed, nr, args), errno, "syscall {nr}");
        }
        assert_eq!(errno_under(&sealed, libc::SYS_getpid, [0; 4]), 0);
    }

    /// The value `forkserver.py` names `name` (a hexadecimal constant at the start of a line).
    fn forkserver_py_constant(name: &str) -> u64 {
        let source = include_str!("forkserver.py");
        let prefix = format!("{name} = 0x");
        let line = source
            .lines()
            .find(|line| line.starts_with(&prefix))
            .unwrap();
        let value = line
            .trim_start_matches(&prefix)
            .split_whitespace()
            .next()
            .unwrap();
        u64::from_str_radix(value, 16).unwrap()
    }

    #[test]
    fn the_fork_server_program_allows_what_forkserver_py_asks_for() {
        assert_eq!(forkserver_py_constant("CLONE_FLAGS"), FORK_SERVER_CLONE);
        assert_eq!(
            forkserver_py_constant("CLONE_PARENT"),
            libc::CLONE_PARENT as u64
        );
        assert_eq!(forkserver_py_constant("UNSHARE_FLAGS"), FORK_SERVER_UNSHARE);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_calls_kill_the_process() {
        let sig = errno_in_child(i64::from(X32_SYSCALL_BIT) | libc::SYS_getpid, [0; 4]);
        assert_eq!(sig, 200 + libc::SIGSYS);
    }
}
