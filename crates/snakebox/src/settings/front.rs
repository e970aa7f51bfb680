//! `[front]`: a front's engine agents (`serve --agents`) and the key it signs their calls
//! with (`--front-key`), issue 35.

use std::path::PathBuf;

use serde::Deserialize;

use crate::cli::FrontArgs;

/// `[front]`: read by `serve` only.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FrontFile {
    #[serde(default)]
    pub(super) agents: Vec<String>,
    pub(super) front_key: Option<PathBuf>,
}

/// A front's settings: its agents, each as (name, URL), and its private key.
#[derive(Debug)]
pub(crate) struct FrontSettings {
    pub(crate) agents: Vec<(String, String)>,
    pub(crate) front_key: PathBuf,
}

/// The agents and key, from the flags (or environment), else the file; `None` when no
/// agent is named (calls run in this process).
///
/// # Errors
/// An agent that is not `[NAME=]http://HOST:PORT`, or agents without a key.
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
    let front_key = args.front_key.clone().or(file.front_key);
    match (agents.is_empty(), front_key) {
        (true, _) => Ok(None),
        (false, Some(front_key)) => Ok(Some(FrontSettings { agents, front_key })),
        (false, None) => anyhow::bail!(
            "--agents needs the front's key to sign its calls with\nhint: pass --front-key FILE (`[front] front_key`): the front.key that `snakebox keys front-keypair --out DIR` wrote"
        ),
    }
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
            front_key: None,
        };
        let err = resolve_front(&args, FrontFile::default())
            .map(|_| ())
            .unwrap_err();
        assert!(format!("{err:#}").contains("--front-key"), "{err:#}");
        let file = FrontFile {
            agents: vec!["http://10.0.0.1:8700".into()],
            front_key: Some("front.key".into()),
        };
        let front = resolve_front(&FrontArgs::default(), file).unwrap_or_default();
        assert_eq!(front.map(|front| front.agents.len()), Some(1));
    }
}
