//! Who a call is for: the [`Caller`] every engine call carries.
//!
//! Everything the engine stores on a caller's behalf — sessions, executions' artifacts — records
//! its owner, and every lookup is filtered by it: another caller's session id or artifact URI
//! answers "not found", exactly as an id that never existed (never "forbidden", which would
//! confirm that it exists). Ids are 128-bit random, so they cannot be guessed either. A face
//! decides who the caller is: stdio has one, [`Caller::local`]; an HTTP face with API keys maps
//! each key to its tenant.

use std::fmt;

/// The tenant a call is for. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    tenant: String,
}

/// The tenant of a server that has one client (stdio), and of everything stored before
/// owners were recorded.
pub const LOCAL_TENANT: &str = "local";

/// A name tenants and profiles share the rules of: 1 to 64 characters of `a-z`, `0-9`, `-`
/// and `_`.
#[must_use]
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Caller {
    /// The one caller of a stdio server.
    #[must_use]
    pub fn local() -> Caller {
        Caller {
            tenant: LOCAL_TENANT.into(),
        }
    }

    /// A named tenant: 1 to 64 characters of `a-z`, `0-9`, `-` and `_`.
    ///
    /// # Errors
    /// When the name is empty, too long or holds other characters.
    pub fn tenant(name: &str) -> Result<Caller, crate::EngineError> {
        if !is_plain_name(name) {
            return Err(crate::EngineError::invalid(
                format!("`{name}` is not a valid tenant name"),
                "use 1 to 64 characters of lowercase letters, digits, `-` and `_`",
            ));
        }
        Ok(Caller {
            tenant: name.into(),
        })
    }

    /// The tenant's name, as stored with what it owns.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.tenant
    }

    /// Whether this caller owns what `owner` owns.
    #[must_use]
    pub fn owns(&self, owner: &str) -> bool {
        self.tenant == owner
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_checked() {
        for good in ["local", "team-a", "t_1", &"a".repeat(64)] {
            assert_eq!(
                Caller::tenant(good)
                    .map(|c| c.id().to_owned())
                    .ok()
                    .as_deref(),
                Some(good)
            );
        }
        for bad in ["", "Team", "a b", "../x", "a/b", &"a".repeat(65), "é"] {
            assert!(Caller::tenant(bad).is_err(), "{bad:?}");
        }
        assert!(Caller::local().owns(LOCAL_TENANT));
        assert!(!Caller::local().owns("team-a"));
    }
}
