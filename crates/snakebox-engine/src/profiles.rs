//! Profiles: named policy bundles an operator offers (`[profiles.NAME]` in the config file,
//! and built-ins matching the four tiers of IBM's python sandbox server). A profile only ever
//! narrows what the server allows: its network is off, the server's policy or a subset of it;
//! its limits are at most the server's; a call may narrow them further, never widen them.
//!
//! Each decision names how it is enforced. Network, subprocesses (a second-stage seccomp
//! program that denies `execve`), the writable working directory and the limits are the
//! sandbox's (the OS enforces them against any code). The package allowlist is checked by the
//! server before anything is installed. The import policy is a guard rail for code that does
//! not attack the runtime (see `validate.rs` and the runner); the sandbox is the boundary.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{EngineError, ErrorKind};

/// The name of the profile that adds nothing to the server's settings.
pub const STANDARD_PROFILE: &str = "standard";

/// Where a profile's runs may connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "mode", content = "domains")]
pub enum ProfileNetwork {
    /// No network at all (a network namespace with loopback only).
    Off,
    /// The server's network policy, as configured in `[network]`.
    Server,
    /// Only these names (each must be allowed by the server's policy too).
    Allow(Vec<String>),
}

impl ProfileNetwork {
    /// `off`, `server` or `allow:NAME,...`.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            ProfileNetwork::Off => "off".into(),
            ProfileNetwork::Server => "server".into(),
            ProfileNetwork::Allow(names) => format!("allow:{}", names.join(",")),
        }
    }
}

/// Limits of a profile; each is at most the server's (absent: the server's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProfileLimits {
    /// Longest run, in seconds.
    pub timeout_seconds: Option<u64>,
    /// Memory, in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU time, in seconds.
    pub cpu_seconds: Option<u64>,
    /// Processes and threads at once.
    pub processes: Option<u64>,
    /// Output kept per stream, in bytes.
    pub output_bytes: Option<u64>,
}

/// One profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// Its name (`basic`, `data_science`, ...).
    pub name: String,
    /// What it is for, for people.
    pub description: String,
    /// Where runs may connect.
    pub network: ProfileNetwork,
    /// Whether runs may start other programs (`false`: `execve` is denied by seccomp once the
    /// interpreter runs).
    pub subprocesses: bool,
    /// Whether the working directory `/work` is writable (`/tmp` always is: a private,
    /// size-capped tmpfs).
    pub writable_work: bool,
    /// Limits (each at most the server's).
    pub limits: ProfileLimits,
    /// The packages a call may ask for (names; PEP 503 normalised); `None`: any.
    pub packages: Option<Vec<String>>,
    /// The modules the script's own code may import; `None`: no import policy.
    pub allowed_imports: Option<Vec<String>>,
    /// The tenants (HTTP API keys' tenants) that may name it; `*` for every one. The server's
    /// default profile is every tenant's, and the local operator (stdio) may name any.
    pub tenants: Vec<String>,
}

/// The safe standard library of the `basic` tier.
const BASIC_MODULES: &[&str] = &[
    "math",
    "random",
    "statistics",
    "decimal",
    "fractions",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "textwrap",
    "re",
    "difflib",
    "unicodedata",
    "base64",
    "binascii",
    "hashlib",
    "hmac",
    "secrets",
    "json",
    "csv",
    "html.parser",
    "xml.etree",
    "urllib.parse",
    "datetime",
    "uuid",
    "calendar",
    "dataclasses",
    "enum",
    "typing",
    "copy",
    "pprint",
    "operator",
    "time",
    "zoneinfo",
    "numbers",
    "cmath",
    "array",
    "abc",
];

