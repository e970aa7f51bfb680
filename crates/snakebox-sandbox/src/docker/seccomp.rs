//! The native backend's seccomp program as a Docker seccomp profile.
//!
//! Why: Docker does not take a BPF program, only a JSON profile that the runtime (runc, via
//! libseccomp) compiles. Its default profile is a different list (it lets i386 `int 0x80`
//! calls and AF_VSOCK sockets through: catalogue K-11, N-06), so the docker backend passes
//! its own, made here from the very rule table the native backend compiles
//! ([`crate::native::seccomp::deny_lists`]): one list of refused calls for both backends.
//!
//! What the format can state, and what it cannot (SECURITY.md lists the same):
//! - the native guard's "other ABIs are killed" becomes `architectures` naming only the
//!   native one: libseccomp then applies its bad-architecture action (kill) to i386 calls,
//!   and on x86_64 to x32 numbers;
//! - every syscall of the deny lists, with EPERM or ENOSYS as `errnoRet`;
//! - argument rules: conditions on different arguments are ANDed, a 32-bit comparison becomes
//!   a masked equality; runc splits a rule with two conditions on the same argument into one
//!   rule per condition (ORed), so "none of these values" (`personality`) is written as the
//!   masked equalities that cover every other value ([`complement_cubes`]). Any other rule
//!   runc would change is left out and named in [`Profile::left_out`] (today: none);
//! - not the guard's "numbers above the newest known one get ENOSYS": a profile names calls,
//!   and runc adds its ENOSYS stub only under a default action that denies.

use seccompiler::{SeccompCmpArgLen, SeccompCmpOp};
use serde_json::{Value, json};

use crate::error::SeccompError;
use crate::native::seccomp::{Cond, Holder, MAX_KNOWN_SYSCALL, Rule, deny_lists};

/// The profile of a run's container.
#[derive(Debug, Clone)]
pub(crate) struct Profile {
    /// The JSON document (`HostConfig.SecurityOpt` carries `seccomp=<this>`).
    pub(crate) json: String,
    /// What of the native program the profile does not state, one line each.
    pub(crate) left_out: Vec<String>,
}

impl Profile {
    /// The `SecurityOpt` entry that applies it.
    pub(crate) fn security_opt(&self) -> String {
        format!("seccomp={}", self.json)
    }
}

/// The report's line: what the profile refuses, and what of the native program it leaves out.
pub(crate) fn summary() -> String {
    match profile() {
        Ok(p) => format!(
            "seccomp: the native backend's program as a Docker profile (only the native ABI; {}); \
             not stated in Docker's format: {}; and runc drops the entries whose names the \
             engine's libseccomp does not know (Debian 12's: statmount, listmount, \
             lsm_set_self_attr, the *xattrat calls, open_tree_attr)",
            crate::native::seccomp::summary()
                .trim_start_matches("seccomp: ")
                .replace("unknown syscalls ENOSYS; ", ""),
            p.left_out.join("; ")
        ),
        Err(e) => format!("seccomp: no profile: {e}"),
    }
}

/// libseccomp's name of the architecture we run on.
fn scmp_arch() -> Result<&'static str, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("SCMP_ARCH_X86_64"),
        "aarch64" => Ok("SCMP_ARCH_AARCH64"),
        arch => Err(SeccompError::UnsupportedArch { arch }),
    }
}

/// One condition as a profile's `args` entry, or why it cannot be one.
fn arg(c: &Cond) -> Result<Value, String> {
    const LOW: u64 = 0xffff_ffff;
    let (op, value, value_two) = match (&c.len, &c.op) {
        (SeccompCmpArgLen::Qword, SeccompCmpOp::Eq) => ("SCMP_CMP_EQ", c.value, 0),
        (SeccompCmpArgLen::Qword, SeccompCmpOp::Ne) => ("SCMP_CMP_NE", c.value, 0),
        (SeccompCmpArgLen::Qword, SeccompCmpOp::Gt) => ("SCMP_CMP_GT", c.value, 0),
        (SeccompCmpArgLen::Qword, SeccompCmpOp::Ge) => ("SCMP_CMP_GE", c.value, 0),
        (SeccompCmpArgLen::Qword, SeccompCmpOp::Lt) => ("SCMP_CMP_LT", c.value, 0),
        (SeccompCmpArgLen::Qword, SeccompCmpOp::Le) => ("SCMP_CMP_LE", c.value, 0),
        // libseccomp's masked equality: `value` is the mask, `valueTwo` the datum.
        (SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(mask)) => {
            ("SCMP_CMP_MASKED_EQ", *mask, c.value)
        }
        // The low 32 bits only (the high ones may be garbage, CVE-2019-10063): a mask.
        (SeccompCmpArgLen::Dword, SeccompCmpOp::Eq) => ("SCMP_CMP_MASKED_EQ", LOW, c.value & LOW),
        (SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(mask)) => {
            ("SCMP_CMP_MASKED_EQ", mask & LOW, c.value & LOW)
        }
        (SeccompCmpArgLen::Dword, op) => {
            return Err(format!(
                "a 32-bit {op:?} comparison (libseccomp compares 64 bits)"
            ));
        }
    };
    Ok(json!({"index": c.arg, "value": value, "valueTwo": value_two, "op": op}))
}

