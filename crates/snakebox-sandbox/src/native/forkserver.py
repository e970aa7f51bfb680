"""snakebox fork server: one pre-initialised interpreter that forks a fresh sandbox per run.

It runs inside a bubblewrap sandbox of its own (read-only system view, the environment, no
network, no host processes) as root, like the server, with only the capabilities it needs to
set runs up (mount and unshare, set uid, loopback, reach the run directories), and never runs
user code: every run happens in a child that gave all of that up first.

It imports the run module once (the slow part of a cold start), then waits for requests on
a private SEQPACKET socket: one message per run, a JSON object with the run's descriptors
(stdout, stderr, control channel, the run's cgroup `tasks` files) attached. For each request
it makes a new pid namespace and forks the run's pid 1 into it, which:

1. joins the run's cgroups, sets its rlimits, and enters new mount, network, ipc, uts and
   cgroup namespaces;
2. binds the run's own directories (host-side scratch, already size-capped) at their places,
   mounts fresh size-capped /tmp and /dev/shm, detaches the directory that showed every run
   directory (so nothing of another run is reachable), mounts a fresh /proc (the new pid
   namespace only, with the read-only covers bubblewrap puts on it), brings up loopback;
3. drops to the run's host uid, makes a user namespace of its own as that uid (in which it
   appears as 65534; its per-uid kernel counters are then its own), drops every capability,
   sets no_new_privs and installs the server's seccomp programs;
4. forks the run itself (pid 2), and from then on only reaps, as bubblewrap's init does, and
   ends the way the run ended.

The run calls the module's `main()` and ends as the interpreter's exit would (see
`_finish`). The server supervises it as any other run: it owns the pipes and the cgroup, and
kills the run through the cgroup.

Messages to the server: `ready`, `exit <id> <wait status>` (of the run's pid 1) and
`fail <id> <reason>` (setup went wrong before user code ran).
"""

import ctypes
import fcntl
import gc
import json
import os
import re
import resource
import select
import signal
import socket
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

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

# Where the server's run directories appear inside this sandbox (this program's own files are
# there too); each run detaches it before any user code runs.
RUNS = "/run/snakebox/runs"
# An empty mount point where a run builds a fresh tmpfs before moving it into place.
SPARE = "/run/snakebox/spare"

# bubblewrap's read-only covers on a fresh /proc.
PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")

MAX_MESSAGE = 1 << 20
MAX_FDS = 16

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


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


def _bind(source, target, writable):
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV
    if not writable:
        flags |= MS_RDONLY
    _mount(None, target, None, flags)


def _prctl(option, arg=0):
    _check(_libc.prctl(option, arg, 0, 0, 0), "prctl %d" % option)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _load_programs(paths):
    programs = []
    for path in paths:
        with open(path, "rb") as handle:
            code = handle.read()
        if not code or len(code) % 8:
            raise SetupError("seccomp program %s is malformed" % path)
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
# changes only below RUNS, where the runs' scratch mounts come and go).
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