const DATA_SCIENCE_PACKAGES: &[&str] = &[
    "numpy",
    "pandas",
    "scipy",
    "matplotlib",
    "seaborn",
    "scikit-learn",
    "statsmodels",
    "plotly",
    "sympy",
];
const DATA_SCIENCE_MODULES: &[&str] = &[
    "numpy",
    "pandas",
    "scipy",
    "matplotlib",
    "seaborn",
    "sklearn",
    "statsmodels",
    "plotly",
    "sympy",
];
const NETWORK_PACKAGES: &[&str] = &["httpx", "requests", "aiohttp", "websocket-client"];
const NETWORK_MODULES: &[&str] = &[
    "httpx",
    "requests",
    "aiohttp",
    "websocket",
    "urllib.request",
    "http.client",
    "email",
    "smtplib",
    "ftplib",
    "ssl",
    "socket",
];
const FILESYSTEM_MODULES: &[&str] = &[
    "pathlib", "os.path", "tempfile", "shutil", "glob", "zipfile", "tarfile", "io", "fnmatch",
    "gzip", "bz2", "lzma",
];

pub(crate) const MIB: u64 = 1024 * 1024;

fn names(lists: &[&[&str]]) -> Vec<String> {
    let mut all: Vec<String> = lists
        .iter()
        .flat_map(|list| list.iter().map(|name| (*name).to_owned()))
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The built-in profiles: `standard` (the server's settings, nothing added) and the four
/// tiers of IBM's python sandbox server.
#[must_use]
pub fn builtin_profiles() -> Vec<Profile> {
    let tier_limits = |memory_mib: u64| ProfileLimits {
        memory_bytes: Some(memory_mib * MIB),
        processes: Some(64),
        ..ProfileLimits::default()
    };
    vec![
        Profile::unrestricted(
            STANDARD_PROFILE,
            "The server's own settings: network, limits and packages as configured, \
             subprocesses allowed, no import policy",
        ),
        Profile {
            name: "basic".into(),
            description: "Safe standard library only: no network, no subprocesses, no packages, \
                          a read-only working directory"
                .into(),
            network: ProfileNetwork::Off,
            subprocesses: false,
            writable_work: false,
            limits: tier_limits(256),
            packages: Some(vec![]),
            allowed_imports: Some(names(&[BASIC_MODULES])),
            tenants: vec![],
        },
        Profile {
            name: "data_science".into(),
            description: "Numerical work: numpy, pandas, scipy, matplotlib and friends; no \
                          network, no subprocesses"
                .into(),
            network: ProfileNetwork::Off,
            subprocesses: false,
            writable_work: true,
            limits: tier_limits(2048),
            packages: Some(names(&[DATA_SCIENCE_PACKAGES])),
            allowed_imports: Some(names(&[BASIC_MODULES, DATA_SCIENCE_MODULES])),
            tenants: vec![],
        },
        Profile {
            name: "network".into(),
            description: "HTTP clients (httpx, requests, aiohttp) under the server's network \
                          policy; no subprocesses"
                .into(),
            network: ProfileNetwork::Server,
            subprocesses: false,
            writable_work: true,
            limits: tier_limits(512),
            packages: Some(names(&[NETWORK_PACKAGES])),
            allowed_imports: Some(names(&[BASIC_MODULES, NETWORK_MODULES])),
            tenants: vec![],
        },
        Profile {
            name: "filesystem".into(),
            description: "File work in the working directory (pathlib, tempfile, shutil, \
                          zipfile, tarfile); no network, no subprocesses, no packages"
                .into(),
            network: ProfileNetwork::Off,
            subprocesses: false,
            writable_work: true,
            limits: tier_limits(512),
            packages: Some(vec![]),
            allowed_imports: Some(names(&[BASIC_MODULES, FILESYSTEM_MODULES])),
            tenants: vec![],
        },
    ]
}

/// The profiles of a server and its default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profiles {
    /// The profile of a call that names none.
    pub default: String,
    /// Every profile, by name.
    pub all: BTreeMap<String, Profile>,
    /// The default profile of a tenant set apart (`[tenants.NAME] default_profile`), by
    /// tenant; the others have [`Profiles::default`].
    pub tenant_defaults: BTreeMap<String, String>,
}

impl Default for Profiles {
    fn default() -> Self {
        Profiles {
            default: STANDARD_PROFILE.into(),
            all: builtin_profiles()
                .into_iter()
                .map(|profile| (profile.name.clone(), profile))
                .collect(),
            tenant_defaults: BTreeMap::new(),
        }
    }
}

impl Profiles {
    /// The names, sorted.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.all.keys().cloned().collect()
    }

    /// The profile of `caller`'s calls that name none: its tenant's own default, else the
    /// server's.
    #[must_use]
    pub fn default_for(&self, caller: &crate::Caller) -> &str {
        self.tenant_defaults
            .get(caller.id())
            .unwrap_or(&self.default)
    }

    /// Let `tenant` name each of `profiles` (`[tenants.NAME] profiles`: the same grant as
    /// the tenant in each profile's own `tenants` list; either way grants it) and, when
    /// given, make `default` its default.
    pub fn grant(&mut self, tenant: &str, profiles: &[String], default: Option<&str>) {
        for name in profiles {
            if let Some(profile) = self.all.get_mut(name)
                && !profile.tenants.iter().any(|t| t == tenant)
            {
                profile.tenants.push(tenant.to_owned());
            }
        }
        if let Some(default) = default {
            self.tenant_defaults
                .insert(tenant.to_owned(), default.to_owned());
        }
    }

    /// The profile `requested` (or the default) for `caller`.
    ///
    /// # Errors
    /// `invalid`: no such profile, or the operator did not allow it for the caller's tenant.
    pub fn for_caller(
        &self,
        caller: &crate::Caller,
        requested: Option<&str>,
    ) -> Result<&Profile, EngineError> {
        self.for_tenant(caller.id(), requested)
    }

    /// The profile `requested` (or the default) for the tenant named `tenant`.
    ///
    /// # Errors
    /// `invalid`: no such profile, or the operator did not allow it for the tenant.
    pub(crate) fn for_tenant(
        &self,
        tenant: &str,
        requested: Option<&str>,
    ) -> Result<&Profile, EngineError> {
        let default = self
            .tenant_defaults
            .get(tenant)
            .map_or(self.default.as_str(), String::as_str);
        let name = requested.unwrap_or(default);
        let Some(profile) = self.all.get(name) else {
            return Err(EngineError::new(
                ErrorKind::Invalid,
                format!("There is no profile `{name}` on this server"),
            )
            .with_hint(format!(
                "name one of {} (check_environment lists what each allows), or leave `profile` out for your default `{default}`",
                self.names().join(", "),
            )));
        };
        let allowed = name == self.default
            || name == default
            || tenant == crate::LOCAL_TENANT
            || profile
                .tenants
                .iter()
                .any(|allowed| allowed == "*" || allowed == tenant);
        if !allowed {
            return Err(EngineError::new(
                ErrorKind::Invalid,
                format!("The profile `{name}` is not allowed for tenant `{tenant}`"),
            )
            .with_hint(format!(
                "leave `profile` out for your default `{default}`; or the operator adds the tenant to `[profiles.{name}] tenants` (or `{name}` to `[tenants.{tenant}] profiles`)"
            )));
        }
        Ok(profile)
    }
}

