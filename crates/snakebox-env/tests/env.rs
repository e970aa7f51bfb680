//! Real uv, real interpreters, real package index: locating uv, discovering Python, building,
//! reusing and pruning environments. Each test uses its own temporary data root.
//!
//! Tests that need something this host lacks (uv, CPython 3.11) return early and say why.
#![allow(clippy::print_stderr)] // timings are reported on stderr (`--nocapture`)
#![allow(clippy::unwrap_used)] // helpers of tests, too

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use pep508_rs::Requirement;
use snakebox_env::{
    CacheConfig, DirectUvRunner, EnvCache, EnvError, EnvVars, Interpreter, Interpreters,
    PruneReason, Role, Uv, UvInvocation, UvRunFuture, UvRunner,
};
use snakebox_sandbox::{BackendKind, Sandbox, SandboxConfig};

fn uv() -> Option<Uv> {
    match Uv::locate(None) {
        Ok(uv) => Some(uv),
        Err(err) => {
            eprintln!("skipped: no uv on this host ({err})");
            None
        }
    }
}

async fn python311(uv: &Uv) -> Option<Interpreter> {
    let interpreters = Interpreters::discover(uv).await;
    match interpreters.find("3.11") {
        Ok(found) => Some(found.clone()),
        Err(err) => {
            eprintln!("skipped: no CPython 3.11 on this host ({err})");
            None
        }
    }
}

fn reqs(items: &[&str]) -> Vec<Requirement> {
    items
        .iter()
        .map(|s| Requirement::from_str(s).unwrap())
        .collect()
}

/// Counts `uv venv` invocations (one per build), records every invocation, and passes
/// everything to the direct runner.
#[derive(Debug, Default)]
struct CountingRunner {
    builds: AtomicUsize,
    seen: Mutex<Vec<UvInvocation>>,
}

impl UvRunner for CountingRunner {
    fn run<'a>(&'a self, invocation: &'a UvInvocation) -> UvRunFuture<'a> {
        if invocation.label == "uv venv" {
            self.builds.fetch_add(1, Ordering::SeqCst);
        }
        self.seen.lock().unwrap().push(invocation.clone());
        DirectUvRunner.run(invocation)
    }

    fn is_sandboxed(&self) -> bool {
        false
    }
}

fn is_script(path: &Path) -> bool {
    fs_err::read(path).is_ok_and(|bytes| bytes.starts_with(b"#!"))
}

#[test]
fn locate_finds_the_real_uv_binary() {
    let Some(uv) = uv() else { return };
    assert!(uv.path.is_absolute());
    assert!(
        !is_script(&uv.path),
        "`{}` is a script, not uv",
        uv.path.display()
    );
    assert!(uv.version.starts_with("0."), "version `{}`", uv.version);
}

#[test]
fn locate_resolves_a_pyenv_shim() {
    let shim = PathBuf::from("/root/.pyenv/shims/uv");
    if !shim.exists() {
        eprintln!("skipped: no pyenv shim for uv at `{}`", shim.display());
        return;
    }
    let uv = Uv::locate(Some(&shim)).unwrap();
    assert!(
        uv.path.starts_with("/root/.pyenv/versions"),
        "resolved to `{}`",
        uv.path.display()
    );
    assert!(!is_script(&uv.path));
}

#[test]
fn locate_refuses_a_bad_explicit_path() {
    let err = Uv::locate(Some(Path::new("/nonexistent/uv"))).unwrap_err();
    assert!(matches!(err, EnvError::UvUnusable { .. }), "{err:?}");
    assert!(err.to_string().ends_with("`/nonexistent/uv`"));
    assert!(err.hint().is_some());
}

