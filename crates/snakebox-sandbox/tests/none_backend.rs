//! The `none` backend: no isolation, but the supervisor's guarantees (clean environment, empty
//! stdin, no inherited descriptors, capped output, tree killed on timeout) hold.
#![allow(clippy::print_stderr, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use snakebox_sandbox::{BackendKind, Termination};
use tokio_util::sync::CancellationToken;

macro_rules! need_python {
    () => {
        match python() {
            Some(p) => p,
            None => {
                eprintln!("skipped: no python3.11 interpreter on this host");
                return;
            }
        }
    };
}

#[tokio::test]
async fn report_is_honest_about_no_isolation() {
    let sb = none_sandbox();
    assert_eq!(sb.kind(), BackendKind::None);
    let report = sb.report();
    assert!(!report.isolation_active);
    assert!(
        report
            .limits
            .iter()
            .any(|l| l.name == "network" && !l.enforced)
    );
}

#[tokio::test]
async fn environment_is_only_the_policy_env_and_stdin_is_empty() {
    let (py_bin, _) = need_python!();
    // SAFETY: set before any thread of this test reads the environment; a canary only.
    unsafe { std::env::set_var("SNAKEBOX_CANARY_SECRET", "sk-canary-none") };
    let tmp = tempfile::tempdir().unwrap();
    let sb = none_sandbox();
    let code = "import os,sys; print(sorted(os.environ)); print(repr(sys.stdin.read())); print(os.getcwd())";
    let out = run(&sb, &policy(tmp.path(), vec![]), &py(&py_bin, code, false)).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.termination, Termination::Exited);
    let lines: Vec<&str> = out.stdout.text.lines().collect();
    assert!(lines[0].contains("'PATH'"), "{out:?}");
    assert!(!out.stdout.text.contains("SNAKEBOX_CANARY"));
    assert!(!out.stdout.text.contains("HOME"));
    assert_eq!(lines[1], "''");
    assert_eq!(
        std::path::Path::new(lines[2]).canonicalize().unwrap(),
        tmp.path().canonicalize().unwrap()
    );
}

#[tokio::test]
async fn no_descriptor_is_inherited_and_the_control_channel_is_fd_3() {
    let (py_bin, _) = need_python!();
    // A descriptor of ours without CLOEXEC must not leak into the child.
    let leaked = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
    assert!(leaked > 2);
    let tmp = tempfile::tempdir().unwrap();
    let sb = none_sandbox();
    let code = "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd'))); os.write(3, b'{\"ok\": 1}'); print('{\"forged\": 1}')";
    let out = run(&sb, &policy(tmp.path(), vec![]), &py(&py_bin, code, true)).await;
    unsafe { libc::close(leaked) };
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    // 0,1,2, the control pipe 3, and the fd listdir itself opened.
    let fds: Vec<i32> = out
        .stdout
        .text
        .lines()
        .next()
        .unwrap()
        .trim_matches(['[', ']'])
        .split(", ")
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(&fds[..4], &[0, 1, 2, 3], "{fds:?}");
    assert!(fds.len() <= 5, "{fds:?}");
    assert_eq!(out.control, b"{\"ok\": 1}");
}

#[tokio::test]
async fn timeout_kills_a_sigterm_ignoring_child_and_a_double_forked_daemon() {
    let (py_bin, _) = need_python!();
    let marker = unique("snakebox-none-daemon");
    let tmp = tempfile::tempdir().unwrap();
    let sb = none_sandbox();
    let code = format!(
        r#"
import os, signal, sys, time
MARK = "{marker}"
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True: time.sleep(0.1)
    os._exit(0)
print("started", flush=True)
while True: time.sleep(0.1)
"#
    );
    let mut pol = policy(tmp.path(), vec![]);
    pol.limits.wall_time = Duration::from_secs(2);
    let start = Instant::now();
    let out = run(&sb, &pol, &py(&py_bin, &code, false)).await;
    let took = start.elapsed();
    assert_eq!(out.termination, Termination::TimedOut, "{out:?}");
    assert_eq!(
        out.stdout.text, "started\n",
        "output before the kill is kept"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        processes_with_marker(&marker),
        Vec::<i32>::new(),
        "a process of the run survived"
    );
}

