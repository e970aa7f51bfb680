"""snakebox fork server: one pre-initialised interpreter that forks a fresh sandbox per run.

It holds no more than a run does. The server starts it with bubblewrap exactly as it starts a
run, as an unprivileged host uid of its own: its own user namespace (where it is uid 65534 with
no capabilities), pid, mount, network, ipc, uts and cgroup namespaces, a read-only system view,
no-new-privs, a seccomp program, a cgroup with a run's limits. Its seccomp program is a run's
with three exceptions, each needed to build a run's sandbox: `unshare` with exactly the flags
below, `mount`/`umount2`, and `move_mount` (to attach the run's directories). Everything of the
environment it imports, `.pth` lines and `sitecustomize` included, therefore runs with that
power and nothing more: no capability outside namespaces it made itself, no host network, no
view of any run directory (each run's directories reach it only as detached mounts of that
run's own, sent with the request).

It imports the run module once (the slow part of a cold start), what the module's path imports
lazily (a pass of it, `warm_up`), the top-level modules of the distributions named on its
command line (the environment's declared packages) and the modules named there (what recent
runs of the environment imported, as the server learned it; see `_preload`), makes everything it
then holds immortal (`_immortalize`: a run that uses it writes no reference count, so copies
no page of it), then waits for requests on a private SEQPACKET socket. A request is
`fork <n> <json>` (the JSON holds no run's data: the fresh `/tmp` and `/dev/shm` sizes and
the per-user counter shares) with a socket of the run's own and the `cgroup.procs` files of
a cgroup the server made for it attached. For each, the fork server clones the run's pid 1
straight into a new user and pid namespace (no process in between: `_clone`). Pid 1:

1. sends the server a pidfd of itself (`pid1`) where no cgroup holds the run (the server
   kills the run and watches its memory through it), joins its cgroups, makes its mount, network, ipc, uts and cgroup namespaces there (their
   cost is the run's, not the fork server's), and maps only its own uid (as 65534);
2. mounts fresh size-capped /tmp and /dev/shm, a devpts instance of its own, a fresh /proc
   with bubblewrap's read-only covers, sets the run's share of per-user kernel counters and
   brings up loopback;
3. installs the run's seccomp programs but for the two calls pid 2 still needs to attach the
   run's directories (`mount`, `move_mount`): installed once here, they are pid 2's too;
4. forks pid 2, the run's process, and from then on only reaps, handling no signal (as the
   namespace's init, it then gets none from the run's processes):
   before any code of a run runs in pid 2 it drops every capability, installs the seal (the
   program that refuses those two calls as a run's programs do: with it, a run's programs
   are complete), closes every descriptor but its socket and makes itself not dumpable (no
   process of the run may trace it or write its memory); pid 2 waits for the end of a pipe
   whose write end pid 1 closes last;
5. pid 2 waits on the socket for its run, having seen nothing of any run: a message `run`
   with the run's stdout, stderr and control channel, a memfd holding the run's request
   (JSON: the fork server's own memory never holds any run's data) and the run's directories
   as detached mounts. A child made ahead of its request waits here (a pre-forked child, the
   server's `--prefork`), after a pass of the run module's own path on a fixed snippet
   (`warm_up`: the pages a run would copy from the fork server are copied while it waits);
   one made for a run that came gets it at once. The server hands the run to pid 2
   directly, so the fork server is not on the run's path at all. One whose socket closes
   before a run arrives (the server dropped it) exits without running anything;
6. pid 2 tells pid 1 it took a run (a pipe), attaches the run's directories, sets the run's
   rlimits and stdio, drops every capability, installs the seal (the run's seccomp programs,
   on top of the fork server's own, are then complete), closes its socket and every other
   descriptor, and runs the code;
7. pid 1 SIGKILLs every other process of its namespace (`kill(-1)`, which no fork slips past)
   and then reports the run's end on the socket: `exit <status>`, as soon as pid 2 says its exit
   code while it exits (the runner's end, `_finish`: a queued signal, `SIG_END`, whose value is
   the code; the two exits then overlap instead of following each other), else pid 2's wait
   status once it is reaped (an `os._exit`, an `exec`, a death by signal), if it took a run;
   pid 2 reports `fail <reason>` when its set-up went wrong before user code ran. What the
   run's code can do with that signal is end its own run with an exit code, as `os._exit`
   would; it needs no descriptor (a script sees none it did not open).

Messages to the server on the fork server's socket: `ready`; `gone <n> <wait status>` (of pid 1,
once reaped: a child that ended before its run, or a run killed with its pid 1) and `fail <n>
<reason>` (the clone failed). Pid 1's report of the run's end comes once nothing of the run
can run code again, but before the run's processes have exited: the server replies at once,
and removes the run's cgroup once they have. (When the server killed the run itself, or pid 1
ended without a word, it kills through the run's cgroup and waits until it is empty.)
"""

