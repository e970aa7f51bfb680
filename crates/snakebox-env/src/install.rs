//! Installing a requirement set in two phases, because a package's code is untrusted.
//!
//! A dependency's build code (`setup.py`, a PEP 517 backend) and its import-time code (`.pth`
//! lines, which the interpreter runs at start-up, also while byte-compiling) are code the
//! caller chose, exactly as untrusted as the script (DESIGN.md §3). So an install is split:
//!
//! 1. **Download** ([`crate::Role::Downloader`]): trusted uv resolves, downloads and unpacks *wheels
//!    only* (`--no-build`) into the environment, with the operator's index settings and
//!    credentials and write access to uv's cache. Nothing in this step runs package code: no
//!    build, no `--compile-bytecode`, and no interpreter of an environment that already holds
//!    packages (uv's interpreter query runs `python -I`, which processes `.pth` files, so the
//!    download always targets a fresh, empty venv; what got installed is read from the
//!    `.dist-info` directories here, never by asking that interpreter).
//! 2. **Package code** ([`crate::Role::PackageCode`]): byte-compiling (`python -m compileall` with
//!    the environment's interpreter) and, only when the operator allowed it, building sdists.
//!    It runs as a run's identity (never the uid that owns uv's cache), with a run's limits,
//!    no network, no credentials, `HOME` in its scratch, and uv's cache not mounted. The
//!    environment's files, hard links to inodes in uv's cache, are not writable by that uid:
//!    it may only add `__pycache__` entries ([`hand_to_package_code`]).

use std::ffi::{OsStr, OsString};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pep508_rs::{Requirement, VersionOrUrl};
use snakebox_sandbox::Limits;

use crate::cache::ResolvedPackage;
use crate::error::EnvError;

/// How package code (compilation, builds) is run: the run limits, and whether sdists may be
/// built at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSettings {
    /// The limits of a run (the wall time is replaced by the install timeout).
    pub limits: Limits,
    /// Build requirements that have no wheel from their sdist (sandboxed, offline).
    pub allow_sdist_builds: bool,
}

impl Default for BuildSettings {
    /// The engine's default run limits; wheels only.
    fn default() -> Self {
        Self {
            limits: Limits {
                wall_time: crate::cache::DEFAULT_INSTALL_TIMEOUT,
                cpu_time: None,
                memory_bytes: Some(1024 * 1024 * 1024),
                max_processes: Some(128),
                max_output_bytes: 4 * 1024 * 1024,
                scratch_bytes: Some(512 * 1024 * 1024),
                file_size_bytes: Some(256 * 1024 * 1024),
                open_files: Some(1024),
                cpu_millicores: Some(1000),
            },
            allow_sdist_builds: false,
        }
    }
}

/// Whether uv refused because a requirement has no usable wheel (builds being disabled).
pub fn is_missing_wheel(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr).to_lowercase();
    text.contains("building from source is disabled")
        || text.contains("building source distributions is disabled")
        || text.contains("--no-build")
}

/// The packages uv says need a wheel (its hint: ``Wheels are required for `NAME` because
/// building from source is disabled``), in order, without repeats.
pub(crate) fn packages_without_wheels(stderr: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(stderr);
    let mut names: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Wheels are required for `").nth(1)
            && let Some((name, _)) = rest.split_once('`')
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_owned());
        }
    }
    names
}

/// `<env>/lib/pythonX.Y/site-packages`, when there is one.
pub fn site_packages(env: &Path) -> Option<PathBuf> {
    fs_err::read_dir(env.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages"))
        .find(|path| path.is_dir())
}

/// What is installed in `env`, read from its `.dist-info` directories (`Name` and `Version` of
/// each `METADATA`), sorted by name. Never runs the environment's interpreter.
pub fn installed_packages(env: &Path) -> Vec<ResolvedPackage> {
    let Some(site) = site_packages(env) else {
        return Vec::new();
    };
    let Ok(entries) = fs_err::read_dir(&site) else {
        return Vec::new();
    };
    let mut packages: Vec<ResolvedPackage> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".dist-info"))
        .filter_map(|entry| {
            let metadata = fs_err::read_to_string(entry.path().join("METADATA")).ok()?;
            let header = |key: &str| {
                metadata
                    .lines()
                    .take_while(|line| !line.is_empty())
                    .find_map(|line| line.strip_prefix(key).map(|v| v.trim().to_owned()))
            };
            Some(ResolvedPackage {
                name: header("Name:")?,
                version: header("Version:")?,
            })
        })
        .collect();
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    packages
}