#[tokio::test]
async fn discovery_finds_real_interpreters_and_answers_requests() {
    let Some(uv) = uv() else { return };
    let started = Instant::now();
    let interpreters = Interpreters::discover(&uv).await;
    eprintln!(
        "discovery took {:?}: {:?}",
        started.elapsed(),
        interpreters
            .all()
            .iter()
            .map(|i| (i.version.to_string(), &i.source))
            .collect::<Vec<_>>()
    );
    assert!(!interpreters.all().is_empty());
    for interpreter in interpreters.all() {
        assert!(
            !is_script(&interpreter.executable),
            "shim `{}`",
            interpreter.executable.display()
        );
        assert!(!interpreter.executable.starts_with("/root/.pyenv/shims"));
        assert!(interpreter.executable.is_absolute() && interpreter.prefix.is_dir());
        assert_eq!(interpreter.implementation, "CPython");
        assert!(interpreter.version.release()[..2] >= [3, 8][..]);
    }
    // Older interpreters are reported, not used.
    for skipped in interpreters.skipped() {
        assert!(!skipped.reason.is_empty());
    }

    let Ok(found) = interpreters.find("3.11") else {
        eprintln!("skipped the rest: no CPython 3.11 on this host");
        return;
    };
    assert_eq!(found.version.release()[..2], [3, 11]);
    assert!(interpreters.find(">=3.10,<3.13").is_ok());

    let err = interpreters.find("2.5").unwrap_err();
    assert!(
        matches!(&err, EnvError::NoMatchingInterpreter { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "Failed to find a Python interpreter matching `2.5`"
    );
    let hint = err.hint().unwrap();
    assert!(hint.contains(&found.version.to_string()), "hint `{hint}`");
}

#[tokio::test]
async fn direct_runner_passes_only_the_given_environment() {
    let invocation = UvInvocation {
        program: PathBuf::from("/usr/bin/env"),
        args: Vec::new(),
        env: vec![("ONLY".to_owned(), "this".to_owned())],
        cwd: PathBuf::from("/"),
        network: false,
        read_only: Vec::new(),
        writable: Vec::new(),
        timeout: Duration::from_secs(10),
        label: "env".to_owned(),
        role: snakebox_env::Role::Downloader,
        egress: None,
        cpu: None,
    };
    let output = DirectUvRunner.run(&invocation).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "ONLY=this");

    let sleeper = UvInvocation {
        program: PathBuf::from("/bin/sleep"),
        args: vec!["30".into()],
        timeout: Duration::from_millis(200),
        label: "sleep".to_owned(),
        ..invocation
    };
    let started = Instant::now();
    let err = DirectUvRunner.run(&sleeper).await.unwrap_err();
    assert!(matches!(err, EnvError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn six_builds_once_imports_and_is_reused() {
    let Some(uv) = uv() else { return };
    let Some(python) = python311(&uv).await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let cache = EnvCache::new(CacheConfig::new(data.path()), uv, Arc::new(DirectUvRunner)).unwrap();
    let six = reqs(&["six==1.16.0"]);

    let started = Instant::now();
    let env = cache.ensure(&python, &six).await.unwrap();
    let built = started.elapsed();
    assert!(!env.reused);
    assert!(env.root.starts_with(data.path().join("environments-v1")));
    assert_eq!(env.python, env.root.join("bin/python"));
    assert!(
        env.packages
            .iter()
            .any(|p| p.name == "six" && p.version == "1.16.0"),
        "{:?}",
        env.packages
    );
    assert!(env.root.join("snakebox-env.json").is_file());

    let output = std::process::Command::new(&env.python)
        .args(["-c", "import six, sys; print(six.__version__, sys.prefix)"])
        .env_clear()
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.trim(), format!("1.16.0 {}", env.root.display()));

    // World-readable, so an unprivileged sandbox uid can use it.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &fs_err::metadata(env.root.join("pyvenv.cfg"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o444, 0o444);

    let started = Instant::now();
    let again = cache.ensure(&python, &six).await.unwrap();
    let reused = started.elapsed();
    assert!(again.reused);
    assert_eq!(again.root, env.root);
    eprintln!("six env: built in {built:?}, reused in {reused:?}");

    let mounts = env.mounts();
    assert!(mounts.iter().all(|m| !m.writable && m.host == m.dest));
    assert!(mounts.iter().any(|m| m.host == env.root));
    assert!(mounts.iter().any(|m| m.host == python.prefix));

    let stats = cache.stats();
    assert_eq!(stats.environments, 1);
    assert!(stats.bytes > 0);
    assert_eq!(
        stats.uv_cache_dir,
        data.path().join("installs-v1").join("uv-cache")
    );
}

#[tokio::test]
async fn concurrent_ensures_of_one_key_build_once() {
    let Some(uv) = uv() else { return };
    let Some(python) = python311(&uv).await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let runner = Arc::new(CountingRunner::default());
    let cache = Arc::new(
        EnvCache::new(
            CacheConfig::new(data.path()),
            uv,
            Arc::clone(&runner) as Arc<dyn UvRunner>,
        )
        .unwrap(),
    );

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let cache = Arc::clone(&cache);
        let python = python.clone();
        tasks.spawn(async move {
            cache
                .ensure(&python, &reqs(&["six==1.16.0"]))
                .await
                .unwrap()
        });
    }
    let mut envs = Vec::new();
    while let Some(env) = tasks.join_next().await {
        envs.push(env.unwrap());
    }
    assert_eq!(runner.builds.load(Ordering::SeqCst), 1);
    assert_eq!(envs.iter().filter(|e| !e.reused).count(), 1);
    assert!(envs.iter().all(|e| e.root == envs[0].root));

    // No requirements: still a cached environment, built once.
    let bare = cache.ensure(&python, &[]).await.unwrap();
    let bare_again = cache.warm(&python, &[]).await.unwrap();
    assert!(!bare.reused && bare_again.reused);
    assert!(bare.packages.is_empty());
    assert_ne!(bare.root, envs[0].root);
    assert_eq!(runner.builds.load(Ordering::SeqCst), 2);

    // What was run: the trusted download (wheels only, no compilation: it runs no package
    // code) writes the build directory and uv's cache, for a pinned set first from the cache
    // alone (`--offline`, no network: uv's cache is empty here, so it fails) and then with
    // network; compiling runs package code, so it is a run: no network, no credentials, no
    // cache, the environment only.
    let seen = runner.seen.lock().unwrap().clone();
    let labels: Vec<&str> = seen.iter().map(|i| i.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "uv venv",
            "uv pip install --offline",
            "uv pip install",
            "compile the packages (runs their code)",
            "uv venv"
        ]
    );
    let offline = &seen[1];
    assert!(!offline.network && offline.args.iter().any(|a| a == "--offline"));
    for invocation in seen.iter().filter(|i| i.role == Role::Downloader) {
        assert_eq!(invocation.network, invocation.label == "uv pip install");
        // One mount holding the build directory and uv's cache, so that uv can hard-link.
        assert_eq!(invocation.writable, [data.path().join("installs-v1")]);
        assert!(
            invocation
                .cwd
                .starts_with(data.path().join("installs-v1/builds"))
        );
        assert!(invocation.read_only.contains(&python.prefix));
        let policy = invocation.policy();
        assert_eq!(policy.mounts.iter().filter(|m| m.writable).count(), 1);
        assert!(policy.mounts.iter().all(|m| m.host == m.dest));
        for (name, _) in &invocation.env {
            let fixed = [
                "PATH",
                "UV_CACHE_DIR",
                "UV_PYTHON_DOWNLOADS",
                "UV_NO_PROGRESS",
                "NO_COLOR",
            ];
            assert!(
                fixed.contains(&name.as_str()) || EnvVars::PASSTHROUGH.contains(&name.as_str()),
                "`{name}` reached uv"
            );
        }
    }
    let install = &seen[2];
    assert!(install.network && !install.args.iter().any(|a| a == "--offline"));
    assert!(install.args.iter().any(|a| a == "--no-build"));
    assert!(!install.args.iter().any(|a| a == "--compile-bytecode"));
    assert_eq!(install.writable.len(), 1);
    assert!(
        install.env.contains(&(
            "UV_CACHE_DIR".to_owned(),
            data.path()
                .join("installs-v1/uv-cache")
                .display()
                .to_string()
        ))
    );

    let compile = &seen[3];
    assert!(matches!(compile.role, Role::PackageCode { .. }));
    assert!(!compile.network);
    assert_eq!(compile.writable.len(), 1);
    assert!(compile.writable[0].ends_with("env"));
    assert!(
        !compile
            .read_only
            .iter()
            .any(|p| p.ends_with("uv-cache") || p.ends_with("installs-v1"))
    );
    assert!(
        compile
            .env
            .contains(&("HOME".to_owned(), "/tmp".to_owned()))
    );
    assert!(!compile.env.iter().any(|(k, _)| k.starts_with("UV_INDEX")));
    let policy = compile.policy();
    assert!(!policy.network);
    assert!(policy.limits.memory_bytes.is_some() && policy.limits.max_processes.is_some());
    assert_eq!(policy.limits.wall_time, compile.timeout);
}

#[tokio::test]
async fn installs_run_through_the_sandbox() {
    let Some(uv) = uv() else { return };
    let Some(python) = python311(&uv).await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    // The `none` backend is the one available everywhere; the policy itself is checked above.
    let sandbox = Sandbox::new(SandboxConfig {
        backend: BackendKind::None,
        bwrap_path: None,
        scratch_root: data.path().join("scratch"),
        docker_runtime: None,
    })
    .unwrap();
    let sandbox = Arc::new(sandbox);
    let cache = EnvCache::new(
        CacheConfig::new(data.path().join("data")),
        uv,
        Arc::clone(&sandbox) as Arc<dyn UvRunner>,
    )
    .unwrap();
    let env = cache
        .ensure(&python, &reqs(&["six==1.16.0"]))
        .await
        .unwrap();
    assert!(!env.reused);
    assert!(env.packages.iter().any(|p| p.name == "six"));
    let output = std::process::Command::new(&env.python)
        .args(["-c", "import six"])
        .env_clear()
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(
        cache
            .ensure(&python, &reqs(&["six==1.16.0"]))
            .await
            .unwrap()
            .reused
    );
}

#[tokio::test]
async fn an_unknown_package_is_an_install_failure_with_uv_s_message() {
    let Some(uv) = uv() else { return };
    let Some(python) = python311(&uv).await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let cache = EnvCache::new(CacheConfig::new(data.path()), uv, Arc::new(DirectUvRunner)).unwrap();

    let err = cache
        .ensure(&python, &reqs(&["snakebox-surely-no-such-package==1.0"]))
        .await
        .unwrap_err();
    let EnvError::InstallFailed { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        source.0.contains("snakebox-surely-no-such-package"),
        "uv said: {}",
        source.0
    );
    assert!(
        err.to_string()
            .ends_with("`snakebox-surely-no-such-package==1.0`")
    );
    assert!(err.hint().is_some());

    let err = cache
        .ensure(&python, &reqs(&["six==0.0.999"]))
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::InstallFailed { .. }), "{err:?}");
    eprintln!("hint for a missing version: {}", err.hint().unwrap());

    // Nothing half-built is left under a key.
    assert_eq!(cache.stats().environments, 0);
}

