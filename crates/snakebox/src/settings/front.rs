//! `[front]`: a front's engine agents (`serve --agents`, or `--directory kubernetes`) and the
//! key it signs their calls with (`--front-key`), issue 35.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::cli::FrontArgs;

/// `[front]`: read by `serve` only.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FrontFile {
    #[serde(default)]
    pub(super) agents: Vec<String>,
    pub(super) front_key: Option<PathBuf>,
    pub(super) directory: Option<String>,
    pub(super) namespace: Option<String>,
    pub(super) agent_port: Option<u16>,
    pub(super) claim_ready_timeout: Option<u64>,
    pub(super) runner_idle_ttl: Option<u64>,
    pub(super) claim_max_age: Option<u64>,
}

/// A front's settings: where its agents are, and its private key.
#[derive(Debug)]
pub(crate) struct FrontSettings {
    pub(crate) directory: DirectorySettings,
    pub(crate) front_key: PathBuf,
}

/// Where a front's agents are.
#[derive(Debug)]
pub(crate) enum DirectorySettings {
    /// A list of agents, each as (name, URL).
    Static(Vec<(String, String)>),
    /// agent-sandbox claims through the Kubernetes API.
    Kubernetes(KubernetesFront),
}

/// `--directory kubernetes`: how the front uses the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubernetesFront {
    pub(crate) namespace: Option<String>,
    pub(crate) agent_port: u16,
    pub(crate) ready_timeout: Duration,
    pub(crate) runner_idle_ttl: Duration,
    pub(crate) claim_max_age: Duration,
}

/// The directory and key, from the flags (or environment), else the file; `None` when no
/// agent is named and no directory asked for (calls run in this process).
///
/// # Errors
/// An agent that is not `[NAME=]http://HOST:PORT`, an unknown directory, a directory and
/// agents that do not go together, or agents without a key.
pub(super) fn resolve_front(
    args: &FrontArgs,
    file: FrontFile,
) -> anyhow::Result<Option<FrontSettings>> {
    let entries = if args.agents.is_empty() {
        file.agents
    } else {
        args.agents.clone()
    };
    let agents = resolve_agents(&entries)?;
    let kind = args.directory.clone().or(file.directory);
    let kubernetes_only = [
        (
            "--namespace",
            args.namespace.is_some() || file.namespace.is_some(),
        ),
        (
            "--agent-port",
            args.agent_port.is_some() || file.agent_port.is_some(),
        ),
        (
            "--claim-ready-timeout",
            args.claim_ready_timeout.is_some() || file.claim_ready_timeout.is_some(),
        ),
        (
            "--runner-idle-ttl",
            args.runner_idle_ttl.is_some() || file.runner_idle_ttl.is_some(),
        ),
        (
            "--claim-max-age",
            args.claim_max_age.is_some() || file.claim_max_age.is_some(),
        ),
    ];
    let directory = match kind.as_deref().map(str::trim) {
        None | Some("static") => {
            if let Some((flag, _)) = kubernetes_only.iter().find(|(_, given)| *given) {
                anyhow::bail!(
                    "{flag} is a setting of the kubernetes directory\nhint: add --directory kubernetes (`[front] directory = \"kubernetes\"`), or drop {flag}"
                );
            }
            if agents.is_empty() {
                if kind.is_some() {
                    anyhow::bail!(
                        "--directory static needs its agents\nhint: pass --agents http://HOST:PORT[,…] (`[front] agents`)"
                    );
                }
                return Ok(None);
            }
            DirectorySettings::Static(agents)
        }
        Some("kubernetes") => {
            if !agents.is_empty() {
                anyhow::bail!(
                    "--agents and --directory kubernetes do not go together: the Kubernetes API says where the agents are\nhint: drop --agents (`[front] agents`), or use --directory static"
                );
            }
            let seconds = |flag: &str, value: Option<u64>, default: u64| {
                let value = value.unwrap_or(default);
                if value == 0 {
                    anyhow::bail!("{flag} is 0\nhint: give a number of seconds above 0");
                }
                Ok(Duration::from_secs(value))
            };
            let port = args.agent_port.or(file.agent_port).unwrap_or(8700);
            if port == 0 {
                anyhow::bail!(
                    "--agent-port is 0\nhint: give the port the agents listen on in their pods (the templates' --listen), 8700 by default"
                );
            }
            let namespace = args.namespace.clone().or(file.namespace);
            if let Some(namespace) = &namespace
                && !snakebox_kube::names::is_dns_label(namespace)
            {
                anyhow::bail!(
                    "`--namespace {namespace}` is not a namespace name\nhint: a namespace is lowercase letters, digits and `-`, at most 63 characters"
                );
            }
            DirectorySettings::Kubernetes(KubernetesFront {
                namespace,
                agent_port: port,
                ready_timeout: seconds(
                    "--claim-ready-timeout",
                    args.claim_ready_timeout.or(file.claim_ready_timeout),
                    60,
                )?,
                runner_idle_ttl: seconds(
                    "--runner-idle-ttl",
                    args.runner_idle_ttl.or(file.runner_idle_ttl),
                    900,
                )?,
                claim_max_age: seconds(
                    "--claim-max-age",
                    args.claim_max_age.or(file.claim_max_age),
                    86_400,
                )?,
            })
        }
        Some(other) => anyhow::bail!(
            "`--directory {other}` is not a directory\nhint: use static (with --agents) or kubernetes"
        ),
    };
    let Some(front_key) = args.front_key.clone().or(file.front_key) else {
        anyhow::bail!(
            "a front needs its key to sign its calls to the agents with\nhint: pass --front-key FILE (`[front] front_key`): the front.key that `snakebox keys front-keypair --out DIR` wrote"
        );
    };
    Ok(Some(FrontSettings {
        directory,
        front_key,
    }))
}

