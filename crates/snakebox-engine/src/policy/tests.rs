//! The table of [`CallPolicy::decide`]: one row per rule and kind of call, each the inputs
//! (the kind, the server's settings, the tenant, what the call asked for) and what was
//! decided (summarised on one line) or the refusal (its message, its hint, and whether it is
//! the profile's).

use std::time::Duration;

use snakebox_sandbox::{BackendKind, Names};

use super::{Asked, CallKind, CallPolicy, Refusal, SessionFacts};
use crate::{EngineConfig, NetworkPolicy, Profile, ProfileLimits, Tenant};

/// The server of the rows: the defaults (network off, 30 s by default, 300 s at most,
/// 1 GiB), a CPU-time limit of 60 s, install steps of at most 450 s, and a profile `quick`
/// of at most 5 s.
fn server(network: NetworkPolicy) -> EngineConfig {
    let mut server = EngineConfig::new("/nonexistent".into(), BackendKind::None);
    server.network = network;
    server.cpu_time = Some(Duration::from_secs(60));
    server.install_timeout = Duration::from_secs(450);
    let mut quick = Profile::unrestricted("quick", "calls of at most 5 seconds");
    quick.limits = ProfileLimits {
        timeout_seconds: Some(5),
        ..ProfileLimits::default()
    };
    server.profiles.all.insert(quick.name.clone(), quick);
    server
}

fn tenant(server: &EngineConfig, name: &str) -> Tenant {
    let caller = crate::Caller::tenant(name).unwrap_or_else(|_| crate::Caller::local());
    Tenant {
        name: name.to_owned(),
        max_concurrent_runs: None,
        runs_per_minute: None,
        max_sessions: None,
        history_max_runs: None,
        history_max_bytes: None,
        audit_max_bytes: 0,
        artifacts_max_bytes: 0,
        sessions_max_disk_bytes: None,
        profiles: server.profiles.names(),
        default_profile: server.profiles.default_for(&caller).to_owned(),
    }
}

/// A session created under `profile`, with or without network.
fn session(profile: &str, network: bool) -> SessionFacts {
    SessionFacts {
        id: "s1".into(),
        profile: profile.into(),
        network,
        network_names: Vec::new(),
        python_version: "3.12.4".into(),
        packages: Vec::new(),
    }
}

/// What was decided, on one line: profile, timeout, memory, CPU time, processes, network,
/// exec, `/work`, imports (how many modules), notes.
fn summary(policy: &CallPolicy) -> String {
    let limits = &policy.shape.limits;
    let mib = |bytes: Option<u64>| bytes.map_or("-".to_owned(), |b| format!("{}M", b >> 20));
    let network = match &policy.network {
        None => "off".to_owned(),
        Some(Names::Any) => "any".to_owned(),
        Some(Names::Only(names)) => names.join(","),
    };
    let mut line = format!(
        "{} {}s mem={} cpu={} procs={} net={} exec={} work={} imports={}",
        policy.profile,
        limits.wall_time.as_secs(),
        mib(limits.memory_bytes),
        limits
            .cpu_time
            .map_or("-".to_owned(), |t| format!("{}s", t.as_secs())),
        limits
            .max_processes
            .map_or("-".to_owned(), |p| p.to_string()),
        network,
        if policy.shape.deny_exec {
            "deny"
        } else {
            "allow"
        },
        if policy.shape.writable_work {
            "rw"
        } else {
            "ro"
        },
        policy
            .imports
            .as_ref()
            .map_or("-".to_owned(), |list| list.join(",")),
    );
    for note in &policy.notes {
        line.push_str(" | ");
        line.push_str(note);
    }
    line
}

/// A refusal, on one line: whose (`profile NAME` or `server`), the message, the hint.
fn refusal(refusal: &Refusal) -> String {
    format!(
        "{}: {} (hint: {})",
        refusal
            .profile
            .as_ref()
            .map_or("server".to_owned(), |p| format!("profile {p}")),
        refusal.error.message,
        refusal.error.hint.as_deref().unwrap_or("-"),
    )
}

/// What a request asks for, owned (a row's input).
#[derive(Default)]
struct Ask {
    timeout: Option<f64>,
    memory_mib: Option<u64>,
    profile: Option<&'static str>,
    network: Option<bool>,
    domains: Vec<String>,
    imports: Option<Vec<String>>,
    python: Option<&'static str>,
    packages: Vec<&'static str>,
}

