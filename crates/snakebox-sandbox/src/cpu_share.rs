//! CPU weights that follow the work, not the sandbox: why a sandbox's cgroup weighs what it
//! does against the server's other sandboxes when the CPU is contended.
//!
//! Every run cgroup is a sibling of the others under the server's own cgroup, so by default
//! each busy sandbox gets an equal part of the CPU, and whoever has more sandboxes busy gets
//! more of it. A caller that wants another split holds a [`CpuShare`] for each unit of work
//! (the engine: one per sandbox slot, weighted so that each tenant's busy sandboxes together
//! weigh what one tenant weighs) and hands it to the sandbox doing that work: a run's
//! [`crate::Policy::cpu`] (for the sandbox's whole life), [`crate::ForkRun::cpu`] (a forked
//! run, from the moment it takes its pre-forked child), [`crate::PendingRun::attach_cpu`] and
//! [`crate::LiveSandbox::attach_cpu`] (while the returned [`CpuAttachment`] is held: one
//! request of a long-lived sandbox). The sandbox's cgroup is then *attached* to the share: it
//! gets the share's weight at once, and every later [`CpuShare::set`] is written to each
//! cgroup attached to it, a few small writes bounded by how many are attached (usually one).
//!
//! This crate knows nothing of tenants: it only writes the weight it is given. Where there is
//! no cpu cgroup to write (no cgroups at all, a cgroup v1 host without a writable cpu
//! hierarchy, cgroup v2 without the cpu controller delegated, the `none` and `docker`
//! backends), attaching does nothing and the kernel's default weight holds; the backend's
//! report says so (`cpu_weight`).

use std::sync::{Arc, Mutex, PoisonError};

use crate::cgroup::CpuKnob;
use crate::error::CgroupError;

/// A CPU weight, in the units of cgroup v1 `cpu.shares`: [`CpuWeight::DEFAULT`] (1024) is what
/// a sandbox weighs when nobody says otherwise. cgroup v2 `cpu.weight` gets the same fraction of
/// its own default (100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CpuWeight(u32);

impl CpuWeight {
    /// The kernel's default (`cpu.shares` 1024, `cpu.weight` 100).
    pub const DEFAULT: CpuWeight = CpuWeight(1024);
    /// Work that may wait for all other work: a sixteenth of the default (`cpu.shares` 64,
    /// `cpu.weight` 6), as for a pre-forked child before its run.
    pub const BACKGROUND: CpuWeight = CpuWeight(64);
    /// The server's work on the host for callers (walking a workspace, shaping an answer), all
    /// of it together: a quarter of the default (`cpu.shares` 256, `cpu.weight` 25), so that a
    /// flood of one tenant's host work yields the CPU to the sandboxes' work (each tenant's
    /// weighs the default) and to the server's own threads, without being starved.
    pub const HOST_WORK: CpuWeight = CpuWeight(256);
    /// The least a share is divided down to (cgroup v1's smallest `cpu.shares`).
    pub const MIN: CpuWeight = CpuWeight(2);

    /// A weight of `shares` (cgroup v1 units), at least [`CpuWeight::MIN`].
    #[must_use]
    pub fn from_shares(shares: u32) -> CpuWeight {
        CpuWeight(shares.max(Self::MIN.0))
    }

    /// This weight in cgroup v1 `cpu.shares` units.
    #[must_use]
    pub fn shares(self) -> u32 {
        self.0
    }

    /// One of `parts` equal parts of this weight (rounded down, at least [`CpuWeight::MIN`]);
    /// `parts` 0 is taken as 1.
    #[must_use]
    pub fn divided(self, parts: usize) -> CpuWeight {
        let parts = u32::try_from(parts.max(1)).unwrap_or(u32::MAX);
        CpuWeight::from_shares(self.0 / parts)
    }
}

/// The weight of one unit of work, shared by the cgroups of the sandboxes doing it; see the
/// module documentation. Cloning gives another handle to the same share.
#[derive(Clone)]
pub struct CpuShare {
    inner: Arc<Mutex<ShareState>>,
}