/// The agents of `serve --agents`: each as (name, URL); the name is `NAME=` when given, else
/// the URL's `HOST:PORT`.
///
/// # Errors
/// An entry that is not `[NAME=]http://HOST:PORT`.
pub(super) fn resolve_agents(entries: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    entries
        .iter()
        .map(|entry| entry.trim())
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (name, url) = match entry.split_once('=') {
                Some((name, url)) => (Some(name.trim()), url.trim()),
                None => (None, entry),
            };
            let authority = url
                .trim_end_matches('/')
                .strip_prefix("http://")
                .filter(|rest| !rest.is_empty() && !rest.contains('/'))
                .ok_or_else(|| {
                    anyhow::anyhow!("`--agents {entry}` is not an agent\nhint: write each agent as http://HOST:PORT or NAME=http://HOST:PORT (NAME: the agent's --name)")
                })?;
            let name = name.unwrap_or(authority);
            if name.is_empty() {
                anyhow::bail!("`--agents {entry}` names no agent\nhint: write NAME=http://HOST:PORT, NAME being the agent's --name");
            }
            Ok((name.to_owned(), url.trim_end_matches('/').to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_named_by_their_address_unless_named() {
        let agents = resolve_agents(&[
            "http://10.0.0.1:8700".into(),
            " b1=http://10.0.0.2:8700/ ".into(),
        ])
        .unwrap_or_default();
        assert_eq!(
            agents,
            vec![
                (
                    "10.0.0.1:8700".to_owned(),
                    "http://10.0.0.1:8700".to_owned()
                ),
                ("b1".to_owned(), "http://10.0.0.2:8700".to_owned()),
            ]
        );
    }

    #[test]
    fn an_agent_that_is_not_an_http_url_is_refused_with_a_hint() {
        for bad in [
            "https://a:1",
            "a:1",
            "http://",
            "http://a:1/v1",
            "=http://a:1",
        ] {
            let err = resolve_agents(&[bad.into()]).map(|_| ()).unwrap_err();
            assert!(format!("{err:#}").contains("hint:"), "{bad}: {err:#}");
        }
    }

    #[test]
    fn agents_need_a_key() {
        let args = FrontArgs {
            agents: vec!["http://10.0.0.1:8700".into()],
            ..FrontArgs::default()
        };
        let err = resolve_front(&args, FrontFile::default())
            .map(|_| ())
            .unwrap_err();
        assert!(format!("{err:#}").contains("--front-key"), "{err:#}");
        let file = FrontFile {
            agents: vec!["http://10.0.0.1:8700".into()],
            front_key: Some("front.key".into()),
            ..FrontFile::default()
        };
        let front = resolve_front(&FrontArgs::default(), file).unwrap_or_default();
        assert!(matches!(
            front.map(|front| front.directory),
            Some(DirectorySettings::Static(agents)) if agents.len() == 1
        ));
    }

    #[test]
    fn the_kubernetes_directory_takes_its_settings_from_flags_or_the_file() {
        let file = FrontFile {
            directory: Some("kubernetes".into()),
            namespace: Some("sandboxes".into()),
            claim_ready_timeout: Some(5),
            front_key: Some("front.key".into()),
            ..FrontFile::default()
        };
        let front = resolve_front(&FrontArgs::default(), file).unwrap_or_default();
        let Some(DirectorySettings::Kubernetes(kube)) = front.map(|front| front.directory) else {
            panic!("not the kubernetes directory");
        };
        assert_eq!(kube.namespace.as_deref(), Some("sandboxes"));
        assert_eq!(kube.ready_timeout, Duration::from_secs(5));
        assert_eq!(kube.agent_port, 8700);
        assert_eq!(kube.runner_idle_ttl, Duration::from_secs(900));
    }

    #[test]
    fn a_directory_that_does_not_fit_is_refused_with_a_hint() {
        let key = Some(PathBuf::from("front.key"));
        let cases = [
            (
                FrontArgs {
                    directory: Some("consul".into()),
                    front_key: key.clone(),
                    ..FrontArgs::default()
                },
                "not a directory",
            ),
            (
                FrontArgs {
                    directory: Some("kubernetes".into()),
                    agents: vec!["http://a:1".into()],
                    front_key: key.clone(),
                    ..FrontArgs::default()
                },
                "do not go together",
            ),
            (
                FrontArgs {
                    namespace: Some("ns".into()),
                    agents: vec!["http://a:1".into()],
                    front_key: key.clone(),
                    ..FrontArgs::default()
                },
                "setting of the kubernetes directory",
            ),
            (
                FrontArgs {
                    directory: Some("kubernetes".into()),
                    namespace: Some("Not_A_Namespace".into()),
                    front_key: key.clone(),
                    ..FrontArgs::default()
                },
                "not a namespace",
            ),
            (
                FrontArgs {
                    directory: Some("kubernetes".into()),
                    claim_ready_timeout: Some(0),
                    front_key: key.clone(),
                    ..FrontArgs::default()
                },
                "is 0",
            ),
            (
                FrontArgs {
                    directory: Some("kubernetes".into()),
                    ..FrontArgs::default()
                },
                "--front-key",
            ),
            (
                FrontArgs {
                    directory: Some("static".into()),
                    front_key: key,
                    ..FrontArgs::default()
                },
                "needs its agents",
            ),
        ];
        for (args, says) in cases {
            let err = resolve_front(&args, FrontFile::default())
                .map(|_| ())
                .unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.contains(says) && text.contains("hint:"),
                "{args:?}: {text}"
            );
        }
    }
}