fn age_marker(root: &Path, key: &str, age: Duration) {
    let file = fs_err::OpenOptions::new()
        .write(true)
        .open(root.join("last-used-v1").join(key))
        .unwrap();
    file.file().set_modified(SystemTime::now() - age).unwrap();
}

#[tokio::test]
async fn prune_removes_old_then_least_recently_used_but_never_in_use() {
    let Some(uv) = uv() else { return };
    let Some(python) = python311(&uv).await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let day = Duration::from_secs(24 * 3600);
    let config = CacheConfig {
        max_age: 7 * day,
        ..CacheConfig::new(data.path())
    };
    let cache = EnvCache::new(config.clone(), uv.clone(), Arc::new(DirectUvRunner)).unwrap();

    let bare = cache.ensure(&python, &[]).await.unwrap();
    let six = cache
        .ensure(&python, &reqs(&["six==1.16.0"]))
        .await
        .unwrap();
    let (bare_key, six_key) = (bare.key.clone(), six.key.clone());
    age_marker(data.path(), &bare_key, 30 * day);
    age_marker(data.path(), &six_key, 2 * day);

    // Old but in use: kept.
    let report = cache.prune().await.unwrap();
    assert!(report.removed.is_empty(), "{report:?}");
    assert_eq!(report.skipped_in_use, 1);

    // Old and released: removed by age; the recent one stays.
    drop(bare);
    let report = cache.prune().await.unwrap();
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert_eq!(
        (report.removed[0].key.as_str(), report.removed[0].reason),
        (bare_key.as_str(), PruneReason::Age)
    );
    assert!(!data.path().join("environments-v1").join(&bare_key).exists());
    assert_eq!(report.kept, 1);

    // Over the size budget: least recently used goes first, once released.
    let bare = cache.ensure(&python, &[]).await.unwrap();
    assert!(!bare.reused);
    age_marker(data.path(), &six_key, 3 * day);
    drop(six);
    let small = EnvCache::new(
        CacheConfig {
            max_bytes: bare_bytes(&cache),
            ..config
        },
        uv,
        Arc::new(DirectUvRunner),
    )
    .unwrap();
    let report = small.prune().await.unwrap();
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert_eq!(
        (report.removed[0].key.as_str(), report.removed[0].reason),
        (six_key.as_str(), PruneReason::Size)
    );
    assert!(report.bytes_after <= report.bytes_before);
    assert!(bare.root.join("bin/python").exists());
    assert_eq!(small.stats().environments, 1);
}