/// Make `env` ready for package code running as `ids`: every directory becomes theirs (so
/// `__pycache__` entries can be created), no file becomes theirs, and no file stays writable
/// by group or others. Files are hard links into uv's cache: their inodes are shared with it,
/// so they must never be writable by package code.
///
/// # Errors
/// The first file-system error.
pub fn hand_to_package_code(env: &Path, ids: Option<(u32, u32)>) -> std::io::Result<()> {
    let mut stack = vec![env.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs_err::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        if meta.is_dir() {
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
            }
            if mode & 0o7777 != 0o755 {
                fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            }
            for entry in fs_err::read_dir(&path)? {
                stack.push(entry?.path());
            }
        } else if mode & 0o6022 != 0 {
            fs_err::set_permissions(&path, std::fs::Permissions::from_mode(mode & !0o6022))?;
        }
    }
    Ok(())
}

/// The label of the compilation step (its errors say that it runs package code).
pub(crate) const COMPILE_LABEL: &str = "compile the packages (runs their code)";

/// Give every file and directory under `env` (without following links) to `ids`: after
/// package code ran, what it created (`__pycache__`) and the directories handed to it become
/// the installer's again.
///
/// # Errors
/// The first file-system error.
pub fn take_back_from_package_code(env: &Path, (uid, gid): (u32, u32)) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let mut stack = vec![env.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs_err::symlink_metadata(&path)?;
        if meta.uid() != uid || meta.gid() != gid {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        }
        if meta.is_dir() {
            for entry in fs_err::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Point the scripts uv wrote into `<venv>/bin` for `base` (an install with `--prefix` and the
/// base interpreter writes `#!<base>` shebangs) at the venv's own interpreter.
///
/// # Errors
/// The first file-system error.
pub fn point_scripts_at_venv(venv: &Path, base: &Path) -> std::io::Result<()> {
    let from = format!("#!{}\n", base.display());
    let to = format!("#!{}\n", venv.join("bin").join("python").display());
    let Ok(entries) = fs_err::read_dir(venv.join("bin")) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        let meta = fs_err::symlink_metadata(&path)?;
        if !meta.is_file() || meta.len() > 1024 * 1024 {
            continue;
        }
        let text = fs_err::read(&path)?;
        if let Some(rest) = text.strip_prefix(from.as_bytes()) {
            let mut fixed = to.clone().into_bytes();
            fixed.extend_from_slice(rest);
            fs_err::write(&path, fixed)?;
        }
    }
    Ok(())
}

/// The arguments of byte-compilation: the environment's own interpreter (it processes the
/// environment's `.pth` files: package code) compiling its `site-packages`.
/// The script compiles with `compileall`, then loads every `.pyc` it has (the `verify`
/// module): a truncated one is reported (exit status 3), never left for imports to find.
pub(crate) fn compile_args(site_packages: &Path) -> Vec<OsString> {
    vec![
        "-c".into(),
        crate::verify::COMPILE_AND_CHECK.into(),
        site_packages.as_os_str().to_owned(),
    ]
}

/// The local directories among the find-links settings (`/path` or `file:///path`): the only
/// source a build can use, since builds have no network.
pub(crate) fn local_find_links(urls: &[String]) -> Vec<PathBuf> {
    urls.iter()
        .filter_map(|url| {
            let path = url.strip_prefix("file://").unwrap_or(url);
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .filter(|path| path.is_dir())
        .collect()
}

/// Arguments of an sdist build (everything in the untrusted sandbox, offline, its own
/// cache in scratch, local find-links directories as the only source).
pub(crate) fn build_args(
    python: &OsStr,
    requirements_file: &Path,
    find_links: &[PathBuf],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "pip".into(),
        "install".into(),
        "--python".into(),
        python.to_owned(),
        "--link-mode".into(),
        "copy".into(),
        "--compile-bytecode".into(),
        "--offline".into(),
        "--no-index".into(),
    ];
    for dir in find_links {
        args.push("--find-links".into());
        args.push(dir.as_os_str().to_owned());
    }
    args.push("-r".into());
    args.push(requirements_file.as_os_str().to_owned());
    args
}

/// The environment of an sdist build: [`crate::UvEnvironment::for_package_code`], offline, with
/// uv's cache in the sandbox's scratch.
pub(crate) fn build_env() -> Vec<(String, String)> {
    let mut env = crate::UvEnvironment::for_package_code();
    env.push(("UV_CACHE_DIR".to_owned(), "/tmp/uv-cache".to_owned()));
    env.push(("UV_OFFLINE".to_owned(), "1".to_owned()));
    env
}

/// Refuse a requirement whose URL points at a host the install proxy would refuse: one not
/// in `[network] install_hosts` when that is set, or at host loopback, a private range, a
/// link-local or metadata address (or a name resolving to one) unless the operator's
/// exceptions cover it; a configured index's host and port are always accepted. Names are
/// resolved here; uv resolves again later (a name that changes its answer in between is not
/// caught here, but the proxy checks again: see SECURITY.md).
///
/// # Errors
/// [`EnvError::ForbiddenUrl`] for the first requirement whose URL points at a host not
/// allowed or at a non-public address.
pub async fn check_requirement_urls(
    requirements: &[Requirement],
    uv_env: &crate::UvEnvironment,
) -> Result<(), EnvError> {
    let index_urls = uv_env.index_urls();
    let allowed: Vec<(String, Option<u16>)> =
        index_urls.iter().filter_map(|url| host_port(url)).collect();
    let rules = snakebox_sandbox::EgressRules::for_urls(
        &index_urls,
        uv_env.install_network().hosts.clone(),
    );
    let exceptions = &uv_env.install_network().exceptions;
    for requirement in requirements {
        let Some(VersionOrUrl::Url(url)) = &requirement.version_or_url else {
            continue;
        };
        if !matches!(url.scheme(), "http" | "https") {
            continue;
        }
        let Some(host) = url.host_str() else {
            continue;
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port_or_known_default();
        if allowed
            .iter()
            .any(|(h, p)| h.eq_ignore_ascii_case(&host) && *p == port)
        {
            continue;
        }
        let forbidden = |reason: String| EnvError::ForbiddenUrl {
            requirement: requirement.to_string(),
            reason,
        };
        if let Some(reason) = port.and_then(|port| rules.refuses_host(&host, port)) {
            return Err(forbidden(reason));
        }
        let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                let lookup = tokio::time::timeout(
                    Duration::from_secs(10),
                    tokio::net::lookup_host((host.as_str(), port.unwrap_or(443))),
                )
                .await;
                match lookup {
                    Ok(Ok(addrs)) => addrs.map(|a| a.ip()).collect(),
                    // An unresolvable name reaches nothing; uv reports it.
                    _ => continue,
                }
            }
        };
        if let Some(ip) = addresses.iter().find(|ip| {
            !snakebox_sandbox::is_public(**ip) && !exceptions.iter().any(|n| n.contains(*ip))
        }) {
            return Err(forbidden(format!("a non-public address (`{ip}`)")));
        }
    }
    Ok(())
}

/// [`check_requirement_urls`] for requirements given as PEP 508 strings (already validated;
/// a string that does not parse is left to uv), against `uv_env`'s configured indexes.
///
/// # Errors
/// [`EnvError::ForbiddenUrl`] for the first requirement whose URL points at a non-public
/// address.
pub async fn check_requirement_strings(
    requirements: &[String],
    uv_env: &crate::UvEnvironment,
) -> Result<(), EnvError> {
    use std::str::FromStr as _;
    let parsed: Vec<Requirement> = requirements
        .iter()
        .filter_map(|text| Requirement::from_str(text).ok())
        .collect();
    check_requirement_urls(&parsed, uv_env).await
}

/// `(host, port)` of a URL given as text (for comparing with the configured indexes).
fn host_port(url: &str) -> Option<(String, Option<u16>)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let default = match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, port) = v6.split_once(']')?;
        let port = port
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .or(default);
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok().or(default))),
        None => Some((authority.to_owned(), default)),
    }
}

