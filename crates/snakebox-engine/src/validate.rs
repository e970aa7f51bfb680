//! `validate_script`: every problem a script has, found without running it.
//!
//! Metadata and requirement problems come from `snakebox-script` (pure). Python syntax is
//! checked by the target interpreter itself (`compile()`, which parses but never executes),
//! inside the sandbox with no network, because only the real parser of that version knows its
//! grammar.

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_env::Interpreter;
use snakebox_sandbox::{Mount, Policy, SandboxCommand, Termination};
use tokio_util::sync::CancellationToken;

use crate::run::RunDir;
use crate::{Engine, EngineError, ErrorKind, ids};

/// The compile-only check run by the target interpreter. Prints one JSON object.
const SYNTAX_CHECK: &str = r#"
import json, sys
path = sys.argv[1]
with open(path, "rb") as f:
    source = f.read()
try:
    compile(source, "<script>", "exec", dont_inherit=True)
    print(json.dumps({"ok": True}))
except SyntaxError as e:
    print(json.dumps({"ok": False, "kind": type(e).__name__, "message": e.msg,
                      "line": e.lineno, "column": e.offset, "text": (e.text or "").rstrip()}))
except (ValueError, RecursionError, MemoryError) as e:
    print(json.dumps({"ok": False, "kind": type(e).__name__, "message": str(e),
                      "line": None, "column": None, "text": ""}))
"#;

/// One problem found in a script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ValidationProblem {
    /// What kind of problem (`malformed_toml`, `invalid_requirement`, `syntax_error`, ...).
    pub kind: String,
    /// What is wrong.
    pub message: String,
    /// 1-based line in the script, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// How to fix it.
    pub hint: Option<String>,
}

/// The verdict of `validate_script`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Validation {
    /// True when no problem was found.
    pub valid: bool,
    /// Every problem found.
    pub problems: Vec<ValidationProblem>,
    /// The interpreter version the script would run with, when one could be chosen.
    pub python_version: Option<String>,
    /// The merged requirement list the script would run with (when it parses).
    pub dependencies: Vec<String>,
}

#[derive(Deserialize)]
struct SyntaxReport {
    ok: bool,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    message: String,
    line: Option<usize>,
    column: Option<usize>,
    #[serde(default)]
    text: String,
}

