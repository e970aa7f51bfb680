//! The settings' tables: what each config file gives, and what each bad one is told.

use std::time::Duration;

use indoc::indoc;
use serde::Deserialize;

use super::*;
use super::{
    artifacts::*, cache::*, file::*, http::*, limits::*, network::*, pool::*, python::*,
    sandbox::*, server::*, sessions::*, tenants::*, values::*,
};
use crate::cli::{HttpArgs, ServerArgs};

#[test]
fn several_tenants_get_a_quarter_of_the_sessions_disk_each_unless_told() {
    let share = |total: u64, told: Option<u64>| {
        let mut engine = EngineConfig::new(PathBuf::new(), BackendKind::Native);
        engine.sessions.max_disk_bytes = total;
        engine.sessions.tenant_max_disk_bytes = told;
        several_tenants(&mut engine);
        engine.sessions.tenant_max_disk_bytes
    };
    assert_eq!(share(10 << 30, None), Some((10 << 30) / 4));
    assert_eq!(share(10 << 30, Some(1 << 30)), Some(1 << 30));
    // Never less than the smallest share, nor more than the disk.
    assert_eq!(share(64 << 20, None), Some(32 << 20));
    assert_eq!(share(16 << 20, None), Some(16 << 20));
}

#[test]
fn download_links_live_an_hour_unless_told_and_within_bounds() {
    let serving = HttpArgs {
        http: Some(String::new()),
        ..HttpArgs::default()
    };
    let ttl = |args: &HttpArgs, text: &str| {
        let file = parse_file(text).map(|mut file| std::mem::take(&mut file.http));
        resolve_http(args, file.unwrap_or_else(|err| panic!("{err:#}")), 1 << 20)
            .map(|http| http.map(|http| http.link_ttl))
    };
    assert_eq!(
        ttl(&serving, "").unwrap_or_else(|err| panic!("{err:#}")),
        Some(snakebox_http::DEFAULT_LINK_TTL)
    );
    assert_eq!(
        ttl(&serving, "[http]\nlink_ttl = 600\n").unwrap_or_else(|err| panic!("{err:#}")),
        Some(Duration::from_secs(600))
    );
    let flag = HttpArgs {
        link_ttl: Some(60),
        ..serving.clone()
    };
    assert_eq!(
        ttl(&flag, "[http]\nlink_ttl = 600\n").unwrap_or_else(|err| panic!("{err:#}")),
        Some(Duration::from_secs(60))
    );
    for bad in ["0", "99999999"] {
        let err = ttl(&serving, &format!("[http]\nlink_ttl = {bad}\n"))
            .err()
            .map(|err| format!("{err:#}"))
            .unwrap_or_default();
        assert!(err.contains("--link-ttl") && err.contains("hint:"), "{err}");
    }
}

#[test]
fn the_body_limit_is_64_mib_unless_told_and_within_bounds() {
    let serving = HttpArgs {
        http: Some(String::new()),
        ..HttpArgs::default()
    };
    let limit = |args: &HttpArgs, text: &str, script: usize| {
        let file = parse_file(text).map(|mut file| std::mem::take(&mut file.http));
        resolve_http(args, file.unwrap_or_else(|err| panic!("{err:#}")), script)
            .map(|http| http.map(|http| http.max_body_bytes))
    };
    let ok = |result: anyhow::Result<Option<usize>>| result.unwrap_or_else(|err| panic!("{err:#}"));
    assert_eq!(ok(limit(&serving, "", 1 << 20)), Some(64 << 20));
    // Twice a large script limit, when that is more.
    assert_eq!(ok(limit(&serving, "", 40 << 20)), Some(80 << 20));
    assert_eq!(
        ok(limit(
            &serving,
            "[http]\nmax_body_bytes = \"8MiB\"\n",
            1 << 20
        )),
        Some(8 << 20)
    );
    assert_eq!(
        ok(limit(
            &serving,
            "[http]\nmax_body_bytes = 1048577\n",
            1 << 20
        )),
        Some((1 << 20) + 1)
    );
    let flag = HttpArgs {
        max_body_bytes: Some("2MiB".into()),
        ..serving.clone()
    };
    assert_eq!(
        ok(limit(&flag, "[http]\nmax_body_bytes = \"8MiB\"\n", 1 << 20)),
        Some(2 << 20)
    );
    for (bad, script, says) in [
        ("\"1K\"", 1 << 20, "between 64KiB and 1GiB"),
        ("\"2GiB\"", 1 << 20, "between 64KiB and 1GiB"),
        ("\"big\"", 1 << 20, "--max-body-bytes"),
        ("\"1MiB\"", 2 << 20, "leaves no room for a script"),
    ] {
        let err = limit(
            &serving,
            &format!("[http]\nmax_body_bytes = {bad}\n"),
            script,
        )
        .err()
        .map(|err| format!("{err:#}"))
        .unwrap_or_default();
        assert!(err.contains(says) && err.contains("hint:"), "{bad}: {err}");
    }
}

/// Parse `text` as a config file and resolve it with no flags.
fn resolve_settings(text: &str) -> anyhow::Result<Settings> {
    resolve_with(&EngineArgs::default(), parse_file(text)?)
}

/// The engine's part of [`resolve_settings`].
fn resolve_text(text: &str) -> anyhow::Result<EngineConfig> {
    resolve_settings(text).map(|settings| settings.engine)
}

/// The resolved settings, comparable.
fn shown(settings: &Settings) -> String {
    format!("{settings:?}")
}