#[tokio::test]
async fn cancellation_kills_and_keeps_output() {
    let (py_bin, _) = need_python!();
    let tmp = tempfile::tempdir().unwrap();
    let sb = none_sandbox();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        c2.cancel();
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cmd = py(
        &py_bin,
        "import time; print('tick', flush=True); time.sleep(60)",
        false,
    );
    let out = sb
        .run(&policy(tmp.path(), vec![]), &cmd, cancel, Some(tx))
        .await
        .unwrap();
    assert_eq!(out.termination, Termination::Cancelled);
    assert_eq!(out.stdout.text, "tick\n");
    let chunk = rx.recv().await.unwrap();
    assert_eq!(chunk.text, "tick\n");
}

#[tokio::test]
async fn output_cap_keeps_head_and_tail_of_a_50_mib_print() {
    let (py_bin, _) = need_python!();
    let tmp = tempfile::tempdir().unwrap();
    let sb = none_sandbox();
    let code = "import sys\nsys.stdout.write('HEAD\\n')\nsys.stdout.write('x' * (50 << 20))\nsys.stdout.write('\\nTAIL\\n')\nsys.stderr.write('E' * (1 << 20))";
    let pol = policy(tmp.path(), vec![]);
    let out = run(&sb, &pol, &py(&py_bin, code, false)).await;
    assert_eq!(out.exit_code, Some(0));
    assert!(out.stdout.truncated && out.stderr.truncated);
    assert!(out.stdout.text.starts_with("HEAD\n"));
    assert!(out.stdout.text.ends_with("\nTAIL\n"));
    assert!(out.stdout.text.contains(" bytes truncated ...]"));
    let total = out.stdout.text.len() + out.stderr.text.len();
    assert!(total as u64 <= pol.limits.max_output_bytes, "{total}");
    assert_eq!(out.stdout.total_bytes, 5 + (50 << 20) + 6);
}

#[tokio::test]
async fn cpu_rlimit_ends_a_busy_loop_as_cpu_limit() {
    let (py_bin, _) = need_python!();
    let tmp = tempfile::tempdir().unwrap();
    let sb = none_sandbox();
    let mut pol = policy(tmp.path(), vec![]);
    pol.limits.cpu_time = Some(Duration::from_secs(1));
    let code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nprint('spin', flush=True)\nwhile True: pass";
    let out = run(&sb, &pol, &py(&py_bin, code, false)).await;
    assert_eq!(out.stdout.text, "spin\n");
    assert_eq!(out.termination, Termination::CpuLimit, "{out:?}");
}

// See: issue 16 (item 5): RLIMIT_AS stood in for memory and broke libraries that reserve
// address space. The watchdog lets a large reservation through and stops real use.
#[tokio::test]
async fn memory_is_resident_use_not_address_space() {
    let Some((interpreter, _)) = python() else {
        eprintln!("skipped: no python3.11 interpreter on this host");
        return;
    };
    let sb = none_sandbox();
    let mut p = policy(&std::env::temp_dir(), vec![]);
    p.limits.memory_bytes = Some(256 << 20);
    // 4 GiB of address space reserved, a few pages touched: fine.
    let reserve = "import mmap\nm = mmap.mmap(-1, 4 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\nm[0] = 1\nprint('reserved', flush=True)";
    let out = run(&sb, &p, &py(&interpreter, reserve, false)).await;
    assert_eq!(out.stdout.text, "reserved\n", "{out:?}");
    assert_eq!(out.termination, Termination::Exited, "{out:?}");
    let hog =
        "print('alive', flush=True)\nchunks = []\nwhile True: chunks.append(b'\\x01' * (16 << 20))";
    let out = run(&sb, &p, &py(&interpreter, hog, false)).await;
    assert_eq!(out.stdout.text, "alive\n", "{out:?}");
    assert_eq!(out.termination, Termination::MemoryLimit, "{out:?}");
    // Shared anonymous memory (Python's default for `mmap.mmap(-1, n)`) counts too.
    let shared = "import mmap\nm = mmap.mmap(-1, 2 << 30)\nprint('alive', flush=True)\nfor i in range(0, 2 << 30, 1 << 20): m[i:i + (1 << 20)] = b'\\x01' * (1 << 20)\nprint('filled 2 GiB')";
    let out = run(&sb, &p, &py(&interpreter, shared, false)).await;
    assert_eq!(out.stdout.text, "alive\n", "{out:?}");
    assert_eq!(out.termination, Termination::MemoryLimit, "{out:?}");
}
