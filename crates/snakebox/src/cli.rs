//! Command-line definitions (clap). Plain data: no logic lives here; `settings` resolves it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Run Python for AI agents in sandboxes: an MCP server.
#[derive(Debug, Parser)]
#[command(name = "snakebox", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve MCP over stdio (for Claude Code, Claude Desktop, Cursor, Codex, ...), or over
    /// HTTP with `--http` (streamable HTTP at /mcp, API keys for tenants).
    Serve(ServeArgs),
    /// Serve the engine to fronts over an internal HTTP API (issue 35): a host of a
    /// deployment whose fronts (`snakebox serve --agents URL,…`) hold the MCP and HTTP faces.
    /// Only calls signed with the front's key (`--front-public-key`) are answered.
    Agent(AgentArgs),
    /// Manage the API keys of the HTTP face: each key names a tenant.
    Keys(KeysArgs),
    /// Run a script through the same engine and print its output (exit code passed through).
    Run(RunArgs),
    /// Report what `check_environment` reports, with a fix for anything missing.
    Check(CheckArgs),
    /// Query the audit log: every call (who, what code by hash, how it ended, what was
    /// stopped or refused), oldest first.
    Audit(AuditArgs),
    /// Manage the Python interpreters snakebox can use.
    Python(PythonCommandArgs),
    /// The docker backend's run image (built locally: no registry needed).
    Image(ImageArgs),
    /// Print what an agent's client needs to use snakebox: the command to run or the file
    /// snippet, with this binary's absolute path (stdio) or a server's URL (`--http`).
    ClientConfig(ClientConfigArgs),
}

/// Arguments of `snakebox client-config`.
#[derive(Debug, Args)]
pub struct ClientConfigArgs {
    /// The client: claude-code, gemini, codex, cursor, vscode or claude-desktop.
    pub client: String,
    /// A running `snakebox serve --http` to connect to (its base URL, e.g.
    /// `https://sb.example.com`) instead of starting this binary over stdio.
    #[arg(long, value_name = "URL")]
    pub http: Option<String>,
    /// The API key the client sends (`snakebox keys add --tenant NAME` makes one); without
    /// it, a placeholder is printed to replace.
    #[arg(long, value_name = "KEY", requires = "http", conflicts_with = "no_key")]
    pub key: Option<String>,
    /// The server needs no key (started with `--insecure-no-auth`).
    #[arg(long, requires = "http")]
    pub no_key: bool,
}

/// Arguments of `snakebox python`.
#[derive(Debug, Args)]
pub struct PythonCommandArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: PythonAction,
}

/// `snakebox python install`.
#[derive(Debug, Subcommand)]
pub enum PythonAction {
    /// Download a CPython version with uv (from python-build-standalone, or
    /// UV_PYTHON_INSTALL_MIRROR) into uv's Python directory, where the server finds it.
    Install {
        /// The version, e.g. `3.14` or `3.12.7`.
        version: String,
        #[command(flatten)]
        engine: Box<EngineArgs>,
    },
}

/// Arguments of `snakebox image`.
#[derive(Debug, Args)]
pub struct ImageArgs {
    /// What to do with the image.
    #[command(subcommand)]
    pub action: ImageAction,
}

/// `snakebox image build | status`, against the engine at `DOCKER_HOST` (a `unix://`
/// socket) or /var/run/docker.sock.
#[derive(Debug, Subcommand)]
pub enum ImageAction {
    /// Build this host's run image into the engine (nothing to do when it is there). Its tag
    /// names its content: `snakebox-run:<hash>`.
    Build,
    /// Say whether this host's run image is in the engine (exit code 1 when it is not).
    Status,
}

/// Arguments of `snakebox serve`.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    #[command(flatten, next_help_heading = "HTTP")]
    pub http: HttpArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten, next_help_heading = "Engine agents")]
    pub front: FrontArgs,
}

