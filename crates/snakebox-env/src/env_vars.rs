//! The environment uv runs with: one allow-list, in one place.
//!
//! uv never inherits the server's environment. It gets a minimal `PATH`, `HOME`, our cache
//! directory, a few fixed settings, and the operator's index, proxy and certificate settings
//! from [`EnvVars::PASSTHROUGH`] — nothing else, so secrets in the server's environment never
//! reach uv or a package's build script. `PIP_*` variables are not passed: uv does not read them.

use std::collections::BTreeMap;
use std::path::Path;

/// Names of the environment variables this crate reads or sets.
#[derive(Debug, Clone, Copy)]
pub struct EnvVars;

impl EnvVars {
    /// Search path for executables (set to [`EnvVars::MINIMAL_PATH`]).
    pub const PATH: &'static str = "PATH";
    /// Home directory (passed through; uv reads its user configuration there).
    pub const HOME: &'static str = "HOME";
    /// uv's cache directory (always ours, under the data root).
    pub const UV_CACHE_DIR: &'static str = "UV_CACHE_DIR";
    /// Never let uv download an interpreter on its own (we always pass an explicit one);
    /// `manual` for `uv python install` ([`crate::install_python`]).
    pub const UV_PYTHON_DOWNLOADS: &'static str = "UV_PYTHON_DOWNLOADS";
    /// Where `uv python install` fetches interpreters from instead of python-build-standalone's
    /// releases (`<mirror>/<build>/<archive>`; `file://` for a local directory).
    pub const UV_PYTHON_INSTALL_MIRROR: &'static str = "UV_PYTHON_INSTALL_MIRROR";
    /// A JSON list of interpreter downloads replacing the one built into uv (an
    /// organisation's own builds).
    pub const UV_PYTHON_DOWNLOADS_JSON_URL: &'static str = "UV_PYTHON_DOWNLOADS_JSON_URL";
    /// Disable uv's progress bars (its stderr is captured).
    pub const UV_NO_PROGRESS: &'static str = "UV_NO_PROGRESS";
    /// Disable colour codes in uv's messages.
    pub const NO_COLOR: &'static str = "NO_COLOR";
    /// Load TLS roots from the platform's store (uv's `--system-certs`).
    pub const UV_SYSTEM_CERTS: &'static str = "UV_SYSTEM_CERTS";
    /// The deprecated name of [`EnvVars::UV_SYSTEM_CERTS`]: accepted from the operator, never
    /// passed to uv.
    pub const UV_NATIVE_TLS: &'static str = "UV_NATIVE_TLS";
    /// The pyenv root (read to find pyenv's interpreters and the real uv behind a shim).
    pub const PYENV_ROOT: &'static str = "PYENV_ROOT";

    /// The value of `PATH` given to uv and to interpreter queries.
    pub const MINIMAL_PATH: &'static str = "/usr/local/bin:/usr/bin:/bin";

    /// Variables copied from the server's environment to uv when set. Index settings (the ones
    /// in [`EnvVars::INDEX_SETTINGS`]) also go into the environment cache key.
    pub const PASSTHROUGH: &'static [&'static str] = &[
        "HOME",
        "UV_INDEX",
        "UV_INDEX_URL",
        "UV_EXTRA_INDEX_URL",
        "UV_DEFAULT_INDEX",
        "UV_FIND_LINKS",
        "UV_INDEX_STRATEGY",
        "UV_KEYRING_PROVIDER",
        "UV_SYSTEM_CERTS",
        // Deprecated by uv (it warns in every message): read, and passed on as
        // `UV_SYSTEM_CERTS` ([`UvEnvironment::for_uv`]).
        "UV_NATIVE_TLS",
        "UV_HTTP_TIMEOUT",
        "UV_CONCURRENT_DOWNLOADS",
        // Where interpreters are downloaded from (`snakebox python install`, and
        // `python_downloads = "automatic"`): the operator's choice of source, like an index.
        // Of uv's other `UV_PYTHON_*` variables none is passed: `UV_PYTHON_INSTALL_DIR` would
        // let the server and `snakebox python install` disagree on where interpreters are;
        // `UV_PYTHON`, `UV_PYTHON_PREFERENCE` and `UV_PYTHON_DOWNLOADS` would change which
        // interpreter uv takes or whether it downloads (snakebox decides both);
        // `UV_PYTHON_INSTALL_BIN`/`_REGISTRY` write outside uv's directory; PyPy and
        // GraalPy mirrors serve interpreters snakebox does not use.
        "UV_PYTHON_INSTALL_MIRROR",
        "UV_PYTHON_DOWNLOADS_JSON_URL",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    ];

    /// Variables that change what gets resolved, so they are part of the cache key.
    pub const INDEX_SETTINGS: &'static [&'static str] = &[
        "UV_INDEX",
        "UV_INDEX_URL",
        "UV_EXTRA_INDEX_URL",
        "UV_DEFAULT_INDEX",
        "UV_FIND_LINKS",
        "UV_INDEX_STRATEGY",
    ];
}

