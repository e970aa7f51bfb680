//! A tool's result as both clients hand it to a test: the same shape over MCP and HTTP.

use serde_json::Value;

/// What a `tools/call` answered (a result, not a protocol error).
#[derive(Debug, Clone)]
pub struct ToolReply {
    /// The structured result (`structuredContent`; `null` when there is none).
    pub structured: Value,
    /// The text content blocks, joined.
    pub text: String,
    /// Whether the tool said it failed (`isError`).
    pub is_error: bool,
    /// The whole result as sent (`content` with its resource links, `_meta`…).
    pub raw: Value,
}

impl ToolReply {
    /// The reply of a `tools/call` result in its wire form.
    #[must_use]
    pub fn from_result(raw: Value) -> ToolReply {
        let text = raw["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|block| block["text"].as_str())
            .collect::<Vec<_>>()
            .join("");
        ToolReply {
            structured: raw["structuredContent"].clone(),
            text,
            is_error: raw["isError"].as_bool().unwrap_or(false),
            raw,
        }
    }

    /// The structured result's `key`, as a string.
    ///
    /// # Panics
    /// When it is absent or not a string.
    #[must_use]
    pub fn str(&self, key: &str) -> &str {
        self.structured[key]
            .as_str()
            .unwrap_or_else(|| panic!("no string `{key}` in {}", self.structured))
    }
}
