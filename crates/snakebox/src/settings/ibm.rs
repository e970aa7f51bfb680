//! IBM's python sandbox server's environment variables (`SANDBOX_*`, seed 003), honoured when
//! its tool set is served (`--compat-tools`), so that a user of that server keeps the settings
//! they started it with. Each maps onto one snakebox setting, and only fills in what snakebox's
//! own flags, environment and config file leave unset:
//!
//! | variable | snakebox setting |
//! |---|---|
//! | `SANDBOX_TIMEOUT` (seconds) | `--default-timeout` |
//! | `SANDBOX_MAX_OUTPUT_SIZE` (bytes) | `--max-output-bytes` |
//! | `SANDBOX_ENABLE_DATA_SCIENCE`, `SANDBOX_ENABLE_NETWORK`, `SANDBOX_ENABLE_FILESYSTEM` | the default profile: `data_science`, `network`, `filesystem` (one at a time: each is one of snakebox's profiles) |
//! | `SANDBOX_ALLOWED_IMPORTS` (comma-separated) | the default profile's import policy, replaced |
//!
//! `SANDBOX_ENABLE_CONTAINER_MODE`, `SANDBOX_CONTAINER_IMAGE` and
//! `SANDBOX_DEFAULT_MEMORY_LIMIT` configure IBM's optional Docker mode; snakebox runs every call
//! in a sandbox already (`--sandbox-backend docker` for containers, with an image it builds
//! itself), so they are not used, and the server's log says so.

use anyhow::bail;
use snakebox_engine::EngineConfig;

/// The variables that configure IBM's Docker mode, which snakebox does not use.
const NOT_USED: &[&str] = &[
    "SANDBOX_ENABLE_CONTAINER_MODE",
    "SANDBOX_CONTAINER_IMAGE",
    "SANDBOX_DEFAULT_MEMORY_LIMIT",
];

/// The tiers IBM enables one variable each, and the profile each is.
const TIERS: &[(&str, &str)] = &[
    ("SANDBOX_ENABLE_DATA_SCIENCE", "data_science"),
    ("SANDBOX_ENABLE_NETWORK", "network"),
    ("SANDBOX_ENABLE_FILESYSTEM", "filesystem"),
];

/// What IBM's variables say, read and checked.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct IbmEnvironment {
    timeout_seconds: Option<u64>,
    max_output_bytes: Option<u64>,
    profile: Option<&'static str>,
    allowed_imports: Option<Vec<String>>,
}

impl IbmEnvironment {
    /// Read them through `env` (the process's environment, or a test's).
    ///
    /// # Errors
    /// A value that does not parse, or several tiers at once; the message names the variable.
    pub(super) fn read(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<IbmEnvironment> {
        let number = |name: &str, least: u64, unit: &str| -> anyhow::Result<Option<u64>> {
            let Some(text) = env(name) else {
                return Ok(None);
            };
            match text.trim().parse::<u64>() {
                Ok(n) if n >= least => Ok(Some(n)),
                _ => bail!(
                    "{name}={text} is not a whole number of {unit} (at least {least})\nhint: IBM's variables are honoured with --compat-tools; fix it or unset it"
                ),
            }
        };
        let mut tiers = Vec::new();
        for &(name, profile) in TIERS {
            let Some(text) = env(name) else { continue };
            match text.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => tiers.push((name, profile)),
                "false" | "0" | "no" | "off" | "" => {}
                _ => bail!("{name}={text} is not true or false\nhint: write true or false"),
            }
        }
        if tiers.len() > 1 {
            let names: Vec<&str> = tiers.iter().map(|(name, _)| *name).collect();
            bail!(
                "{} are on together, and each is one of snakebox's profiles\nhint: turn on one, or define a `[profiles.NAME]` in the config file with what you need and start with --profile NAME",
                names.join(" and ")
            );
        }
        let allowed_imports = match env("SANDBOX_ALLOWED_IMPORTS") {
            None => None,
            Some(text) => {
                let modules: Vec<String> = text
                    .split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
                    .collect();
                if let Some(bad) = modules.iter().find(|m| !snakebox_engine::is_module_name(m)) {
                    bail!(
                        "SANDBOX_ALLOWED_IMPORTS names `{bad}`, which is not a module name\nhint: a comma-separated list of module names, such as math,json,collections"
                    );
                }
                Some(modules)
            }
        };
        for name in NOT_USED {
            if env(name).is_some() {
                tracing::warn!(
                    variable = name,
                    "IBM's Docker-mode setting is not used: every call runs in a sandbox already (--sandbox-backend docker for containers)"
                );
            }
        }
        Ok(IbmEnvironment {
            timeout_seconds: number("SANDBOX_TIMEOUT", 1, "seconds")?,
            max_output_bytes: number("SANDBOX_MAX_OUTPUT_SIZE", 1024, "bytes")?,
            profile: tiers.first().map(|(_, profile)| *profile),
            allowed_imports,
        })
    }

