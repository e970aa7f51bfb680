//! `[secrets.NAME]`: the operator's secrets, whose values the run proxy alone holds (see the
//! engine's `secrets` module). A value comes from the server's environment or a file, never
//! from the command line (where every user of the host could read it in `/proc`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::bail;
use serde::Deserialize;
use snakebox_engine::{EngineConfig, SecretSpec};

/// `[secrets.NAME]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SecretFile {
    /// The server's environment variable that holds the value.
    pub(super) env: Option<String>,
    /// A file that holds the value (a trailing newline is dropped).
    pub(super) file: Option<PathBuf>,
    /// The hosts it may be sent to (`name` or `*.suffix`), over HTTPS.
    pub(super) hosts: Vec<String>,
    /// A header the proxy sets on each request to the hosts, `{}` for the value
    /// (`"Authorization: Bearer {}"`).
    pub(super) header: Option<String>,
    /// The tenants that may ask for it (`*`: every one); absent: the local operator only.
    pub(super) tenants: Option<Vec<String>>,
    /// The profiles it may be used under; absent: any.
    pub(super) profiles: Option<Vec<String>>,
}

/// The secrets declared by `--secrets` (`SNAKEBOX_SECRETS`: the same tables, in TOML) and by
/// the config file's `[secrets.NAME]` tables; a name declared in both is an error.
pub(super) fn declared(
    text: Option<&str>,
    mut file: BTreeMap<String, SecretFile>,
) -> anyhow::Result<BTreeMap<String, SecretFile>> {
    let Some(text) = text else {
        return Ok(file);
    };
    let more: BTreeMap<String, SecretFile> = toml::from_str(text).map_err(|err| {
        anyhow::anyhow!(
            "--secrets (SNAKEBOX_SECRETS): {}\nhint: write TOML tables as in the config file, e.g. `API_TOKEN = {{ env = \"VAR\", hosts = [\"api.example.com\"] }}`, one per line",
            err.to_string().trim_end()
        )
    })?;
    for (name, table) in more {
        if file.contains_key(&name) {
            bail!(
                "secret `{name}` is declared by both --secrets (SNAKEBOX_SECRETS) and the config file\nhint: keep one of the two declarations"
            );
        }
        file.insert(name, table);
    }
    Ok(file)
}

/// The declared secrets, their values read through `read_env` (the server's environment).
pub(super) fn resolve_secrets(
    file: BTreeMap<String, SecretFile>,
    read_env: &dyn Fn(&str) -> Option<String>,
    config: &mut EngineConfig,
) -> anyhow::Result<()> {
    for (name, table) in file {
        let what = |key: &str| format!("`[secrets.{name}] {key}`");
        if !snakebox_engine::is_secret_name(&name) {
            bail!(
                "invalid secret name `[secrets.{name}]`\nhint: a secret's name is the environment variable runs see it in: upper-case letters, digits and `_` (`API_TOKEN`), not one the run needs itself (PATH, HOME, PYTHON*, SSL_*, HTTP*, ...)"
            );
        }
        let value = match (&table.env, &table.file) {
            (Some(variable), None) => read_env(variable).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: the environment variable `{variable}` is not set\nhint: set it in the server's environment (never on its command line), or read the value from a file with `file = \"/path\"`",
                    what("env")
                )
            })?,
            (None, Some(path)) => fs_err::read_to_string(path)
                .map_err(|err| {
                    anyhow::anyhow!(
                        "{}: {err}\nhint: the file must be readable by the server (keep it readable by the server alone)",
                        what("file")
                    )
                })?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
            _ => bail!(
                "`[secrets.{name}]` needs exactly one of `env` and `file`\nhint: `env = \"VARIABLE\"` names the server's environment variable holding the value; `file = \"/path\"` a file holding it"
            ),
        };
        if value.is_empty() || value.chars().any(|c| c.is_control()) {
            bail!(
                "the value of secret `{name}` is empty or holds control characters (a line break, a NUL)\nhint: a secret goes into an HTTP header: one line of printable text"
            );
        }
        if table.hosts.is_empty() {
            bail!(
                "{} is empty: the secret would go nowhere\nhint: list the hosts it may be sent to, e.g. `hosts = [\"api.example.com\"]`",
                what("hosts")
            );
        }
        let hosts: Vec<String> = table
            .hosts
            .iter()
            .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
            .collect();
        for host in &hosts {
            if !is_pattern(host) {
                bail!(
                    "{}: `{host}` is not a host name or `*.domain` pattern\nhint: secrets are sent to named hosts over HTTPS, e.g. `api.example.com` or `*.example.com`",
                    what("hosts")
                );
            }
        }
        let header = match &table.header {
            None => None,
            Some(text) => {
                let Some((header, template)) = text.split_once(':') else {
                    bail!(
                        "{}: `{text}` is not `Name: value`\nhint: for example `header = \"Authorization: Bearer {{}}\"` ({{}} stands for the value)",
                        what("header")
                    );
                };
                let header = header.trim();
                let template = template.trim();
                let valid_name = !header.is_empty()
                    && header
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !valid_name || !template.contains("{}") {
                    bail!(
                        "{}: `{text}` needs a header name and `{{}}` where the value goes\nhint: for example `header = \"Authorization: Bearer {{}}\"`",
                        what("header")
                    );
                }
                Some((header.to_owned(), template.to_owned()))
            }
        };
        config.secrets.declared.insert(
            name.clone(),
            SecretSpec {
                name: name.clone(),
                value: snakebox_engine::SecretValue::new(&value),
                hosts,
                header,
                tenants: table.tenants.unwrap_or_default(),
                profiles: table.profiles.unwrap_or_default(),
            },
        );
    }
    Ok(())
}