/// A front's engine agents: where its faces' calls run, when not in this process.
#[derive(Debug, Clone, Default, Args)]
pub struct FrontArgs {
    /// Run every call on these engine agents (`snakebox agent`) instead of in this process:
    /// `[NAME=]http://HOST:PORT`, comma-separated or repeated. NAME is the agent's `--name`
    /// [default: the URL's HOST:PORT]. One-shot runs and new sessions take turns over them; a
    /// session stays on the agent that made it. Needs --front-key (`[front] agents`: a list).
    #[arg(
        long = "agents",
        env = "SNAKEBOX_AGENTS",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub agents: Vec<String>,
    /// The front's private key, which signs every call to the agents (`front.key` of
    /// `snakebox keys front-keypair`; mode 0600) (`[front] front_key`).
    #[arg(long, env = "SNAKEBOX_FRONT_KEY", value_name = "FILE")]
    pub front_key: Option<PathBuf>,
    /// Where the agents are: `static` (the --agents list) or `kubernetes` (an agent-sandbox
    /// claim per session and per tenant's one-shot runs, in --namespace; docs: Running on
    /// Kubernetes) [default: static when --agents is given] (`[front] directory`).
    #[arg(long, env = "SNAKEBOX_DIRECTORY", value_name = "KIND")]
    pub directory: Option<String>,
    /// The namespace of the claims and warm pools [default: the kubeconfig's, or the
    /// front pod's own] (`[front] namespace`).
    #[arg(long, env = "SNAKEBOX_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,
    /// The port the agents listen on in their pods [default: 8700] (`[front] agent_port`).
    #[arg(long, env = "SNAKEBOX_AGENT_PORT", value_name = "PORT")]
    pub agent_port: Option<u16>,
    /// Seconds a claim may take to become Ready before the call that needs it fails
    /// [default: 60] (`[front] claim_ready_timeout`).
    #[arg(long, env = "SNAKEBOX_CLAIM_READY_TIMEOUT", value_name = "S")]
    pub claim_ready_timeout: Option<u64>,
    /// Seconds without a one-shot run after which a tenant's runner claim is deleted
    /// [default: 900] (`[front] runner_idle_ttl`).
    #[arg(long, env = "SNAKEBOX_RUNNER_IDLE_TTL", value_name = "S")]
    pub runner_idle_ttl: Option<u64>,
    /// Seconds a claim lives at most (its `lifecycle.shutdownTime`) [default: 86400]
    /// (`[front] claim_max_age`).
    #[arg(long, env = "SNAKEBOX_CLAIM_MAX_AGE", value_name = "S")]
    pub claim_max_age: Option<u64>,
}

/// Arguments of `snakebox agent`.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Where the internal API listens [default: 127.0.0.1:8700]. Make it reachable by the
    /// fronts only (SECURITY.md).
    #[arg(long, env = "SNAKEBOX_AGENT_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The front's public key (`front.pub` of `snakebox keys front-keypair`): only calls
    /// signed with its private half are answered.
    #[arg(long, env = "SNAKEBOX_FRONT_PUBLIC_KEY", value_name = "FILE")]
    pub front_public_key: PathBuf,
    /// This agent's name: fronts sign each call for it (`--agents NAME=URL`) [default: the
    /// --listen address as written, which is what a front derives from the URL
    /// http://ADDR].
    #[arg(long, env = "SNAKEBOX_AGENT_NAME", value_name = "NAME")]
    pub name: Option<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The HTTP face (`[http]`): where it listens and who may reach it.
#[derive(Debug, Clone, Default, Args)]
pub struct HttpArgs {
    /// Serve MCP over HTTP instead of stdio, on ADDR [default: 127.0.0.1:8000, or `[http]
    /// addr`]. Without API keys only a loopback address is served (see `snakebox keys`).
    #[arg(long, env = "SNAKEBOX_HTTP", value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub http: Option<String>,
    /// The URL clients use to reach the server (behind a proxy or a name): its host is
    /// accepted in `Host` and its origin in `Origin`.
    #[arg(long, env = "SNAKEBOX_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
    /// Another `Host` to accept (a name, or name:port), repeatable.
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// A browser origin allowed to call the server (`https://app.example.com`), repeatable.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Serve without API keys on a non-loopback address (a proxy in front authenticates).
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Also serve the MCP conformance suite's fixture tools and resources (for the suite's
    /// test only: tests/clients/conformance-not-applicable.yml).
    #[arg(long, hide = true)]
    pub conformance_fixtures: bool,
    /// Seconds the download links in results stay valid [default: 3600, or `[http]
    /// link_ttl`].
    #[arg(long, env = "SNAKEBOX_LINK_TTL", value_name = "S")]
    pub link_ttl: Option<u64>,
    /// Largest request body on every route and transport (`/mcp`, the legacy SSE posts, UI
    /// forms); a larger one is refused with 413 naming this limit [default: 64MiB, or `[http]
    /// max_body_bytes`].
    #[arg(long, env = "SNAKEBOX_MAX_BODY_BYTES", value_name = "SIZE")]
    pub max_body_bytes: Option<String>,
}

