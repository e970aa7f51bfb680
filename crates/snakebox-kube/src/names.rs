//! Names and labels derived from snakebox's own identifiers (session ids, tenants, profiles,
//! Python versions). Kubernetes takes an object name only if it is a DNS-1123 label and a label
//! value only if it matches its own pattern, while snakebox's identifiers come from callers and
//! configuration: this module is the one place that turns any string into a name or label value
//! the API server accepts, so no caller has to think about it and no hostile id can break a
//! create.
//!
//! Every derived name and label value is `<readable part>-<hash>`: the readable part keeps what
//! a person looking at `kubectl get sandboxclaims` needs (lowercase letters and digits of the
//! original, cut short), the hash (SHA-256 of the kind of thing and the whole original, 12 hex
//! digits) keeps two identifiers that read alike apart. The hash is always there, even for an
//! identifier that would be valid as it is, so no chosen identifier can take the derived name of
//! another. The original itself travels in an annotation (`ANNOTATION_*`), where any string
//! fits; whoever reads an object back compares that, not the derived name.

use sha2::{Digest, Sha256};

/// The longest DNS-1123 label (object names here, label values): 63 characters.
pub const MAX_LABEL_LEN: usize = 63;

/// The prefix of snakebox's own label and annotation keys.
pub const DOMAIN: &str = "snakebox.dev";
/// Label: which kind of claim (`session` or `runner`) or pod (`agent`).
pub const LABEL_KIND: &str = "snakebox.dev/kind";
/// Label: the tenant a claim is for, derived by [`tenant_label`].
pub const LABEL_TENANT: &str = "snakebox.dev/tenant";
/// Label: the session a claim holds, derived by [`session_label`].
pub const LABEL_SESSION: &str = "snakebox.dev/session";
/// Label: the engine profile of a template's agents.
pub const LABEL_PROFILE: &str = "snakebox.dev/profile";
/// Label: the Python version of a template's agents.
pub const LABEL_PYTHON: &str = "snakebox.dev/python";
/// Label (Kubernetes' recommended one): every object snakebox creates says `snakebox` here.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "snakebox";
/// Annotation: the session id, exactly as the engine knows it.
pub const ANNOTATION_SESSION: &str = "snakebox.dev/session-id";
/// Annotation: the tenant, exactly as the front knows it.
pub const ANNOTATION_TENANT: &str = "snakebox.dev/tenant";
/// Annotation: the name of the agent a session was made on (`IP:PORT`, what its tokens are
/// signed for): a claim whose pod now has another address has lost the session.
pub const ANNOTATION_AGENT: &str = "snakebox.dev/agent";
/// Annotation: when a front last used a claim (RFC 3339), for the idle TTL.
pub const ANNOTATION_LAST_USED: &str = "snakebox.dev/last-used";

/// Hex digits of the hash in every derived name.
const HASH_LEN: usize = 12;
/// The most of the original kept readable in a derived name.
const READABLE_LEN: usize = 32;

/// The name of the `SandboxClaim` holding a session, from the reservation the front made for
/// it (the session's id does not exist yet when the claim is made): `sbx-<reservation>-<hash>`.
pub fn session_claim_name(reservation: &str) -> String {
    derive("sbx", "session", reservation)
}

/// The name of a tenant's runner claim (one-shot runs): `run-<tenant>-<hash>`.
pub fn runner_claim_name(tenant: &str) -> String {
    derive("run", "runner", tenant)
}

/// The name of the `SandboxTemplate` (and of its `SandboxWarmPool`) for one engine profile and
/// Python version: `agent-<profile>-<python>-<hash>`.
pub fn template_name(profile: &str, python: &str) -> String {
    // The separator cannot occur in either part's hash input by accident: a NUL byte.
    let key = format!("{profile}\0{python}");
    let readable = format!("{profile}-py{python}");
    with_hash("agent", &readable, "template", &key)
}

