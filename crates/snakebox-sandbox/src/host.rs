//! Host process operations (listing processes, sending signals) behind a trait, so the logic
//! that decides *which* processes belong to a run can be tested with a recording double.

use std::io;

/// The fields of `/proc/<pid>/stat` that tie a process to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Process id.
    pub(crate) pid: i32,
    /// Parent process id.
    pub(crate) ppid: i32,
    /// Process group.
    pub(crate) pgrp: i32,
    /// Session.
    pub(crate) session: i32,
}

/// Signals and the process table.
pub(crate) trait ProcessHost: Send + Sync + std::fmt::Debug {
    /// Every process visible in `/proc`.
    fn processes(&self) -> Vec<ProcStat>;
    /// `kill(pid, signal)`.
    fn kill(&self, pid: i32, signal: i32) -> io::Result<()>;
}

/// The real host.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RealHost;

impl ProcessHost for RealHost {
    fn processes(&self) -> Vec<ProcStat> {
        let Ok(dir) = fs_err::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(|pid| {
                let stat = fs_err::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                parse_stat(pid, &stat)
            })
            .collect()
    }

    fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        // SAFETY: kill(2) has no memory-safety preconditions.
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Parse `/proc/<pid>/stat`. The command name may contain spaces and parentheses, so fields
/// are counted after the LAST `)`.
pub(crate) fn parse_stat(pid: i32, stat: &str) -> Option<ProcStat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        ppid,
        pgrp,
        session,
    })
}

/// Processes that belong to the tree started as `leader` (its own session and group): members
/// of the session or group, and descendants by parent links.
pub(crate) fn tree_members(procs: &[ProcStat], leader: i32) -> Vec<i32> {
    let parent: std::collections::HashMap<i32, i32> =
        procs.iter().map(|p| (p.pid, p.ppid)).collect();
    procs
        .iter()
        .filter(|p| p.pid != leader)
        .filter(|p| {
            if p.session == leader || p.pgrp == leader {
                return true;
            }
            let mut cur = p.ppid;
            for _ in 0..128 {
                if cur == leader {
                    return true;
                }
                match parent.get(&cur) {
                    Some(&next) if next != cur && next > 0 => cur = next,
                    _ => return false,
                }
            }
            false
        })
        .map(|p| p.pid)
        .collect()
}

/// Kill the tree of `leader`: freeze it with SIGSTOP first (a stopped process cannot fork,
/// and a stopped subreaper still holds its orphans, so nothing is re-parented to host init
/// between the scan and the kill), rescan until no new member appears (at most `rounds`
/// times), then SIGKILL every member, the process group and the leader.
pub(crate) fn kill_tree(host: &dyn ProcessHost, leader: i32, rounds: usize) {
    let mut stopped = std::collections::BTreeSet::new();
    let _ = host.kill(leader, libc::SIGSTOP);
    for _ in 0..rounds {
        let new: Vec<i32> = tree_members(&host.processes(), leader)
            .into_iter()
            .filter(|pid| !stopped.contains(pid))
            .collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            let _ = host.kill(pid, libc::SIGSTOP);
            stopped.insert(pid);
        }
    }
    for &pid in &stopped {
        let _ = host.kill(pid, libc::SIGKILL);
    }
    let _ = host.kill(-leader, libc::SIGKILL);
    let _ = host.kill(leader, libc::SIGKILL);
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A process table that records signals and removes killed processes.
    #[derive(Debug, Default)]
    pub(crate) struct FakeHost {
        pub(crate) procs: Mutex<Vec<ProcStat>>,
        pub(crate) signals: Mutex<Vec<(i32, i32)>>,
    }

    impl ProcessHost for FakeHost {
        fn processes(&self) -> Vec<ProcStat> {
            self.procs.lock().unwrap().clone()
        }
        fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
            self.signals.lock().unwrap().push((pid, signal));
            if signal != libc::SIGKILL {
                return Ok(());
            }
            let mut procs = self.procs.lock().unwrap();
            if pid < 0 {
                procs.retain(|p| p.pgrp != -pid);
            } else {
                procs.retain(|p| p.pid != pid);
            }
            Ok(())
        }
    }

    fn p(pid: i32, ppid: i32, pgrp: i32, session: i32) -> ProcStat {
        ProcStat {
            pid,
            ppid,
            pgrp,
            session,
        }
    }

    #[test]
    fn parse_stat_handles_parentheses_in_the_name() {
        let s = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 ...";
        assert_eq!(parse_stat(1234, s), Some(p(1234, 1, 1234, 1234)));
    }

    #[test]
    fn members_include_escaped_sessions_descendants_only() {
        let procs = vec![
            p(1, 0, 1, 1),         // init
            p(100, 1, 100, 100),   // the server
            p(200, 100, 200, 200), // leader
            p(201, 200, 200, 200), // child in group
            p(202, 200, 202, 202), // child that called setsid
            p(203, 202, 202, 202), // its child
            p(300, 1, 300, 300),   // unrelated
            p(301, 1, 200, 200),   // double-forked, reparented, still in session
        ];
        let mut m = tree_members(&procs, 200);
        m.sort_unstable();
        assert_eq!(m, vec![201, 202, 203, 301]);
    }

    #[test]
    fn kill_tree_signals_group_then_stragglers() {
        let host = FakeHost::default();
        *host.procs.lock().unwrap() = vec![
            p(1, 0, 1, 1),
            p(200, 1, 200, 200),
            p(202, 200, 202, 202),
            p(300, 1, 300, 300),
        ];
        kill_tree(&host, 200, 5);
        let signals = host.signals.lock().unwrap().clone();
        assert_eq!(signals[0], (200, libc::SIGSTOP));
        assert_eq!(signals[1], (202, libc::SIGSTOP));
        assert_eq!(
            &signals[2..],
            &[
                (202, libc::SIGKILL),
                (-200, libc::SIGKILL),
                (200, libc::SIGKILL)
            ]
        );
        assert!(!signals.iter().any(|&(pid, _)| pid == 300 || pid == 1));
    }
}