    /// Before snakebox's own limits are read: the values they replace when set.
    pub(super) fn apply_limits(&self, config: &mut EngineConfig) {
        if let Some(seconds) = self.timeout_seconds {
            config.default_timeout = std::time::Duration::from_secs(seconds);
        }
        if let Some(bytes) = self.max_output_bytes {
            config.max_output_bytes = bytes;
        }
    }

    /// After the profiles are read: the default profile (unless one was chosen) and its
    /// import policy.
    pub(super) fn apply_profile(&self, config: &mut EngineConfig, profile_chosen: bool) {
        // IBM's server runs its Basic tier unless told otherwise: so does snakebox when IBM's
        // is the only tool set it serves beside its own and nothing names a profile (another
        // set's users expect snakebox's default, `standard`).
        let only_ibm = config.compat_tools == [snakebox_engine::CompatToolSet::Ibm];
        let tier = self.profile.or(only_ibm.then_some("basic"));
        if let Some(profile) = tier
            && !profile_chosen
        {
            config.profiles.default = profile.to_owned();
        }
        if let Some(modules) = &self.allowed_imports {
            let default = config.profiles.default.clone();
            if let Some(profile) = config.profiles.all.get_mut(&default) {
                profile.allowed_imports = Some(modules.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn read(pairs: &[(&str, &str)]) -> anyhow::Result<IbmEnvironment> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        IbmEnvironment::read(&|name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn each_variable_maps_onto_its_setting() {
        let ibm = read(&[
            ("SANDBOX_TIMEOUT", "12"),
            ("SANDBOX_MAX_OUTPUT_SIZE", "4096"),
            ("SANDBOX_ENABLE_NETWORK", "True"),
            ("SANDBOX_ENABLE_FILESYSTEM", "false"),
            ("SANDBOX_ALLOWED_IMPORTS", "math, json ,xml.etree,"),
        ])
        .unwrap();
        assert_eq!(
            ibm,
            IbmEnvironment {
                timeout_seconds: Some(12),
                max_output_bytes: Some(4096),
                profile: Some("network"),
                allowed_imports: Some(vec!["math".into(), "json".into(), "xml.etree".into()]),
            }
        );
        assert_eq!(read(&[]).unwrap(), IbmEnvironment::default());
    }

    #[test]
    fn bad_values_and_tiers_together_are_refused_by_name() {
        for (pairs, expected) in [
            (
                vec![("SANDBOX_TIMEOUT", "soon")],
                "SANDBOX_TIMEOUT=soon is not a whole number",
            ),
            (vec![("SANDBOX_TIMEOUT", "0")], "at least 1"),
            (vec![("SANDBOX_MAX_OUTPUT_SIZE", "10")], "at least 1024"),
            (
                vec![("SANDBOX_ENABLE_NETWORK", "maybe")],
                "is not true or false",
            ),
            (
                vec![
                    ("SANDBOX_ENABLE_NETWORK", "true"),
                    ("SANDBOX_ENABLE_DATA_SCIENCE", "1"),
                ],
                "SANDBOX_ENABLE_DATA_SCIENCE and SANDBOX_ENABLE_NETWORK are on together",
            ),
            (vec![("SANDBOX_ALLOWED_IMPORTS", "math,os;rm")], "`os;rm`"),
        ] {
            let err = read(&pairs).unwrap_err().to_string();
            assert!(err.contains(expected), "{pairs:?}: {err}");
            assert!(err.contains("hint:"), "{err}");
        }
    }
}