/// The value of [`LABEL_TENANT`] for a tenant.
pub fn tenant_label(tenant: &str) -> String {
    derive("t", "tenant", tenant)
}

/// The value of [`LABEL_SESSION`] for a session id.
pub fn session_label(session_id: &str) -> String {
    derive("s", "session", session_id)
}

/// The value of [`LABEL_PROFILE`] for a profile name.
pub fn profile_label(profile: &str) -> String {
    derive("p", "profile", profile)
}

/// The value of [`LABEL_PYTHON`] for a Python version.
pub fn python_label(python: &str) -> String {
    derive("py", "python", python)
}

fn derive(prefix: &str, kind: &str, original: &str) -> String {
    with_hash(prefix, original, kind, original)
}

/// `<prefix>-<readable>-<hash of kind and key>`, or `<prefix>-<hash>` when nothing of
/// `readable` is left; at most [`MAX_LABEL_LEN`] characters, starting with the prefix's first
/// letter and ending with a hex digit.
fn with_hash(prefix: &str, readable: &str, kind: &str, key: &str) -> String {
    let mut digest = Sha256::new();
    digest.update(kind.as_bytes());
    digest.update([0]);
    digest.update(key.as_bytes());
    let hash: String = digest
        .finalize()
        .iter()
        .flat_map(|byte| [byte >> 4, byte & 0xf])
        .take(HASH_LEN)
        .map(|nibble| char::from_digit(u32::from(nibble), 16).unwrap_or('0'))
        .collect();
    let readable = slug(readable, READABLE_LEN);
    let name = if readable.is_empty() {
        format!("{prefix}-{hash}")
    } else {
        format!("{prefix}-{readable}-{hash}")
    };
    debug_assert!(is_dns_label(&name), "{name}");
    name
}

/// Lowercase ASCII letters and digits of `text`, every other run of characters one `-`, no `-`
/// at either end, at most `max` characters.
fn slug(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if out.len() >= max {
            break;
        }
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// A DNS-1123 label (RFC 1123, as Kubernetes checks it): 1 to 63 lowercase letters, digits or
/// `-`, starting and ending with a letter or digit. The names of claims, templates and pools,
/// and so of the Sandboxes, pods and Services made after them.
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_LEN
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes.iter().all(|b| edge(b) || *b == b'-')
}

/// A label value as Kubernetes checks it: empty, or at most 63 characters of letters, digits,
/// `-`, `_` and `.`, starting and ending with a letter or digit.
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    bytes.is_empty()
        || (bytes.len() <= MAX_LABEL_LEN
            && bytes.first().is_some_and(edge)
            && bytes.last().is_some_and(edge)
            && bytes
                .iter()
                .all(|b| edge(b) || matches!(b, b'-' | b'_' | b'.')))
}

