//! PostgreSQL as the shared store (`--database postgres://…`): the URL, its connections and
//! its schema.
//!
//! It exists so that every front of a deployment reads and writes one set of keys, runs and
//! audit lines. The rest of the engine is synchronous around its stores (the runs table's
//! writer is a thread of its own; keys are read by the HTTP face per request), so the
//! connections live on a small runtime of their own (`snakebox-pg` threads), started once per
//! process and never dropped: a caller hands it a query and waits for the answer
//! ([`PgStore::block`]), which never starts a runtime inside another's (a panic) and never
//! polls a connection on the caller's runtime. Connections come from a pool
//! (`deadpool-postgres`), a few per process.
//!
//! The schema is one ordered list of steps ([`SCHEMA`]), recorded in `snakebox_migrations`
//! and applied in one transaction holding an advisory lock: two fronts starting together
//! apply it once (the second waits, then finds it applied). Every table is `snakebox_`-named,
//! so the database may be shared with other applications.
//!
//! Connections are made without TLS (`NoTls`): reach the database over a unix socket
//! (`postgres://snakebox@%2Frun%2Fpostgresql/snakebox`), loopback or a private network. A URL
//! asking for TLS (`sslmode=require`) is refused when connecting, with that said.
//!
//! The URL's password is a secret: it is never logged, shown by `snakebox check` or put in an
//! error; [`DatabaseUrl::redacted`] is what is shown.

use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

/// How long connecting may take before it is reported.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one use of the database may take (a query, a transaction) before the caller is
/// told it failed.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections per process.
const POOL_SIZE: usize = 4;
/// The advisory lock the schema's steps are applied under (any constant of snakebox's own).
const SCHEMA_LOCK: i64 = 0x736e_616b_6562_6f78; // "snakebox"

/// A `postgres://` URL, parsed once (its password never shown).
#[derive(Clone)]
pub struct DatabaseUrl {
    config: tokio_postgres::Config,
    /// The URL without its password.
    redacted: String,
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DatabaseUrl").field(&self.redacted).finish()
    }
}

impl PartialEq for DatabaseUrl {
    fn eq(&self, other: &Self) -> bool {
        self.redacted == other.redacted && self.config.get_password() == other.config.get_password()
    }
}

impl FromStr for DatabaseUrl {
    type Err = PgError;

    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME[?options]` (`postgresql://` too; a
    /// unix socket directory as the host, percent-encoded: `%2Frun%2Fpostgresql`).
    fn from_str(text: &str) -> Result<DatabaseUrl, PgError> {
        let text = text.trim();
        if !(text.starts_with("postgres://") || text.starts_with("postgresql://")) {
            return Err(PgError::Url {
                reason: "it does not start with `postgres://` (only PostgreSQL is supported)"
                    .into(),
            });
        }
        let mut config = tokio_postgres::Config::from_str(text).map_err(|err| PgError::Url {
            // The parser's message names the part that is wrong, never the password.
            reason: crate::error::describe(&err),
        })?;
        if config.get_hosts().is_empty() {
            return Err(PgError::Url {
                reason: "it names no host".into(),
            });
        }
        if config.get_user().is_none() {
            return Err(PgError::Url {
                reason: "it names no user".into(),
            });
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("snakebox");
        let redacted = redact(&config);
        Ok(DatabaseUrl { config, redacted })
    }
}

/// The URL as it may be shown: user, hosts, ports and database, never the password.
fn redact(config: &tokio_postgres::Config) -> String {
    let user = config.get_user().unwrap_or("");
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(n, host)| {
            let name = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string().replace('/', "%2F"),
            };
            match ports.get(n).or(ports.first()) {
                Some(port) => format!("{name}:{port}"),
                None => name,
            }
        })
        .collect();
    let password = if config.get_password().is_some() {
        ":***"
    } else {
        ""
    };
    format!(
        "postgres://{user}{password}@{}/{}",
        hosts.join(","),
        config.get_dbname().unwrap_or(user)
    )
}

