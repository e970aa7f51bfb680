//! Dependencies inferred from a script's imports (`--infer-dependencies`).
//!
//! Why: the systems snakebox replaces ran `import pandas` without a declaration (pydantic's
//! mcp-run-python infers dependencies from imports; IBM's data-science tier ships them), and
//! the prompts written for them do not declare what they import. With inference on, a script
//! that imports a well-known third-party module it did not declare gets that module's
//! package, and the result's notes say what was added.
//!
//! Only the import names of [`KNOWN`] are inferred, each to the one distribution written
//! there: a name off the list is never turned into a package to install, since installing
//! whatever an import happens to be called is how a typosquatted package gets in. A module
//! already provided by a declared requirement (by name or a well-known alias, as validation
//! judges it), or installed in the session, is left alone; so is one the call's profile does
//! not allow (its import fails as it would have).
//!
//! The imports are read lexically, line by line (statements `import a, b.c as d` and
//! `from a.b import c`, also after `;` and when indented; not inside a triple-quoted string;
//! relative imports skipped). A word in a comment or string that looks like an import can at
//! worst install a package of this list, which the profile allows anyway.

use pep508_rs::Requirement;

use crate::validate::{declared_covers, normalized};

/// Import names and the distribution each is inferred to: the libraries scripts import most
/// without saying so, each the package its project publishes under that import name. Large
/// frameworks (`torch`, `tensorflow`) are left out on purpose: hundreds of megabytes should be
/// asked for, with a version.
pub(crate) const KNOWN: &[(&str, &str)] = &[
    ("altair", "altair"),
    ("bokeh", "bokeh"),
    ("bs4", "beautifulsoup4"),
    ("cv2", "opencv-python-headless"),
    ("dateutil", "python-dateutil"),
    ("docx", "python-docx"),
    ("dotenv", "python-dotenv"),
    ("duckdb", "duckdb"),
    ("faker", "faker"),
    ("fitz", "pymupdf"),
    ("h5py", "h5py"),
    ("httpx", "httpx"),
    ("jinja2", "jinja2"),
    ("joblib", "joblib"),
    ("lightgbm", "lightgbm"),
    ("lxml", "lxml"),
    ("markdown", "markdown"),
    ("matplotlib", "matplotlib"),
    ("mpl_toolkits", "matplotlib"),
    ("networkx", "networkx"),
    ("nltk", "nltk"),
    ("numpy", "numpy"),
    ("openpyxl", "openpyxl"),
    ("orjson", "orjson"),
    ("pandas", "pandas"),
    ("PIL", "pillow"),
    ("plotly", "plotly"),
    ("polars", "polars"),
    ("pptx", "python-pptx"),
    ("pyarrow", "pyarrow"),
    ("pydantic", "pydantic"),
    ("pypdf", "pypdf"),
    ("pytz", "pytz"),
    ("regex", "regex"),
    ("requests", "requests"),
    ("rich", "rich"),
    ("scipy", "scipy"),
    ("seaborn", "seaborn"),
    ("shapely", "shapely"),
    ("skimage", "scikit-image"),
    ("sklearn", "scikit-learn"),
    ("sqlalchemy", "sqlalchemy"),
    ("statsmodels", "statsmodels"),
    ("sympy", "sympy"),
    ("tabulate", "tabulate"),
    ("toml", "toml"),
    ("tqdm", "tqdm"),
    ("xgboost", "xgboost"),
    ("xlrd", "xlrd"),
    ("yaml", "pyyaml"),
];

/// A package added for an import.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Inferred {
    /// The import that asked for it, as written (`sklearn.linear_model`).
    pub(crate) module: String,
    /// Its 1-based line.
    pub(crate) line: usize,
    /// The package added (a bare name: the resolver picks the version).
    pub(crate) requirement: Requirement,
}

impl Inferred {
    /// The result's note for it.
    pub(crate) fn note(&self) -> String {
        format!(
            "added {} for `import {}` (line {}): this server infers dependencies from \
             imports (--infer-dependencies); declare it in the script's `# /// script` block \
             or `dependencies` to choose its version",
            self.requirement.name, self.module, self.line
        )
    }
}

/// The packages to add to `script`'s run: one per distribution of [`KNOWN`] it imports and
/// neither `declared` nor `present` (installed already: normalized names) provide, that
/// `allowed` lets in. In the order of the imports.
pub(crate) fn infer(
    script: &str,
    declared: &[Requirement],
    present: &[String],
    allowed: impl Fn(&Requirement, &str) -> bool,
) -> Vec<Inferred> {
    let mut have: Vec<String> = declared
        .iter()
        .map(|requirement| normalized(requirement.name.as_ref()))
        .chain(present.iter().map(|name| normalized(name)))
        .collect();
    let mut added = Vec::new();
    for (module, line) in imported_modules(script) {
        let top = module.split('.').next().unwrap_or(&module);
        let Some((_, dist)) = KNOWN.iter().find(|(import, _)| *import == top) else {
            continue;
        };
        if declared_covers(&module, &have) || have.contains(&normalized(dist)) {
            continue;
        }
        let Ok(requirement) = dist.parse::<Requirement>() else {
            continue;
        };
        if !allowed(&requirement, &module) {
            continue;
        }
        have.push(normalized(dist));
        added.push(Inferred {
            module,
            line,
            requirement,
        });
    }
    added
}