/// `name: file => |config| condition,` — the file is accepted and the condition holds.
macro_rules! accepted {
    ($($name:ident: $text:expr => |$config:ident| $check:expr,)*) => {$(
        #[test]
        fn $name() {
            let $config = match resolve_text($text) {
                Ok(config) => config,
                Err(err) => panic!("refused: {err:#}"),
            };
            assert!($check, "{:#?}", $config);
        }
    )*};
}

/// `name: file => ["part", ...],` — the file is refused and the message has every part.
macro_rules! refused {
    ($($name:ident: $text:expr => [$($part:expr),+ $(,)?],)*) => {$(
        #[test]
        fn $name() {
            let err = match resolve_text($text) {
                Ok(config) => panic!("accepted: {config:#?}"),
                Err(err) => format!("{err:#}"),
            };
            $(assert!(err.contains($part), "`{}` not in: {err}", $part);)+
        }
    )*};
}

accepted! {
    empty_file_gives_the_defaults: "" => |config| format!("{config:?}") == format!("{:?}", resolve_text("\n").unwrap())
        && config.max_timeout == Duration::from_secs(300)
        && config.warm_cache
        && config.fork_server,
    sectioned_limits: indoc! {r#"
        [limits]
        max_timeout = 120
        default_timeout = 10
        memory = "256MiB"
        processes = "unlimited"
    "#} => |config| config.max_timeout == Duration::from_secs(120)
        && config.default_timeout == Duration::from_secs(10)
        && config.memory_bytes == Some(256 << 20)
        && config.max_processes.is_none(),
    two_processes: "[limits]\nprocesses = 2\n" => |config| config.max_processes == Some(2),
    sizes_may_be_numbers: "[limits]\nmemory = 134217728\n" => |config| config.memory_bytes == Some(128 << 20),
    cores_may_be_fractions: "[limits]\ncpu_cores = 1.5\n" => |config| config.cpu_millicores == Some(1500),
    cores_may_be_whole: "[limits]\ncpu_cores = 2\n" => |config| config.cpu_millicores == Some(2000),
    sizes_and_counts_may_be_unlimited: "[limits]\nmemory = \"unlimited\"\ncpu_seconds = \"unlimited\"\n" => |config| config.memory_bytes.is_none() && config.cpu_time.is_none(),
    cores_may_be_unlimited: "[limits]\ncpu_cores = \"unlimited\"\n" => |config| config.cpu_millicores.is_none(),
    network_section: "[network]\nmode = \"on\"\n" => |config| config.network == snakebox_engine::NetworkPolicy::On,
    network_caps: "[network]\nmax_connections = 1\nmax_bytes = \"2MiB\"\nmax_connection_seconds = 5\n" => |config| config.network_proxy.caps == snakebox_sandbox::NetCaps { connections: 1, bytes: 2 << 20, connection_time: Duration::from_secs(5) },
    install_hosts: "[network]\ninstall_hosts = \"Files.Example.org., *.cdn.example.org, 198.51.100.7\"\n" => |config| config.network_proxy.install_hosts == Some(vec!["files.example.org".into(), "*.cdn.example.org".into(), "198.51.100.7".into()]),
    install_hosts_empty: "[network]\ninstall_hosts = \"\"\n" => |config| config.network_proxy.install_hosts == Some(Vec::new()),
    install_hosts_unset: "" => |config| config.network_proxy.install_hosts.is_none() && config.network_proxy.caps == snakebox_sandbox::NetCaps::default(),
    network_allowlist: "[network]\nmode = \"allow:api.example.com,*.example.com\"\nresolvers = \"198.51.100.2\"\nports = \"443\"\n" => |config| config.network == snakebox_engine::NetworkPolicy::Allow(vec!["api.example.com".into(), "*.example.com".into()]) && config.network_proxy.resolvers == vec!["198.51.100.2:53".parse().unwrap()] && config.network_proxy.ports == vec![443],
    tenants_section: "[tenants]\nmax_concurrent_runs = 2\nruns_per_minute = 60\nmax_sessions = 3\n" => |config| config.tenants.max_concurrent_runs == Some(2)
        && config.tenants.runs_per_minute == Some(60)
        && config.tenants.max_sessions == Some(3),
    no_tenant_quotas_by_default: "" => |config| config.tenants == snakebox_engine::TenantQuotas::default(),
    the_one_tenant_has_the_whole_sessions_disk: "" => |config| config.sessions.tenant_max_disk_bytes.is_none(),
    a_sessions_share: "[sessions]\nmax_disk = \"1GiB\"\n[tenants]\nsessions_max_disk = \"100MiB\"\n" => |config| config.sessions.tenant_max_disk_bytes == Some(100 << 20),
    store_budgets_by_default: "" => |config| config.store_budgets == snakebox_engine::StoreBudgets::default()
        && config.store_budgets.history.items == Some(100_000)
        && config.store_budgets.audit_bytes == 160 << 20
        && config.store_budgets.artifact_bytes == 256 << 20
        && config.store_budgets.audit_queue_bytes == 64 << 20,
    store_budgets_per_tenant: indoc! {r#"
        [server]
        audit_queue_size = "1MiB"
        [tenants]
        history_max_runs = 500
        history_max_size = "10MiB"
        audit_max_size = "2MiB"
        artifacts_max_size = 3145728
    "#} => |config| config.store_budgets.history == snakebox_engine::Budget { items: Some(500), bytes: Some(10 << 20) }
        && config.store_budgets.audit_bytes == 2 << 20
        && config.store_budgets.artifact_bytes == 3 << 20
        && config.store_budgets.audit_queue_bytes == 1 << 20,
    tenant_tables_override_the_defaults_for_one_tenant: indoc! {r#"
        [tenants]
        max_sessions = 4
        runs_per_minute = 60
        [tenants.team-a]
        max_sessions = 1
        history_max_size = "2MiB"
        profiles = ["network"]
        default_profile = "basic"
        [profiles.network]
        tenants = ["team-b"]
    "#} => |config| config.tenants.max_sessions == Some(4)
        && config.tenants.runs_per_minute == Some(60)
        && config.tenant_overrides["team-a"] == snakebox_engine::TenantOverride {
            max_sessions: Some(1),
            history_max_bytes: Some(2 << 20),
            profiles: vec!["network".into()],
            default_profile: Some("basic".into()),
            ..snakebox_engine::TenantOverride::default()
        }
        && config.profiles.all["network"].tenants == ["team-b"]
        && config.tenant_overrides.len() == 1,
    a_tenant_table_alone: "[tenants.team-b]\nmax_concurrent_runs = 1\n" => |config| config.tenants == snakebox_engine::TenantQuotas::default()
        && config.tenant_overrides["team-b"].max_concurrent_runs == Some(1),
    switches_and_booleans: indoc! {r#"
        [pool]
        fork_server = "off"
        [cache]
        no_warm = true
        allow_sdist_builds = true
    "#} => |config| !config.fork_server && !config.warm_cache && config.allow_sdist_builds,
    warm_packages: "[cache]\nwarm = [\"pandas>=2.2\", \"six\"]\n" => |config| config
        .warm_packages
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        == ["pandas>=2.2", "six"],
    flat_and_sectioned_keys_mix: indoc! {r#"
        max_timeout = 120
        [sessions]
        max_sessions = 3
    "#} => |config| config.max_timeout == Duration::from_secs(120) && config.sessions.max_sessions == 3,
    flat_key_fills_a_section_that_is_also_written: indoc! {r#"
        max_timeout = 120
        [limits]
        default_timeout = 10
    "#} => |config| config.max_timeout == Duration::from_secs(120)
        && config.default_timeout == Duration::from_secs(10),
    builtin_profiles_and_the_standard_default: "" => |config| config.profiles.default == "standard"
        && config.profiles.names() == ["basic", "data_science", "filesystem", "network", "standard"]
        && config.compat_tools.is_empty()
        && !config.infer_dependencies,
    dependencies_are_inferred_with_the_compat_tools: indoc! {r#"
        [server]
        compat_tools = true
    "#} => |config| config.infer_dependencies,
    ibms_tools_alone_run_its_basic_tier_by_default: indoc! {r#"
        [server]
        compat_tools = ["ibm"]
    "#} => |config| config.profiles.default == "basic",
    ibms_tools_with_a_profile_named_run_that_profile: indoc! {r#"
        [server]
        compat_tools = ["ibm"]
        profile = "data_science"
    "#} => |config| config.profiles.default == "data_science",
    ibms_tools_beside_another_set_keep_snakebox_s_default: indoc! {r#"
        [server]
        compat_tools = ["ibm", "python-mcp-sandbox"]
    "#} => |config| config.profiles.default == "standard",
    inferring_can_be_turned_off_with_the_compat_tools: indoc! {r#"
        [server]
        compat_tools = true
        [python]
        infer_dependencies = false
    "#} => |config| !config.infer_dependencies,
    a_package_index_mirror: indoc! {r#"
        [cache]
        index_url = "https://pypi.example.org/simple"
    "#} => |config| config.index_url.as_deref() == Some("https://pypi.example.org/simple"),
    no_index_url_by_default: "" => |config| config.index_url.is_none(),
    inferring_can_be_turned_on_alone: indoc! {r#"
        [python]
        infer_dependencies = true
    "#} => |config| config.infer_dependencies && config.compat_tools.is_empty(),
    a_profile_of_the_operators: indoc! {r#"
        [server]
        profile = "web"
        compat_tools = true
        [profiles.web]
        network = ["API.example.com."]
        subprocesses = false
        memory = "512MiB"
        timeout = 20
        packages = ["httpx"]
        tenants = ["team-a"]
    "#} => |config| {
        let web = &config.profiles.all["web"];
        config.profiles.default == "web"
            && config.compat_tools == [snakebox_engine::CompatToolSet::Ibm]
            && web.network == snakebox_engine::ProfileNetwork::Allow(vec!["api.example.com".into()])
            && !web.subprocesses
            && web.writable_work
            && web.limits.memory_bytes == Some(512 << 20)
            && web.limits.timeout_seconds == Some(20)
            && web.packages == Some(vec!["httpx".into()])
            && web.allowed_imports.is_none()
            && web.tenants == ["team-a"]
    },
    a_builtin_changed_key_by_key: "[profiles.basic]
tenants = [\"*\"]
network = \"off\"
" => |config| {
        let basic = &config.profiles.all["basic"];
        basic.tenants == ["*"] && !basic.subprocesses && basic.allowed_imports.as_ref().is_some_and(|m| m.contains(&"math".to_owned()))
    },
}

refused! {
    an_index_url_that_is_not_a_url: "[cache]\nindex_url = \"pypi mirror\"\n" => ["invalid --index-url (`[cache] index_url`)", "hint: give the index's simple API URL"],
    an_index_url_of_another_scheme: "[cache]\nindex_url = \"ftp://mirror.example/simple\"\n" => ["`ftp` is not http, https or file"],
    flat_typo_gets_a_did_you_mean: "max_timeuot = 5\n" => ["unknown key `max_timeuot`", "hint: did you mean `max_timeout`?"],
    section_typo_gets_a_did_you_mean: "[limit]\nmax_timeout = 5\n" => ["unknown key `limit`", "did you mean the section `[limits]`?"],
    key_typo_in_a_section: "[limits]\nmemroy = \"1G\"\n" => ["unknown key `memroy` in `[limits]`", "did you mean `memory`?"],
    unknown_key_in_a_section_lists_the_keys: "[pool]\nwhatever = 1\n" => ["unknown key `whatever` in `[pool]`", "`size`, `fork_server`, `preload_packages`, `prefork`"],
    flat_key_inside_its_section: "[limits]\nmemory_limit = \"1G\"\n" => ["`memory_limit`", "in a section it is `[limits] memory`"],
    key_in_the_wrong_section: "[limits]\nidle_stop = 5\n" => ["`idle_stop` in `[limits]`", "belongs in `[sessions]`"],
    sectioned_key_at_the_top: "idle_stop = 5\n" => ["unknown key `idle_stop`", "`[sessions] idle_stop`"],
    section_that_is_not_a_table: "limits = 5\n" => ["`limits` must be a section", "hint"],
    flat_and_sectioned_twins_conflict: "max_timeout = 5\n[limits]\nmax_timeout = 6\n" => ["`max_timeout` and `[limits] max_timeout`", "both are set", "hint"],
    renamed_twins_conflict: "memory_limit = \"1G\"\n[limits]\nmemory = \"2G\"\n" => ["`memory_limit` and `[limits] memory`"],
    wrong_type_in_a_section: "[limits]\nmax_timeout = \"soon\"\n" => ["`[limits] max_timeout`: invalid type: string \"soon\", expected a whole number", "hint: numbers are written bare"],
    wrong_type_flat: "warm_pool = -1\n" => ["`warm_pool` (`[pool] size`): invalid value: integer `-1`, expected a whole number", "hint: this key takes a whole number, 0 or more"],
    unknown_choice: "[network]\nmode = \"maybe\"\n" => ["maybe", "hint"],
    warm_package_that_is_no_requirement: "[cache]\nwarm = [\"pandas>=\"]\n" => ["`[cache] warm`: `pandas>=` is not a requirement", "hint: one PEP 508 requirement per entry"],
    warm_package_with_an_environment_variable: "[cache]\nwarm = [\"x @ https://h/${HOME}\"]\n" => ["`[cache] warm`", "hint"],
    too_many_warm_packages: "[cache]\nwarm = [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\",\"r\",\"s\",\"t\",\"u\",\"v\",\"w\",\"x\",\"y\",\"z\",\"aa\",\"ab\",\"ac\",\"ad\",\"ae\",\"af\",\"ag\"]\n" => ["lists 33 requirements, more than 32", "hint"],
    bad_install_host: "[network]\ninstall_hosts = \"files example\"\n" => ["--network-install-hosts", "`files example`", "hint"],
    zero_connections: "[network]\nmax_connections = 0\n" => ["--network-max-connections must be at least 1", "hint"],
    bad_network_bytes: "[network]\nmax_bytes = \"lots\"\n" => ["--network-max-bytes", "hint"],
    unknown_choice_flat: "sandbox_backend = \"podman\"\n" => ["podman"],
    bad_size_names_the_flag: "[limits]\nmemory = \"lots\"\n" => ["--memory-limit", "hint"],
    bad_size_flat: "memory_limit = \"lots\"\n" => ["--memory-limit", "hint"],
    zero_timeout: "[limits]\nmax_timeout = 0\n" => ["--max-timeout must be at least 1"],
    default_above_max: "[limits]\nmax_timeout = 10\ndefault_timeout = 20\n" => ["larger than --max-timeout", "hint"],
    not_toml: "[limits\n" => ["TOML", "limits"],
    zero_tenant_quota: "[tenants]\nmax_sessions = 0\n" => ["--tenant-max-sessions must be at least 1", "hint"],
    zero_history_runs: "[tenants]\nhistory_max_runs = 0\n" => ["--tenant-history-max-runs must be at least 1", "hint"],
    tiny_audit_budget: "[tenants]\naudit_max_size = \"1KiB\"\n" => ["--tenant-audit-max-size (`[tenants] audit_max_size`) must be at least 65536 bytes", "hint"],
    bad_artifacts_budget: "[tenants]\nartifacts_max_size = \"lots\"\n" => ["invalid --tenant-artifacts-max-size (`[tenants] artifacts_max_size`)"],
    bad_sessions_share: "[tenants]\nsessions_max_disk = \"lots\"\n" => ["invalid --tenant-sessions-max-disk (`[tenants] sessions_max_disk`)", "hint"],
    tiny_sessions_share: "[tenants]\nsessions_max_disk = \"1MiB\"\n" => ["--tenant-sessions-max-disk", "at least 32MiB", "hint"],
    share_larger_than_the_disk: "[sessions]\nmax_disk = \"1GiB\"\n[tenants]\nsessions_max_disk = \"2GiB\"\n" => ["--tenant-sessions-max-disk (`2GiB`) is larger than --sessions-max-disk", "hint: a tenant's share is a part"],
    tiny_audit_queue: "[server]\naudit_queue_size = \"64KiB\"\n" => ["--audit-queue-size (`[server] audit_queue_size`) must be at least 524288 bytes", "hint"],
    tenant_key_typo: "[tenants]\nmax_session = 2\n" => ["unknown key `max_session` in `[tenants]`", "did you mean `max_sessions`?"],
    tenant_table_key_typo: "[tenants.team-a]\nmax_session = 2\n" => ["unknown key `max_session` in `[tenants.team-a]`", "did you mean `max_sessions`?"],
    tenant_table_profile_typo: "[tenants.team-a]\ndefault_profiles = \"basic\"\n" => ["unknown key `default_profiles` in `[tenants.team-a]`", "did you mean `default_profile`?"],
    tenant_table_bad_name: "[tenants.Team-A]\nmax_sessions = 2\n" => ["invalid tenant name `[tenants.Team-A]`", "hint"],
    tenant_table_named_like_a_setting: "[tenants.max_sessions]\nmax_sessions = 2\n" => ["`max_sessions` is a setting of `[tenants]`", "hint"],
    tenant_table_zero: "[tenants.team-a]\nmax_sessions = 0\n" => ["`[tenants.team-a] max_sessions` must be at least 1", "hint"],
    tenant_table_wrong_type: "[tenants.team-a]\nmax_sessions = \"2\"\n" => ["`[tenants.team-a] max_sessions`", "hint: numbers are written bare"],
    tenant_table_bad_size: "[tenants.team-a]\naudit_max_size = \"1KiB\"\n" => ["`[tenants.team-a] audit_max_size` must be at least 65536 bytes", "hint"],
    tenant_table_share_larger_than_the_disk: "[sessions]\nmax_disk = \"1GiB\"\n[tenants.team-a]\nsessions_max_disk = \"2GiB\"\n" => ["`[tenants.team-a] sessions_max_disk`", "larger than --sessions-max-disk", "hint"],
    tenant_table_unknown_profile: "[tenants.team-a]\nprofiles = [\"nope\"]\n" => ["`[tenants.team-a] profiles` names `nope`, which is not a profile", "hint: name one of basic"],
    tenant_table_unknown_default_profile: "[tenants.team-a]\ndefault_profile = \"nope\"\n" => ["`[tenants.team-a] default_profile` names `nope`", "hint"],
    frame_limit_too_small: "[server]\nmax_frame_bytes = \"1K\"\n" => ["--max-frame-bytes must be between 64KiB and 1GiB", "hint"],
    frame_limit_not_a_size: "[server]\nmax_frame_bytes = \"big\"\n" => ["--max-frame-bytes", "hint"],
    unknown_default_profile: "[server]\nprofile = \"nope\"\n" => ["names `nope`, which is not a profile", "hint: name one of basic, data_science"],
    profile_key_typo: "[profiles.x]\nsubprocess = false\n" => ["unknown field `subprocess`"],
    profile_network_choice: "[profiles.x]\nnetwork = \"sometimes\"\n" => ["`[profiles.x] network` `sometimes`", "hint"],
    profile_memory_too_small: "[profiles.x]\nmemory = \"1MiB\"\n" => ["invalid `[profiles.x] memory`: `1MiB` is below 16MiB, too little for Python to start", "hint: give 16MiB or more"],
    profile_name: "[profiles.Big]\n" => ["invalid profile name `[profiles.Big]`", "hint"],
    one_process: "[limits]\nprocesses = 1\n" => ["invalid --max-processes (`[limits] processes`) value", "a run needs at least 2 processes", "got 1", "hint: give 2 or more"],
    profile_one_process: "[profiles.x]\nprocesses = 1\n" => ["invalid `[profiles.x] processes`", "a run needs at least 2 processes", "hint"],
    profile_no_process: "[profiles.x]\nprocesses = 0\n" => ["invalid `[profiles.x] processes`", "a run needs at least 2 processes", "got 0", "hint"],
    frame_limit_below_the_script_limit: "[server]\nmax_frame_bytes = \"1MiB\"\n[limits]\nmax_script_bytes = \"2MiB\"\n" => ["leaves no room for a script", "hint"],
}

/// A value for every flat key, each different from its default.
const SAMPLES: &[(&str, &str)] = &[
    ("data_dir", "\"/srv/snakebox\""),
    ("max_concurrent_runs", "3"),
    ("max_frame_bytes", "\"4MiB\""),
    ("python_version", "\"3.12\""),
    ("uv_path", "\"/opt/uv\""),
    ("python_downloads", "\"automatic\""),
    ("sandbox_backend", "\"none\""),
    ("bwrap_path", "\"/opt/bwrap\""),
    ("network", "\"on\""),
    ("network_resolvers", "\"198.51.100.2\""),
    ("network_ports", "\"443,8443\""),
    ("network_allow_ip_literals", "true"),
    ("network_exceptions", "\"10.20.0.0/16\""),
    ("network_install_hosts", "\"files.example.org\""),
    ("network_max_connections", "8"),
    ("network_max_bytes", "\"64MiB\""),
    ("network_max_connection_seconds", "30"),
    ("default_timeout", "7"),
    ("max_timeout", "70"),
    ("max_output_bytes", "4096"),
    ("memory_limit", "\"2GiB\""),
    ("max_processes", "64"),
    ("cpu_limit", "20"),
    ("cpu_cores", "0.5"),
    ("scratch_limit", "\"64MiB\""),
    ("max_script_bytes", "2048"),
    ("warm_pool", "5"),
    ("fork_server", "\"off\""),
    ("preload_packages", "3"),
    ("prefork", "3"),
    ("no_warm_cache", "true"),
    ("allow_sdist_builds", "true"),
    ("install_timeout", "90"),
    ("cache_max_size", "\"1GiB\""),
    ("cache_max_age_days", "3"),
    ("session_idle_stop", "60"),
    ("session_idle_delete", "600"),
    ("max_sessions", "4"),
    ("sessions_max_disk", "\"1GiB\""),
    ("session_max_interpreters", "2"),
    ("artifact_max_age_hours", "2"),
    ("artifact_max_size", "\"10MiB\""),
];

#[test]
fn every_flat_key_and_its_sectioned_twin_resolve_alike() {
    assert_eq!(SAMPLES.len(), FLAT_KEYS.len());
    let defaults = shown(&resolve_settings("").unwrap());
    for &(flat, section, name) in FLAT_KEYS {
        let value = SAMPLES
            .iter()
            .find(|(key, _)| *key == flat)
            .map(|(_, value)| *value)
            .unwrap_or_else(|| panic!("no sample for `{flat}`"));
        let flat_form = resolve_settings(&format!("{flat} = {value}\n"))
            .unwrap_or_else(|err| panic!("`{flat}` refused: {err:#}"));
        let sectioned_form = resolve_settings(&format!("[{section}]\n{name} = {value}\n"))
            .unwrap_or_else(|err| panic!("`[{section}] {name}` refused: {err:#}"));
        assert_eq!(shown(&flat_form), shown(&sectioned_form), "{flat}");
        assert_ne!(shown(&flat_form), defaults, "`{flat}` changed nothing");
        let both = resolve_text(&format!(
            "{flat} = {value}\n[{section}]\n{name} = {value}\n"
        ))
        .expect_err(flat);
        let both = format!("{both:#}");
        // `network` is also the section's name: TOML refuses the pair before we see it.
        let named = if flat == "network" {
            "`[network]` section cannot both be written".to_owned()
        } else {
            format!("`{flat}` and `[{section}] {name}`")
        };
        assert!(both.contains(&named) && both.contains("hint"), "{both}");
    }
}

#[test]
fn the_frame_limit_defaults_to_16_mib_or_twice_the_script_limit() {
    let frame = |text: &str| resolve_settings(text).unwrap().max_frame_bytes;
    assert_eq!(frame(""), 16 << 20);
    assert_eq!(frame("[limits]\nmax_script_bytes = \"12MiB\"\n"), 24 << 20);
    assert_eq!(frame("[server]\nmax_frame_bytes = \"2MiB\"\n"), 2 << 20);
}

/// The keys a section's struct reads, as serde sees them: a deserializer that only
/// records the field list it is asked for.
fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Fields<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Fields<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    fields
}

/// A key a section's struct reads but the key check does not know is refused as unknown
/// (as `[sandbox] docker_runtime` was): every field must be a known key.
#[test]
fn every_field_of_every_section_is_a_known_key() {
    let sections: [(&str, &[&str]); 12] = [
        ("server", fields_of::<ServerFile>()),
        ("python", fields_of::<PythonFile>()),
        ("sandbox", fields_of::<SandboxFile>()),
        ("network", fields_of::<NetworkFile>()),
        ("limits", fields_of::<LimitsFile>()),
        ("pool", fields_of::<PoolFile>()),
        ("cache", fields_of::<CacheFile>()),
        ("sessions", fields_of::<SessionsFile>()),
        ("artifacts", fields_of::<ArtifactsFile>()),
        ("tenants", fields_of::<TenantsFile>()),
        ("http", fields_of::<HttpFile>()),
        ("front", fields_of::<super::front::FrontFile>()),
    ];
    assert_eq!(sections.len(), SECTIONS.len());
    for (section, fields) in sections {
        assert!(!fields.is_empty(), "{section}");
        for field in fields {
            assert!(
                check_section_key(section, field).is_ok(),
                "[{section}] {field} is read but refused as unknown"
            );
        }
    }
}

#[test]
fn a_wrong_type_names_its_key_and_what_to_write() {
    let error = |text: &str| format!("{:#}", parse_file(text).unwrap_err());
    let message = error("[limits]\ndefault_timeout = \"60\"\n");
    assert!(
        message.contains(
            "`[limits] default_timeout`: invalid type: string \"60\", expected a whole number"
        ),
        "{message}"
    );
    assert!(
        message.contains("hint: numbers are written bare: `120`"),
        "{message}"
    );
    let message = error("[limits]\nmemory = 5.5\n");
    assert!(
        message.contains("`[limits] memory`: expected a whole number"),
        "{message}"
    );
    assert!(!message.contains("untagged"), "{message}");
    let message = error("[cache]\nno_warm = \"on\"\n");
    assert!(
        message.contains("hint: a switch of this key is written bare: `true` or `false`"),
        "{message}"
    );
    let message = error("[pool]\nfork_server = true\n");
    assert!(
        message.contains("`[pool] fork_server`: expected `\"on\"` or `\"off\"`"),
        "{message}"
    );
    let message = error("install_timeout = \"9\"\n");
    assert!(
        message.contains("`install_timeout` (`[cache] install_timeout`): invalid type"),
        "{message}"
    );
    let message = error("[profiles.mine]\ntimeout = \"5\"\n");
    assert!(
        message.contains("`[profiles.mine] timeout`: invalid type"),
        "{message}"
    );
    let message = error("profile = \"basic\"\n");
    assert!(
        message.contains("hint: `profile` belongs in a section: `[server] profile`"),
        "{message}"
    );
    assert!(parse_file("[sandbox]\ndocker_runtime = \"runsc\"\n").is_ok());
}

#[test]
fn sections_are_the_flat_keys_sections() {
    for &(_, section, _) in FLAT_KEYS {
        assert!(SECTIONS.contains(&section), "{section}");
    }
    for section in SECTIONS {
        assert!(
            FLAT_KEYS.iter().any(|(_, s, _)| s == section)
                || SECTION_KEYS.iter().any(|(s, _)| s == section),
            "{section}"
        );
    }
}

/// `audit --event` and `--status` list their values by hand in `--help`: every kind and
/// status the parser accepts must be among them.
#[test]
fn audit_help_lists_every_event_kind_and_status() {
    use clap::CommandFactory;
    let command = crate::cli::Cli::command();
    let audit = command
        .find_subcommand("audit")
        .expect("an audit subcommand");
    let help = |id: &str| {
        audit
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .and_then(|arg| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default()
    };
    let (events, statuses) = (help("event"), help("status"));
    for kind in snakebox_engine::EventKind::ALL {
        assert!(
            events.contains(kind.as_str()),
            "--event's help lacks {}",
            kind.as_str()
        );
    }
    for status in snakebox_engine::Status::ALL {
        assert!(
            statuses.contains(status.as_str()),
            "--status's help lacks {}",
            status.as_str()
        );
    }
}

#[test]
fn the_command_line_is_well_formed() {
    use clap::CommandFactory;
    crate::cli::Cli::command().debug_assert();
}

/// Every flag of earlier versions, with a value, as `serve`, `run` and `check` take them.
#[test]
fn every_flag_still_parses_for_every_command() {
    use crate::cli::{Cli, Command};
    use clap::Parser;
    let flags: Vec<String> = [
        "--config=/etc/snakebox.toml",
        "--python-version=3.12",
        "--sandbox-backend=none",
        "--max-timeout=70",
        "--default-timeout=7",
        "--max-output-bytes=4096",
        "--no-warm-cache",
        "--warm-pool=5",
        "--fork-server=off",
        "--preload-packages=3",
        "--prefork=3",
        "--uv-path=/opt/uv",
        "--python-downloads=automatic",
        "--bwrap-path=/opt/bwrap",
        "--data-dir=/srv/snakebox",
        "--network=on",
        "--network-resolvers=198.51.100.2",
        "--network-ports=443",
        "--network-allow-ip-literals",
        "--network-exceptions=10.20.0.0/16",
        "--network-install-hosts=files.example.org",
        "--network-max-connections=8",
        "--network-max-bytes=64MiB",
        "--network-max-connection-seconds=30",
        "--allow-sdist-builds",
        "--install-timeout=90",
        "--memory-limit=2GiB",
        "--max-processes=64",
        "--cpu-limit=20",
        "--cpu-cores=0.5",
        "--scratch-limit=64MiB",
        "--max-script-bytes=2048",
        "--cache-max-size=1GiB",
        "--cache-max-age-days=3",
        "--max-concurrent-runs=3",
        "--max-frame-bytes=4MiB",
        "--session-idle-stop=60",
        "--session-idle-delete=600",
        "--max-sessions=4",
        "--sessions-max-disk=1GiB",
        "--session-max-interpreters=2",
        "--artifact-max-age-hours=2",
        "--artifact-max-size=10MiB",
    ]
    .map(str::to_owned)
    .to_vec();
    assert_eq!(flags.len(), FLAT_KEYS.len() + 1);
    for command in [
        vec!["serve"],
        vec!["run", "x.py"],
        vec!["check"],
        vec!["python", "install", "3.14"],
        vec!["agent", "--front-public-key", "front.pub"],
    ] {
        let argv = ["snakebox"]
            .into_iter()
            .map(str::to_owned)
            .chain(command.iter().map(|word| (*word).to_owned()))
            .chain(flags.iter().cloned());
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|err| panic!("{command:?}: {err}"));
        let args = match cli.command {
            Command::Serve(serve) => serve.engine,
            Command::Agent(agent) => agent.engine,
            Command::Run(run) => run.engine,
            Command::Check(check) => check.engine,
            Command::Audit(audit) => audit.engine,
            Command::Keys(keys) => keys.action.engine().cloned().unwrap_or_default(),
            Command::Python(python) => {
                let crate::cli::PythonAction::Install { engine, .. } = python.action;
                *engine
            }
            Command::Image(_) | Command::ClientConfig(_) => {
                unreachable!("`image` and `client-config` take no engine flags")
            }
        };
        assert_eq!(
            args.python.python_downloads,
            Some(crate::cli::PythonDownloadsArg::Automatic)
        );
        assert_eq!(args.limits.memory_limit.as_deref(), Some("2GiB"));
        assert_eq!(args.sessions.max_sessions, Some(4));
        assert!(args.cache.no_warm_cache && args.cache.allow_sdist_builds);
        assert_eq!(args.network.network.as_deref(), Some("on"));
        assert_eq!(args.artifacts.artifact_max_size.as_deref(), Some("10MiB"));
    }
}

#[test]
fn sizes_parse_with_binary_units() {
    assert_eq!(parse_size("1024").unwrap(), 1024);
    assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
    assert_eq!(parse_size("2G").unwrap(), 2 << 30);
    assert!(parse_size("12 parsecs").is_err());
    assert!(parse_size("").is_err());
}

#[test]
fn cores_parse_to_millicores() {
    assert_eq!(parse_cores("1").unwrap(), Some(1000));
    assert_eq!(parse_cores("0.5").unwrap(), Some(500));
    assert_eq!(parse_cores("unlimited").unwrap(), None);
    assert!(parse_cores("0").is_err());
    assert!(parse_cores("lots").is_err());
}

#[test]
fn unlimited_means_none() {
    assert_eq!(optional("unlimited", "--x", parse_size).unwrap(), None);
    assert_eq!(optional("1G", "--x", parse_size).unwrap(), Some(1 << 30));
}

#[test]
fn edit_distance_counts_edits() {
    assert_eq!(edit_distance("max_timeout", "max_timeout"), 0);
    assert_eq!(edit_distance("max_timeuot", "max_timeout"), 2);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(closest("zzzzzz", ["max_timeout"].into_iter()), None);
}

#[test]
fn cli_wins_over_file_and_file_over_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    fs_err::write(
        &path,
        indoc! {r#"
            install_timeout = 90
            [limits]
            max_timeout = 120
            default_timeout = 10
            memory = "256MiB"
            [network]
            mode = "on"
            [pool]
            fork_server = "off"
            [cache]
            allow_sdist_builds = true
        "#},
    )
    .unwrap();
    let mut args = EngineArgs {
        config: Some(path),
        ..EngineArgs::default()
    };
    args.limits.default_timeout = Some(20);
    let config = resolve(&args).unwrap().engine;
    assert_eq!(config.max_timeout, Duration::from_secs(120));
    assert_eq!(config.default_timeout, Duration::from_secs(20));
    assert_eq!(config.memory_bytes, Some(256 << 20));
    assert_eq!(config.network, snakebox_engine::NetworkPolicy::On);
    assert!(!config.fork_server);
    assert!(config.allow_sdist_builds);
    assert_eq!(config.install_timeout, Duration::from_secs(90));
    assert_eq!(config.backend, BackendKind::Native);
    // On unless turned off; wheels only unless builds are allowed.
    let empty = dir.path().join("empty.toml");
    fs_err::write(&empty, "").unwrap();
    let args = EngineArgs {
        config: Some(empty),
        ..EngineArgs::default()
    };
    let config = resolve(&args).unwrap().engine;
    assert!(config.fork_server);
    assert!(!config.allow_sdist_builds);
    assert_eq!(
        config.install_timeout,
        snakebox_env::DEFAULT_INSTALL_TIMEOUT
    );
}

#[test]
fn errors_name_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    fs_err::write(&path, "max_timeuot = 5\n").unwrap();
    let args = EngineArgs {
        config: Some(path.clone()),
        ..EngineArgs::default()
    };
    let err = format!("{:#}", resolve(&args).unwrap_err());
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("max_timeuot") && err.contains("hint"), "{err}");
}

/// Issue 36: `--compat-tools` names the tool sets; a bare flag or `true` still means IBM's.
#[test]
fn compat_tools_name_the_tool_sets_and_true_still_means_ibm() {
    use snakebox_engine::CompatToolSet::{CodeExecutor, Ibm, PythonMcpSandbox};
    for (text, expected) in [
        ("true", vec![Ibm]),
        ("1", vec![Ibm]),
        ("", vec![Ibm]),
        ("false", vec![]),
        ("0", vec![]),
        ("ibm", vec![Ibm]),
        ("python-mcp-sandbox", vec![PythonMcpSandbox]),
        (
            "code-executor, python_mcp_sandbox",
            vec![PythonMcpSandbox, CodeExecutor],
        ),
        ("ibm,python-mcp-sandbox,ibm", vec![Ibm, PythonMcpSandbox]),
    ] {
        assert_eq!(parse_compat_tools(text).unwrap(), expected, "{text:?}");
    }
    let unknown = format!("{:#}", parse_compat_tools("ibm,mcp-sandbox").unwrap_err());
    assert!(
        unknown.contains("unknown tool set `mcp-sandbox`"),
        "{unknown}"
    );
    assert!(
        unknown.contains("hint: the tool sets are ibm, python-mcp-sandbox, code-executor"),
        "{unknown}"
    );
    let both = format!("{:#}", parse_compat_tools("ibm,code-executor").unwrap_err());
    assert!(
        both.contains("get_sandbox_info") && both.contains("hint: serve one of them"),
        "{both}"
    );

    // The config file takes a switch, a string or a list; the command line wins over it.
    let file_sets = |text: &str, flag: Option<&str>| {
        let file = parse_file(text).map(|mut file| std::mem::take(&mut file.server));
        let args = ServerArgs {
            compat_tools: flag.map(str::to_owned),
            ..ServerArgs::default()
        };
        let mut config = EngineConfig::new(PathBuf::new(), BackendKind::Native);
        resolve_server(
            &args,
            file.unwrap_or_else(|err| panic!("{err:#}")),
            &mut config,
        )
        .map(|()| config.compat_tools)
    };
    assert_eq!(
        file_sets("[server]\ncompat_tools = true", None).unwrap(),
        [Ibm]
    );
    assert_eq!(
        file_sets(
            "[server]\ncompat_tools = \"python-mcp-sandbox,code-executor\"",
            None
        )
        .unwrap(),
        [PythonMcpSandbox, CodeExecutor]
    );
    assert_eq!(
        file_sets("[server]\ncompat_tools = [\"code-executor\"]", None).unwrap(),
        [CodeExecutor]
    );
    assert_eq!(
        file_sets("[server]\ncompat_tools = true", Some("false")).unwrap(),
        []
    );
    let error = format!(
        "{:#}",
        file_sets("[server]\ncompat_tools = [\"nope\"]", None).unwrap_err()
    );
    assert!(
        error.contains("`[server] compat_tools`") && error.contains("unknown tool set `nope`"),
        "{error}"
    );
}

/// Issue 36: the directories uploads may read are absolute, existing directories, kept
/// canonical; none by default.
#[test]
fn upload_dirs_are_canonical_existing_directories() {
    assert_eq!(resolve_upload_dirs(&[]).unwrap(), Vec::<PathBuf>::new());
    let root = std::env::temp_dir().join(format!("snakebox-upload-dirs-{}", std::process::id()));
    fs_err::create_dir_all(root.join("real")).unwrap();
    fs_err::write(root.join("file"), "x").unwrap();
    let _ = fs_err::remove_file(root.join("link"));
    std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
    let canonical = fs_err::canonicalize(root.join("real")).unwrap();
    assert_eq!(
        resolve_upload_dirs(&[root.join("link"), root.join("real")]).unwrap(),
        [canonical]
    );
    for (dir, expected) in [
        (PathBuf::from("relative/dir"), "needs absolute paths"),
        (root.join("missing"), "cannot be resolved"),
        (root.join("file"), "not a directory"),
    ] {
        let error = format!(
            "{:#}",
            resolve_upload_dirs(std::slice::from_ref(&dir)).unwrap_err()
        );
        assert!(
            error.contains(expected) && error.contains("hint:"),
            "{dir:?}: {error}"
        );
    }
    let _ = fs_err::remove_dir_all(&root);
}