/// Arguments of `snakebox keys`.
#[derive(Debug, Args)]
pub struct KeysArgs {
    /// What to do with the keys.
    #[command(subcommand)]
    pub action: KeysAction,
}

/// `snakebox keys add | list | revoke` (API keys; each reads the data directory from the same
/// flags, environment and config file as `serve`) and `front-keypair`.
#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Make a key for a tenant and print it once (its last line is the key alone).
    Add {
        /// The tenant its calls are for: 1-64 of `a-z`, `0-9`, `-`, `_`.
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        engine: Box<EngineArgs>,
    },
    /// List the keys (masked) with their ids and tenants.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: Box<EngineArgs>,
    },
    /// Revoke a key by id: it stops working at the next request.
    Revoke {
        /// The key's id, as `keys list` shows it (`k-…`).
        id: String,
        #[command(flatten)]
        engine: Box<EngineArgs>,
    },
    /// Make the key pair a front signs its calls to engine agents with: `front.key` (the
    /// front's, mode 0600) and `front.pub` (every agent's) in DIR. Nothing is replaced.
    FrontKeypair {
        /// The directory to write them to (made, mode 0700, if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Arguments of `snakebox run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The script to run (`-` for standard input).
    pub file: PathBuf,
    /// An extra dependency (PEP 508), repeatable: `--dep "numpy>=1.26"`.
    #[arg(long = "dep", value_name = "SPEC")]
    pub deps: Vec<String>,
    /// Timeout for this run, in seconds (at least 1; above --max-timeout it is clamped).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(i64).range(1..))]
    pub timeout: Option<i64>,
    /// Print the full structured result as JSON instead of the script's output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Arguments of `snakebox check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Arguments of `snakebox audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this tenant's calls (`local` for the stdio and keyless tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only calls that ended so: ok, error, timeout, cancelled, memory_limit, cpu_limit,
    /// setup_failed, invalid_request (or `running`: started, not finished; `refused`: a call
    /// refused before it ran, recorded by the size and hash of what was sent).
    #[arg(long)]
    pub status: Option<String>,
    /// Only calls with a security event of this kind: timeout, memory_limit, cpu_limit,
    /// output_limit, process_limit, disk_limit, output_escaped, import_blocked,
    /// network_denied, quota_refused, setup_failed, exec_blocked, policy_refused.
    #[arg(long)]
    pub event: Option<String>,
    /// Only calls started within this long before now: `90s`, `30m`, `12h`, `7d`.
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// At most this many calls, the newest.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Print one JSON object per call.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Isolation backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendArg {
    /// bubblewrap + seccomp + cgroup/rlimit limits (Linux).
    Native,
    /// No isolation at all: only for trusted code. Must be asked for explicitly.
    None,
    /// A fresh container of a Docker engine per run, through the Engine API (build its
    /// image first: `snakebox image build`); sessions are containers too, and one-shot runs
    /// take pre-started containers of the warm pool.
    Docker,
}

/// A feature switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    /// Turned off.
    Off,
    /// Turned on.
    On,
}