import atexit
import ctypes
import fcntl
import gc
import importlib
import json
import os
import re
import resource
import select
import signal
import socket
import struct
import sys
import warnings

# Exactly these, in one call: the only namespace-making `clone` the fork server's seccomp
# program allows (with CLONE_PARENT or without): a run's pid 1 in a new user and pid namespace
# (the pid namespace owned by the user namespace). The low byte is the exit signal, SIGCHLD.
CLONE_FLAGS = 0x30000011  # NEWUSER | NEWPID | SIGCHLD
CLONE_PARENT = 0x8000
# The only `unshare` it allows, all at once: pid 1's other namespaces, made once it is in the
# run's cgroup (so their making and its cost are the run's).
UNSHARE_FLAGS = 0x4E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWNET
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine)

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

SYS_CLOSE_RANGE = 436  # the same number on every architecture
LAST_FD = 0xFFFFFFFF  # close_range's "to the end"

AT_FDCWD = -100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
SYS_MOVE_MOUNT = 429
SYS_PIDFD_OPEN = 434  # the same number on every architecture

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

# The uid the fork server has in its own user namespace, and each run in its own.
SANDBOX_ID = 65534
# An empty mount point where a run builds a fresh tmpfs before moving it into place.
SPARE = "/run/snakebox/spare"

# bubblewrap's read-only covers on a fresh /proc.
PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")

MAX_MESSAGE = 4096
MAX_FDS = 16
MAX_REQUEST = 1 << 20

# Every function a run calls is looked up here, once, in the fork server (each first use of
# one looks its symbol up: ~50 µs of a run's set-up otherwise).
_libc = ctypes.CDLL(None, use_errno=True)
_libc.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.restype = ctypes.c_long
_libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
# The same library, called with the GIL held: a clone made through it copies an interpreter
# whose lock state is its own thread's (see `_clone`).
_libc_gil = ctypes.PyDLL(None, use_errno=True)
_libc_gil.syscall.restype = ctypes.c_long


class SetupError(Exception):
    pass


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError("%s: %s" % (what, os.strerror(err)))


def _mount(source, target, fstype, flags, data=None):
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        "mount %s" % target,
    )


def _attach(mount_fd, target, writable):
    """Attach a detached mount (made by the server from the run's own directory) at `target`,
    then make it nosuid, nodev and, unless writable, read-only."""
    _check(
        0
        if _libc.syscall(SYS_MOVE_MOUNT, mount_fd, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH) == 0
        else -1,
        "attach %s" % target,
    )
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV
    if not writable:
        flags |= MS_RDONLY
    _mount(None, target, None, flags)


