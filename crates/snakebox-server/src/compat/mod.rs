//! The tool sets of other Python-running MCP servers, served beside snakebox's own when the
//! operator names them (`serve --compat-tools ibm,python-mcp-sandbox,code-executor`), so
//! that a user of one of those servers keeps their clients and prompts: the tool names, the
//! argument names and the shapes of the answers are theirs.
//!
//! Why a module per set, each a face: they decide nothing. Each handler translates its
//! arguments into a request of [`snakebox_engine::EngineApi`] (a run, a session, an install,
//! a file), and the engine's answer into that server's shape; sandboxing, limits, profiles
//! and tenants are the engine's, exactly as for snakebox's own tools. What a set's server
//! had that snakebox has not (IBM's containers, a host path to upload from) is said where it
//! is translated, with the refusal and its fix.
//!
//! - [`ibm`]: IBM's python sandbox server (`execute_code`, `validate_code`,
//!   `get_sandbox_info`), fresh sandbox per call.
//! - [`python_mcp_sandbox`]: python-mcp-sandbox (`create_sandbox`, `execute_python_code`, ...):
//!   its sandboxes are snakebox sessions, its `sandbox_id` a `session_id`.
//! - [`code_executor`]: Python Code Executor (`execute_python(code, timeout)`,
//!   `install_package`, ...): one sandbox per caller, a session made on first use.
//!
//! Answers that can be large (a run's output, a listing) are shaped as the caller's host work
//! (`SnakeboxServer::shaped`), as snakebox's own are.
//!
//! Two sets name a tool alike: IBM's and the code executor's `get_sandbox_info`, with
//! different answers. The settings refuse to serve both (one name, one tool); the code
//! executor's `execute_python` takes the place of snakebox's own when that set is served.

pub(crate) mod code_executor;
pub(crate) mod ibm;
pub(crate) mod python_mcp_sandbox;

use rmcp::handler::server::router::tool::ToolRouter;
use serde::Serialize;
use snakebox_engine::{CompatToolSet, EngineError};

use crate::SnakeboxServer;

/// An answer as the text of a tool result: the same JSON as its structured content, for
/// clients that read the text (as those servers' clients did).
pub(crate) fn json_text<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// `answer` as a tool result in those servers' way: its structured content, and the same
/// JSON as the text ([`json_text`]).
pub(crate) fn json_answer<T: Serialize>(answer: &T, is_error: bool) -> rmcp::model::CallToolResult {
    crate::tools::structured(answer, json_text(answer), is_error)
}

/// The tools of `set`.
pub(crate) fn router(set: CompatToolSet) -> ToolRouter<SnakeboxServer> {
    match set {
        CompatToolSet::Ibm => SnakeboxServer::ibm_router(),
        CompatToolSet::PythonMcpSandbox => SnakeboxServer::python_mcp_sandbox_router(),
        CompatToolSet::CodeExecutor => SnakeboxServer::code_executor_router(),
    }
}

/// Requirements in one string, as those servers took them (`"pandas matplotlib seaborn"`,
/// `"numpy, requests>=2.28.0"`): split at whitespace and commas. A version clause written
/// with spaces (`"requests >= 2.28"`) is joined back to its name, so it is not taken for a
/// package named `>=`.
pub(crate) fn split_specifiers(text: &str) -> Vec<String> {
    let mut specifiers: Vec<String> = Vec::new();
    for word in text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|word| !word.is_empty())
    {
        const OPERATORS: [char; 5] = ['<', '>', '=', '!', '~'];
        let clause = word.starts_with(OPERATORS);
        match specifiers.last_mut() {
            // `requests >=` `2.28`, or `pandas` `[excel]`.
            Some(last) if last.ends_with(OPERATORS) || word.starts_with('[') => {
                last.push_str(word);
            }
            // A second clause (`requests>=2.28` `<3`) is joined with the comma PEP 508 uses.
            Some(last) if clause && last.contains(OPERATORS) => {
                last.push(',');
                last.push_str(word);
            }
            Some(last) if clause => last.push_str(word),
            _ => specifiers.push(word.to_owned()),
        }
    }
    specifiers
}

/// The refusal of a requirement string with nothing in it.
pub(crate) fn no_packages(argument: &str, tool: &str) -> EngineError {
    EngineError::invalid(
        format!("`{argument}` names no package"),
        format!(
            "give one or more requirements, separated by spaces or commas, e.g. {tool}(\"pandas matplotlib\") or \"requests>=2.28.0\""
        ),
    )
}

/// A requirement's distribution name, normalised as PEP 503 compares them (`Scikit_Learn>=1`
/// is `scikit-learn`).
pub(crate) fn distribution_name(requirement: &str) -> String {
    let name: String = requirement
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    let mut normalised = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !normalised.ends_with('-') {
                normalised.push('-');
            }
        } else {
            normalised.push(c.to_ascii_lowercase());
        }
    }
    normalised
}

#[cfg(test)]
mod tests {
    use super::{distribution_name, split_specifiers};

    #[test]
    fn one_string_of_several_specifiers_is_split_at_spaces_and_commas() {
        for (text, expected) in [
            ("numpy", vec!["numpy"]),
            (
                "pandas matplotlib seaborn",
                vec!["pandas", "matplotlib", "seaborn"],
            ),
            ("requests>=2.28.0", vec!["requests>=2.28.0"]),
            ("numpy, pandas,scipy", vec!["numpy", "pandas", "scipy"]),
            ("  numpy\n\tpandas  ", vec!["numpy", "pandas"]),
            ("requests >= 2.28 numpy", vec!["requests>=2.28", "numpy"]),
            ("requests >=2.28,<3", vec!["requests>=2.28,<3"]),
            (
                "requests >= 2.28 , < 3 numpy",
                vec!["requests>=2.28,<3", "numpy"],
            ),
            ("pandas [excel]", vec!["pandas[excel]"]),
            ("", vec![]),
            (" , ,", vec![]),
        ] {
            assert_eq!(split_specifiers(text), expected, "{text:?}");
        }
    }

    #[test]
    fn a_distribution_name_is_compared_as_pep_503_says() {
        assert_eq!(distribution_name("Scikit_Learn>=1.0"), "scikit-learn");
        assert_eq!(distribution_name("zope.interface"), "zope-interface");
        assert_eq!(distribution_name("pandas[excel]==2.2"), "pandas");
        assert_eq!(distribution_name("a--b__c"), "a-b-c");
    }
}
