//! `validate_script`: every problem a script has, found without running it.
//!
//! Metadata and requirement problems come from `snakebox-script` (pure). Python syntax is
//! checked by the target interpreter itself (`compile()`, which parses but never executes),
//! inside the sandbox with no network, because only the real parser of that version knows its
//! grammar.

use std::path::PathBuf;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use snakebox_env::Interpreter;
use snakebox_sandbox::{Mount, SandboxCommand, Termination};
use tokio_util::sync::CancellationToken;

use crate::Caller;
use crate::lifecycle::Calls;
use crate::plan::Planner;
use crate::policy::{Asked, CallKind, CallPolicy};
use crate::run::{RunDir, RunNetwork, View, sandbox_policy};
use crate::{EngineConfig, EngineError, ErrorKind, Unavailable, ids};

/// The check run by the target interpreter: `compile()` (parses, never executes), then a walk
/// of the syntax tree for what the script imports and how large it is. Prints one JSON
/// object.
const SYNTAX_CHECK: &str = r#"
import ast, json, sys
path = sys.argv[1]
with open(path, "rb") as f:
    source = f.read()
try:
    compile(source, "<script>", "exec", dont_inherit=True)
    tree = ast.parse(source)
except SyntaxError as e:
    print(json.dumps({"ok": False, "kind": type(e).__name__, "message": e.msg,
                      "line": e.lineno, "column": e.offset, "text": (e.text or "").rstrip()}))
    raise SystemExit(0)
except (ValueError, RecursionError, MemoryError) as e:
    print(json.dumps({"ok": False, "kind": type(e).__name__, "message": str(e),
                      "line": None, "column": None, "text": ""}))
    raise SystemExit(0)
imports, functions, classes = [], 0, 0
def literal(call):
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
for node in ast.walk(tree):
    if isinstance(node, ast.Import):
        imports += [{"module": a.name, "line": node.lineno, "how": "import"} for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        imports.append({"module": node.module, "line": node.lineno, "how": "from"})
    elif isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name in ("__import__", "import_module") and literal(node) and not literal(node).startswith("."):
            imports.append({"module": literal(node), "line": node.lineno, "how": name})
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        functions += 1
    elif isinstance(node, ast.ClassDef):
        classes += 1
imports.sort(key=lambda i: i["line"])
stdlib = sorted(getattr(sys, "stdlib_module_names", ()) or sys.builtin_module_names)
print(json.dumps({"ok": True, "imports": imports, "functions": functions, "classes": classes,
                  "lines": len(source.splitlines()), "stdlib": stdlib}))
"#;

/// Where an imported module comes from, as far as the check can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ImportOrigin {
    /// The target Python's standard library.
    Stdlib,
    /// A declared dependency (by its name, or a well-known import name of it).
    Dependency,
    /// Neither: a missing dependency, or a module the call brings itself (`files`).
    Undeclared,
}

/// One import the script makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImportFound {
    /// The module, as written (`os.path`, `numpy`).
    pub module: String,
    /// 1-based line.
    pub line: usize,
    /// `import`, `from`, `__import__` or `import_module` (a string literal argument).
    pub how: String,
    /// stdlib, dependency or undeclared.
    pub origin: ImportOrigin,
    /// False when `allowed_imports` was given and does not cover it.
    pub allowed: bool,
}

/// The script's size and shape.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScriptAnalysis {
    /// Lines of source.
    pub lines: usize,
    /// Function definitions (nested ones included).
    pub functions: usize,
    /// Class definitions.
    pub classes: usize,
    /// Import statements and literal dynamic imports.
    pub imports: usize,
}

