//! Ready-to-copy client configurations for this server, filled with its URL (the README's
//! "Over HTTP, with API keys" says the same in prose).

/// One client's configuration.
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    /// The client, as people name it.
    pub(crate) name: &'static str,
    /// Where the text goes.
    pub(crate) place: &'static str,
    /// The text to copy.
    pub(crate) text: String,
}

/// The configurations for a server reached at `base` (`http://127.0.0.1:8000`, no trailing
/// slash); `keyed`: whether clients must send an API key (a placeholder is shown).
pub(crate) fn configs(base: &str, keyed: bool) -> Vec<ClientConfig> {
    let key = "sbx_…";
    let mcp = format!("{base}/mcp");
    let header = if keyed {
        format!(" --header \"Authorization: Bearer {key}\"")
    } else {
        String::new()
    };
    let headers_json = if keyed {
        format!(",\n      \"headers\": {{\"Authorization\": \"Bearer {key}\"}}")
    } else {
        String::new()
    };
    let sse = if keyed {
        format!("{base}/sse?api_key={key}")
    } else {
        format!("{base}/sse")
    };
    vec![
        ClientConfig {
            name: "Claude Code",
            place: "a shell",
            text: format!("claude mcp add --transport http snakebox {mcp}{header}"),
        },
        ClientConfig {
            name: "Gemini CLI",
            place: "~/.gemini/settings.json",
            text: format!(
                "{{\n  \"mcpServers\": {{\n    \"snakebox\": {{\n      \"httpUrl\": \"{mcp}\"{headers_json}\n    }}\n  }}\n}}"
            ),
        },
        ClientConfig {
            name: "Cursor",
            place: "~/.cursor/mcp.json",
            text: format!(
                "{{\n  \"mcpServers\": {{\n    \"snakebox\": {{\n      \"url\": \"{mcp}\"{headers_json}\n    }}\n  }}\n}}"
            ),
        },
        ClientConfig {
            name: "Codex",
            place: "~/.codex/config.toml",
            text: if keyed {
                format!(
                    "[mcp_servers.snakebox]\nurl = \"{mcp}\"\nbearer_token_env_var = \"SNAKEBOX_KEY\"  # export SNAKEBOX_KEY={key}"
                )
            } else {
                format!("[mcp_servers.snakebox]\nurl = \"{mcp}\"")
            },
        },
        ClientConfig {
            name: "supergateway (stdio clients, legacy SSE)",
            place: "a client's stdio command",
            text: format!("npx -y supergateway --sse \"{sse}\""),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_carry_the_url_and_a_key_placeholder_when_keys_are_needed() {
        let keyed = configs("https://sb.example.com", true);
        assert_eq!(keyed.len(), 5);
        assert_eq!(
            keyed[0].text,
            "claude mcp add --transport http snakebox https://sb.example.com/mcp --header \"Authorization: Bearer sbx_…\""
        );
        assert!(
            keyed[1]
                .text
                .contains("\"httpUrl\": \"https://sb.example.com/mcp\"")
        );
        assert!(keyed[4].text.contains("/sse?api_key=sbx_…"));
        let open = configs("http://127.0.0.1:8000", false);
        assert!(open.iter().all(|c| !c.text.contains("sbx_")));
    }
}