def _drop_capabilities():
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class ForkServer:
    def __init__(self, sock_fd, module_path, seccomp_paths):
        # The socket moves off fd 3, which each run's control channel takes.
        fd = os.dup(sock_fd)
        os.close(sock_fd)
        os.set_inheritable(fd, False)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fileno=fd)
        self.programs = _load_programs(seccomp_paths)
        self.pid = os.getpid()
        self.children = {}
        self.pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        import importlib.util

        spec = importlib.util.spec_from_file_location("snakebox_run_module", module_path)
        self.module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = self.module
        spec.loader.exec_module(self.module)
        # What the run module imports while it runs (compiling a script), loaded once here.
        import __future__  # noqa: F401

        for target in ("/tmp", "/dev/shm"):
            _BELOW[target] = [p for p in _mount_points_below(target) if not p.startswith(RUNS + "/")]

    def send(self, text):
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
        # Everything loaded so far lives as long as the fork server: out of the collector's
        # sight, so a run's collections do not walk it (nor touch its pages).
        gc.freeze()
        self.send("ready")
        while True:
            ready, _, _ = select.select([self.sock, wake_r], [], [])
            if wake_r in ready:
                os.read(wake_r, 4096)
                self.reap()
            if self.sock not in ready:
                continue
            try:
                message, ancillary, _, _ = self.sock.recvmsg(
                    MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4)
                )
            except InterruptedError:
                continue
            fds = []
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(data) - len(data) % 4
                    fds.extend(struct.unpack("%di" % (usable // 4), data[:usable]))
            if not message:
                return 0
            try:
                request = json.loads(message)
                run_id = str(request["id"])
            except (ValueError, KeyError, TypeError):
                for fd in fds:
                    os.close(fd)
                continue
            # The run's process is pid 1 of a pid namespace of its own: made here, entered by
            # the fork. (Back in our own pid namespace first: a second unshare is refused while
            # the previous run's namespace is still the one for our children.)
            failed = None
            if _libc.setns(self.pid_ns, CLONE_NEWPID) != 0 or _libc.unshare(CLONE_NEWPID) != 0:
                failed = "new pid namespace: %s" % os.strerror(ctypes.get_errno())
            else:
                try:
                    pid = os.fork()
                except OSError as err:
                    failed = "fork: %s" % err
            if failed is not None:
                self.send("fail %s %s" % (run_id, failed))
                for fd in fds:
                    os.close(fd)
                continue
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                return self.child(request, fds)
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
                self.send("exit %s %d" % (run_id, status))

    def child(self, request, fds):
        """The run's process: pid 1 of the fresh pid namespace the fork server made for it."""
        run_id = str(request["id"])
        try:
            self.enter(request, fds)
        except Exception as err:  # noqa: BLE001 - reported to the server
            self.send("fail %s %s" % (run_id, err))
            os._exit(127)
        try:
            self.sock.close()
        except OSError:
            pass
        # As in a bubblewrap sandbox, pid 1 is a small init that reaps orphans and passes on
        # how the run ended; the run itself is pid 2, so that signals it sends itself (and
        # alarms) act as they do anywhere else (the kernel ignores those sent to a pid 1).
        pid = os.fork()
        if pid != 0:
            _init(pid)
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(sys.argv[0])
        code = 1
        try:
            code = self.module.main()
        finally:
            _finish(code)

    def enter(self, request, fds):
        count = int(request["cgroups"])
        stdout, stderr, control = fds[0], fds[1], fds[2]
        for fd in fds[3 : 3 + count]:
            os.write(fd, b"0")
            os.close(fd)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for kind, soft, hard in request["rlimits"]:
            resource.setrlimit(kind, (soft, hard))
        # The pid namespace was made by the fork server (this process is its pid 1); the
        # others are entered here. None of them is the fork server's.
        _check(
            _libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP),
            "unshare",
        )
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        for source, target, writable in request["binds"]:
            _bind(RUNS + "/" + source, target, writable)
        for target, size in request["tmpfs"]:
            _fresh_tmpfs(target, size)
        _check(_libc.umount2(RUNS.encode(), MNT_DETACH), "umount %s" % RUNS)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for name in PROC_COVERS:
            path = "/proc/" + name
            if os.path.exists(path):
                _mount(path, path, None, MS_BIND | MS_REC)
                _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _loopback_up()
        _write("/proc/self/oom_score_adj", "1000")
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.dup2(control, 3)
        for fd in (null, stdout, stderr, control):
            if fd > 3:
                os.close(fd)
        uid = int(request["uid"])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # The uid change made the process non-dumpable, which leaves its /proc files (uid_map
        # among them) to root; as the run's own uid it may then write its own maps.
        _prctl(PR_SET_DUMPABLE, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _check(_libc.unshare(CLONE_NEWUSER), "unshare user")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", "65534 %d 1" % uid)
        _write("/proc/self/gid_map", "65534 %d 1" % uid)
        _drop_capabilities()
        os.setsid()
        os.chdir(request["cwd"])
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        for _, program in self.programs:
            _check(
                _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(program), 0, 0),
                "seccomp",
            )
        keep = {0, 1, 2, 3, self.sock.fileno()}
        for fd in _open_fds():
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _init(main):
    """Pid 1 of a run: reap every child until `main` ends, then end the same way (a death by
    signal N as exit status 128 + N, as bubblewrap reports it). The rest of the namespace dies
    with it."""
    for fd in (0, 1, 2, 3):
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        try:
            pid, status = os.wait()
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(255)
        if pid == main:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255)


def _finish(code):
    """End the run as the interpreter's exit would, as far as a run can observe it: other
    threads joined, atexit handlers run, the script's objects released (open files flushed
    and closed), output flushed. The teardown of the whole interpreter, which nothing of the
    run can see and which costs more than the run itself, is skipped."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit

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
    os._exit(code if isinstance(code, int) else 1)


def _open_fds():
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(4, 1024))


def main():
    server = ForkServer(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