/// "None of these values" as libseccomp can state it: the values outside the set are the
/// branches a binary trie of the set lacks, each one masked equality on the bits down to it
/// (at most `bits` × values of them). Returns (mask, value) pairs.
fn complement_cubes(values: &[u64], bits: u32) -> Vec<(u64, u64)> {
    fn walk(values: &[u64], bit: u32, above: u64, prefix: u64, out: &mut Vec<(u64, u64)>) {
        let here = 1u64 << bit;
        let mask = above | here;
        for side in [0, here] {
            let part: Vec<u64> = values
                .iter()
                .copied()
                .filter(|v| v & here == side)
                .collect();
            if part.is_empty() {
                out.push((mask, prefix | side));
            } else if bit > 0 {
                walk(&part, bit - 1, mask, prefix | side, out);
            }
        }
    }
    let mut out = Vec::new();
    if values.is_empty() {
        out.push((0, 0));
    } else {
        walk(values, bits - 1, 0, 0, &mut out);
    }
    out
}

/// A rule as profile rules (their `args`; ORed), or why runc would not keep its meaning.
fn args(rule: &Rule) -> Result<Vec<Vec<Value>>, String> {
    // "Not equal to any of these", all on one argument: runc would OR the conditions (every
    // value is unequal to one of them), so it becomes the masked equalities of its complement.
    let first = rule.0.first().ok_or("a rule without conditions")?;
    if rule.0.len() > 1
        && rule
            .0
            .iter()
            .all(|c| c.arg == first.arg && c.len == first.len && c.op == SeccompCmpOp::Ne)
    {
        let (bits, low) = match first.len {
            SeccompCmpArgLen::Dword => (32, 0xffff_ffff),
            SeccompCmpArgLen::Qword => (64, u64::MAX),
        };
        let values: Vec<u64> = rule.0.iter().map(|c| c.value & low).collect();
        return Ok(complement_cubes(&values, bits)
            .into_iter()
            .map(|(mask, value)| {
                vec![json!({"index": first.arg, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"})]
            })
            .collect());
    }
    let mut seen = [false; 6];
    for c in &rule.0 {
        let slot = seen
            .get_mut(usize::from(c.arg))
            .ok_or("argument index > 5")?;
        if *slot {
            return Err(format!(
                "several conditions on argument {} (runc ORs them)",
                c.arg
            ));
        }
        *slot = true;
    }
    Ok(vec![rule.0.iter().map(arg).collect::<Result<_, _>>()?])
}

/// The profile of a run (the native backend's [`Holder::Run`] program).
///
/// # Errors
/// On an architecture the native backend has no program for.
pub(crate) fn profile() -> Result<Profile, SeccompError> {
    let arch = scmp_arch()?;
    let mut entries = Vec::new();
    let mut left_out = Vec::new();
    for (errno, table) in deny_lists(Holder::Run) {
        let mut always = Vec::new();
        let mut conditional = Vec::new();
        for (nr, rules) in &table {
            let name = usize::try_from(*nr)
                .ok()
                .and_then(syscalls::Sysno::new)
                .map(|s| s.name());
            let Some(name) = name else {
                left_out.push(format!("syscall {nr}: no name known to this build"));
                continue;
            };
            if rules.is_empty() {
                always.push(name);
                continue;
            }
            for rule in rules {
                match args(rule) {
                    Ok(alternatives) => conditional.extend(alternatives.into_iter().map(|args| {
                        json!({
                            "names": [name],
                            "action": "SCMP_ACT_ERRNO",
                            "errnoRet": errno,
                            "args": args,
                        })
                    })),
                    Err(why) => left_out.push(format!("{name} {:?}: {why}", rule.0)),
                }
            }
        }
        entries.push(json!({"names": always, "action": "SCMP_ACT_ERRNO", "errnoRet": errno}));
        entries.extend(conditional);
    }
    left_out.push(format!(
        "syscall numbers above {MAX_KNOWN_SYSCALL} (ENOSYS natively): a profile names calls, \
         and runc adds no ENOSYS stub under a default action that allows"
    ));
    let document = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [arch],
        "syscalls": entries,
    });
    Ok(Profile {
        json: document.to_string(),
        left_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(p: &Profile) -> Vec<Value> {
        let doc: Value = serde_json::from_str(&p.json).unwrap();
        doc["syscalls"].as_array().unwrap().clone()
    }

    fn errno_of(p: &Profile, name: &str) -> Vec<(i64, Value)> {
        entries(p)
            .into_iter()
            .filter(|e| e["names"].as_array().unwrap().iter().any(|n| n == name))
            .map(|e| (e["errnoRet"].as_i64().unwrap(), e["args"].clone()))
            .collect()
    }

    #[test]
    fn the_profile_names_only_the_native_architecture_and_allows_by_default() {
        let p = profile().unwrap();
        let doc: Value = serde_json::from_str(&p.json).unwrap();
        assert_eq!(doc["defaultAction"], "SCMP_ACT_ALLOW");
        assert_eq!(doc["architectures"], json!([scmp_arch().unwrap()]));
        assert!(p.security_opt().starts_with("seccomp={"));
        // The same document every time (it is compared after the create).
        assert_eq!(profile().unwrap().json, p.json);
    }

    #[test]
    fn every_syscall_of_the_native_table_is_in_the_profile_or_left_out_by_name() {
        let p = profile().unwrap();
        let stated: Vec<String> = entries(&p)
            .iter()
            .flat_map(|e| e["names"].as_array().unwrap().clone())
            .map(|n| n.as_str().unwrap().to_owned())
            .collect();
        for (errno, table) in deny_lists(Holder::Run) {
            for (nr, rules) in table {
                let name = syscalls::Sysno::new(usize::try_from(nr).unwrap())
                    .unwrap()
                    .name();
                let here = errno_of(&p, name);
                if stated.iter().any(|n| n == name) {
                    assert!(here.iter().all(|(e, _)| i64::from(errno) == *e), "{name}");
                    // Every rule kept (one or more profile rules each), or the missing ones named.
                    let named = p.left_out.iter().filter(|l| l.starts_with(name)).count();
                    assert!(
                        here.len() + named >= rules.len().max(1),
                        "{name}: {here:?} {:?}",
                        p.left_out
                    );
                } else {
                    assert!(
                        p.left_out
                            .iter()
                            .any(|l| l.starts_with(&format!("{name} "))),
                        "{name} neither stated nor left out"
                    );
                }
            }
        }
    }

    #[test]
    fn argument_rules_keep_their_meaning() {
        let p = profile().unwrap();
        // EPERM, always.
        assert_eq!(errno_of(&p, "keyctl"), vec![(1, Value::Null)]);
        // ENOSYS, so that glibc falls back to clone (K-12).
        assert_eq!(errno_of(&p, "clone3"), vec![(38, Value::Null)]);
        // ioctl TIOCSTI: the low 32 bits of argument 1 only.
        let ioctl = errno_of(&p, "ioctl");
        assert!(ioctl.contains(&(
            1,
            json!([{"index": 1, "value": 0xffff_ffff_u64, "valueTwo": 0x5412, "op": "SCMP_CMP_MASKED_EQ"}])
        )));
        // AF_VSOCK sockets (N-06).
        assert_eq!(
            errno_of(&p, "socket"),
            vec![(
                1,
                json!([{"index": 0, "value": 0xffff_ffff_u64, "valueTwo": 40, "op": "SCMP_CMP_MASKED_EQ"}])
            )]
        );
        // clone with any CLONE_NEW* bit: one rule per bit.
        let clone = errno_of(&p, "clone");
        assert_eq!(clone.len(), 7);
        assert!(clone.contains(&(
            1,
            json!([{"index": 0, "value": libc::CLONE_NEWUSER, "valueTwo": libc::CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}])
        )));
        // personality's "none of these values": the masked equalities of its complement.
        assert!(!errno_of(&p, "personality").is_empty());
        assert!(
            !p.left_out.iter().any(|l| l.starts_with("personality")),
            "{:?}",
            p.left_out
        );
    }

    /// What libseccomp does with the profile's rules of one syscall: refused when any rule's
    /// masked equality holds.
    fn refused(rules: &[(u64, u64)], v: u64) -> bool {
        rules.iter().any(|&(mask, value)| v & mask == value)
    }

    #[test]
    fn the_complement_of_a_value_set_refuses_exactly_the_other_values() {
        let allowed = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];
        let cubes = complement_cubes(&allowed, 32);
        assert!(cubes.len() <= 32 * allowed.len(), "{}", cubes.len());
        for v in allowed {
            assert!(!refused(&cubes, v), "{v:#x} is allowed");
        }
        // Every single bit, every neighbour of an allowed value, and a spread of others.
        let mut probes: Vec<u64> = (0..32).map(|b| 1u64 << b).collect();
        for v in allowed {
            probes.extend([
                v.wrapping_add(1) & 0xffff_ffff,
                v.wrapping_sub(1) & 0xffff_ffff,
            ]);
        }
        probes.extend((0..2000u64).map(|i| i.wrapping_mul(0x9E37_79B9) & 0xffff_ffff));
        for v in probes {
            assert_eq!(refused(&cubes, v), !allowed.contains(&v), "{v:#x}");
        }
        // The profile's own personality rules are these cubes (32-bit: the high bits are
        // ignored, as the native program's Dword comparison does).
        let p = profile().unwrap();
        let from_profile: Vec<(u64, u64)> = errno_of(&p, "personality")
            .into_iter()
            .map(|(_, args)| {
                let a = &args[0];
                assert_eq!(a["op"], "SCMP_CMP_MASKED_EQ");
                (
                    a["value"].as_u64().unwrap(),
                    a["valueTwo"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(from_profile, cubes);
        assert!(
            !refused(&from_profile, (1 << 40) | 0x8),
            "high bits are not compared"
        );
    }
}