/// Decide a row: `kind` is `run`, `cell`, `command`, `interpreter`, `session_start`,
/// `compile`, `session_install` or `build`; a session's calls are in `session`.
fn decide(
    kind: &str,
    session: &SessionFacts,
    server: &EngineConfig,
    tenant_name: &str,
    ask: &Ask,
) -> Result<String, String> {
    let kind = match kind {
        "run" => CallKind::Run,
        "cell" => CallKind::Cell(session),
        "command" => CallKind::Command(session),
        "interpreter" => CallKind::Interpreter(session),
        "session_start" => CallKind::SessionStart,
        "compile" => CallKind::Compile,
        "session_install" => CallKind::SessionInstall(session),
        "build" => CallKind::Build,
        other => panic!("no kind `{other}`"),
    };
    let requirements: Vec<pep508_rs::Requirement> = ask
        .packages
        .iter()
        .map(|spec| spec.parse().expect("a requirement"))
        .collect();
    let asked = Asked {
        timeout_seconds: ask.timeout,
        memory_limit_bytes: ask.memory_mib.map(|mib| mib << 20),
        profile: ask.profile,
        network: ask.network,
        allowed_domains: &ask.domains,
        allowed_imports: ask.imports.as_deref(),
        python_version: ask.python,
        requirements: &requirements,
        script: "",
        secrets: &[],
    };
    CallPolicy::decide(server, kind, &tenant(server, tenant_name), &asked)
        .map(|policy| summary(&policy))
        .map_err(|refused| refusal(&refused))
}