/// A package name as PEP 503 compares them: lowercase, runs of `-`, `_`, `.` as one `-`.
#[must_use]
pub fn normalize_package(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
        } else {
            if separator && !out.is_empty() {
                out.push('-');
            }
            separator = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

impl Profile {
    /// A profile that adds nothing to the server's own settings: its network policy and
    /// limits, subprocesses, a writable `/work`, any package, no import policy, every tenant.
    /// `standard`, and where an operator's own profile starts from.
    #[must_use]
    pub fn unrestricted(name: &str, description: &str) -> Profile {
        Profile {
            name: name.to_owned(),
            description: description.to_owned(),
            network: ProfileNetwork::Server,
            subprocesses: true,
            writable_work: true,
            limits: ProfileLimits::default(),
            packages: None,
            allowed_imports: None,
            tenants: Vec::new(),
        }
    }

    /// The requirements this profile refuses (names not in its package allowlist).
    #[must_use]
    pub fn refused_packages(&self, requirements: &[pep508_rs::Requirement]) -> Vec<String> {
        let Some(allowed) = &self.packages else {
            return Vec::new();
        };
        let allowed: Vec<String> = allowed.iter().map(|n| normalize_package(n)).collect();
        requirements
            .iter()
            .filter(|req| !allowed.contains(&normalize_package(req.name.as_ref())))
            .map(|req| req.name.to_string())
            .collect()
    }

    /// The import policy of a call: the call's list, each module covered by the profile's
    /// (a narrowing), or the profile's own.
    ///
    /// # Errors
    /// `invalid`: the call allows a module the profile does not.
    pub fn imports_for(
        &self,
        requested: Option<&[String]>,
    ) -> Result<Option<Vec<String>>, EngineError> {
        match (requested, &self.allowed_imports) {
            (None, policy) => Ok(policy.clone()),
            (Some(asked), None) => Ok(Some(asked.to_vec())),
            (Some(asked), Some(policy)) => {
                let wider: Vec<&String> = asked
                    .iter()
                    .filter(|module| !crate::import_allowed(module, policy))
                    .collect();
                if wider.is_empty() {
                    return Ok(Some(asked.to_vec()));
                }
                let listed: Vec<String> = wider.iter().map(|m| format!("`{m}`")).collect();
                Err(EngineError::new(
                    ErrorKind::Invalid,
                    format!(
                        "allowed_imports asks for {} which the profile `{}` does not allow",
                        listed.join(", "),
                        self.name
                    ),
                )
                .with_hint(format!(
                    "a call may only narrow its profile's import policy; leave allowed_imports out for the profile's list (check_environment shows it), or name a profile that allows {}",
                    listed.join(", ")
                )))
            }
        }
    }

    /// The requirement specifiers (PEP 508) this profile refuses; ones that do not parse
    /// are left to the usual check.
    #[must_use]
    pub fn refused_specs(&self, specs: &[String]) -> Vec<String> {
        let parsed: Vec<pep508_rs::Requirement> =
            specs.iter().filter_map(|spec| spec.parse().ok()).collect();
        self.refused_packages(&parsed)
    }

    /// The error of a request for packages this profile does not allow.
    #[must_use]
    pub fn packages_refused(&self, refused: &[String]) -> EngineError {
        let allowed = match &self.packages {
            Some(list) if !list.is_empty() => {
                format!("it allows {}: drop the others", list.join(", "))
            }
            _ => "it allows no packages: drop them".to_owned(),
        };
        EngineError::invalid(
            format!(
                "The profile `{}` does not allow installing {}",
                self.name,
                refused
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "{allowed} from dependencies and the PEP 723 block, or name a profile that allows them (check_environment lists the profiles)"
            ),
        )
    }

    /// Whether it decides nothing beyond the server's own settings (as `standard`).
    #[must_use]
    pub fn adds_nothing(&self) -> bool {
        self.network == ProfileNetwork::Server
            && self.subprocesses
            && self.writable_work
            && self.limits == ProfileLimits::default()
            && self.packages.is_none()
            && self.allowed_imports.is_none()
    }

    /// What this profile decides and how each decision is enforced, for `check_environment`.
    #[must_use]
    pub fn enforcement(&self) -> Vec<String> {
        let mut lines = Vec::new();
        lines.push(match &self.network {
            ProfileNetwork::Off => {
                "network: off (sandbox: a network namespace with loopback only)".to_owned()
            }
            ProfileNetwork::Server => {
                "network: the server's network policy (sandbox: own network namespace; the run proxy decides)".to_owned()
            }
            ProfileNetwork::Allow(names) => format!(
                "network: only {} (sandbox: own network namespace; the run proxy allows these names only)",
                names.join(", ")
            ),
        });
        lines.push(if self.subprocesses {
            "subprocesses: allowed (within the process limit)".to_owned()
        } else {
            "subprocesses: denied (sandbox: a seccomp program denies execve/execveat before any user or environment code)".to_owned()
        });
        lines.push(if self.writable_work {
            "writable: /work and /tmp (sandbox: the only writable mounts)".to_owned()
        } else {
            "writable: /tmp only (sandbox: /work mounted read-only)".to_owned()
        });
        let limits = &self.limits;
        let mut bounds = Vec::new();
        if let Some(seconds) = limits.timeout_seconds {
            bounds.push(format!("time {seconds} s"));
        }
        if let Some(bytes) = limits.memory_bytes {
            bounds.push(format!("memory {} MiB", bytes / MIB));
        }
        if let Some(seconds) = limits.cpu_seconds {
            bounds.push(format!("CPU {seconds} s"));
        }
        if let Some(count) = limits.processes {
            bounds.push(format!("{count} processes"));
        }
        if let Some(bytes) = limits.output_bytes {
            bounds.push(format!("output {bytes} bytes"));
        }
        lines.push(if bounds.is_empty() {
            "limits: the server's (sandbox: cgroups/rlimits)".to_owned()
        } else {
            format!(
                "limits: {} at most, and never above the server's (sandbox: cgroups/rlimits)",
                bounds.join(", ")
            )
        });
        lines.push(match &self.packages {
            None => "packages: any (installed in their own sandbox)".to_owned(),
            Some(list) if list.is_empty() => {
                "packages: none (server: refused before anything is installed)".to_owned()
            }
            Some(list) => format!(
                "packages: only {} (server: refused before anything is installed)",
                list.join(", ")
            ),
        });
        lines.push(match &self.allowed_imports {
            None => "imports: no import policy".to_owned(),
            Some(list) => format!(
                "imports: {} modules (guard rail, not a boundary: checked before the run and by the runner's import hook)",
                list.len()
            ),
        });
        lines
    }
}

/// The result of a call its profile refused: the refusal is a `policy_refused` event.
pub(crate) fn refused(result: &mut crate::ExecutionResult, profile: &str) {
    let message = result
        .error
        .as_ref()
        .map_or_else(String::new, |e| e.message.clone());
    let who = if profile.is_empty() {
        String::new()
    } else {
        format!("profile `{profile}`: ")
    };
    result.events.push(crate::events::event(
        crate::EventKind::PolicyRefused,
        format!("{who}{message}"),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_compare_as_pep_503_says() {
        assert_eq!(normalize_package("Scikit_Learn"), "scikit-learn");
        assert_eq!(normalize_package("zope.interface"), "zope-interface");
        assert_eq!(normalize_package("a--_b"), "a-b");
    }

    #[test]
    fn the_default_is_every_tenants_and_others_need_the_operators_word() {
        let mut profiles = Profiles::default();
        let tenant = crate::Caller::tenant("team-a").unwrap();
        assert!(profiles.for_caller(&tenant, None).is_ok());
        let refused = profiles.for_caller(&tenant, Some("network")).unwrap_err();
        assert!(refused.message.contains("not allowed for tenant `team-a`"));
        assert!(refused.hint.unwrap().contains("[profiles.network] tenants"));
        // The local operator may name any.
        assert!(
            profiles
                .for_caller(&crate::Caller::local(), Some("network"))
                .is_ok()
        );
        profiles.all.get_mut("network").unwrap().tenants = vec!["team-a".into()];
        assert!(profiles.for_caller(&tenant, Some("network")).is_ok());
        let unknown = profiles.for_caller(&tenant, Some("nope")).unwrap_err();
        assert!(unknown.hint.unwrap().contains("basic, data_science"));
    }

    #[test]
    fn a_call_narrows_the_import_policy_and_never_widens_it() {
        let basic = Profiles::default().all["basic"].clone();
        assert_eq!(
            basic.imports_for(Some(&["math".to_owned()])).unwrap(),
            Some(vec!["math".to_owned()])
        );
        let wider = basic.imports_for(Some(&["os".to_owned()])).unwrap_err();
        assert!(wider.message.contains("`os`"), "{}", wider.message);
        assert_eq!(basic.imports_for(None).unwrap(), basic.allowed_imports);
    }

    #[test]
    fn packages_outside_the_allowlist_are_named() {
        let data = Profiles::default().all["data_science"].clone();
        let reqs: Vec<pep508_rs::Requirement> = ["numpy>=1.26", "Scikit_Learn", "requests"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(data.refused_packages(&reqs), ["requests"]);
    }
}