/// Whether `allowed` (module names; a name covers its submodules) covers `module`.
#[must_use]
pub fn import_allowed(module: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|entry| {
        let entry = entry.trim();
        module == entry
            || module
                .strip_prefix(entry)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The origin of `module` given the interpreter's standard library and the declared
/// requirements.
fn origin_of(module: &str, stdlib: &[String], dependencies: &[String]) -> ImportOrigin {
    let top = module.split('.').next().unwrap_or(module);
    if stdlib.iter().any(|name| name == top) || top == "__future__" {
        return ImportOrigin::Stdlib;
    }
    let declared: Vec<String> = dependencies
        .iter()
        .filter_map(|spec| {
            let name: String = spec
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
                .collect();
            (!name.is_empty()).then(|| crate::infer::normalized(&name))
        })
        .collect();
    if crate::infer::declared_covers(module, &declared) {
        ImportOrigin::Dependency
    } else {
        ImportOrigin::Undeclared
    }
}

/// One problem found in a script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Validation {
    /// True when no problem was found.
    pub valid: bool,
    /// Every problem found.
    pub problems: Vec<ValidationProblem>,
    /// The interpreter version the script would run with, when one could be chosen.
    pub python_version: Option<String>,
    /// The merged requirement list the script would run with (when it parses).
    pub dependencies: Vec<String>,
    /// What the script imports, with the line, where each comes from, and whether
    /// `allowed_imports` covers it (when the script parses).
    pub imports: Vec<ImportFound>,
    /// Its size and shape (when it parses).
    pub analysis: Option<ScriptAnalysis>,
    /// What to change before running it (undeclared dependencies, imports outside the
    /// policy).
    pub recommendations: Vec<String>,
}

#[derive(Deserialize)]
struct RawImport {
    module: String,
    line: usize,
    how: String,
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
    #[serde(default)]
    imports: Vec<RawImport>,
    #[serde(default)]
    functions: usize,
    #[serde(default)]
    classes: usize,
    #[serde(default)]
    lines: usize,
    #[serde(default)]
    stdlib: Vec<String>,
}

/// What the interpreter's check found.
struct Checked {
    syntax_error: Option<ValidationProblem>,
    imports: Vec<RawImport>,
    analysis: Option<ScriptAnalysis>,
    stdlib: Vec<String>,
}

/// Validation as a service: what checking a script without running it needs (the settings,
/// the sandbox its compile runs in, a slot for it, the interpreter choice); the one-shot path
/// asks it for the imports outside a run's policy, so both judge imports the same way.
pub(crate) struct Validator {
    config: Arc<EngineConfig>,
    sandbox: Result<Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    calls: Arc<Calls>,
    planner: Arc<Planner>,
}

impl Validator {
    pub(crate) fn new(
        config: Arc<EngineConfig>,
        sandbox: Result<Arc<snakebox_sandbox::Sandbox>, Unavailable>,
        calls: Arc<Calls>,
        planner: Arc<Planner>,
    ) -> Validator {
        Validator {
            config,
            sandbox,
            calls,
            planner,
        }
    }

    /// Check a script without running it: metadata, requirements, `requires-python` against
    /// the interpreters here, Python syntax for the target version, and what it imports
    /// (against `allowed_imports`, when given: each import outside it is a problem with its
    /// line).
    pub(crate) async fn validate(
        &self,
        caller: &Caller,
        script: &str,
        dependencies: &[String],
        python_version: Option<&str>,
        profile: Option<&str>,
        allowed_imports: Option<&[String]>,
    ) -> Result<Validation, EngineError> {
        // The import policy a run of the same call would be held to: the profile's, narrowed
        // by `allowed_imports` and never widened (as `execute_python` decides it).
        let policy = CallPolicy::decide(
            &self.config,
            CallKind::Compile,
            &self.calls.tenant(caller),
            &Asked {
                profile,
                allowed_imports,
                ..Asked::default()
            },
        )
        .map_err(|refusal| refusal.error)?;
        Ok(self
            .validate_against(caller, script, dependencies, python_version, &policy)
            .await)
    }

    /// [`Validator::validate`] under the compile's policy already decided (its import policy,
    /// its limits).
    async fn validate_against(
        &self,
        caller: &Caller,
        script: &str,
        dependencies: &[String],
        python_version: Option<&str>,
        policy: &CallPolicy,
    ) -> Validation {
        let allowed_imports = policy.imports.as_deref();
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
                imports: Vec::new(),
                analysis: None,
                recommendations: Vec::new(),
            };
        }
        let available: Vec<pep440_rs::Version> = self
            .planner
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
        let merged: Vec<String> = snakebox_script::merge_dependencies(metadata, dependencies)
            .map(|reqs| reqs.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        let requires_python = metadata.and_then(|m| m.requires_python.as_ref());
        let interpreter = match self
            .planner
            .pick_interpreter(python_version, requires_python)
        {
            Ok(interpreter) => Some(interpreter),
            Err(error) => {
                // A requires-python mismatch is already reported by the script crate.
                if python_version.is_some() || requires_python.is_none() {
                    problems.push(problem("python_unavailable", error.message, error.hint));
                }
                None
            }
        };
        let mut imports = Vec::new();
        let mut analysis = None;
        let mut recommendations = Vec::new();
        if let Some(interpreter) = &interpreter {
            match self
                .syntax_check(caller, interpreter, script, &policy.shape.limits)
                .await
            {
                Ok(checked) => {
                    problems.extend(checked.syntax_error);
                    analysis = checked.analysis;
                    imports = checked
                        .imports
                        .into_iter()
                        .map(|raw| ImportFound {
                            origin: origin_of(&raw.module, &checked.stdlib, &merged),
                            allowed: allowed_imports
                                .is_none_or(|allowed| import_allowed(&raw.module, allowed)),
                            module: raw.module,
                            line: raw.line,
                            how: raw.how,
                        })
                        .collect();
                }
                Err(error) => problems.push(problem(
                    "check_failed",
                    format!("Python syntax could not be checked: {}", error.message),
                    error.hint,
                )),
            }
        }
        for found in imports.iter().filter(|found| !found.allowed) {
            problems.push(ValidationProblem {
                kind: "import_not_allowed".into(),
                message: format!(
                    "`{}` is outside the import policy (allowed_imports, or the profile's)",
                    found.module
                ),
                line: Some(found.line),
                column: None,
                hint: Some(format!(
                    "remove the import, or add `{}` to allowed_imports if the operator allows it",
                    found.module.split('.').next().unwrap_or(&found.module)
                )),
            });
        }
        let mut undeclared: Vec<&ImportFound> = Vec::new();
        for found in &imports {
            let top = found.module.split('.').next().unwrap_or(&found.module);
            if found.origin == ImportOrigin::Undeclared
                && !undeclared
                    .iter()
                    .any(|seen| seen.module.split('.').next() == Some(top))
            {
                undeclared.push(found);
            }
        }
        for found in undeclared {
            let top = found.module.split('.').next().unwrap_or(&found.module);
            recommendations.push(format!(
                "Line {}: `{}` is neither in the standard library nor a declared dependency: add its package to `dependencies` (or the script's `# /// script` block), unless the call brings it in `files`",
                found.line, top
            ));
        }
        if imports.iter().any(|found| !found.allowed) {
            recommendations.push(
                "Remove the imports outside the import policy (allowed_imports, or the profile's): the run would refuse them".into(),
            );
        }
        Validation {
            valid: problems.is_empty(),
            problems,
            python_version: interpreter.map(|i| i.version.to_string()),
            dependencies: merged,
            imports,
            analysis,
            recommendations,
        }
    }

    /// The imports of `script` (module, line) that `allowed` does not cover, found by the
    /// target interpreter's parser in the sandbox.
    ///
    /// # Errors
    /// The script does not parse, or the check could not run.
    pub(crate) async fn imports_outside(
        &self,
        caller: &Caller,
        interpreter: &Interpreter,
        script: &str,
        allowed: &[String],
    ) -> Result<Vec<(String, usize)>, EngineError> {
        let limits = crate::policy::compile_limits(&self.config);
        let checked = self
            .syntax_check(caller, interpreter, script, &limits)
            .await?;
        if let Some(problem) = checked.syntax_error {
            // The run reports syntax errors itself, with its traceback.
            tracing::debug!(message = %problem.message, "import check: the script does not parse");
            return Ok(Vec::new());
        }
        Ok(checked
            .imports
            .into_iter()
            .filter(|found| !import_allowed(&found.module, allowed))
            .map(|found| (found.module, found.line))
            .collect())
    }

    /// Compile the script with the target interpreter in the sandbox, held to `limits` (the
    /// compile's, see [`crate::policy::CallKind::Compile`]), and list its imports.
    async fn syntax_check(
        &self,
        caller: &Caller,
        interpreter: &Interpreter,
        script: &str,
        limits: &snakebox_sandbox::Limits,
    ) -> Result<Checked, EngineError> {
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
        let view = View {
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
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
            cwd,
            identity: snakebox_sandbox::Identity::Untrusted,
        };
        // Never with network: the compile runs no code of the caller's and needs none.
        let mut policy = sandbox_policy(view, limits, RunNetwork::Off);
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
            init: false,
        };
        // The compile is a sandbox like any other: it holds a slot of the concurrency cap, in
        // the caller's name, and weighs on the CPU as the slot's share says.
        let slot = self.calls.share(caller).slot().await?;
        policy.cpu = slot.cpu().cloned();
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
            return Ok(Checked {
                syntax_error: None,
                analysis: Some(ScriptAnalysis {
                    lines: report.lines,
                    functions: report.functions,
                    classes: report.classes,
                    imports: report.imports.len(),
                }),
                imports: report.imports,
                stdlib: report.stdlib,
            });
        }
        let mut message = format!(
            "{}: {} (Python {})",
            report.kind, report.message, interpreter.version
        );
        if !report.text.is_empty() {
            message.push_str(&format!("\n    {}", report.text.trim()));
        }
        let syntax_error = Some(ValidationProblem {
            kind: "syntax_error".into(),
            message,
            line: report.line,
            column: report.column,
            hint: Some(format!(
                "fix the code at the line and column given; it must be valid Python {}.{}",
                interpreter.version.release().first().copied().unwrap_or(3),
                interpreter.version.release().get(1).copied().unwrap_or(0)
            )),
        });
        Ok(Checked {
            syntax_error,
            imports: Vec::new(),
            analysis: None,
            stdlib: Vec::new(),
        })
    }
}