/// One `#[test]` per row: `name: kind, session profile, server network, ask => expected`,
/// where the expected is `Ok(summary)` (exact) or `Err(fragment)` (a part of the refusal).
macro_rules! rows {
    ($($name:ident: $kind:literal $(in $session:expr)?, $network:expr, $(tenant $tenant:literal,)? { $($field:ident: $value:expr),* $(,)? } => $expected:expr;)*) => {
        $(
            #[test]
            fn $name() {
                #[allow(unused_mut, unused_assignments)]
                let mut facts = session("standard", false);
                $(facts = $session;)?
                #[allow(unused_mut, unused_assignments)]
                let mut tenant_name = crate::LOCAL_TENANT;
                $(tenant_name = $tenant;)?
                let ask = Ask { $($field: $value,)* ..Ask::default() };
                let got = decide($kind, &facts, &server($network), tenant_name, &ask);
                let expected: Result<&str, &str> = $expected;
                match (&got, expected) {
                    (Ok(got), Ok(expected)) => assert_eq!(got, expected),
                    (Err(got), Err(fragment)) => assert!(
                        got.contains(fragment),
                        "refusal `{got}` does not contain `{fragment}`"
                    ),
                    _ => panic!("got {got:?}, expected {expected:?}"),
                }
            }
        )*
    };
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

const OFF: NetworkPolicy = NetworkPolicy::Off;
const ON: NetworkPolicy = NetworkPolicy::On;

rows! {
    // One-shot runs: the whole request applies.
    run_takes_the_servers_defaults: "run", OFF, {} =>
        Ok("standard 30s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports=-");
    run_rounds_a_fraction_up_with_a_note: "run", OFF, { timeout: Some(2.5) } =>
        Ok("standard 3s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports=- | timeout_seconds 2.5 was rounded up to 3 (limits are whole seconds)");
    run_clamps_to_the_servers_maximum_with_a_note: "run", OFF, { timeout: Some(1000.0) } =>
        Ok("standard 300s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports=- | timeout_seconds 1000 is above this server's maximum; 300 was used");
    run_refuses_less_than_a_second: "run", OFF, { timeout: Some(0.0) } =>
        Err("server: timeout_seconds must be at least 1, got `0` (hint: pass a whole number of seconds between 1 and 300)");
    run_refuses_a_timeout_that_is_not_a_number: "run", OFF, { timeout: Some(f64::NAN) } =>
        Err("server: timeout_seconds must be at least 1");
    run_under_basic_is_held_to_it: "run", OFF, { profile: Some("basic"), imports: Some(strings(&["math"])) } =>
        Ok("basic 30s mem=256M cpu=60s procs=64 net=off exec=deny work=ro imports=math");
    run_gets_its_profiles_shorter_time: "run", OFF, { profile: Some("quick") } =>
        Ok("quick 5s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports=-");
    run_refuses_more_time_than_its_profile: "run", OFF, { profile: Some("quick"), timeout: Some(30.0) } =>
        Err("profile quick: timeout_seconds 30 is above the profile `quick`'s limit of 5 s (hint: ask for at most 5 seconds");
    run_narrows_memory: "run", OFF, { memory_mib: Some(128) } =>
        Ok("standard 30s mem=128M cpu=60s procs=128 net=off exec=allow work=rw imports=-");
    run_refuses_too_little_memory: "run", OFF, { memory_mib: Some(8) } =>
        Err("profile standard: memory_limit 8 MiB is too small to start Python (hint: ask for at least 16 MiB)");
    run_refuses_more_memory_than_its_profile: "run", OFF, { profile: Some("basic"), memory_mib: Some(512) } =>
        Err("profile basic: memory_limit 512 MiB is above the profile `basic`'s limit of 256 MiB");
    run_refuses_network_the_server_does_not_allow: "run", OFF, { network: Some(true) } =>
        Err("profile standard: This call asked for network access, but this server does not allow network for runs");
    run_gets_the_servers_network: "run", ON, {} =>
        Ok("standard 30s mem=1024M cpu=60s procs=128 net=any exec=allow work=rw imports=-");
    run_declines_the_network: "run", ON, { network: Some(false) } =>
        Ok("standard 30s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports=-");
    run_narrows_the_network: "run", ON, { domains: strings(&["API.example.com."]) } =>
        Ok("standard 30s mem=1024M cpu=60s procs=128 net=api.example.com exec=allow work=rw imports=-");
    run_refuses_network_its_profile_denies: "run", ON, { profile: Some("basic"), network: Some(true) } =>
        Err("profile basic: This call asked for network access, but the profile `basic` allows no network");
    run_refuses_imports_wider_than_its_profile: "run", OFF, { profile: Some("basic"), imports: Some(strings(&["socket"])) } =>
        Err("profile basic: allowed_imports asks for `socket` which the profile `basic` does not allow");
    run_refuses_a_malformed_module_name: "run", OFF, { imports: Some(strings(&["os-path"])) } =>
        Err("server: `os-path` in allowed_imports is not a module name");
    run_refuses_packages_its_profile_does_not_allow: "run", OFF, { profile: Some("basic"), packages: vec!["numpy>=2"] } =>
        Err("profile basic: The profile `basic` does not allow installing `numpy`");
    run_refuses_an_unknown_profile: "run", OFF, { profile: Some("nope") } =>
        Err("profile nope: There is no profile `nope` on this server");
    run_refuses_a_profile_not_granted_to_its_tenant: "run", OFF, tenant "acme", { profile: Some("basic") } =>
        Err("profile basic: The profile `basic` is not allowed for tenant `acme`");

    // A session's cells: the session's profile, limits, network and imports; the time is the
    // call's own.
    cell_keeps_its_sessions_limits_without_cpu_time: "cell", OFF, {} =>
        Ok("standard 30s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=-");
    cell_under_basic_gets_its_profile: "cell" in session("basic", false), OFF, {} =>
        Ok(&*BASIC_CELL);
    cell_refuses_memory_limit: "cell", OFF, { memory_mib: Some(128) } =>
        Err("server: `profile` and `memory_limit` apply to one-shot runs, not to a session's cells");
    cell_refuses_a_profile: "cell", OFF, { profile: Some("basic") } =>
        Err("server: `profile` and `memory_limit` apply to one-shot runs, not to a session's cells");
    cell_refuses_allowed_domains: "cell", ON, { domains: strings(&["example.com"]) } =>
        Err("server: allowed_domains cannot be used with a session: session s1's network policy was fixed when it was created");
    cell_refuses_allowed_imports: "cell", OFF, { imports: Some(strings(&["math"])) } =>
        Err("server: allowed_imports cannot be used with a session yet");
    cell_rounds_a_fraction_up_with_a_note: "cell", OFF, { timeout: Some(2.5) } =>
        Ok("standard 3s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=- | timeout_seconds 2.5 was rounded up to 3 (limits are whole seconds)");
    cell_refuses_more_time_than_its_profile: "cell" in session("quick", false), OFF, { timeout: Some(30.0) } =>
        Err("profile quick: timeout_seconds 30 is above the profile `quick`'s limit of 5 s");
    cell_refuses_network_its_session_lacks: "cell", ON, { network: Some(true) } =>
        Err("server: This call asked for network access, but session s1 was created without network");
    cell_refuses_declining_its_sessions_network: "cell" in session("standard", true), ON, { network: Some(false) } =>
        Err("server: This call asked to run without network, but session s1 was created with network");
    cell_has_its_sessions_network: "cell" in session("standard", true), ON, { network: Some(true) } =>
        Ok("standard 30s mem=1024M cpu=- procs=128 net=any exec=allow work=rw imports=-");
    cell_notes_a_network_the_server_took_away: "cell" in session("standard", true), OFF, {} =>
        Ok("standard 30s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=- | session s1 was created with network, but this server does not allow network now: its code runs without");
    cell_notes_an_ignored_python_version: "cell", OFF, { python: Some("3.11") } =>
        Ok("standard 30s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=- | python_version `3.11` is ignored: session s1 runs Python 3.12.4");
    cell_refuses_packages_its_profile_does_not_allow: "cell" in session("basic", false), OFF, { packages: vec!["numpy"] } =>
        Err("profile basic: The profile `basic` does not allow installing `numpy`");
    cell_refuses_when_its_profile_is_gone: "cell" in session("removed", false), OFF, {} =>
        Err("server: The session's profile `removed` is no longer on this server");

    // A session's commands: the interpreter's view and limits, the time its own.
    command_refuses_more_time_than_its_profile: "command" in session("quick", false), OFF, { timeout: Some(30.0) } =>
        Err("profile quick: timeout_seconds 30 is above the profile `quick`'s limit of 5 s");
    command_gets_its_profiles_time_by_default: "command" in session("quick", false), OFF, {} =>
        Ok("quick 5s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=-");
    command_rounds_a_fraction_up_with_a_note: "command", OFF, { timeout: Some(2.5) } =>
        Ok("standard 3s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=- | timeout_seconds 2.5 was rounded up to 3 (limits are whole seconds)");
    command_clamps_to_the_servers_maximum_with_a_note: "command", OFF, { timeout: Some(1000.0) } =>
        Ok("standard 300s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=- | timeout_seconds 1000 is above this server's maximum; 300 was used");
    command_refuses_under_a_profile_without_subprocesses: "command" in session("basic", false), OFF, {} =>
        Err("profile basic: run_command cannot be used in session s1: its profile `basic` denies subprocesses");
    command_has_its_sessions_network: "command" in session("standard", true), ON, {} =>
        Ok("standard 30s mem=1024M cpu=- procs=128 net=any exec=allow work=rw imports=-");

    // A session's interpreter: alive across calls, the server's maximum (or its profile's).
    interpreter_lives_for_the_servers_maximum: "interpreter", OFF, {} =>
        Ok("standard 300s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=-");
    interpreter_is_held_to_its_profile: "interpreter" in session("quick", false), OFF, {} =>
        Ok("quick 5s mem=1024M cpu=- procs=128 net=off exec=allow work=rw imports=-");

    // A session's start: its network, fixed for its life, and its packages.
    session_start_narrows_the_network: "session_start", ON, { domains: strings(&["*.example.com"]) } =>
        Ok("standard 300s mem=1024M cpu=60s procs=128 net=*.example.com exec=allow work=rw imports=-");
    session_start_refuses_network_its_profile_denies: "session_start", ON, { profile: Some("basic"), network: Some(true) } =>
        Err("profile basic: This session asked for network access, but the profile `basic` allows no network");
    session_start_refuses_packages_its_profile_does_not_allow: "session_start", OFF, { profile: Some("basic"), packages: vec!["pandas"] } =>
        Err("profile basic: The profile `basic` does not allow installing `pandas`");

    // Validation's compile: the server's limits for 15 s, no network, the run's imports.
    compile_runs_under_the_servers_limits: "compile", ON, { profile: Some("basic") } =>
        Ok(&*BASIC_COMPILE);
    compile_holds_imports_to_the_profile: "compile", OFF, { profile: Some("basic"), imports: Some(strings(&["socket"])) } =>
        Err("profile basic: allowed_imports asks for `socket` which the profile `basic` does not allow");
    compile_refuses_a_malformed_module_name: "compile", OFF, { imports: Some(strings(&["not a module"])) } =>
        Err("server: `not a module` in allowed_imports is not a module name");

    // Installs: the session's package allowlist; package code under the server's limits.
    session_install_refuses_packages_its_profile_does_not_allow: "session_install" in session("data_science", false), OFF, { packages: vec!["requests"] } =>
        Err("profile data_science: The profile `data_science` does not allow installing `requests`");
    session_install_steps_get_the_install_timeout: "session_install" in session("data_science", false), OFF, { packages: vec!["numpy"] } =>
        Ok("data_science 450s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports=-");
    build_steps_get_the_install_timeout: "build", ON, {} =>
        Ok(" 450s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports=-");
}

/// The `basic` profile's modules, as a summary lists them.
fn basic_modules() -> String {
    crate::builtin_profiles()
        .into_iter()
        .find(|p| p.name == "basic")
        .and_then(|p| p.allowed_imports)
        .unwrap_or_default()
        .join(",")
}

static BASIC_CELL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "basic 30s mem=256M cpu=- procs=64 net=off exec=deny work=ro imports={}",
        basic_modules()
    )
});

