//! Long-lived sandboxes (`Sandbox::spawn` + `LiveSandbox::exchange`) against the real
//! bubblewrap and the `none` backend: state survives between requests, output is attributed
//! to its request, a timeout kills the tree and the sandbox is dead afterwards. Skips with a
//! printed reason when bwrap is missing.
#![allow(clippy::print_stderr, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use snakebox_sandbox::{
    BackendKind, ExchangeEnd, LiveSandbox, Sandbox, SandboxCommand, SandboxConfig,
};
use tokio_util::sync::CancellationToken;

/// A responder in `sh`: each request line `N` prints `out N` (stdout) and `err N` (stderr),
/// each stream's marker `<<N>>`, then the answer `<<N>>{"n":"N","count":C}` on descriptor 3
/// (an answer line starts with its request's marker).
/// `count` grows: state kept between requests. The request `sleep` hangs forever.
const RESPONDER: &str = r#"
count=0
while read -r n; do
  count=$((count + 1))
  if [ "$n" = sleep ]; then while :; do :; done; fi
  echo "out $n"; echo "err $n" >&2
  printf '<<%s>>' "$n"; printf '<<%s>>' "$n" >&2
  printf '<<%s>>{"n":"%s","count":%s}\n' "$n" "$n" "$count" >&3
done
"#;

fn command() -> SandboxCommand {
    SandboxCommand {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), RESPONDER.into()],
        control_channel: true,
        init: false,
    }
}

async fn ask(live: &mut LiveSandbox, n: &str, timeout: u64) -> snakebox_sandbox::Exchange {
    live.exchange(
        format!("{n}\n").as_bytes(),
        format!("<<{n}>>").as_bytes(),
        Duration::from_secs(timeout),
        CancellationToken::new(),
        None,
    )
    .await
    .unwrap()
}

async fn conversation(sandbox: &Sandbox) {
    let policy = policy(Path::new("/tmp"), vec![]);
    let mut live = sandbox.spawn(&policy, &command()).unwrap();
    for (i, n) in ["a1", "b2", "c3"].into_iter().enumerate() {
        let exchange = ask(&mut live, n, 10).await;
        assert_eq!(exchange.end, ExchangeEnd::Answered, "{exchange:?}");
        assert_eq!(exchange.stdout.text, format!("out {n}\n"));
        assert_eq!(exchange.stderr.text, format!("err {n}\n"));
        assert_eq!(
            String::from_utf8_lossy(&exchange.answer),
            format!("{{\"n\":\"{n}\",\"count\":{}}}", i + 1)
        );
    }
    assert!(live.is_alive());
    let started = std::time::Instant::now();
    let exchange = ask(&mut live, "sleep", 1).await;
    assert_eq!(exchange.end, ExchangeEnd::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!live.is_alive());
    let after = ask(&mut live, "d4", 1).await;
    assert_eq!(after.end, ExchangeEnd::Exited);
}

#[tokio::test]
async fn native_live_sandbox_keeps_state_and_dies_on_timeout() {
    if !Path::new("/usr/bin/bwrap").exists() {
        eprintln!("skipped: bubblewrap is not installed at /usr/bin/bwrap");
        return;
    }
    let sandbox = Sandbox::new(SandboxConfig {
        backend: BackendKind::Native,
        bwrap_path: Some("/usr/bin/bwrap".into()),
        scratch_root: std::env::temp_dir(),
        docker_runtime: None,
    })
    .unwrap();
    conversation(&sandbox).await;
}

#[tokio::test]
async fn none_live_sandbox_keeps_state_and_dies_on_timeout() {
    conversation(&none_sandbox()).await;
}

#[tokio::test]
async fn exit_between_requests_is_reported() {
    let sandbox = none_sandbox();
    let policy = policy(Path::new("/tmp"), vec![]);
    let cmd = SandboxCommand {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), "read -r n; echo bye; exit 7".into()],
        control_channel: true,
        init: false,
    };
    let mut live = sandbox.spawn(&policy, &cmd).unwrap();
    let exchange = ask(&mut live, "x", 10).await;
    assert_eq!(exchange.end, ExchangeEnd::Exited);
    assert_eq!(exchange.exit_code, Some(7));
    assert_eq!(exchange.stdout.text, "bye\n");
}