/// Settings of the engine, shared by every subcommand. Each also reads an environment
/// variable and the config file; the command line wins, then the environment, then the file.
///
/// The flags are grouped as the config file's sections are (one struct per section, flattened:
/// the flags themselves are unchanged), so `settings` resolves one section at a time.
#[derive(Debug, Clone, Default, Args)]
pub struct EngineArgs {
    /// Config file (TOML): sections such as `[limits]` with `max_timeout = 120`; the flat keys
    /// of earlier versions (the long flags with `_`: `max_timeout = 120`) are read too.
    /// Default: `$XDG_CONFIG_HOME/snakebox/config.toml` when it exists.
    #[arg(long, env = "SNAKEBOX_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Server")]
    pub server: ServerArgs,
    #[command(flatten, next_help_heading = "Python")]
    pub python: PythonArgs,
    #[command(flatten, next_help_heading = "Sandbox")]
    pub sandbox: SandboxArgs,
    #[command(flatten, next_help_heading = "Network")]
    pub network: NetworkArgs,
    #[command(flatten, next_help_heading = "Limits per run")]
    pub limits: LimitsArgs,
    #[command(flatten, next_help_heading = "Warm pool")]
    pub pool: PoolArgs,
    #[command(flatten, next_help_heading = "Environment cache")]
    pub cache: CacheArgs,
    #[command(flatten, next_help_heading = "Sessions")]
    pub sessions: SessionsArgs,
    #[command(flatten, next_help_heading = "Artifacts")]
    pub artifacts: ArtifactsArgs,
    #[command(flatten, next_help_heading = "Quotas per tenant")]
    pub tenants: TenantsArgs,
}

/// The server as a whole: where its data lives and how much work runs at once (`[server]`).
#[derive(Debug, Clone, Default, Args)]
pub struct ServerArgs {
    /// Where environments, uv's cache and run scratch live
    /// [default: /var/lib/snakebox as root, else $XDG_DATA_HOME/snakebox].
    #[arg(long, env = "SNAKEBOX_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Runs executing at once; further calls queue [default: 8].
    #[arg(long, env = "SNAKEBOX_MAX_CONCURRENT_RUNS", value_name = "N")]
    pub max_concurrent_runs: Option<usize>,
    /// Largest MCP message `serve` reads from stdin (one line); a larger one is answered with
    /// an error naming this limit [default: 16MiB, or twice --max-script-bytes if larger].
    #[arg(long, env = "SNAKEBOX_MAX_FRAME_BYTES", value_name = "SIZE")]
    pub max_frame_bytes: Option<String>,
    /// The profile of a call that names none: `standard` (the server's settings), `basic`,
    /// `data_science`, `network`, `filesystem` or a `[profiles.NAME]` of the config file
    /// [default: standard].
    #[arg(long, env = "SNAKEBOX_PROFILE", value_name = "NAME")]
    pub profile: Option<String>,
    /// Also serve the tool sets of other servers, for clients and prompts written for them:
    /// `ibm` (`execute_code`, `validate_code`, `get_sandbox_info`), `python-mcp-sandbox`
    /// (`create_sandbox`, `execute_python_code`, ...), `code-executor` (`install_package`,
    /// `reset_sandbox`, ...), comma-separated; bare or `true` means `ibm`, `false` none.
    #[arg(
        long,
        env = "SNAKEBOX_COMPAT_TOOLS",
        value_name = "SETS",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub compat_tools: Option<String>,
    /// Host directories whose files python-mcp-sandbox's `upload_file_to_sandbox` may read
    /// (comma-separated; symlinks out of them are refused) [default: none, it reads no file].
    #[arg(
        long,
        env = "SNAKEBOX_UPLOAD_DIRS",
        value_name = "DIR,...",
        value_delimiter = ','
    )]
    pub upload_dirs: Option<Vec<PathBuf>>,
    /// Records queued for the runs table's and audit log's writer, in bytes; past it, the
    /// tenant with the most queued loses its own newest records (counted, reported)
    /// [default: 64MiB; at least 512KiB].
    #[arg(long, env = "SNAKEBOX_AUDIT_QUEUE_SIZE", value_name = "SIZE")]
    pub audit_queue_size: Option<String>,
    /// A PostgreSQL database (`postgres://USER:PASSWORD@HOST:PORT/DB`) that keeps the API
    /// keys, the runs table and the audit log, shared by every front of a deployment
    /// [default: the data directory's SQLite store]. Sessions stay in the data directory.
    #[arg(
        long,
        env = "SNAKEBOX_DATABASE",
        value_name = "URL",
        hide_env_values = true
    )]
    pub database: Option<String>,
}