impl DatabaseUrl {
    /// The URL without its password (`postgres://snakebox:***@db:5432/snakebox`).
    #[must_use]
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// Why PostgreSQL could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// `--database` is not a PostgreSQL URL.
    #[error("Failed to read the database URL (--database): {reason}")]
    Url {
        /// What is wrong with it.
        reason: String,
    },
    /// The database could not be reached, or refused the login.
    #[error("Failed to connect to the database `{url}`")]
    Connect {
        /// The URL, without its password.
        url: String,
        /// What PostgreSQL (or the network) said.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A query failed.
    #[error("Failed to use the database `{url}`")]
    Query {
        /// The URL, without its password.
        url: String,
        /// What PostgreSQL said.
        #[source]
        source: tokio_postgres::Error,
    },
    /// No connection of the pool could be had in time.
    #[error("Failed to get a connection to the database `{url}`: {reason}")]
    Pool {
        /// The URL, without its password.
        url: String,
        /// What the pool said.
        reason: String,
    },
    /// The database did not answer in time.
    #[error("The database `{url}` did not answer within {} s", QUERY_TIMEOUT.as_secs())]
    Timeout {
        /// The URL, without its password.
        url: String,
    },
    /// The database's schema is of a later snakebox.
    #[error(
        "The database `{url}` was set up by a later version of snakebox (schema step {found}; this one knows up to {known})"
    )]
    Newer {
        /// The URL, without its password.
        url: String,
        /// The last step the database has.
        found: i32,
        /// The last step this version knows.
        known: i32,
    },
    /// The threads the connections run on could not be started.
    #[error("Failed to start the database's threads")]
    Runtime(#[source] std::io::Error),
}

impl PgError {
    /// How to fix it.
    #[must_use]
    pub fn hint(&self) -> String {
        match self {
            PgError::Url { .. } => "give a URL such as `postgres://snakebox:PASSWORD@db.example:5432/snakebox` (a unix socket: `postgres://snakebox@%2Frun%2Fpostgresql/snakebox`), or leave --database unset for the data directory's SQLite store".into(),
            PgError::Connect { url, .. } | PgError::Pool { url, .. } => format!(
                "check that PostgreSQL is running and reachable at `{url}`, that the user may log in to that database (`psql` with the same URL says why not), and that the URL asks for no TLS (connections are made without it: use a unix socket, loopback or a private network)"
            ),
            PgError::Query { .. } | PgError::Timeout { .. } => {
                "check the database's health and its log; the user needs to create tables in the database the first time (then SELECT, INSERT, UPDATE, DELETE on the `snakebox_` tables)".into()
            }
            PgError::Newer { .. } => {
                "run the same version of snakebox on every front of the deployment (upgrade this one)".into()
            }
            PgError::Runtime(_) => "check the process's limits on threads (ulimit -u)".into(),
        }
    }
}

/// The connections' runtime: started once, never dropped (dropping a runtime on another's
/// thread panics).
fn runtime() -> Result<&'static tokio::runtime::Runtime, PgError> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    static STARTING: Mutex<()> = Mutex::new(());
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let _one = STARTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("snakebox-pg")
        .enable_all()
        .build()
        .map_err(PgError::Runtime)?;
    Ok(RUNTIME.get_or_init(|| runtime))
}

/// One PostgreSQL database, as every user in this process shares it (cheap to clone).
#[derive(Clone)]
pub struct PgStore(Arc<Inner>);

struct Inner {
    url: DatabaseUrl,
    pool: Pool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.0.url.redacted)
            .finish_non_exhaustive()
    }
}