/// The absolute imports of `script`, each with its 1-based line, read lexically (see the
/// module documentation).
pub(crate) fn imported_modules(script: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    // The triple quote of a string still open at the end of the previous line.
    let mut open: Option<&str> = None;
    for (index, line) in script.lines().enumerate() {
        let starts_in_string = open.is_some();
        for quote in ["\"\"\"", "'''"] {
            if open.is_none_or(|q| q == quote) && line.matches(quote).count() % 2 == 1 {
                open = if open.is_some() { None } else { Some(quote) };
            }
        }
        if starts_in_string {
            continue;
        }
        let code = line.split('#').next().unwrap_or("");
        for statement in code.split(';') {
            for module in statement_imports(statement.trim()) {
                found.push((module, index + 1));
            }
        }
    }
    found
}

/// The modules one statement imports (none if it is not an import).
fn statement_imports(statement: &str) -> Vec<String> {
    if let Some(rest) = statement.strip_prefix("import ") {
        rest.split(',')
            .filter_map(|item| item.split_whitespace().next())
            .filter(|module| is_dotted_name(module))
            .map(str::to_owned)
            .collect()
    } else if let Some(rest) = statement.strip_prefix("from ") {
        let mut words = rest.split_whitespace();
        match (words.next(), words.next()) {
            (Some(module), Some("import")) if is_dotted_name(module) => vec![module.to_owned()],
            _ => Vec::new(),
        }
    } else {
        Vec::new()
    }
}

/// `a.b.c` of identifiers (a relative `.a` is not).
fn is_dotted_name(text: &str) -> bool {
    !text.is_empty()
        && text.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(script: &str) -> Vec<String> {
        infer(script, &[], &[], |_, _| true)
            .into_iter()
            .map(|added| added.requirement.to_string())
            .collect()
    }

    #[test]
    fn imports_are_read_in_every_statement_form() {
        let script = "\
import os, numpy as np
from sklearn.linear_model import LinearRegression
import PIL.Image; import yaml
def f():
    import cv2  # indented, with a comment
from . import local
from .sibling import thing
x = 1  # import pandas
";
        let found: Vec<(String, usize)> = imported_modules(script);
        let modules: Vec<&str> = found.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(
            modules,
            [
                "os",
                "numpy",
                "sklearn.linear_model",
                "PIL.Image",
                "yaml",
                "cv2"
            ]
        );
        assert_eq!(found[2].1, 2, "lines are 1-based");
        assert_eq!(
            names(script),
            [
                "numpy",
                "scikit-learn",
                "pillow",
                "pyyaml",
                "opencv-python-headless"
            ]
        );
    }

    #[test]
    fn nothing_inside_a_triple_quoted_string_is_an_import() {
        let script = "doc = \"\"\"\nimport pandas\n\"\"\"\nother = '''one line ''' \nimport numpy\ntext = '''\nfrom scipy import stats\n'''\n";
        assert_eq!(names(script), ["numpy"]);
    }

    #[test]
    fn only_names_on_the_list_become_packages() {
        // A typosquat's bait and an unknown module are never installed; the stdlib is not
        // on the list either.
        assert!(names("import reqeusts\nimport my_private_thing\nimport json\n").is_empty());
    }

    #[test]
    fn what_is_declared_or_installed_is_not_added_again() {
        let declared: Vec<Requirement> = vec![
            "numpy>=1.26".parse().unwrap_or_else(|_| unreachable!()),
            "opencv-python".parse().unwrap_or_else(|_| unreachable!()),
        ];
        let present = vec!["Pandas".to_owned()];
        let script = "import numpy\nimport cv2\nimport pandas\nimport scipy\nimport scipy.stats\n";
        let added: Vec<String> = infer(script, &declared, &present, |_, _| true)
            .iter()
            .map(|a| a.requirement.to_string())
            .collect();
        assert_eq!(
            added,
            ["scipy"],
            "cv2 is opencv-python's, declared; scipy once"
        );
    }

    #[test]
    fn a_package_the_profile_refuses_is_not_added() {
        let added = infer("import numpy\nimport pandas\n", &[], &[], |r, _| {
            r.name.as_ref() != "pandas"
        });
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].module, "numpy");
        assert!(
            added[0]
                .note()
                .contains("added numpy for `import numpy` (line 1)")
        );
    }

    #[test]
    fn every_listed_distribution_is_a_valid_requirement() {
        for (import, dist) in KNOWN {
            assert!(is_dotted_name(import), "{import}");
            assert!(dist.parse::<Requirement>().is_ok(), "{dist}");
        }
    }
}