static BASIC_COMPILE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "basic 15s mem=1024M cpu=60s procs=128 net=off exec=allow work=rw imports={}",
        basic_modules()
    )
});

#[test]
fn every_kind_of_call_of_a_session_is_held_to_the_same_profile_timeout_rule() {
    // The divergence of issue 34: a command clamped what a cell refused.
    let server = server(OFF);
    let facts = session("quick", false);
    let asked = Asked {
        timeout_seconds: Some(30.0),
        ..Asked::default()
    };
    for kind in [
        CallKind::Run,
        CallKind::Cell(&facts),
        CallKind::Command(&facts),
    ] {
        let asked = Asked {
            profile: (kind == CallKind::Run).then_some("quick"),
            ..asked
        };
        let refused = CallPolicy::decide(&server, kind, &tenant(&server, "local"), &asked)
            .expect_err("more than the profile allows");
        assert_eq!(refused.profile.as_deref(), Some("quick"), "{kind:?}");
        assert!(refused.error.message.contains("limit of 5 s"), "{kind:?}");
    }
}

/// Dependencies inferred from imports (`--infer-dependencies`): only where the server infers
/// them, for the calls that run a script (a run, a cell), only what the profile allows and the
/// import policy lets in, and not what is declared or installed in the session already.
#[test]
fn inferred_dependencies_follow_the_server_the_kind_the_profile_and_what_is_there() {
    let script = "import numpy as np\nimport pandas\nfrom sklearn import svm\n";
    let infer = |kind: &str,
                 profile: Option<&str>,
                 declared: &[&str],
                 imports: Option<&[&str]>,
                 on: bool,
                 installed: &[&str]| {
        let mut server = server(NetworkPolicy::Off);
        server.infer_dependencies = on;
        let mut facts = session(profile.unwrap_or("standard"), false);
        facts.packages = strings(installed);
        let kind = match kind {
            "run" => CallKind::Run,
            "cell" => CallKind::Cell(&facts),
            "command" => CallKind::Command(&facts),
            other => panic!("no kind `{other}`"),
        };
        let requirements: Vec<pep508_rs::Requirement> = declared
            .iter()
            .map(|spec| spec.parse().expect("a requirement"))
            .collect();
        let imports = imports.map(strings);
        let asked = Asked {
            profile: if kind == CallKind::Run { profile } else { None },
            allowed_imports: imports.as_deref(),
            requirements: &requirements,
            script,
            ..Asked::default()
        };
        let policy =
            CallPolicy::decide(&server, kind, &tenant(&server, crate::LOCAL_TENANT), &asked)
                .map_err(|refused| refusal(&refused))
                .expect("decided");
        let added: Vec<String> = policy.inferred.iter().map(ToString::to_string).collect();
        let notes = policy
            .notes
            .iter()
            .filter(|n| n.contains("infers dependencies"))
            .count();
        assert_eq!(notes, added.len(), "a note per package: {:?}", policy.notes);
        added
    };
    assert_eq!(
        infer("run", None, &[], None, true, &[]),
        ["numpy", "pandas", "scikit-learn"]
    );
    assert!(
        infer("run", None, &[], None, false, &[]).is_empty(),
        "off by default"
    );
    assert_eq!(
        infer("run", None, &["numpy>=2"], None, true, &[]),
        ["pandas", "scikit-learn"]
    );
    assert!(
        infer("run", Some("basic"), &[], None, true, &[]).is_empty(),
        "basic allows no packages"
    );
    assert_eq!(
        infer("run", None, &[], Some(&["numpy", "pandas"]), true, &[]),
        ["numpy", "pandas"],
        "an import the policy refuses gets no package"
    );
    assert_eq!(
        infer("cell", None, &[], None, true, &["numpy", "Scikit_Learn"]),
        ["pandas"]
    );
    assert!(
        infer("command", None, &[], None, true, &[]).is_empty(),
        "a command runs no script"
    );
}