/// A label key as Kubernetes checks it: an optional DNS-1123 subdomain prefix (at most 253
/// characters) and `/`, then a name of 1 to 63 letters, digits, `-`, `_` and `.`, starting and
/// ending with a letter or digit.
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|prefix| {
        !prefix.is_empty() && prefix.len() <= 253 && prefix.split('.').all(is_dns_label)
    });
    prefix_ok && !name.is_empty() && is_label_value(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids no engine hands out today, but a name must survive all of them.
    const HOSTILE: &[&str] = &[
        "",
        "-",
        "---",
        ".",
        "..",
        "/",
        "../../etc/passwd",
        "UPPER-CASE",
        "s-0123456789abcdef",
        "trailing-",
        "-leading",
        "a b\tc\nd",
        "naïve-ünïcödé-ßession",
        "日本語のセッション",
        "😀😀😀",
        "\0nul\0",
        "x.y.z",
        "under_score",
        "a--b",
        "%2e%2e%2f",
        "${HOME}",
        "$(rm -rf /)",
        "'; DROP TABLE sessions; --",
        "kube-system",
        "default",
        "0",
        "9-9",
    ];

    fn long_ids() -> Vec<String> {
        vec![
            "a".repeat(63),
            "a".repeat(64),
            "a".repeat(10_000),
            "-".repeat(500),
            "ä".repeat(300),
            format!("{}-{}", "b".repeat(40), "c".repeat(40)),
        ]
    }

    fn every_id() -> Vec<String> {
        HOSTILE
            .iter()
            .map(|id| (*id).to_owned())
            .chain(long_ids())
            .collect()
    }

    #[test]
    fn every_derived_name_is_a_dns_label() {
        for id in every_id() {
            for name in [
                session_claim_name(&id),
                runner_claim_name(&id),
                template_name(&id, &id),
                template_name(&id, "3.12"),
            ] {
                assert!(is_dns_label(&name), "{id:?} gave {name:?}");
                assert!(name.len() <= MAX_LABEL_LEN, "{name}");
            }
        }
    }

    #[test]
    fn every_derived_label_value_is_a_label_value() {
        for id in every_id() {
            for value in [
                tenant_label(&id),
                session_label(&id),
                profile_label(&id),
                python_label(&id),
            ] {
                assert!(is_label_value(&value), "{id:?} gave {value:?}");
                assert!(!value.is_empty());
            }
        }
    }

    #[test]
    fn names_are_stable_and_readable() {
        let name = session_claim_name("s-0123456789abcdef");
        assert!(name.starts_with("sbx-s-0123456789abcdef-"), "{name}");
        assert_eq!(name, session_claim_name("s-0123456789abcdef"));
        assert_eq!(name.len(), "sbx-s-0123456789abcdef-".len() + HASH_LEN);
        let template = template_name("default", "3.12");
        assert!(template.starts_with("agent-default-py3-12-"), "{template}");
    }

    #[test]
    fn ids_that_read_alike_get_different_names() {
        let ids = every_id();
        let alike = [
            ("UPPER", "upper"),
            ("a b", "a-b"),
            ("a_b", "a.b"),
            ("trailing-", "trailing"),
            ("", "-"),
        ];
        for (one, other) in alike {
            assert_ne!(session_claim_name(one), session_claim_name(other));
            assert_ne!(tenant_label(one), tenant_label(other));
        }
        let mut names: Vec<String> = ids.iter().map(|id| session_claim_name(id)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ids.len(), "two ids shared a claim name");
        // The template key keeps profile and version apart: ("a-b", "c") is not ("a", "b-c").
        assert_ne!(template_name("a-b", "c"), template_name("a", "b-c"));
        assert_ne!(template_name("a\0b", "c"), template_name("a", "b\0c"));
    }

    #[test]
    fn a_chosen_id_cannot_take_another_ids_name() {
        // An id spelled like another id's derived name still derives a name of its own.
        let victim = session_claim_name("s-victim");
        assert_ne!(session_claim_name(&victim), victim);
        let tenant = tenant_label("acme");
        assert_ne!(tenant_label(&tenant), tenant);
        // And a session's claim is never a tenant's runner claim.
        assert_ne!(session_claim_name("acme"), runner_claim_name("acme"));
    }

    #[test]
    fn the_checks_follow_kubernetes_rules() {
        for good in ["a", "a-b", "0", "a".repeat(63).as_str(), "sbx-1"] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "a_b",
            "a".repeat(64).as_str(),
            "ä",
        ] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for good in ["", "a", "A.b_c-d", "0", "a".repeat(63).as_str()] {
            assert!(is_label_value(good), "{good}");
        }
        for bad in ["-a", "a-", "a b", "a/b", "a".repeat(64).as_str(), "é"] {
            assert!(!is_label_value(bad), "{bad}");
        }
        for good in [LABEL_TENANT, LABEL_MANAGED_BY, "plain", "a.b.c/d_e"] {
            assert!(is_label_key(good), "{good}");
        }
        for bad in ["", "/a", "a/", "A.b/c", "a/b/c", "-a.b/c", "a/-b"] {
            assert!(!is_label_key(bad), "{bad}");
        }
    }
}