/// A host name, or `*.` and a host name (no address: secrets go to names the TLS
/// certificate is checked for).
fn is_pattern(host: &str) -> bool {
    let name = host.strip_prefix("*.").unwrap_or(host);
    !name.is_empty()
        && name.parse::<std::net::IpAddr>().is_err()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, env: &[(&str, &str)]) -> anyhow::Result<EngineConfig> {
        let file: BTreeMap<String, SecretFile> = toml::from_str(text)?;
        let mut config =
            EngineConfig::new(PathBuf::from("/tmp/x"), snakebox_engine::BackendKind::None);
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        resolve_secrets(
            file,
            &|name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            &mut config,
        )?;
        Ok(config)
    }

    #[test]
    fn secrets_are_declared_with_a_value_from_the_environment_or_a_file() {
        let config = parse(
            "[API_TOKEN]\nenv = \"TOKEN_VALUE\"\nhosts = [\"API.example.com.\", \"*.example.org\"]\nheader = \"Authorization: Bearer {}\"\ntenants = [\"team-a\"]\n",
            &[("TOKEN_VALUE", "s3cret")],
        )
        .unwrap();
        let spec = &config.secrets.declared["API_TOKEN"];
        assert_eq!(spec.value.expose(), "s3cret");
        assert_eq!(spec.hosts, ["api.example.com", "*.example.org"]);
        assert_eq!(
            spec.header,
            Some(("Authorization".into(), "Bearer {}".into()))
        );
        assert!(!format!("{spec:?}").contains("s3cret"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        fs_err::write(&path, "from-file\n").unwrap();
        let config = parse(
            &format!(
                "[T]\nfile = \"{}\"\nhosts = [\"api.test\"]\n",
                path.display()
            ),
            &[],
        )
        .unwrap();
        assert_eq!(config.secrets.declared["T"].value.expose(), "from-file");
    }

    #[test]
    fn secrets_are_declared_in_the_environment_too() {
        let file: BTreeMap<String, SecretFile> =
            toml::from_str("[A]\nenv = \"V\"\nhosts = [\"a.test\"]\n").unwrap();
        let both = declared(
            Some("B = { env = \"W\", hosts = [\"b.test\"], header = \"X-Key: {}\" }\n"),
            file,
        )
        .unwrap();
        assert_eq!(both.keys().collect::<Vec<_>>(), ["A", "B"]);
        let file: BTreeMap<String, SecretFile> =
            toml::from_str("[A]\nenv = \"V\"\nhosts = [\"a.test\"]\n").unwrap();
        let twice = declared(Some("A = { env = \"W\", hosts = [\"b.test\"] }"), file).unwrap_err();
        assert!(
            format!("{twice:#}").contains("declared by both"),
            "{twice:#}"
        );
        let bad = declared(Some("A = 1"), BTreeMap::new()).unwrap_err();
        assert!(format!("{bad:#}").contains("hint:"), "{bad:#}");
    }

    #[test]
    fn bad_declarations_are_refused_with_a_hint() {
        for (text, env, expected) in [
            (
                "[T]\nenv = \"MISSING\"\nhosts = [\"a.test\"]\n",
                vec![],
                "is not set",
            ),
            (
                "[T]\nhosts = [\"a.test\"]\n",
                vec![],
                "exactly one of `env` and `file`",
            ),
            (
                "[T]\nenv = \"V\"\nhosts = []\n",
                vec![("V", "x")],
                "would go nowhere",
            ),
            (
                "[T]\nenv = \"V\"\nhosts = [\"10.0.0.1\"]\n",
                vec![("V", "x")],
                "not a host name",
            ),
            (
                "[T]\nenv = \"V\"\nhosts = [\"a.test\"]\n",
                vec![("V", "a\nb")],
                "control characters",
            ),
            (
                "[T]\nenv = \"V\"\nhosts = [\"a.test\"]\nheader = \"Authorization\"\n",
                vec![("V", "x")],
                "not `Name: value`",
            ),
            (
                "[T]\nenv = \"V\"\nhosts = [\"a.test\"]\nheader = \"Authorization: Bearer\"\n",
                vec![("V", "x")],
                "`{}`",
            ),
            (
                "[PATH]\nenv = \"V\"\nhosts = [\"a.test\"]\n",
                vec![("V", "x")],
                "invalid secret name",
            ),
            (
                "[api]\nenv = \"V\"\nhosts = [\"a.test\"]\n",
                vec![("V", "x")],
                "invalid secret name",
            ),
        ] {
            let message = format!("{:#}", parse(text, &env).unwrap_err());
            assert!(
                message.contains(expected) && message.contains("hint:"),
                "{text}: {message}"
            );
        }
    }
}
