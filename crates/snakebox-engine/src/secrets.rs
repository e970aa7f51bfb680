//! Secrets the code never sees: which secrets the operator declared, which a call may have,
//! and what a run that has some is given (a placeholder per secret and a trust bundle), while
//! its proxy holds the values.
//!
//! Why a module of its own: a secret crosses three rooms (the operator's settings, a call's
//! policy, the run's proxy) and must be judged the same way on every path. The decision is
//! [`decide`], called from the call policy (`CallPolicy::decide`); the grant is
//! [`Secrets::grant`], called where a run's proxy is started. The values stay in the
//! server: a run gets `secrets.json` (names and placeholders) and `ca-bundle.pem` (the
//! host's CAs and the server's egress CA, no key) in its read-only input directory, and the
//! runner sets the environment from them before any user code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_sandbox::{Interceptor, RunSecrets, SecretGrant, SecretValue};

use crate::{EngineError, ErrorKind, Profile};

/// File name, in a run's input directory, of the names and placeholders the runner exports.
pub(crate) const SECRETS_FILE: &str = "secrets.json";
/// File name, in a run's input directory, of the trust bundle of a run with secrets.
pub(crate) const BUNDLE_FILE: &str = "ca-bundle.pem";
/// Where the server's egress CA is kept, under the data directory.
const CA_DIR: &str = "egress-ca";

/// One secret the operator declared (`[secrets.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    /// Its name: the environment variable a run sees its placeholder in.
    pub name: String,
    /// Its value (read from an environment variable or a file when the settings were read).
    pub value: SecretValue,
    /// The hosts it may be sent to (`name` or `*.suffix`), over HTTPS.
    pub hosts: Vec<String>,
    /// A header set on every request to its hosts (`("Authorization", "Bearer {}")`);
    /// `None`: a placeholder in a header is replaced.
    pub header: Option<(String, String)>,
    /// The tenants that may ask for it (`*`: every one). The local operator (stdio) always may.
    pub tenants: Vec<String>,
    /// The profiles under which it may be asked for; empty: any.
    pub profiles: Vec<String>,
}

impl SecretSpec {
    /// Whether `tenant` may ask for it.
    fn allows_tenant(&self, tenant: &str) -> bool {
        tenant == crate::LOCAL_TENANT || self.tenants.iter().any(|t| t == "*" || t == tenant)
    }

    /// Whether it may be asked for under `profile`.
    fn allows_profile(&self, profile: &str) -> bool {
        self.profiles.is_empty() || self.profiles.iter().any(|p| p == profile)
    }
}

/// The operator's secrets and how the proxy verifies their hosts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecretsConfig {
    /// The secrets, by name.
    pub declared: BTreeMap<String, SecretSpec>,
    /// A PEM file of CA certificates trusted upstream besides the host's (a private API's
    /// own CA).
    pub extra_ca_file: Option<PathBuf>,
}

/// Whether `name` can be a secret's name: an environment variable's (`A-Z`, `0-9`, `_`, not
/// starting with a digit, at most 64 characters).
#[must_use]
pub fn is_secret_name(name: &str) -> bool {
    // Names the run's environment needs for itself (the interpreter, the proxy, the trust
    // bundle, the loader) cannot be a secret's.
    const RESERVED: [&str; 9] = [
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "USER",
        "VIRTUAL_ENV",
        "NO_PROXY",
        "ALL_PROXY",
        "MPLBACKEND",
    ];
    const RESERVED_PREFIXES: [&str; 8] = [
        "PYTHON",
        "LD_",
        "SSL_",
        "REQUESTS_",
        "CURL_",
        "HTTP",
        "SNAKEBOX",
        "UV_",
    ];
    !name.is_empty()
        && !RESERVED.contains(&name)
        && !RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
        && name.len() <= 64
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// A secret a caller may ask for, as `check_environment` lists it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretReport {
    /// Its name, for `secrets`.
    pub name: String,
    /// The hosts it is sent to (over HTTPS only).
    pub hosts: Vec<String>,
    /// The header it is put in (its name), when the proxy sets one.
    pub header: Option<String>,
    /// The profiles it may be asked for under (empty: any).
    pub profiles: Vec<String>,
}