/// Where package code starts (as its working directory): its own scratch (`/tmp`, a capped tmpfs), also its `HOME`.
pub const PACKAGE_CODE_CWD: &str = "/tmp";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_hosts_and_ports_are_read_from_urls() {
        assert_eq!(
            host_port("http://user:pw@127.0.0.1:8080/simple"),
            Some(("127.0.0.1".to_owned(), Some(8080)))
        );
        assert_eq!(
            host_port("https://mirror.example/simple"),
            Some(("mirror.example".to_owned(), Some(443)))
        );
        assert_eq!(
            host_port("http://[::1]/simple"),
            Some(("::1".to_owned(), Some(80)))
        );
    }

    #[tokio::test]
    async fn urls_at_loopback_private_and_metadata_are_refused_unless_an_index() {
        use std::str::FromStr as _;
        let index = crate::UvEnvironment::from_vars([(
            "UV_INDEX_URL".to_owned(),
            "http://u:p@127.0.0.1:8000/simple".to_owned(),
        )]);
        for bad in [
            "evil @ http://127.0.0.1:9/evil-1.0-py3-none-any.whl",
            "evil @ http://[::1]:9/evil-1.0-py3-none-any.whl",
            "evil @ http://169.254.169.254/evil-1.0-py3-none-any.whl",
            "evil @ http://10.0.0.1/evil-1.0-py3-none-any.whl",
            "evil @ http://localhost:9/evil-1.0-py3-none-any.whl",
        ] {
            let reqs = vec![Requirement::from_str(bad).unwrap()];
            let err = check_requirement_urls(&reqs, &index).await.unwrap_err();
            assert!(
                matches!(err, EnvError::ForbiddenUrl { .. }),
                "{bad}: {err:?}"
            );
        }
        let ok = vec![
            Requirement::from_str("ok @ http://127.0.0.1:8000/files/ok-1.0-py3-none-any.whl")
                .unwrap(),
            Requirement::from_str("six==1.16.0").unwrap(),
        ];
        check_requirement_urls(&ok, &index).await.unwrap();
        // See: issue 13 (installs: exactly the configured hosts). With `install_hosts`, a
        // direct URL elsewhere is refused by name before anything runs; the index still passes.
        let listed = index.with_install_network(crate::InstallNetwork {
            hosts: Some(vec!["files.example".into()]),
            ..crate::InstallNetwork::default()
        });
        let elsewhere = vec![
            Requirement::from_str("evil @ https://other.example/evil-1.0-py3-none-any.whl")
                .unwrap(),
        ];
        let err = check_requirement_urls(&elsewhere, &listed)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("`other.example`, which is not an install host")
                && err.to_string().contains("files.example"),
            "{err}"
        );
        check_requirement_urls(&ok, &listed).await.unwrap();
    }

    #[test]
    fn missing_wheels_are_recognised() {
        assert!(is_missing_wheel(
            b"Because foo==1.0 has no usable wheels and building from source is disabled, we can conclude"
        ));
        assert!(!is_missing_wheel(b"No solution found"));
        assert_eq!(
            packages_without_wheels(
                b"hint: Wheels are required for `sbxsrconly` because building from source is disabled\nhint: Wheels are required for `b` because"
            ),
            ["sbxsrconly", "b"]
        );
    }
}
