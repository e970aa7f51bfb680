//! A throwaway PostgreSQL cluster for tests: `initdb` in a temporary directory, a server on a
//! free loopback port, stopped (`pg_ctl stop -m immediate`) and removed when dropped.
//!
//! It exists so the shared store's PostgreSQL side is tested against a real server, with the
//! same test bodies as SQLite's. The binaries are found in `SNAKEBOX_PG_BIN`, Debian's
//! `/usr/lib/postgresql/<version>/bin` (package `postgresql`) or on `PATH`; without them the
//! tests that need a cluster skip, saying so. PostgreSQL refuses to run as root: as root, the
//! cluster belongs to `SNAKEBOX_PG_USER`, `postgres` or `cloudsdk`, whichever exists first, and
//! its commands run through `runuser`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::DatabaseUrl;

/// A running cluster; stopped and removed on drop.
pub(crate) struct TestCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<String>,
    /// `postgres://snakebox@127.0.0.1:PORT/postgres`.
    pub(crate) url: DatabaseUrl,
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`.
fn binaries() -> Option<PathBuf> {
    let has = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    if let Some(dir) = std::env::var_os("SNAKEBOX_PG_BIN").map(PathBuf::from) {
        return has(&dir).then_some(dir);
    }
    let mut debian: Vec<PathBuf> = fs_err::read_dir("/usr/lib/postgresql")
        .map(|read| {
            read.filter_map(Result::ok)
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    debian.sort();
    debian.reverse();
    let path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    debian.into_iter().chain(path).find(|dir| has(dir))
}

/// The user the cluster runs as when this process is root.
fn cluster_user() -> Option<nix::unistd::User> {
    let names = std::env::var("SNAKEBOX_PG_USER")
        .ok()
        .into_iter()
        .chain(["postgres".to_owned(), "cloudsdk".to_owned()]);
    names
        .filter_map(|name| nix::unistd::User::from_name(&name).ok().flatten())
        .next()
}

impl TestCluster {
    /// A new cluster, or `None` (with the reason on stderr) where PostgreSQL is not installed.
    ///
    /// # Panics
    /// PostgreSQL is installed but the cluster cannot be made or started (a test failure).
    #[allow(clippy::print_stderr)] // The skip reason is for the person running the tests.
    pub(crate) fn start() -> Option<TestCluster> {
        let Some(bin) = binaries() else {
            eprintln!(
                "skipped: PostgreSQL's binaries (initdb, pg_ctl, postgres) are not installed (Debian: `apt-get install postgresql`; or set SNAKEBOX_PG_BIN)"
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let user = if nix::unistd::geteuid().is_root() {
            let user = cluster_user().expect("a user other than root to run PostgreSQL as");
            nix::unistd::chown(dir.path(), Some(user.uid), Some(user.gid)).expect("chown");
            Some(user.name)
        } else {
            None
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let cluster = TestCluster {
            url: format!("postgres://snakebox@127.0.0.1:{port}/postgres")
                .parse()
                .expect("the test cluster's URL"),
            dir,
            bin,
            user,
        };
        let data = cluster.dir.path().join("data");
        cluster.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "snakebox",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        cluster.run(
            "pg_ctl",
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &cluster.dir.path().join("log").display().to_string(),
                "-o",
                &format!(
                    "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                    cluster.dir.path().display()
                ),
                "-w",
                "start",
            ],
        );
        Some(cluster)
    }

    fn command(&self, binary: &str) -> Command {
        let program = self.bin.join(binary);
        match &self.user {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn run(&self, binary: &str, args: &[&str]) {
        let out = self
            .command(binary)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("a PostgreSQL binary");
        assert!(
            out.status.success(),
            "{binary} failed: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = self
            .command("pg_ctl")
            .args(["-D", &data.display().to_string(), "-m", "immediate", "stop"])
            .current_dir(self.dir.path())
            .output();
    }
}
