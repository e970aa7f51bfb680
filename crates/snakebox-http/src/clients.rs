//! Ready-to-copy client configurations: what each agent's client needs to reach this server,
//! over stdio (this binary, by its absolute path) or over HTTP (a URL and an API key). One
//! place for them: `snakebox client-config` prints one, and the web UI's "connect" page shows
//! the HTTP ones filled with the server's URL, so the two never disagree.

use std::path::Path;

/// An agent's client snakebox has a configuration for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Claude Code (`claude mcp add`).
    ClaudeCode,
    /// Gemini CLI (`~/.gemini/settings.json`).
    Gemini,
    /// OpenAI Codex CLI (`~/.codex/config.toml`).
    Codex,
    /// Cursor (`~/.cursor/mcp.json`).
    Cursor,
    /// VS Code (`.vscode/mcp.json` of a workspace).
    Vscode,
    /// Claude Desktop (`claude_desktop_config.json`): stdio servers only, so HTTP goes
    /// through supergateway.
    ClaudeDesktop,
}

impl Client {
    /// Every client, in the order they are shown.
    pub const ALL: [Client; 6] = [
        Client::ClaudeCode,
        Client::Gemini,
        Client::Codex,
        Client::Cursor,
        Client::Vscode,
        Client::ClaudeDesktop,
    ];

    /// The name on the command line: `claude-code`, `gemini`, `codex`, `cursor`, `vscode`,
    /// `claude-desktop`.
    #[must_use]
    pub fn id(self) -> &'static str {
        match self {
            Client::ClaudeCode => "claude-code",
            Client::Gemini => "gemini",
            Client::Codex => "codex",
            Client::Cursor => "cursor",
            Client::Vscode => "vscode",
            Client::ClaudeDesktop => "claude-desktop",
        }
    }

    /// The client as people name it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Client::ClaudeCode => "Claude Code",
            Client::Gemini => "Gemini CLI",
            Client::Codex => "Codex",
            Client::Cursor => "Cursor",
            Client::Vscode => "VS Code",
            Client::ClaudeDesktop => "Claude Desktop",
        }
    }

    /// The client named `id` on the command line.
    ///
    /// # Errors
    /// The names there are, when `id` is none of them.
    pub fn from_id(id: &str) -> Result<Client, String> {
        Client::ALL
            .into_iter()
            .find(|client| client.id() == id)
            .ok_or_else(|| {
                let ids: Vec<&str> = Client::ALL.iter().map(|c| c.id()).collect();
                format!("no client `{id}`: one of {}", ids.join(", "))
            })
    }
}

/// How the client reaches the server.
#[derive(Debug, Clone, Copy)]
pub enum Connection<'a> {
    /// The client starts `binary serve` itself and talks over its stdin and stdout.
    Stdio {
        /// This binary, by its absolute path.
        binary: &'a Path,
    },
    /// The client calls a running `snakebox serve --http` at `base` (`https://host:port`, no
    /// trailing slash), with `key` as its bearer token when the server needs one.
    Http {
        /// The server's base URL.
        base: &'a str,
        /// The API key (or a placeholder), when keys are needed.
        key: Option<&'a str>,
    },
}

/// One client's configuration.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The client, as people name it.
    pub name: &'static str,
    /// Where the text goes: `a shell` for a command, else the file to put it in.
    pub place: &'static str,
    /// The text to copy.
    pub text: String,
}

/// `client`'s configuration for `connection`.
#[must_use]
pub fn config(client: Client, connection: Connection<'_>) -> ClientConfig {
    let (place, text) = match connection {
        Connection::Stdio { binary } => stdio(client, &binary.display().to_string()),
        Connection::Http { base, key } => http(client, base, key),
    };
    ClientConfig {
        name: client.name(),
        place,
        text,
    }
}