/// The schema, in order. Append only: a step once released is never changed.
pub(crate) const SCHEMA: &[(i32, &str, &str)] = &[(
    1,
    "keys, runs and the audit log",
    "CREATE TABLE IF NOT EXISTS snakebox_keys (
         id TEXT PRIMARY KEY,
         tenant TEXT NOT NULL,
         hash BYTEA NOT NULL,
         masked TEXT NOT NULL,
         created_at BIGINT NOT NULL,
         revoked_at BIGINT
     );
     CREATE TABLE IF NOT EXISTS snakebox_runs (
         seq BIGSERIAL UNIQUE,
         execution_id TEXT PRIMARY KEY,
         owner TEXT NOT NULL,
         kind TEXT NOT NULL,
         session_id TEXT,
         started_at_ms BIGINT NOT NULL,
         server_host TEXT NOT NULL,
         server_pid BIGINT NOT NULL,
         status TEXT NOT NULL,
         duration_ms BIGINT,
         setup_ms BIGINT,
         exit_code INTEGER,
         python_version TEXT,
         dependencies TEXT NOT NULL,
         script TEXT NOT NULL,
         script_truncated BOOLEAN NOT NULL,
         output TEXT,
         script_bytes BIGINT,
         script_sha256 TEXT,
         row_bytes BIGINT NOT NULL DEFAULT 0
     );
     CREATE INDEX IF NOT EXISTS snakebox_runs_by_owner
         ON snakebox_runs (owner, started_at_ms DESC, seq DESC);
     CREATE INDEX IF NOT EXISTS snakebox_runs_budget
         ON snakebox_runs (owner, started_at_ms, seq) INCLUDE (row_bytes, status);
     CREATE TABLE IF NOT EXISTS snakebox_audit (
         seq BIGSERIAL PRIMARY KEY,
         tenant TEXT NOT NULL,
         at_ms BIGINT NOT NULL,
         line TEXT NOT NULL,
         bytes BIGINT NOT NULL
     );
     CREATE INDEX IF NOT EXISTS snakebox_audit_by_tenant ON snakebox_audit (tenant, seq);
     CREATE TABLE IF NOT EXISTS snakebox_audit_usage (
         tenant TEXT PRIMARY KEY,
         bytes BIGINT NOT NULL
     );
     CREATE TABLE IF NOT EXISTS snakebox_runs_usage (
         owner TEXT PRIMARY KEY,
         items BIGINT NOT NULL,
         bytes BIGINT NOT NULL
     );
     CREATE OR REPLACE FUNCTION snakebox_runs_usage_count() RETURNS trigger
     LANGUAGE plpgsql AS $$
     BEGIN
         IF TG_OP IN ('UPDATE', 'DELETE') THEN
             UPDATE snakebox_runs_usage
                 SET items = items - 1, bytes = bytes - OLD.row_bytes
                 WHERE owner = OLD.owner;
         END IF;
         IF TG_OP IN ('INSERT', 'UPDATE') THEN
             INSERT INTO snakebox_runs_usage (owner, items, bytes)
                 VALUES (NEW.owner, 1, NEW.row_bytes)
                 ON CONFLICT (owner) DO UPDATE
                 SET items = snakebox_runs_usage.items + 1,
                     bytes = snakebox_runs_usage.bytes + EXCLUDED.bytes;
         END IF;
         RETURN NULL;
     END $$;
     DROP TRIGGER IF EXISTS snakebox_runs_usage ON snakebox_runs;
     CREATE TRIGGER snakebox_runs_usage AFTER INSERT OR UPDATE OR DELETE ON snakebox_runs
         FOR EACH ROW EXECUTE FUNCTION snakebox_runs_usage_count();",
)];

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl PgStore {
    /// The database `url` names, connected and at the current schema; opened once per
    /// process and URL (a second call gets the same pool).
    ///
    /// Blocks while it connects: call it at start or off the async runtime's threads.
    ///
    /// # Errors
    /// The database cannot be reached, refuses the login, or its schema cannot be made.
    pub fn open(url: &DatabaseUrl) -> Result<PgStore, PgError> {
        static OPENED: Mutex<Vec<PgStore>> = Mutex::new(Vec::new());
        let mut opened = OPENED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(store) = opened.iter().find(|store| store.0.url == *url) {
            return Ok(store.clone());
        }
        let store = PgStore::connect(url)?;
        opened.push(store.clone());
        Ok(store)
    }

    /// A pool of its own on `url`, at the current schema (what another front has).
    fn connect(url: &DatabaseUrl) -> Result<PgStore, PgError> {
        let manager = Manager::from_config(
            url.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(QUERY_TIMEOUT))
            .build()
            .map_err(|err| PgError::Pool {
                url: url.redacted.clone(),
                reason: err.to_string(),
            })?;
        let store = PgStore(Arc::new(Inner {
            url: url.clone(),
            pool,
        }));
        store.block(migrate)?;
        Ok(store)
    }

    /// The database's URL.
    #[must_use]
    pub fn url(&self) -> &DatabaseUrl {
        &self.0.url
    }

    /// Run `work` on the connections' runtime and wait for its answer (at most
    /// [`QUERY_TIMEOUT`]). Safe from any thread: on an async runtime's thread it blocks that
    /// thread as a SQLite read would, no more.
    ///
    /// # Errors
    /// What `work` returned, or a timeout.
    pub(crate) fn block<T, F, Fut>(&self, work: F) -> Result<T, PgError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, PgError>> + Send + 'static,
        T: Send + 'static,
    {
        let runtime = runtime()?;
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let future = work(Conn {
            pool: self.0.pool.clone(),
            url: self.0.url.redacted.clone(),
        });
        runtime.spawn(async move {
            // The caller may have stopped waiting (a timeout): its answer is dropped.
            let _ = answer.send(future.await);
        });
        answered
            .recv_timeout(QUERY_TIMEOUT + Duration::from_secs(1))
            .map_err(|_| PgError::Timeout {
                url: self.0.url.redacted.clone(),
            })?
    }
}

/// What a use of the database gets: its pool and how to name it in errors.
pub(crate) struct Conn {
    pub(crate) pool: Pool,
    pub(crate) url: String,
}

impl Conn {
    /// A connection of the pool.
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        self.pool.get().await.map_err(|err| match err {
            deadpool_postgres::PoolError::Backend(source) => PgError::Connect {
                url: self.url.clone(),
                source,
            },
            other => PgError::Pool {
                url: self.url.clone(),
                reason: other.to_string(),
            },
        })
    }

    /// A failed query, named.
    pub(crate) fn failed(&self, source: tokio_postgres::Error) -> PgError {
        PgError::Query {
            url: self.url.clone(),
            source,
        }
    }
}