/// Interpreters and the installer (`[python]`).
#[derive(Debug, Clone, Default, Args)]
pub struct PythonArgs {
    /// Python version used when a call does not ask for one (`3.12`, `>=3.10`).
    /// Default: the newest CPython 3 found.
    #[arg(long, env = "SNAKEBOX_PYTHON_VERSION", value_name = "VERSION")]
    pub python_version: Option<String>,
    /// Path to the uv binary, or a name looked up on PATH (`uv`) [default: found on PATH
    /// (pyenv shims resolved), ~/.local/bin, ~/.cargo/bin, or installed by pip].
    #[arg(long, env = "SNAKEBOX_UV_PATH", value_name = "PATH")]
    pub uv_path: Option<PathBuf>,
    /// Whether a Python version a call asks for and this host lacks is downloaded with uv
    /// (`automatic`) or refused (`never`) [default: never].
    #[arg(long, env = "SNAKEBOX_PYTHON_DOWNLOADS", value_enum)]
    pub python_downloads: Option<PythonDownloadsArg>,
    /// Install the package of a well-known import a script does not declare (`import
    /// sklearn` adds scikit-learn; only names on snakebox's curated list, never a guess),
    /// and say so in the result's notes; `--infer-dependencies=false` turns it off
    /// [default: on with --compat-tools, else off].
    #[arg(
        long,
        env = "SNAKEBOX_INFER_DEPENDENCIES",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub infer_dependencies: Option<bool>,
}

/// `--python-downloads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PythonDownloadsArg {
    /// Refuse a missing version, naming the fix (`snakebox python install`).
    Never,
    /// Download a missing version when a call asks for it.
    Automatic,
}

/// The isolation backend (`[sandbox]`).
#[derive(Debug, Clone, Default, Args)]
pub struct SandboxArgs {
    /// Isolation backend [default: native].
    #[arg(long, env = "SNAKEBOX_SANDBOX_BACKEND", value_enum)]
    pub sandbox_backend: Option<BackendArg>,
    /// Path to bwrap [default: found on PATH].
    #[arg(long, env = "SNAKEBOX_BWRAP_PATH", value_name = "PATH")]
    pub bwrap_path: Option<PathBuf>,
    /// The docker backend's container runtime, as registered with the engine (`runsc` for
    /// gVisor) [default: the engine's default, runc].
    #[arg(long, env = "SNAKEBOX_DOCKER_RUNTIME", value_name = "NAME")]
    pub docker_runtime: Option<String>,
}

/// What runs may reach (`[network]`).
#[derive(Debug, Clone, Default, Args)]
pub struct NetworkArgs {
    /// Network for runs: `off` (own namespace, loopback only), `on` (any public host name,
    /// through the run proxy) or `allow:NAME[,NAME...]` (only these names; `*.example.com`
    /// for any name below it) [default: off].
    #[arg(long, env = "SNAKEBOX_NETWORK", value_name = "POLICY")]
    pub network: Option<String>,
    /// Name servers the run proxy asks, comma-separated `IP` or `IP:PORT`
    /// [default: the host's resolv.conf].
    #[arg(long, env = "SNAKEBOX_NETWORK_RESOLVERS", value_name = "ADDRESSES")]
    pub network_resolvers: Option<String>,
    /// Ports runs may reach through the proxy, comma-separated [default: 80,443].
    #[arg(long, env = "SNAKEBOX_NETWORK_PORTS", value_name = "PORTS")]
    pub network_ports: Option<String>,
    /// Let runs name destinations by IP address (their address is still checked: loopback,
    /// private and metadata addresses stay refused) [default: names only].
    #[arg(long, env = "SNAKEBOX_NETWORK_ALLOW_IP_LITERALS")]
    pub network_allow_ip_literals: bool,
    /// Address ranges runs may reach although they are not public, comma-separated CIDR
    /// (e.g. an internal package mirror at `10.20.0.0/16`) [default: none].
    #[arg(long, env = "SNAKEBOX_NETWORK_EXCEPTIONS", value_name = "CIDRS")]
    pub network_exceptions: Option<String>,
    /// Hosts installs may download from besides the configured package indexes,
    /// comma-separated names, `*.example.com` patterns or addresses (empty: the indexes only)
    /// [default: any host on ports 80 and 443 at a public address].
    #[arg(long, env = "SNAKEBOX_NETWORK_INSTALL_HOSTS", value_name = "HOSTS")]
    pub network_install_hosts: Option<String>,
    /// Secrets runs may ask for, declared as the config file's `[secrets.NAME]` tables are,
    /// in TOML: `API_TOKEN = { env = "VAR", hosts = ["api.example.com"] }`, one per line. A
    /// declaration only: the value comes from the environment variable or file it names
    /// [default: none].
    #[arg(long, env = "SNAKEBOX_SECRETS", value_name = "TOML")]
    pub secrets: Option<String>,
    /// Connections one run (or session call) may open through its proxy [default: 256].
    #[arg(long, env = "SNAKEBOX_NETWORK_MAX_CONNECTIONS", value_name = "N")]
    pub network_max_connections: Option<u64>,
    /// Bytes one run may move through its proxy, both directions together, e.g. `1GiB`
    /// [default: 1GiB].
    #[arg(long, env = "SNAKEBOX_NETWORK_MAX_BYTES", value_name = "SIZE")]
    pub network_max_bytes: Option<String>,
    /// Seconds one connection through a run's proxy may stay open [default: 600].
    #[arg(
        long,
        env = "SNAKEBOX_NETWORK_MAX_CONNECTION_SECONDS",
        value_name = "SECONDS"
    )]
    pub network_max_connection_seconds: Option<u64>,
}