/// The secrets a call of `tenant` under `profile` gets for `asked` (names), or why not.
/// `network`: whether the call has network through a proxy of its own.
///
/// # Errors
/// An unknown name, one the tenant or the profile may not have, or a call without network.
pub(crate) fn decide(
    config: &SecretsConfig,
    tenant: &str,
    profile: &Profile,
    asked: &[String],
    network: bool,
) -> Result<Vec<String>, EngineError> {
    let mut granted: Vec<String> = Vec::new();
    for name in asked {
        let available = || {
            let names: Vec<&str> = config
                .declared
                .values()
                .filter(|s| s.allows_tenant(tenant) && s.allows_profile(&profile.name))
                .map(|s| s.name.as_str())
                .collect();
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        };
        let Some(spec) = config
            .declared
            .get(name)
            .filter(|s| s.allows_tenant(tenant))
        else {
            // An unknown secret and one of another tenant's read the same: no name leaks.
            return Err(EngineError::invalid(
                format!(
                    "This call asked for secret `{name}`, which this server does not offer to it"
                ),
                format!(
                    "ask only for the secrets check_environment lists (here: {}); the operator declares them as `[secrets.NAME]`",
                    available()
                ),
            ));
        };
        if !spec.allows_profile(&profile.name) {
            return Err(EngineError::invalid(
                format!(
                    "Secret `{name}` cannot be used under the profile `{}`",
                    profile.name
                ),
                format!(
                    "run under one of its profiles ({}), or ask the operator to add `{}` to `[secrets.{name}] profiles`",
                    spec.profiles.join(", "),
                    profile.name
                ),
            ));
        }
        if !granted.contains(name) {
            granted.push(name.clone());
        }
    }
    if !granted.is_empty() && !network {
        return Err(EngineError::invalid(
            format!(
                "This call asked for secret `{}` but has no network: a secret is only ever sent by the network proxy",
                granted.join("`, `")
            ),
            "ask for network as well (omit `network: false`), under a profile and a server that allow it; check_environment shows the network policy",
        ));
    }
    Ok(granted)
}

/// The secrets service: what callers may ask for, and the grant of placeholders to a run,
/// with the interceptor (the server's CA and upstream trust) made on first use.
pub(crate) struct Secrets {
    config: SecretsConfig,
    /// Where the server's CA is kept (under [`CA_DIR`]).
    data_dir: PathBuf,
    interceptor: OnceLock<Result<Arc<Interceptor>, String>>,
}

/// What the runner reads from [`SECRETS_FILE`].
#[derive(Serialize)]
struct RunnerSecrets<'a> {
    /// Name → placeholder.
    env: BTreeMap<&'a str, &'a str>,
    /// The trust bundle, as the sandbox sees it.
    ca_bundle: String,
}

impl Secrets {
    /// The service for the secrets `config` declares, its CA kept under `data_dir`.
    pub(crate) fn new(config: SecretsConfig, data_dir: PathBuf) -> Secrets {
        Secrets {
            config,
            data_dir,
            interceptor: OnceLock::new(),
        }
    }

    /// The secrets `caller` may ask for, as check_environment lists them.
    pub(crate) fn report(&self, caller: Option<&crate::Caller>) -> Vec<SecretReport> {
        self.config
            .declared
            .values()
            .filter(|s| caller.is_none_or(|c| s.allows_tenant(c.id())))
            .map(|s| SecretReport {
                name: s.name.clone(),
                hosts: s.hosts.clone(),
                header: s.header.as_ref().map(|(name, _)| name.clone()),
                profiles: s.profiles.clone(),
            })
            .collect()
    }

    /// The interceptor, made now if not yet.
    fn interceptor(&self) -> Result<Arc<Interceptor>, EngineError> {
        self.interceptor
            .get_or_init(|| {
                let ca = snakebox_sandbox::EgressCa::load_or_create(
                    &self.data_dir.join(CA_DIR),
                )?;
                Interceptor::new(ca, self.config.extra_ca_file.as_deref()).map(Arc::new)
            })
            .clone()
            .map_err(|message| {
                EngineError::new(
                    ErrorKind::Unavailable,
                    format!("Secrets cannot be served: {message}"),
                )
                .with_hint("check that the data directory is writable and `[secrets] extra_ca_file` (if set) is a PEM file of CA certificates")
            })
    }