/// Apply the steps the database has not had, in one transaction under [`SCHEMA_LOCK`].
async fn migrate(conn: Conn) -> Result<(), PgError> {
    let mut client = conn.client().await?;
    let tx = client.transaction().await.map_err(|e| conn.failed(e))?;
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"))
        .await
        .map_err(|e| conn.failed(e))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS snakebox_migrations (
             id INTEGER PRIMARY KEY,
             name TEXT NOT NULL,
             applied_at_ms BIGINT NOT NULL
         )",
    )
    .await
    .map_err(|e| conn.failed(e))?;
    let done: i32 = tx
        .query_one("SELECT COALESCE(MAX(id), 0) FROM snakebox_migrations", &[])
        .await
        .map_err(|e| conn.failed(e))?
        .get(0);
    let known = SCHEMA.last().map_or(0, |step| step.0);
    if done > known {
        return Err(PgError::Newer {
            url: conn.url.clone(),
            found: done,
            known,
        });
    }
    for (id, name, sql) in SCHEMA.iter().filter(|step| step.0 > done) {
        tx.batch_execute(sql).await.map_err(|e| conn.failed(e))?;
        tx.execute(
            "INSERT INTO snakebox_migrations (id, name, applied_at_ms) VALUES ($1, $2, $3)",
            &[id, name, &now_ms()],
        )
        .await
        .map_err(|e| conn.failed(e))?;
    }
    tx.commit().await.map_err(|e| conn.failed(e))
}

/// `text` as PostgreSQL's `TEXT` takes it: a NUL character (which SQLite keeps) becomes
/// U+FFFD, so a script holding one is still recorded.
pub(crate) fn pg_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// This host's name: a `running` row is marked `interrupted` only by a server of the host
/// that ran it (its pid means nothing elsewhere).
pub(crate) fn host_name() -> String {
    fs_err::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_parsed_once_and_shown_without_its_password() {
        let url: DatabaseUrl = "postgres://snakebox:s3cret-pw@db.example:5433/runs"
            .parse()
            .unwrap();
        assert_eq!(
            url.redacted(),
            "postgres://snakebox:***@db.example:5433/runs"
        );
        assert!(!format!("{url:?}").contains("s3cret-pw"));
        let socket: DatabaseUrl = "postgresql://me@%2Ftmp%2Fpg/db".parse().unwrap();
        assert_eq!(socket.redacted(), "postgres://me@%2Ftmp%2Fpg:5432/db");
        for (bad, says) in [
            ("mysql://a@b/c", "postgres://"),
            ("sqlite:///x.db", "postgres://"),
            ("postgres://", "no host"),
            ("postgres://host/db", "no user"),
            ("postgres://u:pw@h:notaport/db", "port"),
        ] {
            let err = bad.parse::<DatabaseUrl>().unwrap_err();
            let text = format!("{err}: {}", err.hint());
            assert!(text.contains(says), "{bad}: {text}");
            assert!(!text.contains("pw@"), "{text}");
        }
    }

    #[test]
    fn fronts_starting_together_make_the_schema_once() {
        let Some(cluster) = crate::shared::test_cluster::TestCluster::start() else {
            return;
        };
        // Four fronts, each with a pool of its own, starting at the same moment.
        let started = std::sync::Barrier::new(4);
        let stores: Vec<PgStore> = std::thread::scope(|scope| {
            let fronts: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        started.wait();
                        PgStore::connect(&cluster.url)
                    })
                })
                .collect();
            fronts
                .into_iter()
                .map(|front| front.join().unwrap().unwrap())
                .collect()
        });
        let steps = stores[0]
            .block(|conn| async move {
                let client = conn.client().await?;
                let rows = client
                    .query("SELECT id FROM snakebox_migrations ORDER BY id", &[])
                    .await
                    .map_err(|e| conn.failed(e))?;
                Ok(rows
                    .iter()
                    .map(|row| row.get::<_, i32>(0))
                    .collect::<Vec<_>>())
            })
            .unwrap();
        let known: Vec<i32> = SCHEMA.iter().map(|step| step.0).collect();
        assert_eq!(steps, known);
        // A later start finds it made.
        PgStore::connect(&cluster.url).unwrap();
    }

    #[test]
    fn nul_characters_become_replacement_characters() {
        assert_eq!(pg_text("a\0b"), "a\u{FFFD}b");
        assert!(matches!(pg_text("ab"), std::borrow::Cow::Borrowed(_)));
    }
}
