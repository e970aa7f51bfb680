//! Our own memory stays bounded while the child prints 200 MiB (its own test binary, so no
//! other test's allocations disturb the measurement).
#![allow(clippy::print_stderr, clippy::unwrap_used)]

mod common;

use common::*;

fn vm_hwm_kib() -> u64 {
    let status = fs_err::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_200_mib_print_does_not_grow_the_supervisor() {
    let Some((py_bin, _)) = python() else {
        eprintln!("skipped: no python3.11 interpreter on this host");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sb = none_sandbox();
    // Warm up the runtime and allocator first.
    let _ = run(
        &sb,
        &policy(tmp.path(), vec![]),
        &py(&py_bin, "print(1)", false),
    )
    .await;
    let before = vm_hwm_kib();
    let code = "import sys\nb = b'y' * (1 << 20)\nfor _ in range(200): sys.stdout.buffer.write(b)";
    let out = run(&sb, &policy(tmp.path(), vec![]), &py(&py_bin, code, false)).await;
    let after = vm_hwm_kib();
    assert_eq!(out.stdout.total_bytes, 200 << 20);
    assert!(out.stdout.truncated);
    assert!(
        after - before < 8 * 1024,
        "peak RSS grew by {} KiB",
        after - before
    );
}