/// What one run may use (`[limits]`).
#[derive(Debug, Clone, Default, Args)]
pub struct LimitsArgs {
    /// Timeout when a call gives none, in seconds [default: 30].
    #[arg(long, env = "SNAKEBOX_DEFAULT_TIMEOUT", value_name = "SECONDS")]
    pub default_timeout: Option<u64>,
    /// Largest timeout a call may ask for, in seconds [default: 300].
    #[arg(long, env = "SNAKEBOX_MAX_TIMEOUT", value_name = "SECONDS")]
    pub max_timeout: Option<u64>,
    /// Bytes of stdout + stderr kept per run (head and tail) [default: 102400].
    #[arg(long, env = "SNAKEBOX_MAX_OUTPUT_BYTES", value_name = "BYTES")]
    pub max_output_bytes: Option<u64>,
    /// Memory per run, e.g. `512MiB`, `2G`, or `unlimited` [default: 1GiB].
    #[arg(long, env = "SNAKEBOX_MEMORY_LIMIT", value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// Processes and threads per run, or `unlimited` [default: 128].
    #[arg(long, env = "SNAKEBOX_MAX_PROCESSES", value_name = "N")]
    pub max_processes: Option<String>,
    /// CPU seconds per run, or `unlimited` [default: unlimited; wall time bounds it].
    #[arg(long, env = "SNAKEBOX_CPU_LIMIT", value_name = "SECONDS")]
    pub cpu_limit: Option<String>,
    /// CPU bandwidth per run in cores (`0.5`, `2`), or `unlimited` [default: 1]. Where
    /// the cores are contended, each tenant's busy sandboxes together get what one tenant's do.
    #[arg(long, env = "SNAKEBOX_CPU_CORES", value_name = "CORES")]
    pub cpu_cores: Option<String>,
    /// Scratch space (/tmp, /dev/shm and the working directory) per run [default: 512MiB].
    #[arg(long, env = "SNAKEBOX_SCRATCH_LIMIT", value_name = "SIZE")]
    pub scratch_limit: Option<String>,
    /// Largest script accepted [default: 1MiB].
    #[arg(long, env = "SNAKEBOX_MAX_SCRIPT_BYTES", value_name = "SIZE")]
    pub max_script_bytes: Option<String>,
}