/// A snapshot of the allow-listed variables, taken once (at startup), so every uv invocation
/// sees the same settings and the cache key is stable; with the operator's install network
/// settings ([`InstallNetwork`]) beside them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UvEnvironment {
    passthrough: BTreeMap<String, String>,
    install: InstallNetwork,
}

/// What installs may reach beyond the configured indexes (the operator's `[network]`
/// settings; not part of the cache key: they decide where files may come from, not which).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallNetwork {
    /// `install_hosts`: only these hosts besides the indexes (`name`, `*.suffix`, or an
    /// address); `None`: any host on ports 80 and 443 whose addresses are public.
    pub hosts: Option<Vec<String>>,
    /// Address ranges installs may reach although they are not public.
    pub exceptions: Vec<ipnet::IpNet>,
}

impl UvEnvironment {
    /// Take the allow-listed variables from this process's environment.
    pub fn from_process() -> Self {
        Self::from_vars(std::env::vars_os().filter_map(|(name, value)| {
            Some((name.into_string().ok()?, value.into_string().ok()?))
        }))
    }

    /// Take the allow-listed variables from the given pairs (everything else is dropped).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let passthrough = vars
            .into_iter()
            .filter(|(name, value)| {
                EnvVars::PASSTHROUGH.contains(&name.as_str()) && !value.is_empty()
            })
            .collect();
        Self {
            passthrough,
            install: InstallNetwork::default(),
        }
    }

    /// What installs may reach beyond the configured indexes.
    pub fn install_network(&self) -> &InstallNetwork {
        &self.install
    }

    /// The same, with `install` deciding what installs may reach beyond the indexes.
    #[must_use]
    pub fn with_install_network(mut self, install: InstallNetwork) -> Self {
        self.install = install;
        self
    }

    /// The same, with `url` as the one default package index (`UV_DEFAULT_INDEX`), in place
    /// of an index the server's environment named (`UV_DEFAULT_INDEX`, or the older
    /// `UV_INDEX_URL`): the operator's `index_url` setting. Extra indexes stay.
    #[must_use]
    pub fn with_default_index(mut self, url: &str) -> Self {
        self.passthrough.remove("UV_INDEX_URL");
        self.passthrough
            .insert("UV_DEFAULT_INDEX".to_owned(), url.to_owned());
        self
    }

    /// The value of one allow-listed variable, if it was set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.passthrough.get(name).map(String::as_str)
    }

    /// The settings that decide what gets resolved, as `NAME=value` lines (for the cache key).
    pub fn index_settings(&self) -> Vec<String> {
        EnvVars::INDEX_SETTINGS
            .iter()
            .filter_map(|name| self.get(name).map(|value| format!("{name}={value}")))
            .collect()
    }

    /// [`UvEnvironment::index_settings`] with the user information of every URL replaced by
    /// `***` (`https://***@host/simple`): what may be written where runs can read it (the
    /// environment's manifest). The cache key keeps the full settings.
    pub fn index_settings_redacted(&self) -> Vec<String> {
        self.index_settings()
            .iter()
            .map(|setting| redact_userinfo(setting))
            .collect()
    }

    /// The egress rules of a download: the configured indexes (and find-links URLs), and the
    /// install hosts (or, without them, public addresses on ports 80 and 443), chained
    /// through the operator's own proxy when one is set for uv (`HTTPS_PROXY`, `HTTP_PROXY`,
    /// `ALL_PROXY`, either case; `NO_PROXY` honoured). `None` when that proxy cannot be
    /// chained (not `http://`): the download then uses the host network to reach it, as uv
    /// would.
    pub fn egress_rules(&self) -> Option<snakebox_sandbox::EgressRules> {
        let mut rules =
            snakebox_sandbox::EgressRules::for_urls(&self.index_urls(), self.install.hosts.clone());
        rules.exceptions.clone_from(&self.install.exceptions);
        let proxy = [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        ]
        .iter()
        .find_map(|name| self.get(name));
        if let Some(url) = proxy {
            match snakebox_sandbox::Upstream::parse(url) {
                Ok(upstream) => rules.upstream = Some(upstream),
                Err(reason) => {
                    tracing::warn!(%reason, "the operator's proxy cannot be chained: downloads use the host network to reach it");
                    return None;
                }
            }
            rules.no_proxy = ["NO_PROXY", "no_proxy"]
                .iter()
                .filter_map(|name| self.get(name))
                .flat_map(|value| value.split(','))
                .map(|entry| entry.trim().to_owned())
                .filter(|entry| !entry.is_empty())
                .collect();
        }
        Some(rules)
    }

    /// The index and find-links URLs uv is configured with (unredacted: for the installer's
    /// own checks, never for package code).
    pub fn index_urls(&self) -> Vec<String> {
        [
            "UV_INDEX",
            "UV_INDEX_URL",
            "UV_EXTRA_INDEX_URL",
            "UV_DEFAULT_INDEX",
            "UV_FIND_LINKS",
        ]
        .iter()
        .filter_map(|name| self.get(name))
        .flat_map(|value| value.split([' ', ',', '\n']))
        .map(|item| {
            item.split_once('=')
                .filter(|(name, _)| !name.contains(':'))
                .map_or(item, |(_, url)| url)
        })
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
    }

    /// The complete environment of code that runs a package's code (bytecode compilation,
    /// builds): a minimal `PATH`, `HOME` in the sandbox's scratch, and nothing of the
    /// operator's: no index URL, credential, proxy or certificate setting.
    pub fn for_package_code() -> Vec<(String, String)> {
        vec![
            (EnvVars::PATH.to_owned(), EnvVars::MINIMAL_PATH.to_owned()),
            (EnvVars::HOME.to_owned(), "/tmp".to_owned()),
            (EnvVars::UV_PYTHON_DOWNLOADS.to_owned(), "never".to_owned()),
            (EnvVars::UV_NO_PROGRESS.to_owned(), "1".to_owned()),
            (EnvVars::NO_COLOR.to_owned(), "1".to_owned()),
        ]
    }

    /// The complete environment of one uv invocation using `cache_dir` as uv's cache.
    pub fn for_uv(&self, cache_dir: &Path) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            (EnvVars::PATH.to_owned(), EnvVars::MINIMAL_PATH.to_owned()),
            (
                EnvVars::UV_CACHE_DIR.to_owned(),
                cache_dir.display().to_string(),
            ),
            (EnvVars::UV_PYTHON_DOWNLOADS.to_owned(), "never".to_owned()),
            (EnvVars::UV_NO_PROGRESS.to_owned(), "1".to_owned()),
            (EnvVars::NO_COLOR.to_owned(), "1".to_owned()),
        ];
        env.extend(
            self.passthrough
                .iter()
                .filter(|(k, _)| k.as_str() != EnvVars::UV_NATIVE_TLS)
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        // The deprecated name is passed on under the new one: uv prints a deprecation warning
        // in every message otherwise (and hints were read from it).
        if self.get(EnvVars::UV_SYSTEM_CERTS).is_none()
            && let Some(value) = self.get(EnvVars::UV_NATIVE_TLS)
        {
            env.push((EnvVars::UV_SYSTEM_CERTS.to_owned(), value.to_owned()));
        }
        // With no certificate setting at all, trust the system's store: an organisation's CA
        // (a TLS-intercepting proxy, a private index) is installed there, not in uv's bundle.
        // MCP clients often start servers with a stripped environment, so this is the common case.
        if self.get("SSL_CERT_FILE").is_none()
            && self.get("SSL_CERT_DIR").is_none()
            && self.get(EnvVars::UV_SYSTEM_CERTS).is_none()
            && self.get(EnvVars::UV_NATIVE_TLS).is_none()
        {
            env.push((EnvVars::UV_SYSTEM_CERTS.to_owned(), "1".to_owned()));
        }
        env
    }

    /// The environment of an interpreter query (no uv settings at all).
    pub(crate) fn for_python() -> Vec<(String, String)> {
        vec![(EnvVars::PATH.to_owned(), EnvVars::MINIMAL_PATH.to_owned())]
    }
}