impl Engine {
    /// Check a script without running it: metadata, requirements, `requires-python` against
    /// the interpreters here, and Python syntax for the target version.
    pub async fn validate(
        &self,
        script: &str,
        dependencies: &[String],
        python_version: Option<&str>,
    ) -> Validation {
        let problem = |kind: &str, message: String, hint: Option<String>| ValidationProblem {
            kind: kind.into(),
            message,
            line: None,
            column: None,
            hint,
        };
        if script.len() > self.config.max_script_bytes {
            return Validation {
                valid: false,
                problems: vec![problem(
                    "script_too_large",
                    format!(
                        "The script is {} bytes, more than the limit of {} bytes",
                        script.len(),
                        self.config.max_script_bytes
                    ),
                    Some("send a shorter script".into()),
                )],
                python_version: None,
                dependencies: Vec::new(),
            };
        }
        let available: Vec<pep440_rs::Version> = self
            .interpreters()
            .all()
            .iter()
            .map(|i| i.version.clone())
            .collect();
        let mut problems: Vec<ValidationProblem> =
            snakebox_script::validate(script, dependencies, &available)
                .into_iter()
                .map(|p| ValidationProblem {
                    kind: serde_json::to_value(p.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_else(|| "metadata".into()),
                    message: p.message,
                    line: p.line,
                    column: p.column,
                    hint: p.hint,
                })
                .collect();

        let block = snakebox_script::parse(script).ok().flatten();
        let metadata = block.as_ref().map(|b| &b.metadata);
        let merged = snakebox_script::merge_dependencies(metadata, dependencies)
            .map(|reqs| reqs.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        let requires_python = metadata.and_then(|m| m.requires_python.as_ref());
        let interpreter = match self.pick_interpreter(python_version, requires_python) {
            Ok(interpreter) => Some(interpreter),
            Err(error) => {
                // A requires-python mismatch is already reported by the script crate.
                if python_version.is_some() || requires_python.is_none() {
                    problems.push(problem("python_unavailable", error.message, error.hint));
                }
                None
            }
        };
        if let Some(interpreter) = &interpreter {
            match self.syntax_check(interpreter, script).await {
                Ok(Some(found)) => problems.push(found),
                Ok(None) => {}
                Err(error) => problems.push(problem(
                    "check_failed",
                    format!("Python syntax could not be checked: {}", error.message),
                    error.hint,
                )),
            }
        }
        Validation {
            valid: problems.is_empty(),
            problems,
            python_version: interpreter.map(|i| i.version.to_string()),
            dependencies: merged,
        }
    }

    /// Compile the script with the target interpreter in the sandbox; `Some` on a syntax error.
    async fn syntax_check(
        &self,
        interpreter: &Interpreter,
        script: &str,
    ) -> Result<Option<ValidationProblem>, EngineError> {
        let sandbox = self.sandbox.as_ref().map_err(Clone::clone)?;
        let id = ids::execution_id();
        let run_dir = RunDir::create(
            &self.config.data_dir,
            &id,
            Some(script),
            sandbox.host_ids(snakebox_sandbox::Identity::Untrusted),
        )
        .map_err(|err| {
            EngineError::internal(
                format!("Failed to prepare the check directory: {err}"),
                "check that the data directory is writable",
            )
        })?;
        let script_path = sandbox
            .path_inside(&run_dir.input, std::path::Path::new("/snakebox"))
            .join("script.py");
        let cwd = sandbox.path_inside(&run_dir.tmp, std::path::Path::new("/tmp"));
        let policy = Policy {
            mounts: vec![
                Mount {
                    host: interpreter.prefix.clone(),
                    dest: interpreter.prefix.clone(),
                    writable: false,
                },
                Mount {
                    host: run_dir.input.clone(),
                    dest: PathBuf::from("/snakebox"),
                    writable: false,
                },
            ],
            network: false,
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
            cwd,
            limits: self.limits(Duration::from_secs(15)),
            identity: snakebox_sandbox::Identity::Untrusted,
        };
        let command = SandboxCommand {
            program: interpreter.executable.clone(),
            args: vec![
                "-I".into(),
                "-S".into(),
                "-c".into(),
                SYNTAX_CHECK.into(),
                script_path.into_os_string(),
            ],
            control_channel: false,
        };
        // The compile is a sandbox like any other: it holds a slot of the concurrency cap.
        let slot = self.sandbox_slot().await?;
        let outcome = sandbox
            .run(&policy, &command, CancellationToken::new(), None)
            .await?;
        drop(slot);
        drop(run_dir);
        if outcome.termination != Termination::Exited {
            return Err(EngineError::new(
                ErrorKind::Failed,
                format!("the compile check ended with {:?}", outcome.termination),
            )
            .with_hint("the script may be too large or too deeply nested to parse"));
        }
        let report: SyntaxReport =
            serde_json::from_str(outcome.stdout.text.trim()).map_err(|err| {
                EngineError::new(
                    ErrorKind::Internal,
                    format!(
                        "unexpected output from the compile check ({err}): {}",
                        outcome.stderr.text.trim()
                    ),
                )
            })?;
        if report.ok {
            return Ok(None);
        }
        let mut message = format!(
            "{}: {} (Python {})",
            report.kind, report.message, interpreter.version
        );
        if !report.text.is_empty() {
            message.push_str(&format!("\n    {}", report.text.trim()));
        }
        Ok(Some(ValidationProblem {
            kind: "syntax_error".into(),
            message,
            line: report.line,
            column: report.column,
            hint: Some(format!(
                "fix the code at the line and column given; it must be valid Python {}.{}",
                interpreter.version.release().first().copied().unwrap_or(3),
                interpreter.version.release().get(1).copied().unwrap_or(0)
            )),
        }))
    }
}
