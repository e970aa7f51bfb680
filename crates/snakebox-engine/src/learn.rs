//! What recent runs of an environment imported, so that its fork server can import it ahead.
//!
//! A fork server preloads the top-level modules of its environment's declared packages. What
//! a script imports below them (`scipy.stats`, `matplotlib.pyplot`, `sklearn.ensemble`) and
//! what it imports from the standard library is each run's own cost, often most of it. A
//! forked run of an environment with packages reports the modules it imported (its runner's
//! `--report-imports`: those whose package was loaded already, in the order their imports
//! started, so the script's own imports come first); a module that [`RUNS_TO_LEARN`] runs
//! imported is learned, in that order, and the
//! pool starts a new fork server that imports the learned modules too and puts it in the old
//! one's place (at most once per [`RESTART_AFTER`] for each fork server's key).
//!
//! Trust: the names come from the run's own process, so a script can report anything. They
//! are only counted, and kept only if they are dotted identifiers ([`is_module_name`]); what
//! a fork server imports of them runs in its sandbox, which holds no more than a run does,
//! exactly as the declared packages' import-time code. Learning is per fork server key: an
//! environment with packages has a fork server of its own for each tenant, so what one
//! tenant's runs import never shapes what another's find loaded. Environments without
//! packages (one fork server for every tenant) learn nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Learned modules of one fork server key, at most (the fork server's own `MAX_LEARNED`).
pub(crate) const MAX_LEARNED: usize = 64;
/// A module this many runs imported is learned.
pub(crate) const RUNS_TO_LEARN: u32 = 2;
/// Module names counted for one key, at most (later new names are not counted).
const MAX_COUNTED: usize = 1024;
/// At most one fork server start to learn per key in this time: each start imports the
/// environment again.
pub(crate) const RESTART_AFTER: Duration = Duration::from_secs(60);
/// A module name, at most (Python has no limit; real ones are far shorter).
const NAME_MAX_BYTES: usize = 200;

/// Whether `name` is a dotted name of Python identifiers (ASCII), as a module's is: nothing
/// else is counted or passed to a fork server.
pub fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX_BYTES
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// The imports counted for one fork server key.
#[derive(Debug, Default)]
pub(crate) struct Imports {
    /// Runs that imported each module (up to [`RUNS_TO_LEARN`]).
    counts: HashMap<String, u32>,
    /// The modules learned, in the order they were.
    learned: Vec<String>,
    /// When a fork server was last started to import them.
    restarted: Option<Instant>,
}

impl Imports {
    /// Count one run's imports; whether a module was learned.
    pub(crate) fn count(&mut self, imported: &[String]) -> bool {
        let mut learned_one = false;
        let mut seen = std::collections::HashSet::new();
        for name in imported {
            if self.learned.len() >= MAX_LEARNED {
                break;
            }
            if !is_module_name(name) || self.learned.contains(name) || !seen.insert(name) {
                continue;
            }
            if !self.counts.contains_key(name) && self.counts.len() >= MAX_COUNTED {
                continue;
            }
            let runs = self.counts.entry(name.clone()).or_insert(0);
            *runs += 1;
            if *runs >= RUNS_TO_LEARN {
                self.counts.remove(name);
                self.learned.push(name.clone());
                learned_one = true;
            }
        }
        learned_one
    }

    /// The modules learned.
    pub(crate) fn learned(&self) -> &[String] {
        &self.learned
    }

    /// Whether a fork server started with `modules` lacks a learned one and may be replaced now.
    pub(crate) fn wants_restart(&self, modules: &[String]) -> bool {
        self.learned.iter().any(|m| !modules.contains(m))
            && self
                .restarted
                .is_none_or(|when| when.elapsed() >= RESTART_AFTER)
    }

    /// A fork server is being started to import what was learned.
    pub(crate) fn restarting(&mut self) {
        self.restarted = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn module_names_are_dotted_identifiers() {
        for good in [
            "scipy",
            "scipy.stats",
            "_private",
            "a1.b_2",
            "xml.dom.minidom",
        ] {
            assert!(is_module_name(good), "{good}");
        }
        let long = "a".repeat(NAME_MAX_BYTES + 1);
        for bad in [
            "", ".", "a.", ".a", "a..b", "1a", "a-b", "a b", "a,b", "os;rm", "é", &long,
        ] {
            assert!(!is_module_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_module_is_learned_once_enough_runs_imported_it() {
        let mut imports = Imports::default();
        // A run that lists a name twice counts once.
        assert!(!imports.count(&names(&["scipy.stats", "json", "json"])));
        assert!(imports.learned().is_empty());
        // A second run that imports it makes it learned.
        assert!(imports.count(&names(&["scipy.stats"])));
        assert_eq!(imports.learned(), ["scipy.stats"]);
        // Learned once: not again.
        assert!(!imports.count(&names(&["scipy.stats"])));
        assert_eq!(imports.learned(), ["scipy.stats"]);
        // Names that are not module names are never counted.
        assert!(!imports.count(&names(&["os;x", "os;x", "a,b"])));
        assert!(!imports.count(&names(&["os;x", "a,b"])));
        assert_eq!(imports.learned(), ["scipy.stats"]);
    }

    #[test]
    fn learning_is_bounded() {
        let mut imports = Imports::default();
        let many: Vec<String> = (0..MAX_LEARNED + 10).map(|i| format!("m{i}")).collect();
        imports.count(&many);
        imports.count(&many);
        assert_eq!(imports.learned().len(), MAX_LEARNED);
        // The counts are bounded too: a run reporting thousands of names counts MAX_COUNTED.
        let mut imports = Imports::default();
        let flood: Vec<String> = (0..MAX_COUNTED * 3).map(|i| format!("f{i}")).collect();
        imports.count(&flood);
        assert_eq!(imports.counts.len(), MAX_COUNTED);
    }

    #[test]
    fn a_restart_is_wanted_for_what_the_fork_server_lacks_at_most_once_a_while() {
        let mut imports = Imports::default();
        assert!(!imports.wants_restart(&[]));
        imports.count(&names(&["wave"]));
        imports.count(&names(&["wave"]));
        assert!(imports.wants_restart(&[]));
        assert!(!imports.wants_restart(&names(&["wave"])));
        imports.restarting();
        // Just restarted: not again before RESTART_AFTER.
        assert!(!imports.wants_restart(&[]));
    }
}