/// Sandboxes kept ready while serving (`[pool]`).
#[derive(Debug, Clone, Default, Args)]
pub struct PoolArgs {
    /// Pre-started sandboxes kept ready per warm environment while serving (`0`: off)
    /// [default: 2].
    #[arg(long, env = "SNAKEBOX_WARM_POOL", value_name = "N")]
    pub warm_pool: Option<usize>,
    /// Fork runs of the environments kept warm (one fork server per network setting) from a pre-initialised
    /// interpreter, each in a fresh sandbox, while serving (native sandbox: a root server, or
    /// a normal user's in a user namespace of its own; always off with the docker backend)
    /// [default: on].
    #[arg(long, env = "SNAKEBOX_FORK_SERVER", value_enum)]
    pub fork_server: Option<Switch>,
    /// How many of an environment's declared packages its fork server imports before it
    /// forks runs, so that a run finds them in memory; it also imports what its runs were
    /// seen to import (`0`: neither) [default: 8].
    #[arg(long, env = "SNAKEBOX_PRELOAD_PACKAGES", value_name = "N")]
    pub preload_packages: Option<usize>,
    /// Children each fork server keeps already forked into a run's fresh sandbox, waiting
    /// for a run, so that a call pays only for its code (`0`: none) [default: 2].
    #[arg(long, env = "SNAKEBOX_PREFORK", value_name = "N")]
    pub prefork: Option<usize>,
}

/// Environments: how they are built and how long they are kept (`[cache]`).
#[derive(Debug, Clone, Default, Args)]
pub struct CacheArgs {
    /// Do not build the default environment at start-up.
    #[arg(long, env = "SNAKEBOX_NO_WARM_CACHE")]
    pub no_warm_cache: bool,
    /// Build dependencies that publish no wheel from their source distribution. A build runs
    /// the package's own code: it is sandboxed like a run (run limits, no credentials) and has
    /// no network, so sdists and their build requirements must be in a local `UV_FIND_LINKS`
    /// directory [default: off, wheels only].
    #[arg(long, env = "SNAKEBOX_ALLOW_SDIST_BUILDS")]
    pub allow_sdist_builds: bool,
    /// The package index installs resolve from instead of PyPI (a mirror), as uv's
    /// `--default-index` [default: the server's UV_DEFAULT_INDEX or UV_INDEX_URL, else PyPI].
    #[arg(long, env = "SNAKEBOX_INDEX_URL", value_name = "URL")]
    pub index_url: Option<String>,
    /// Time limit of each step of an install, an environment build's and a session
    /// install's alike, in seconds (also the wall time of the package code it runs)
    /// [default: 600].
    #[arg(long, env = "SNAKEBOX_INSTALL_TIMEOUT", value_name = "SECONDS")]
    pub install_timeout: Option<u64>,
    /// Environment cache size above which the least recently used are removed [default: 10GiB].
    #[arg(long, env = "SNAKEBOX_CACHE_MAX_SIZE", value_name = "SIZE")]
    pub cache_max_size: Option<String>,
    /// Environments unused for this many days are removed [default: 30].
    #[arg(long, env = "SNAKEBOX_CACHE_MAX_AGE_DAYS", value_name = "DAYS")]
    pub cache_max_age_days: Option<u64>,
}

/// Persistent sessions (`[sessions]`).
#[derive(Debug, Clone, Default, Args)]
pub struct SessionsArgs {
    /// A session's interpreter idle this many seconds is stopped (files and packages stay)
    /// [default: 900].
    #[arg(long, env = "SNAKEBOX_SESSION_IDLE_STOP", value_name = "SECONDS")]
    pub session_idle_stop: Option<u64>,
    /// A session unused this many seconds is deleted with its files [default: 604800, 7 days].
    #[arg(long, env = "SNAKEBOX_SESSION_IDLE_DELETE", value_name = "SECONDS")]
    pub session_idle_delete: Option<u64>,
    /// Sessions that may exist at once [default: 32].
    #[arg(long, env = "SNAKEBOX_MAX_SESSIONS", value_name = "N")]
    pub max_sessions: Option<usize>,
    /// Disk all sessions may use together (workspaces, packages, /tmp): what every tenant's
    /// share together may reserve (see --tenant-sessions-max-disk) [default: 10GiB].
    #[arg(long, env = "SNAKEBOX_SESSIONS_MAX_DISK", value_name = "SIZE")]
    pub sessions_max_disk: Option<String>,
    /// Session interpreters that may run at once; starting one more first stops the least
    /// recently used idle one (files and packages stay) [default: 8].
    #[arg(long, env = "SNAKEBOX_SESSION_MAX_INTERPRETERS", value_name = "N")]
    pub session_max_interpreters: Option<usize>,
}