/// `NAME=scheme://user:secret@host/…` → `NAME=scheme://***@host/…`, for every URL in the text.
pub(crate) fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(['/', '?', '#', ' ', ',', '\n'])
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_information_is_redacted() {
        assert_eq!(
            redact_userinfo("UV_INDEX_URL=http://user:canary-TOKEN@127.0.0.1:8000/simple"),
            "UV_INDEX_URL=http://***@127.0.0.1:8000/simple"
        );
        assert_eq!(
            redact_userinfo("UV_EXTRA_INDEX_URL=https://a:b@x/simple https://y/simple,https://t@z"),
            "UV_EXTRA_INDEX_URL=https://***@x/simple https://y/simple,https://***@z"
        );
        assert_eq!(
            redact_userinfo("UV_INDEX_STRATEGY=first-index"),
            "UV_INDEX_STRATEGY=first-index"
        );
        let env = UvEnvironment::from_vars([(
            "UV_INDEX".to_owned(),
            "private=https://u:p@host/simple".to_owned(),
        )]);
        assert_eq!(env.index_urls(), vec!["https://u:p@host/simple".to_owned()]);
        assert_eq!(
            env.index_settings_redacted(),
            vec!["UV_INDEX=private=https://***@host/simple".to_owned()]
        );
        let package_env = UvEnvironment::for_package_code();
        assert!(
            package_env
                .iter()
                .all(|(k, v)| !k.starts_with("UV_INDEX") && !v.contains("host"))
        );
        assert!(package_env.contains(&("HOME".to_owned(), "/tmp".to_owned())));
    }

    #[test]
    fn only_allow_listed_variables_pass() {
        let env = UvEnvironment::from_vars([
            ("AWS_SECRET_ACCESS_KEY".to_owned(), "s3cr3t".to_owned()),
            (
                "UV_INDEX_URL".to_owned(),
                "https://mirror.example/simple".to_owned(),
            ),
            (
                "SSL_CERT_FILE".to_owned(),
                "/etc/ssl/certs/ca.pem".to_owned(),
            ),
            ("PATH".to_owned(), "/home/me/bin:/usr/bin".to_owned()),
            (
                "UV_PYTHON_INSTALL_MIRROR".to_owned(),
                "file:///srv/pbs".to_owned(),
            ),
            ("UV_PYTHON_INSTALL_DIR".to_owned(), "/elsewhere".to_owned()),
            ("UV_PYTHON".to_owned(), "3.8".to_owned()),
        ]);
        let vars = env.for_uv(Path::new("/data/uv-cache"));
        assert!(vars.iter().all(|(k, _)| k != "AWS_SECRET_ACCESS_KEY"));
        // The interpreter download source passes; what would move or pick interpreters not.
        assert!(vars.contains(&(
            "UV_PYTHON_INSTALL_MIRROR".to_owned(),
            "file:///srv/pbs".to_owned()
        )));
        assert!(
            vars.iter()
                .all(|(k, _)| k != "UV_PYTHON_INSTALL_DIR" && k != "UV_PYTHON")
        );
        assert!(vars.contains(&("PATH".to_owned(), EnvVars::MINIMAL_PATH.to_owned())));
        assert!(vars.contains(&(
            "SSL_CERT_FILE".to_owned(),
            "/etc/ssl/certs/ca.pem".to_owned()
        )));
        assert!(vars.contains(&("UV_CACHE_DIR".to_owned(), "/data/uv-cache".to_owned())));
        // A certificate file is set: the system store is not added.
        assert!(vars.iter().all(|(k, _)| k != "UV_SYSTEM_CERTS"));
        assert_eq!(
            env.index_settings(),
            vec!["UV_INDEX_URL=https://mirror.example/simple".to_owned()]
        );
    }

    // See: issue 12 (7): uv warns about `UV_NATIVE_TLS` in every message (and the warning was
    // taken for a TLS error); it is never passed to uv.
    #[test]
    fn no_deprecated_variable_reaches_uv() {
        let stripped = UvEnvironment::from_vars([]).for_uv(Path::new("/c"));
        assert!(stripped.contains(&("UV_SYSTEM_CERTS".to_owned(), "1".to_owned())));
        let operator = UvEnvironment::from_vars([("UV_NATIVE_TLS".to_owned(), "true".to_owned())])
            .for_uv(Path::new("/c"));
        assert!(operator.contains(&("UV_SYSTEM_CERTS".to_owned(), "true".to_owned())));
        for vars in [stripped, operator] {
            assert!(vars.iter().all(|(k, _)| k != "UV_NATIVE_TLS"), "{vars:?}");
        }
    }

    #[test]
    fn the_operators_index_replaces_the_environments_default_index() {
        let env = UvEnvironment::from_vars([
            (
                "UV_INDEX_URL".to_owned(),
                "https://old.example/simple".to_owned(),
            ),
            (
                "UV_EXTRA_INDEX_URL".to_owned(),
                "https://extra.example/simple".to_owned(),
            ),
        ])
        .with_default_index("https://mirror.example/simple");
        assert_eq!(env.get("UV_INDEX_URL"), None);
        assert_eq!(
            env.get("UV_DEFAULT_INDEX"),
            Some("https://mirror.example/simple")
        );
        assert_eq!(
            env.get("UV_EXTRA_INDEX_URL"),
            Some("https://extra.example/simple")
        );
        assert_eq!(
            env.index_settings(),
            [
                "UV_EXTRA_INDEX_URL=https://extra.example/simple",
                "UV_DEFAULT_INDEX=https://mirror.example/simple"
            ]
        );
    }
}