/// What a share is now: its weight and the cgroups it is written to.
struct ShareState {
    weight: CpuWeight,
    /// The cgroups attached now, each with the id its attachment removes it by.
    attached: Vec<(u64, CpuKnob)>,
    next_id: u64,
}

impl ShareState {
    /// Write each attached cgroup's part of the weight (the weight split evenly between them).
    fn write_all(&self) {
        let part = self.weight.divided(self.attached.len());
        for (_, knob) in &self.attached {
            if let Err(err) = knob.write(part) {
                // A cgroup being removed (its run just ended) has no file any more.
                tracing::debug!(error = %err, "could not rewrite a run cgroup's CPU weight");
            }
        }
    }
}

impl std::fmt::Debug for CpuShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("CpuShare")
            .field("weight", &state.weight)
            .field("attached", &state.attached.len())
            .finish()
    }
}

/// Two handles are equal when they are the same share.
impl PartialEq for CpuShare {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for CpuShare {}

impl Default for CpuShare {
    fn default() -> Self {
        CpuShare::new(CpuWeight::DEFAULT)
    }
}

impl CpuShare {
    /// A share of `weight`, with nothing attached yet.
    #[must_use]
    pub fn new(weight: CpuWeight) -> CpuShare {
        CpuShare {
            inner: Arc::new(Mutex::new(ShareState {
                weight,
                attached: Vec::new(),
                next_id: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ShareState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its weight now.
    #[must_use]
    pub fn weight(&self) -> CpuWeight {
        self.lock().weight
    }

    /// How many cgroups are attached now.
    #[must_use]
    pub fn attached(&self) -> usize {
        self.lock().attached.len()
    }

    /// Change its weight, and write it to every cgroup attached now (nothing when it is the
    /// same). A write that fails is logged: the cgroup keeps its weight until the next.
    pub fn set(&self, weight: CpuWeight) {
        let mut state = self.lock();
        if state.weight == weight {
            return;
        }
        state.weight = weight;
        state.write_all();
    }

    /// Attach a run cgroup's `knob`: it gets its part of the share now and at every change,
    /// until the returned attachment is dropped; then the others attached are rewritten and,
    /// with `then`, the knob gets that weight (a live sandbox between its requests).
    ///
    /// # Errors
    /// When the first write fails: nothing is attached then.
    pub(crate) fn attach(
        &self,
        knob: CpuKnob,
        then: Option<CpuWeight>,
    ) -> Result<CpuAttachment, CgroupError> {
        let mut state = self.lock();
        let part = state.weight.divided(state.attached.len() + 1);
        knob.write(part)?;
        let id = state.next_id;
        state.next_id += 1;
        state.attached.push((id, knob.clone()));
        if state.attached.len() > 1 {
            state.write_all();
        }
        Ok(CpuAttachment {
            share: Some((Arc::clone(&self.inner), id)),
            then: then.map(|weight| (knob, weight)),
        })
    }
}

/// One cgroup attached to a [`CpuShare`]; detached when dropped. One that attached nothing (no
/// cpu cgroup here) is inert.
#[must_use = "the cgroup is detached when this is dropped"]
pub struct CpuAttachment {
    share: Option<(Arc<Mutex<ShareState>>, u64)>,
    then: Option<(CpuKnob, CpuWeight)>,
}

impl std::fmt::Debug for CpuAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuAttachment")
            .field("attached", &self.share.is_some())
            .finish_non_exhaustive()
    }
}

impl CpuAttachment {
    /// An attachment of nothing (there is no cpu cgroup to weigh).
    pub(crate) fn none() -> CpuAttachment {
        CpuAttachment {
            share: None,
            then: None,
        }
    }

    /// Whether a cgroup is attached through it.
    #[must_use]
    pub fn is_attached(&self) -> bool {
        self.share.is_some()
    }
}

impl Drop for CpuAttachment {
    fn drop(&mut self) {
        let Some((inner, id)) = self.share.take() else {
            return;
        };
        let mut state = inner.lock().unwrap_or_else(PoisonError::into_inner);
        state.attached.retain(|(other, _)| *other != id);
        if !state.attached.is_empty() {
            state.write_all();
        }
        // Written while the share is locked, so that a `set` cannot come between.
        if let Some((knob, weight)) = self.then.take()
            && let Err(err) = knob.write(weight)
        {
            tracing::debug!(error = %err, "could not set a detached cgroup's CPU weight");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::CpuKnob;

    fn read(path: &std::path::Path) -> String {
        fs_err::read_to_string(path).unwrap()
    }

    #[test]
    fn a_weight_divides_evenly_and_never_below_the_least() {
        assert_eq!(CpuWeight::DEFAULT.divided(3).shares(), 341);
        assert_eq!(CpuWeight::DEFAULT.divided(1), CpuWeight::DEFAULT);
        assert_eq!(CpuWeight::DEFAULT.divided(0), CpuWeight::DEFAULT);
        assert_eq!(CpuWeight::DEFAULT.divided(100_000), CpuWeight::MIN);
        assert_eq!(CpuWeight::from_shares(0), CpuWeight::MIN);
    }

    #[test]
    fn attached_cgroups_split_the_share_and_follow_its_changes_until_detached() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        fs_err::create_dir(&a).unwrap();
        fs_err::create_dir(&b).unwrap();
        let share = CpuShare::new(CpuWeight::DEFAULT);
        let first = share.attach(CpuKnob::v1(&a), None).unwrap();
        assert_eq!(read(&a.join("cpu.shares")), "1024");
        // A second cgroup doing the same work: each gets half.
        let second = share
            .attach(CpuKnob::v1(&b), Some(CpuWeight::BACKGROUND))
            .unwrap();
        assert_eq!(read(&a.join("cpu.shares")), "512");
        assert_eq!(read(&b.join("cpu.shares")), "512");
        assert_eq!(share.attached(), 2);
        // The holder's weight changes: both are rewritten.
        share.set(CpuWeight::DEFAULT.divided(3));
        assert_eq!(read(&a.join("cpu.shares")), "170");
        assert_eq!(read(&b.join("cpu.shares")), "170");
        // The second is done (a live sandbox between requests): it waits at the background
        // weight, the first has the whole share again.
        drop(second);
        assert_eq!(read(&b.join("cpu.shares")), "64");
        assert_eq!(read(&a.join("cpu.shares")), "341");
        drop(first);
        // Nothing attached: a change writes nothing.
        share.set(CpuWeight::DEFAULT);
        assert_eq!(read(&a.join("cpu.shares")), "341");
        assert_eq!(share.attached(), 0);
    }

    #[test]
    fn cgroup_v2_gets_the_same_fraction_of_its_own_default() {
        let tmp = tempfile::tempdir().unwrap();
        let share = CpuShare::new(CpuWeight::DEFAULT.divided(3));
        let _held = share.attach(CpuKnob::v2(tmp.path()), None).unwrap();
        assert_eq!(read(&tmp.path().join("cpu.weight")), "33");
        share.set(CpuWeight::BACKGROUND);
        assert_eq!(read(&tmp.path().join("cpu.weight")), "6");
        share.set(CpuWeight::DEFAULT);
        assert_eq!(read(&tmp.path().join("cpu.weight")), "100");
        share.set(CpuWeight::MIN);
        assert_eq!(read(&tmp.path().join("cpu.weight")), "1");
    }

    #[test]
    fn a_failed_first_write_attaches_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let share = CpuShare::default();
        let gone = tmp.path().join("gone");
        assert!(share.attach(CpuKnob::v1(&gone), None).is_err());
        assert_eq!(share.attached(), 0);
        assert!(!CpuAttachment::none().is_attached());
    }
}