/// Files runs produced (`[artifacts]`).
#[derive(Debug, Clone, Default, Args)]
pub struct ArtifactsArgs {
    /// Artifacts (files runs produced) are removed this many hours after their run
    /// [default: 24].
    #[arg(long, env = "SNAKEBOX_ARTIFACT_MAX_AGE_HOURS", value_name = "HOURS")]
    pub artifact_max_age_hours: Option<u64>,
    /// Artifact store size, all tenants together: a run that would pass it makes room by
    /// removing its own tenant's oldest artifacts, never another tenant's, or keeps no files
    /// [default: 1GiB].
    #[arg(long, env = "SNAKEBOX_ARTIFACT_MAX_SIZE", value_name = "SIZE")]
    pub artifact_max_size: Option<String>,
}

/// What one tenant (one API key's, on `serve --http`) may take of the server (`[tenants]`).
#[derive(Debug, Clone, Default, Args)]
pub struct TenantsArgs {
    /// Sandboxes of one tenant at once (runs, session calls, validation compiles, builds,
    /// installs); more wait on the tenant's own queue, so the other slots stay free for
    /// other tenants [default: unlimited on stdio; with --http, one less than
    /// --max-concurrent-runs].
    #[arg(long, env = "SNAKEBOX_TENANT_MAX_CONCURRENT_RUNS", value_name = "N")]
    pub tenant_max_concurrent_runs: Option<usize>,
    /// Runs one tenant may start per minute; more are refused with when to retry
    /// [default: unlimited].
    #[arg(long, env = "SNAKEBOX_TENANT_RUNS_PER_MINUTE", value_name = "N")]
    pub tenant_runs_per_minute: Option<u32>,
    /// Sessions one tenant may have at once [default: unlimited; --max-sessions holds for all].
    #[arg(long, env = "SNAKEBOX_TENANT_MAX_SESSIONS", value_name = "N")]
    pub tenant_max_sessions: Option<usize>,
    /// Runs of one tenant kept in the runs table; past it, the tenant's own oldest finished
    /// runs are removed [default: 100000].
    #[arg(long, env = "SNAKEBOX_TENANT_HISTORY_MAX_RUNS", value_name = "N")]
    pub tenant_history_max_runs: Option<u64>,
    /// Bytes of one tenant's runs in the runs table (scripts, results); past it, its own
    /// oldest finished runs are removed [default: 1GiB].
    #[arg(long, env = "SNAKEBOX_TENANT_HISTORY_MAX_SIZE", value_name = "SIZE")]
    pub tenant_history_max_size: Option<String>,
    /// Bytes of one tenant's audit log (its own files); past it, its own oldest file is
    /// removed [default: 160MiB; at least 64KiB].
    #[arg(long, env = "SNAKEBOX_TENANT_AUDIT_MAX_SIZE", value_name = "SIZE")]
    pub tenant_audit_max_size: Option<String>,
    /// Bytes of one tenant's artifacts; past it, its own oldest runs' artifacts are removed
    /// [default: 256MiB].
    #[arg(long, env = "SNAKEBOX_TENANT_ARTIFACTS_MAX_SIZE", value_name = "SIZE")]
    pub tenant_artifacts_max_size: Option<String>,
    /// One tenant's share of the sessions' disk (--sessions-max-disk): its sessions' files
    /// live in a file-system image of this size, so a write past it fails with ENOSPC while
    /// the call runs, in that tenant's code only. Shares are reserved: a tenant whose share
    /// would pass --sessions-max-disk is refused a session until another tenant's last one
    /// is deleted [default: all of --sessions-max-disk on stdio; with --http, a quarter of it
    /// (four tenants with sessions at once); at least 32MiB].
    #[arg(long, env = "SNAKEBOX_TENANT_SESSIONS_MAX_DISK", value_name = "SIZE")]
    pub tenant_sessions_max_disk: Option<String>,
}

impl KeysAction {
    /// The engine settings (for the data directory), for the actions on API keys.
    #[must_use]
    pub fn engine(&self) -> Option<&EngineArgs> {
        match self {
            KeysAction::Add { engine, .. }
            | KeysAction::List { engine, .. }
            | KeysAction::Revoke { engine, .. } => Some(engine),
            KeysAction::FrontKeypair { .. } => None,
        }
    }
}