/// A JSON string (quotes included).
fn json(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// A TOML basic string (quotes included): JSON's escapes (`\"`, `\\`, `\uXXXX` for control
/// characters) are TOML's too.
fn toml_string(text: &str) -> String {
    json(text)
}

/// A shell word (single-quoted when it needs quoting).
fn shell(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:=@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn stdio(client: Client, binary: &str) -> (&'static str, String) {
    let command = json(binary);
    let servers = |key: &str, extra: &str| {
        format!(
            "{{\n  \"{key}\": {{\n    \"snakebox\": {{\n{extra}      \"command\": {command},\n      \"args\": [\"serve\"]\n    }}\n  }}\n}}"
        )
    };
    match client {
        Client::ClaudeCode => (
            "a shell",
            format!(
                "claude mcp add --scope user snakebox -- {} serve",
                shell(binary)
            ),
        ),
        Client::Gemini => ("~/.gemini/settings.json", servers("mcpServers", "")),
        Client::Codex => (
            "~/.codex/config.toml",
            format!(
                "[mcp_servers.snakebox]\ncommand = {}\nargs = [\"serve\"]",
                toml_string(binary)
            ),
        ),
        Client::Cursor => ("~/.cursor/mcp.json", servers("mcpServers", "")),
        Client::Vscode => (
            ".vscode/mcp.json",
            servers("servers", "      \"type\": \"stdio\",\n"),
        ),
        Client::ClaudeDesktop => (
            "~/.config/Claude/claude_desktop_config.json",
            servers("mcpServers", ""),
        ),
    }
}

fn http(client: Client, base: &str, key: Option<&str>) -> (&'static str, String) {
    let mcp = format!("{base}/mcp");
    let bearer = key.map(|key| format!("Bearer {key}"));
    let headers_json = bearer.as_ref().map_or(String::new(), |bearer| {
        format!(
            ",\n      \"headers\": {{\"Authorization\": {}}}",
            json(bearer)
        )
    });
    let url_file = |key: &str, url_field: &str, extra: &str| {
        format!(
            "{{\n  \"{key}\": {{\n    \"snakebox\": {{\n{extra}      \"{url_field}\": {}{headers_json}\n    }}\n  }}\n}}",
            json(&mcp)
        )
    };
    match client {
        Client::ClaudeCode => (
            "a shell",
            format!(
                "claude mcp add --scope user --transport http snakebox {}{}",
                shell(&mcp),
                bearer.as_ref().map_or(String::new(), |bearer| format!(
                    " --header {}",
                    shell(&format!("Authorization: {bearer}"))
                ))
            ),
        ),
        Client::Gemini => (
            "~/.gemini/settings.json",
            url_file("mcpServers", "httpUrl", ""),
        ),
        Client::Codex => (
            "~/.codex/config.toml",
            match key {
                Some(key) => format!(
                    "[mcp_servers.snakebox]\nurl = {}\nbearer_token_env_var = \"SNAKEBOX_KEY\"  # export SNAKEBOX_KEY={key}",
                    toml_string(&mcp)
                ),
                None => format!("[mcp_servers.snakebox]\nurl = {}", toml_string(&mcp)),
            },
        ),
        Client::Cursor => ("~/.cursor/mcp.json", url_file("mcpServers", "url", "")),
        Client::Vscode => (
            ".vscode/mcp.json",
            url_file("servers", "url", "      \"type\": \"http\",\n"),
        ),
        Client::ClaudeDesktop => {
            // Its config file starts stdio servers only: supergateway relays to HTTP.
            let mut args = vec![
                json("-y"),
                json("supergateway"),
                json("--streamableHttp"),
                json(&mcp),
            ];
            if let Some(key) = key {
                args.push(json("--oauth2Bearer"));
                args.push(json(key));
            }
            (
                "~/.config/Claude/claude_desktop_config.json",
                format!(
                    "{{\n  \"mcpServers\": {{\n    \"snakebox\": {{\n      \"command\": \"npx\",\n      \"args\": [{}]\n    }}\n  }}\n}}",
                    args.join(", ")
                ),
            )
        }
    }
}

/// What the web UI shows for a server reached at `base`; `keyed`: whether clients must send
/// an API key (a placeholder is shown): every client's HTTP configuration, then supergateway
/// for stdio-only clients over legacy SSE.
pub(crate) fn configs(base: &str, keyed: bool) -> Vec<ClientConfig> {
    let key = "sbx_…";
    let mut all: Vec<ClientConfig> = Client::ALL
        .into_iter()
        .map(|client| {
            config(
                client,
                Connection::Http {
                    base,
                    key: keyed.then_some(key),
                },
            )
        })
        .collect();
    let sse = if keyed {
        format!("{base}/sse?api_key={key}")
    } else {
        format!("{base}/sse")
    };
    all.push(ClientConfig {
        name: "supergateway (stdio clients, legacy SSE)",
        place: "a client's stdio command",
        text: format!("npx -y supergateway --sse \"{sse}\""),
    });
    all
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_ui_shows_every_client_with_the_url_and_a_key_placeholder_when_keys_are_needed() {
        let keyed = configs("https://sb.example.com", true);
        assert_eq!(keyed.len(), Client::ALL.len() + 1);
        assert_eq!(
            keyed[0].text,
            "claude mcp add --scope user --transport http snakebox https://sb.example.com/mcp --header 'Authorization: Bearer sbx_…'"
        );
        assert!(
            keyed[1]
                .text
                .contains("\"httpUrl\": \"https://sb.example.com/mcp\"")
        );
        assert!(keyed.last().unwrap().text.contains("/sse?api_key=sbx_…"));
        let open = configs("http://127.0.0.1:8000", false);
        assert!(open.iter().all(|c| !c.text.contains("sbx_")));
    }

    #[test]
    fn every_file_config_parses_as_what_its_file_is() {
        let binary = Path::new("/opt/snake box/bin/snakebox \"x\"");
        for client in Client::ALL {
            for connection in [
                Connection::Stdio { binary },
                Connection::Http {
                    base: "http://127.0.0.1:8000",
                    key: Some("sbx_k\"ey"),
                },
                Connection::Http {
                    base: "http://127.0.0.1:8000",
                    key: None,
                },
            ] {
                let made = config(client, connection);
                if made.place.ends_with(".json") {
                    let value: serde_json::Value = serde_json::from_str(&made.text)
                        .unwrap_or_else(|err| panic!("{}: {err}\n{}", client.id(), made.text));
                    let servers = value
                        .get("mcpServers")
                        .or_else(|| value.get("servers"))
                        .unwrap();
                    let server = &servers["snakebox"];
                    if let Connection::Stdio { binary } = connection {
                        assert_eq!(server["command"], binary.display().to_string());
                        assert_eq!(server["args"], serde_json::json!(["serve"]));
                    }
                } else if made.place.ends_with(".toml") {
                    let value: toml::Table = made.text.parse().unwrap();
                    let server = &value["mcp_servers"]["snakebox"];
                    if let Connection::Stdio { binary } = connection {
                        assert_eq!(
                            server["command"].as_str(),
                            Some(binary.display().to_string().as_str())
                        );
                    }
                } else {
                    assert_eq!(made.place, "a shell");
                }
            }
        }
    }

    #[test]
    fn shell_commands_quote_what_needs_it() {
        let made = config(
            Client::ClaudeCode,
            Connection::Stdio {
                binary: Path::new("/home/a b/snakebox"),
            },
        );
        assert_eq!(
            made.text,
            "claude mcp add --scope user snakebox -- '/home/a b/snakebox' serve"
        );
        assert_eq!(shell("it's"), r"'it'\''s'");
        assert_eq!(Client::from_id("vscode"), Ok(Client::Vscode));
        assert!(
            Client::from_id("emacs")
                .unwrap_err()
                .contains("claude-code, gemini")
        );
    }
}