    /// Grant the secrets `names` (decided by the call's policy) to the run whose input
    /// directory is `input` (seen at `input_inside` in its sandbox): a new placeholder per
    /// secret, written with the trust bundle for the runner; the values go to the proxy only.
    pub(crate) fn grant(
        &self,
        input: &Path,
        input_inside: &Path,
        names: &[String],
    ) -> Result<RunSecrets, EngineError> {
        let interceptor = self.interceptor()?;
        let grants: Vec<SecretGrant> = names
            .iter()
            .filter_map(|name| self.config.declared.get(name))
            .map(|spec| SecretGrant {
                name: spec.name.clone(),
                placeholder: format!("snakebox-secret-{}", crate::ids::random_hex()),
                value: spec.value.clone(),
                hosts: spec.hosts.clone(),
                header: spec.header.clone(),
            })
            .collect();
        let bundle_inside = input_inside.join(BUNDLE_FILE);
        let file = RunnerSecrets {
            env: grants
                .iter()
                .map(|g| (g.name.as_str(), g.placeholder.as_str()))
                .collect(),
            ca_bundle: bundle_inside.to_string_lossy().into_owned(),
        };
        let written = serde_json::to_vec(&file)
            .map_err(std::io::Error::other)
            .and_then(|json| write_for_run(&input.join(SECRETS_FILE), &json))
            .and_then(|()| {
                write_for_run(
                    &input.join(BUNDLE_FILE),
                    interceptor.sandbox_bundle().as_bytes(),
                )
            });
        written.map_err(|err| {
            EngineError::internal(
                format!("Failed to give the run its secrets' placeholders: {err}"),
                "check that the data directory is writable",
            )
        })?;
        Ok(RunSecrets {
            interceptor,
            grants,
        })
    }
}

/// Write `bytes` to `path` in a run's input directory (read-only inside), readable by the run.
fn write_for_run(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs_err::write(path, bytes)?;
    fs_err::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, tenants: &[&str], profiles: &[&str]) -> SecretSpec {
        SecretSpec {
            name: name.into(),
            value: SecretValue::new("v"),
            hosts: vec!["api.test".into()],
            header: None,
            tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
            profiles: profiles.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    #[test]
    fn secrets_are_granted_by_tenant_profile_and_network() {
        let mut config = SecretsConfig::default();
        for s in [
            spec("API_TOKEN", &["team-a"], &[]),
            spec("ANY", &["*"], &["standard"]),
        ] {
            config.declared.insert(s.name.clone(), s);
        }
        let standard = Profile::unrestricted("standard", "");
        let other = Profile::unrestricted("other", "");
        let asked = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            decide(
                &config,
                "team-a",
                &standard,
                &asked(&["API_TOKEN", "API_TOKEN"]),
                true
            ),
            Ok(vec!["API_TOKEN".to_owned()])
        );
        // The local operator may have any.
        assert!(
            decide(
                &config,
                crate::LOCAL_TENANT,
                &standard,
                &asked(&["API_TOKEN"]),
                true
            )
            .is_ok()
        );
        // Another tenant: the same refusal as an unknown name, listing only its own.
        let refused =
            decide(&config, "team-b", &standard, &asked(&["API_TOKEN"]), true).unwrap_err();
        let unknown = decide(&config, "team-b", &standard, &asked(&["NOPE"]), true).unwrap_err();
        assert!(
            refused.message.contains("does not offer"),
            "{}",
            refused.message
        );
        assert_eq!(refused.hint, unknown.hint);
        assert!(
            refused
                .hint
                .as_deref()
                .is_some_and(|h| h.contains("here: ANY") && !h.contains("API_TOKEN"))
        );
        let refused = decide(&config, "team-b", &other, &asked(&["ANY"]), true).unwrap_err();
        assert!(
            refused.message.contains("profile `other`"),
            "{}",
            refused.message
        );
        let refused =
            decide(&config, "team-a", &standard, &asked(&["API_TOKEN"]), false).unwrap_err();
        assert!(
            refused.message.contains("no network"),
            "{}",
            refused.message
        );
        assert_eq!(decide(&config, "team-a", &standard, &[], false), Ok(vec![]));
    }

    #[test]
    fn secret_names_are_environment_variables() {
        for good in ["API_TOKEN", "A", "GITHUB_TOKEN2"] {
            assert!(is_secret_name(good), "{good}");
        }
        for bad in [
            "",
            "api_token",
            "2FA",
            "A-B",
            "PATH NAME",
            "PATH",
            "SSL_CERT_FILE",
            "HTTPS_PROXY",
            "PYTHONPATH",
        ] {
            assert!(!is_secret_name(bad), "{bad}");
        }
    }
}