/// The size of the only environment left apart from six (the bare one).
fn bare_bytes(cache: &EnvCache) -> u64 {
    let stats = cache.stats();
    assert_eq!(stats.environments, 2);
    // Generous: anything below bare + six forces exactly one removal, and six is the LRU.
    stats.bytes - 1
}

#[tokio::test]
async fn unpinned_sets_are_re_resolved_and_replaced_atomically() {
    let Some(uv) = uv() else { return };
    let Some(python) = python311(&uv).await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let config = CacheConfig {
        unpinned_freshness: Duration::ZERO,
        ..CacheConfig::new(data.path())
    };
    let cache = EnvCache::new(config, uv, Arc::new(DirectUvRunner)).unwrap();

    let loose = reqs(&["six>=1.15"]);
    let first = cache.ensure(&python, &loose).await.unwrap();
    let second = cache.ensure(&python, &loose).await.unwrap();
    assert!(
        !second.reused,
        "an unpinned set past its freshness is re-resolved"
    );
    assert_eq!(second.root, first.root);
    assert_ne!(second.build_id(), first.build_id());
    // The replaced build is still in use (`first` is alive): parked in the trash, not deleted.
    assert_eq!(
        fs_err::read_dir(data.path().join(".trash"))
            .unwrap()
            .count(),
        1
    );
    let output = std::process::Command::new(&second.python)
        .args(["-c", "import six"])
        .env_clear()
        .output()
        .unwrap();
    assert!(output.status.success());

    drop(first);
    cache.prune().await.unwrap();
    assert_eq!(
        fs_err::read_dir(data.path().join(".trash"))
            .unwrap()
            .count(),
        0
    );

    // Exact pins are reused whatever the freshness window.
    let pinned = reqs(&["six==1.16.0"]);
    cache.ensure(&python, &pinned).await.unwrap();
    assert!(cache.ensure(&python, &pinned).await.unwrap().reused);
}