def _prctl(option, arg=0):
    _check(_libc.prctl(option, arg, 0, 0, 0), "prctl %d" % option)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _load_programs(fds):
    programs = []
    for fd in fds:
        with os.fdopen(fd, "rb") as handle:
            code = handle.read()
        if not code or len(code) % 8:
            raise SetupError("seccomp program on fd %d is malformed" % fd)
        buffer = ctypes.create_string_buffer(code, len(code))
        programs.append((buffer, _Fprog(len(code) // 8, ctypes.addressof(buffer))))
    return programs


def _mount_points_below(target):
    """Mount points strictly below `target` in this mount namespace, outermost only."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = line.split(" ")[4]
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
            if point.startswith(target + "/"):
                found.append(point)
    found.sort()
    outermost = []
    for point in found:
        if not any(point.startswith(outer + "/") or point == outer for outer in outermost):
            outermost.append(point)
    return outermost


# What is mounted below each tmpfs target, read once in the fork server (its mount table
# never changes).
_BELOW = {}


def _fresh_tmpfs(target, size):
    """Mount a fresh, empty tmpfs on `target` (mode 1777, capped at `size`), keeping what is
    mounted below it (an environment under /tmp stays where it is): the tmpfs is built on
    SPARE with those mounts bound in, then moved into place."""
    flags = MS_NOSUID | MS_NODEV
    options = "mode=1777" + (",size=%d" % size if size else "")
    below = _BELOW.get(target)
    if below is None:
        below = _mount_points_below(target)
    if not below:
        _mount("tmpfs", target, "tmpfs", flags, options)
        return
    _mount("tmpfs", SPARE, "tmpfs", flags, options)
    for point in below:
        dest = SPARE + point[len(target) :]
        if os.path.isdir(point):
            os.makedirs(dest, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
            os.close(os.open(dest, os.O_WRONLY | os.O_CREAT, 0o644))
        _mount(point, dest, None, MS_BIND | MS_REC)
    _mount(SPARE, target, None, MS_MOVE)


def _loopback_up():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))
    finally:
        sock.close()


def _drop_bounding_set():
    """Empty the capability bounding and ambient sets: no later `execve` gains a capability.
    The effective set, which attaching the run's directories needs, stays until
    `_drop_capabilities`."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


# capset's arguments, made once in the fork server (making a ctypes array type per run costs
# a tenth of a millisecond): version 3, this process, and every set empty.
_CAP_HEADER = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
_CAP_NONE = (ctypes.c_uint32 * 6)()


def _drop_capabilities():
    """Clear the effective, permitted and inheritable sets (the bounding and ambient sets are
    empty already)."""
    _check(_libc.capset(_CAP_HEADER, _CAP_NONE), "capset")


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_all(fd, limit):
    chunks = []
    size = 0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise SetupError("the request is too large")
        chunks.append(chunk)


class ForkServer:
    def __init__(self, sock_fd, module_path, preload, modules, program_fds):
        # The socket moves off fd 3, which each run's control channel takes.
        fd = os.dup(sock_fd)
        os.close(sock_fd)
        os.set_inheritable(fd, False)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fileno=fd)
        # A run's programs, in two parts (the server's `ForkedRunPrograms`): what pid 1
        # installs before it forks pid 2, and what seals the attaching calls once each of the
        # two has no more use for them.
        self.before_attach = _load_programs(program_fds[:2])
        self.seal = _load_programs(program_fds[2:])
        self.children = {}
        import importlib.util

        spec = importlib.util.spec_from_file_location("snakebox_run_module", module_path)
        self.module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = self.module
        spec.loader.exec_module(self.module)
        # What the run module imports while it runs (a script's codec, `__future__`), loaded
        # once here.
        self.warm_up()

        before = set(sys.modules)
        self.preloaded = _preload(preload, modules)
        # The top-level modules the preloads loaded, with what they imported themselves: a
        # cold run would not have them loaded yet, so a run's own file of that name must win
        # (`_unshadow`).
        self.loaded = frozenset(name for name in set(sys.modules) - before if "." not in name)

        for target in ("/tmp", "/dev/shm"):
            _BELOW[target] = _mount_points_below(target)

    def send(self, text):
        """A message to the server on the fork server's socket (never from a run's pid 1)."""
        try:
            self.sock.send(text.encode("utf-8", "replace")[: MAX_MESSAGE - 1])
        except OSError:
            pass

    def serve(self):
        """Serve requests until the server closes the socket. Returns only in a run's sandbox,
        with the run's exit code (the caller exits with it, so the interpreter finalises as it
        would after `python script.py`)."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_inheritable(wake_r, False)
        os.set_inheritable(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        # Everything loaded so far lives as long as the fork server: immortal, so that using
        # it writes no reference count (`_immortalize`), and out of the collector's sight, so
        # a run's collections do not walk it (nor touch its pages).
        _immortalize()
        gc.freeze()
        # The C heap's free memory goes back to the kernel (glibc): each of a run's two forks
        # copies the page table entries of the pages the fork server has, and each exit drops
        # them (the default environment's: 1.5 of 9.7 MiB of anonymous memory, measured).
        trim = getattr(_libc, "malloc_trim", None)
        if trim is not None:
            trim(0)
        self.send("ready " + ",".join(self.preloaded) if self.preloaded else "ready")
        while True:
            ready, _, _ = select.select([self.sock, wake_r], [], [])
            if wake_r in ready:
                os.read(wake_r, 4096)
                self.reap()
            if self.sock not in ready:
                continue
            try:
                message, ancillary, _, _ = self.sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
            except InterruptedError:
                continue
            fds = []
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(data) - len(data) % 4
                    fds.extend(struct.unpack("%di" % (usable // 4), data[:usable]))
            if not message:
                return 0
            words = message.split(b" ", 2)
            kind = words[0]
            if kind != b"fork" or len(words) != 3 or not words[1].isdigit() or not fds:
                for fd in fds:
                    os.close(fd)
                continue
            run_id = words[1].decode()
            try:
                pid = _fork_into_namespaces()
            except OSError as err:
                self.send("fail %s clone: %s" % (run_id, err))
                for fd in fds:
                    os.close(fd)
                continue
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                # Only the fork server reads requests (they carry other runs' descriptors).
                self.sock.close()
                return self.child(words[2], fds)
            self.children[pid] = run_id
            for fd in fds:
                os.close(fd)

    def reap(self):
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run_id = self.children.pop(pid, None)
            if run_id is not None:
                self.send("gone %s %d" % (run_id, status))

    def child(self, spec_text, fds):
        """Pid 1 of a run's new namespaces (see the module documentation): prepares the
        sandbox, forks pid 2, which waits on `fds[0]` for the one run it serves, and reaps.
        Returns only in the run itself (pid 2)."""
        sock_fd = fds[0]
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            spec = json.loads(spec_text)
            if spec.get("pidfd"):
                _send_pidfd(sock_fd)
            _enter_namespaces(fds[1:])
            self.prepare(spec["tmpfs"], spec["user_limits"])
            # The run's session and process group are pid 1's, as under bubblewrap's init.
            os.setsid()
            # A run's programs but for the calls that attach its directories: pid 2
            # inherits them (the kernel compiles them once per run, not once in each).
            self.install(self.before_attach)
            taken_r, taken_w = os.pipe()
            confined_r, confined_w = os.pipe()
            pid = os.fork()
        except Exception as err:  # noqa: BLE001 - reported to the server
            _fail(sock_fd, err)
        if pid == 0:
            os.close(taken_r)
            os.close(confined_w)
            return self.pid2(spec, sock_fd, taken_w, confined_r)
        os.close(taken_w)
        os.close(confined_r)
        try:
            # Its last step closes `confined_w`: pid 2 runs no code of a run before that.
            self.confine_init(keep=(sock_fd, taken_r))
        except Exception as err:  # noqa: BLE001 - reported to the server
            _fail(sock_fd, err)
        _init(pid, sock_fd, taken_r)

    def confine_init(self, keep):
        """Pid 1, once pid 2 is forked, needs nothing but to reap and report: it gives up
        everything else (no capabilities, the seal that completes the run's seccomp programs,
        no descriptor but `keep`), and no process of the run may trace it or write its memory
        (not dumpable).
        The descriptors go last: among them the write end of the pipe pid 2 waits on before
        it runs any code of its run, so a run never sees pid 1 holding more than itself. (Not
        dumpable comes first anyway: until then it holds capabilities pid 2's code does not
        have, which already keeps that code from tracing it.)"""
        _prctl(PR_SET_DUMPABLE, 0)
        _drop_capabilities()
        self.install(self.seal)
        _close_all_but(keep)

    def install(self, programs):
        """No new privileges, and seccomp `programs` (on top of those installed already)."""
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        for _, program in programs:
            _check(
                _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(program), 0, 0),
                "seccomp",
            )

    def pid2(self, spec, sock_fd, taken, confined):
        """Pid 2, forked before its run: waits for the run on `sock_fd`, tells pid 1 it has
        one (through `taken`), waits until pid 1 has given up everything (`confined` ends:
        a child made for a run that came gets it at once, while pid 1 may still be at it),
        sets the run's sandbox up the rest of the way and runs it."""
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if not select.select([sock_fd], [], [], 0)[0]:
            # No run yet (a pre-forked child): spend the wait on the copies its run would make.
            self.warm_up()
        request, run_fds = _wait_for_run(sock_fd)
        os.write(taken, b"t")
        os.close(taken)
        os.read(confined, 1)
        os.close(confined)
        _RUN_PID[0] = os.getpid()
        try:
            if request["tmpfs"] != spec["tmpfs"]:
                for target, size in request["tmpfs"]:
                    _fresh_tmpfs(target, size)
            _set_rlimits(request["rlimits"])
            self.setup(request, run_fds)
        except Exception as err:  # noqa: BLE001 - reported to the server
            _fail(sock_fd, err)
        _fresh_state()
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(sys.argv[0])
        _unshadow(self.loaded, (sys.path[0], request["cwd"]))
        code = 1
        try:
            code = self.module.main()
        finally:
            _finish(code)

    def warm_up(self):
        """The run module's own pass through its execution path, if it has one (`warm_up`
        in runner.py): in the fork server, it loads what the path imports lazily; in a
        pre-forked child, it copies the pages a run would copy from the fork server, before
        the run comes."""
        warm = getattr(self.module, "warm_up", None)
        if warm is None:
            return
        try:
            warm()
        except Exception:  # noqa: BLE001 - only a missed saving
            pass

    def prepare(self, tmpfs, user_limits):
        """What pid 1 sets up before it knows its run: its own mount table with fresh /tmp,
        /dev/shm, devpts and /proc (with bubblewrap's covers), the run's share of the per-user
        counters, loopback, its OOM score, and empty bounding and ambient capability sets."""
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        for target, size in tmpfs:
            _fresh_tmpfs(target, size)
        # A devpts instance of its own: terminals another run opens are not in its /dev/pts.
        _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        # The run's share of the per-user counters the kernel keeps for the fork server's
        # host uid (every run of this fork server charges them to that uid).
        for name, value in user_limits:
            _write("/proc/sys/user/" + name, "%d" % value)
        for name in PROC_COVERS:
            path = "/proc/" + name
            if os.path.exists(path):
                _mount(path, path, None, MS_BIND | MS_REC)
                _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _loopback_up()
        _write("/proc/self/oom_score_adj", "1000")
        _drop_bounding_set()

    def setup(self, request, fds):
        """Pid 2's setup once its run is known: the run's directories, stdio, no capabilities,
        the seal that completes the run's seccomp programs (the rest came from pid 1), no other
        descriptor (its socket to the server included: pid 1 reports the run's end)."""
        stdout, stderr, control = fds[0], fds[1], fds[2]
        mount_fds = fds[4 : 4 + int(request["mounts"])]
        for fd, (target, writable) in zip(mount_fds, request["targets"]):
            _attach(fd, target, writable)
            os.close(fd)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.dup2(control, 3)
        for fd in (null, stdout, stderr, control):
            if fd > 3:
                os.close(fd)
        _drop_capabilities()
        os.chdir(request["cwd"])
        self.install(self.seal)
        _close_all_but((0, 1, 2, 3))


def _read_request(request_fd):
    request = json.loads(_read_all(request_fd, MAX_REQUEST))
    os.close(request_fd)
    return request


def _fork_into_namespaces():
    """Make a run's pid 1 in new namespaces, as our child: 0 in it, its pid here."""
    if _thread_count() == 1:
        return _clone(0)
    # Code of the environment started threads here: one may hold a lock (of malloc, of stdio)
    # that a raw clone would copy held. A fork makes a consistent child (the C library and the
    # interpreter see to it); that child, single-threaded, clones pid 1 as our child
    # (CLONE_PARENT), says its pid, and ends.
    pid_r, pid_w = os.pipe()
    with warnings.catch_warnings():
        # (Python warns of exactly this hazard; the helper is how it is avoided.)
        warnings.simplefilter("ignore", DeprecationWarning)
        middle = os.fork()
    if middle == 0:
        os.close(pid_r)
        try:
            pid = _clone(CLONE_PARENT)
        except OSError:
            os._exit(1)
        if pid == 0:
            os.close(pid_w)
            return 0
        os.write(pid_w, b"%d" % pid)
        os._exit(0)
    os.close(pid_w)
    try:
        said = _read_all(pid_r, 64)
    finally:
        os.close(pid_r)
        os.waitpid(middle, 0)
    if not said.isdigit():
        raise OSError(0, "the forked helper could not clone")
    return int(said)


def _clone(extra):
    """`clone` with the run's namespace flags (`CLONE_FLAGS | extra`), from Python: 0 in the
    child, its pid here. The call keeps the GIL, so the child's copy of the interpreter is in
    the state this thread left it; only a single-threaded process may call it (the C
    library's locks are copied as they are). The child is pid 1 of its pid namespace, made
    with no process in between, which a fork followed by `unshare` would need."""
    if SYS_CLONE is None:
        raise OSError(0, "no clone syscall number for %s" % os.uname().machine)
    pid = _libc_gil.syscall(
        ctypes.c_long(SYS_CLONE),
        ctypes.c_long(CLONE_FLAGS | extra),
        ctypes.c_long(0),
        ctypes.c_long(0),
        ctypes.c_long(0),
        ctypes.c_long(0),
    )
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return pid


def _thread_count():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _enter_namespaces(cgroup_fds):
    """In a new pid 1: join the run's cgroups (through the `cgroup.procs` files the server
    opened), make its other namespaces there, and map only our own uid (as SANDBOX_ID) into
    the user namespace the clone made."""
    for fd in cgroup_fds:
        os.write(fd, b"0")
        os.close(fd)
    _check(_libc.unshare(UNSHARE_FLAGS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", "%d %d 1" % (SANDBOX_ID, _OUTSIDE_IDS[0]))
    _write("/proc/self/gid_map", "%d %d 1" % (SANDBOX_ID, _OUTSIDE_IDS[1]))


# The fork server's uid and gid in its own user namespace (what a run's 65534 maps to); read
# before any clone (inside a new user namespace they are unmapped until the maps are written).
_OUTSIDE_IDS = (os.geteuid(), os.getegid())


def _send_pidfd(sock_fd):
    """Pid 1, first of all: send the server a pidfd of itself (`pid1`), where no cgroup holds
    the run: the server kills the run through it (the kernel then kills the whole pid
    namespace) and watches the memory of its tree."""
    pidfd = _libc.syscall(ctypes.c_long(SYS_PIDFD_OPEN), ctypes.c_long(1), ctypes.c_long(0))
    if pidfd < 0:
        raise SetupError("pidfd_open: %s" % os.strerror(ctypes.get_errno()))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fileno=sock_fd)
    try:
        sock.sendmsg([b"pid1"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", pidfd))])
    finally:
        sock.detach()
        os.close(pidfd)


def _set_rlimits(rlimits):
    for kind, soft, hard in rlimits:
        resource.setrlimit(kind, (soft, hard))


def _fail(report, err):
    """In pid 1 before the run: report why its setup failed, and end (no user code ran)."""
    try:
        text = ("fail %s" % err).replace("\n", " ")
        os.write(report, text.encode("utf-8", "replace")[: MAX_MESSAGE - 1])
    except OSError:
        pass
    os._exit(127)


def _wait_for_run(sock_fd):
    """In pid 2: wait for the one run it serves (a message with its descriptors). The socket
    stays open (a set-up that fails is reported on it). Ends the process, running nothing, when the
    socket closes first (the server dropped this child) or the message is not a run."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fileno=sock_fd)
    while True:
        try:
            message, ancillary, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
            break
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
    sock.detach()
    fds = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(struct.unpack("%di" % (usable // 4), data[:usable]))
    if message != b"run" or len(fds) < 4:
        os._exit(0)
    try:
        request = _read_request(fds[3])
    except Exception:  # noqa: BLE001 - a malformed request: nothing runs
        os._exit(0)
    return request, fds


# Native thread pools a preloaded package may start at import (OpenBLAS, OpenMP, MKL, BLIS,
# numexpr, Accelerate): one thread each, so that the fork server holds no thread a fork would
# lose while its pool still counts it. Only variables that are not set already; they are
# removed again after the imports, so a run's own subprocesses see the environment a cold run
# would. (A preloaded library keeps the setting it read: its runs compute on one thread.)
THREAD_VARS = (
    "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
)  # fmt: skip
MAX_PRELOAD = 64
# Learned modules (`_preload`): the engine sends no more (`pool::MAX_LEARNED`).
MAX_LEARNED = 64


def _top_level_modules(distribution):
    """The importable top-level modules of an installed distribution: its `top_level.txt`,
    else the packages and modules at the top of its RECORD. Private names are left out."""
    from importlib import metadata

    try:
        dist = metadata.distribution(distribution)
    except Exception:  # noqa: BLE001 - not installed (or unreadable): nothing to preload
        return []
    names = set((dist.read_text("top_level.txt") or "").split())
    if not names:
        for path in dist.files or ():
            parts = path.parts
            if len(parts) == 1 and parts[0].endswith(".py"):
                names.add(parts[0][:-3])
            elif len(parts) == 2 and parts[1] == "__init__.py":
                names.add(parts[0])
    return sorted(n for n in names if n.isidentifier() and not n.startswith("_"))


def _preload(listed, modules):
    """Import the top-level modules of the distributions in `listed`, at most MAX_PRELOAD of
    them, then the `modules` (dotted names: what recent runs of the environment imported, as
    the server learned it), at most MAX_LEARNED; both comma-separated. What fails to import is
    left out (a run imports it itself and sees the error). Returns the modules imported."""
    added = [name for name in THREAD_VARS if name not in os.environ]
    for name in added:
        os.environ[name] = "1"
    done = []
    try:
        for distribution in [d for d in listed.split(",") if d][:MAX_PRELOAD]:
            for module in _top_level_modules(distribution):
                if len(done) >= MAX_PRELOAD:
                    break
                if _import(module):
                    done.append(module)
        for module in [m for m in modules.split(",") if m][:MAX_LEARNED]:
            if _import(module):
                done.append(module)
    finally:
        for name in added:
            os.environ.pop(name, None)
    # Whatever the imports opened stays open here, but no run sees it: each run closes every
    # descriptor but its own before its code runs (`setup`).
    return done


def _import(module):
    """Import `module` (a dotted name); whether it could be."""
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - caller-chosen code: anything may fail
        return False
    return True


# Whether this interpreter keeps an object's reference count in the low 32 bits of its
# first word and leaves it alone once all of them are set (PEP 683: CPython 3.12 and 3.13,
# the default build on a 64-bit little-endian machine; not a free-threaded or debug build,
# whose objects are laid out otherwise). Elsewhere `_immortalize` does nothing.
_IMMORTAL_REFCOUNT = (
    (3, 12) <= sys.version_info[:2] <= (3, 13)
    and sys.maxsize > 2**32
    and sys.byteorder == "little"
    and not set(sys.abiflags) & {"t", "d"}
)
_IMMORTAL = 0xFFFFFFFF


def _immortalize():
    """Make every object the fork server holds now immortal, as CPython's own constants are:
    its reference count is never written again, here or in a process forked from here.

    A run shares the fork server's memory copy-on-write, and taking a reference is a write:
    every function, type, dict or module a run merely uses would otherwise copy its page into
    the run (measured: a third of a pandas `describe()`'s page copies in a forked child, a
    fifth of a small script's). PEP 683 made objects immortal for this use, among others.
    The walk follows what the collector reaches (`gc.get_objects`, then `gc.get_referents`),
    marking each object as it goes (a marked one is not walked again, so no set of seen
    objects grows the fork server's heap); objects immortal already (None, small ints,
    static types) are left as they are. What it costs: none of these objects is ever freed
    (the fork server keeps them for its lifetime anyway; a run that drops one does not get
    its memory back), and `sys.getrefcount` of one says 4294967295. Returns how many it
    made immortal."""
    if not _IMMORTAL_REFCOUNT:
        return 0
    refcount = ctypes.c_uint32.from_address
    referents = gc.get_referents
    made = 0
    stack = gc.get_objects()
    while stack:
        obj = stack.pop()
        count = refcount(id(obj))
        if count.value & 0x80000000:
            continue
        count.value = _IMMORTAL
        made += 1
        stack.extend(referents(obj))
    return made


def _fresh_state():
    """In the run, before its code: what a fork would otherwise share between runs. The
    random generators get fresh seeds (`random` does this itself after a fork; numpy's global
    generator does not), so two runs never draw the same numbers."""
    random = sys.modules.get("random")
    if random is not None:
        try:
            random.seed()
        except Exception:  # noqa: BLE001
            pass
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:  # noqa: BLE001
            pass


def _unshadow(loaded, directories):
    """In the run, before its code: forget the top-level modules in `loaded` (what the
    preloads loaded) that a file of the run's own would be imported as (`helpers.py` or a
    `helpers/` directory in the script's directory or the working directory, both ahead of the
    environment on `sys.path`), with their submodules, so that the script imports its own, as
    it would in a cold run, where none of them is loaded yet."""
    if not loaded:
        return
    own = set()
    for directory in directories:
        try:
            own.update(name[:-3] if name.endswith(".py") else name for name in os.listdir(directory))
        except OSError:
            pass
    for top in loaded & own:
        for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[name]


# The signal pid 2 queues to pid 1 as its runner ends, its value the exit code (`_finish`).
SIG_END = signal.SIGRTMIN + 2
SI_QUEUE = -1


def _init(main, report, taken):
    """Pid 1 of a run: reap every child until the run ends, then report how, and end (the rest
    of the namespace dies with it). The run ends when pid 2 (`main`) says its exit code as it
    exits (`SIG_END`: reported at once, while its exit goes on) or when pid 2 is reaped (its
    wait status). Only if pid 2 took a run (`taken` says so): if it did not, it ran nothing
    (the server dropped this child, or it failed before its run)."""
    os.set_blocking(taken, False)
    # As the namespace's init, it gets only the signals it handles from the run's processes:
    # none (Python's SIGINT handler, or one a preloaded package set, would let the script's
    # `kill(1, SIGINT)` end the run).
    for number in signal.valid_signals():
        try:
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    # Pid 2 was forked with the mask it had before: this blocks the two here only.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, SIG_END})
    ran = False

    def took_a_run():
        nonlocal ran
        if not ran:
            try:
                ran = os.read(taken, 1) == b"t"
            except OSError:
                pass
        return ran

    def end(text):
        # Every other process of the run first gets SIGKILL, in one step no fork can slip
        # past: from a pid namespace's init, kill(-1) signals each process of the namespace
        # (and of namespaces nested in it) under the lock a fork takes to add a process, so
        # a process is either signalled or never made. The report therefore also says that
        # no process of the run can run code again, and the server replies without waiting
        # for their exits (`Forked::wait`).
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.write(report, text)
        except OSError:
            pass
        os._exit(0)

    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(255)
            if pid == 0:
                break
            if pid == main:
                if took_a_run():
                    end(b"exit %d" % status)
                end(b"fail the pre-forked child ended before its run (status %d)" % status)
        info = signal.sigwaitinfo({signal.SIGCHLD, SIG_END})
        if info.si_signo == SIG_END and info.si_code == SI_QUEUE and took_a_run():
            end(b"exit %d" % ((info.si_status & 0xFF) << 8))


def _finish(code):
    """End the run as the interpreter's exit would, as far as a run can observe it: other
    threads joined, atexit handlers run, the script's objects released (open files flushed
    and closed), output flushed. The teardown of the whole interpreter, which nothing of the
    run can see and which costs more than the run itself, is skipped."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
        main = sys.modules.get("__main__")
        if main is not None and main.__dict__ is not globals():
            main.__dict__.clear()
        gc.collect()
    except BaseException:  # noqa: BLE001 - the run is over either way
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    code = code if isinstance(code, int) else 1
    if os.getpid() == _RUN_PID[0]:
        # Pid 1 reports the end now, while this process's address space is torn down (the
        # two exits overlap); its output ends here. Only pid 2 itself: a process the script
        # forked ends through here too.
        for fd in (1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
        _libc.sigqueue(1, SIG_END, ctypes.c_long(code & 0xFF))
        # Pid 1, just woken, is often queued on this CPU behind this process, whose exit
        # (its address space torn down) would then run first: let it report first.
        os.sched_yield()
    os._exit(code)


# Pid 2's pid once it has its run (what `_finish` tells apart from the script's forks).
_RUN_PID = [None]


def _close_all_but(keep):
    """Close every descriptor but those in `keep`: one `close_range` per gap between them
    (listing /proc/self/fd and closing one by one costs a run ~0.1 ms), else, where the
    kernel lacks it, one by one."""
    low = 0
    for fd in sorted(keep) + [LAST_FD + 1]:
        if fd > low and _libc.syscall(SYS_CLOSE_RANGE, low, ctypes.c_uint(fd - 1), 0) != 0:
            break
        low = fd + 1
    else:
        return
    for fd in _open_fds():
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _open_fds():
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(4, 1024))


def main():
    # The socket, the run module, the distributions and the modules to preload (each
    # comma-separated, maybe empty), then a run's seccomp programs.
    server = ForkServer(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], [int(fd) for fd in sys.argv[5:]])
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
