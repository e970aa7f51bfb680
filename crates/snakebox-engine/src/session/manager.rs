//! The sessions that exist and their in-memory state: the [`Manager`] (store, settings, one
//! [`Slot`] per session holding its interpreter behind a fair async mutex), the lifecycle
//! tools (create, list, delete, reset), `check_environment`'s view of sessions, and the
//! background reaper that stops idle interpreters and deletes unused sessions.
//!
//! It exists so that everything about *which* sessions exist and *when* their interpreters
//! live or die is in one place; what runs inside a session is in [`super::interpreter`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use snakebox_env::Interpreter;
use snakebox_sandbox::{LiveSandbox, Sandbox};
use tokio_util::sync::CancellationToken;

use super::SessionService;
use super::disk::SessionDisk;
use super::store::{SessionRow, Store};
use super::{
    CreateSession, InstallState, InstallStatus, SESSIONS_DIR, SessionInfo, SessionList,
    SessionSettings, SessionSummary, Sessions, SessionsReport, db_error, files, new_session_id,
    no_session, now_secs, packages_of, unavailable, valid_id,
};
use crate::Caller;
use crate::{EngineError, ErrorKind};

impl Sessions {
    /// Open the session store under `data_dir` and start the idle reaper. `bwrap`: the
    /// operator's bubblewrap (a normal user's shares are served by a `fuse2fs` it confines).
    /// The reaper (idle interpreters, expired sessions) runs until `stop` fires or the
    /// sessions are dropped.
    pub(crate) fn open(
        data_dir: &Path,
        settings: SessionSettings,
        tenant_disk: crate::budget::PerTenant<Option<u64>>,
        bwrap: Option<&Path>,
        stop: CancellationToken,
    ) -> Sessions {
        let root = data_dir.join(SESSIONS_DIR);
        // This process's run directory tells other processes of this data directory that it
        // uses the shares (see `SessionDisk::release`).
        let _ = fs_err::create_dir_all(crate::run::server_runs_dir(data_dir));
        // A tenant without a share of its own has the whole disk.
        let total = settings.max_disk_bytes;
        let share = tenant_disk.map(|share| share.unwrap_or(total));
        let (disk, store) =
            match SessionDisk::open(data_dir, &root, settings.max_disk_bytes, share, bwrap) {
                Ok(opened) => opened,
                Err(refused) => {
                    return Sessions {
                        inner: Err(refused),
                    };
                }
            };
        disk.watch();
        if !crate::run::other_live_servers(data_dir) {
            sweep_orphans(&root, &disk, &store);
        }
        let manager = Arc::new(Manager {
            disk,
            store,
            slots: Mutex::default(),
            creating: Mutex::new(HashMap::new()),
            settings,
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let reaper = reap_loop(Arc::downgrade(&manager));
            handle.spawn(async move {
                tokio::select! {
                    () = reaper => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        let inner = Ok(manager);
        Sessions { inner }
    }
}

impl Sessions {
    /// Unmount the tenants' shares of the sessions' disk unless another server of this data
    /// directory runs.
    pub(crate) fn release(&self) {
        if let Ok(manager) = &self.inner {
            manager.disk.release_all();
        }
    }

    /// Stop every session's interpreter (the server stops; files and packages stay).
    pub(crate) async fn stop_interpreters(&self) {
        let Ok(manager) = &self.inner else {
            return;
        };
        let slots: Vec<Arc<Slot>> = manager
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for slot in slots {
            slot.state
                .lock()
                .await
                .stop("the server stopped since the session's last call")
                .await;
        }
    }

    /// What `check_environment` says about sessions.
    /// `viewer`: list only that caller's sessions (`None`: every one, for the operator).
    pub(crate) fn report(&self, data_dir: &Path, viewer: Option<&Caller>) -> SessionsReport {
        let defaults = SessionSettings::default();
        let mut report = SessionsReport {
            available: false,
            location: data_dir.join(SESSIONS_DIR).display().to_string(),
            count: 0,
            max_sessions: defaults.max_sessions,
            running_interpreters: 0,
            max_running_interpreters: defaults.max_interpreters,
            used_disk_bytes: 0,
            max_disk_bytes: defaults.max_disk_bytes,
            idle_stop_seconds: defaults.idle_stop.as_secs(),
            idle_delete_seconds: defaults.idle_delete.as_secs(),
            sessions: Vec::new(),
            disk_quota: String::new(),
            disk_enforced_while_running: false,
            tenant_max_disk_bytes: defaults
                .tenant_max_disk_bytes
                .unwrap_or(defaults.max_disk_bytes),
            tenant_used_disk_bytes: None,
            reserved_disk_bytes: 0,
            problem: None,
        };
        let manager = match &self.inner {
            Ok(manager) => manager,
            Err(missing) => {
                report.problem = Some(missing.message.clone());
                return report;
            }
        };
        let settings = &manager.settings;
        report.disk_quota = manager
            .disk
            .mechanism(&manager.store, viewer.map(Caller::id));
        report.disk_enforced_while_running = manager.disk.bounded();
        report.tenant_max_disk_bytes = viewer.map_or(manager.disk.share_bytes(), |caller| {
            manager.disk.share_of(caller.id())
        });
        report.reserved_disk_bytes = manager.store.reserved_bytes().unwrap_or(0);
        report.tenant_used_disk_bytes = viewer.map(|caller| manager.tenant_used(caller.id()));
        report.max_sessions = settings.max_sessions;
        report.max_disk_bytes = settings.max_disk_bytes;
        report.max_running_interpreters = settings.max_interpreters;
        report.idle_stop_seconds = settings.idle_stop.as_secs();
        report.idle_delete_seconds = settings.idle_delete.as_secs();
        let rows = match manager.store.list() {
            Ok(rows) => rows,
            Err(err) => {
                report.problem = Some(db_error(err).message);
                return report;
            }
        };
        let running = manager.running();
        report.available = true;
        report.count = rows.len();
        report.running_interpreters = running.values().filter(|r| **r).count();
        report.used_disk_bytes = rows.iter().map(|r| r.venv_bytes + r.work_bytes).sum();
        report.sessions = rows
            .iter()
            .filter(|row| viewer.is_none_or(|caller| caller.owns(&row.owner)))
            .take(50)
            .map(|row| SessionSummary {
                session_id: row.id.clone(),
                name: row.name.clone(),
                python_version: row.python_version.clone(),
                interpreter_running: running.get(&row.id) == Some(&true),
                size_bytes: row.venv_bytes + row.work_bytes,
                last_used_at: row.last_used_at,
            })
            .collect();
        report
    }
}

/// Everything about sessions that outlives one call.
pub(super) struct Manager {
    /// The tenants' shares of the disk, and how they are bounded (see [`SessionDisk`]).
    pub(super) disk: SessionDisk,
    pub(super) store: Store,
    pub(super) slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Sessions being created (counted against `--max-sessions` before their row exists).
    /// Sessions being created, by owner (counted with the recorded ones against the caps).
    pub(super) creating: Mutex<HashMap<String, u64>>,
    pub(super) settings: SessionSettings,
}

/// A place under `--max-sessions` held while a session is being created; given back when
/// dropped (the session's row then counts, or it failed).
pub(super) struct CreateReservation<'a> {
    manager: &'a Manager,
    owner: String,
}

impl Drop for CreateReservation<'_> {
    fn drop(&mut self) {
        let mut creating = self
            .manager
            .creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = creating.get_mut(&self.owner) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                creating.remove(&self.owner);
            }
        }
    }
}
/// The in-memory side of one session.
pub(super) struct Slot {
    pub(super) state: tokio::sync::Mutex<SlotState>,
    pub(super) install: Mutex<InstallStatus>,
    pub(super) installing: AtomicBool,
    /// Fired when the session is deleted or reset: running calls end now.
    pub(super) doomed: Mutex<CancellationToken>,
    /// Last use (Unix seconds), for stopping idle interpreters.
    pub(super) last_used: AtomicU64,
    /// The tenant the session belongs to: whose interpreters make room for whose.
    pub(super) owner: String,
}
#[derive(Default)]
pub(super) struct SlotState {
    pub(super) interpreter: Option<LiveSandbox>,
    /// The session's network proxy (sessions with network, while the server runs): its
    /// socket is in the session's input directory; each call takes its log.
    pub(super) proxy: Option<snakebox_sandbox::RunProxy>,
    /// Cells run by the current interpreter.
    pub(super) cells_in_interpreter: u64,
    /// Cells run in this session (all interpreters).
    pub(super) cells: u64,
    /// Why the variables of earlier calls are gone, when they are.
    pub(super) lost: Option<String>,
    pub(super) deleted: bool,
    /// The workspace's files as the last cell's collection saw them: the next cell's
    /// baseline, so that it need not walk the workspace again. Taken by each cell and given
    /// back by its collection; cleared by whatever else writes the workspace (the file tools,
    /// `run_command`, a reset). What the interpreter itself changes between two cells (a
    /// thread a cell left running) is then reported by the next cell.
    pub(super) known_files: Option<crate::artifacts::Baseline>,
}
impl SlotState {
    /// Stop the interpreter; remember why its variables are gone.
    pub(super) async fn stop(&mut self, reason: &str) {
        if let Some(mut interpreter) = self.interpreter.take() {
            interpreter.kill().await;
        }
        if self.cells_in_interpreter > 0 {
            self.lost = Some(reason.to_owned());
        }
        self.cells_in_interpreter = 0;
    }
}
/// The host side of one session.
pub(super) struct SessionPaths {
    pub(super) root: PathBuf,
    pub(super) work: PathBuf,
    pub(super) env: PathBuf,
    pub(super) venv: PathBuf,
    pub(super) input: PathBuf,
    pub(super) tmp: PathBuf,
}

impl SessionPaths {
    /// The layout of a session whose directory is `root`.
    fn under(root: PathBuf) -> SessionPaths {
        SessionPaths {
            work: root.join("work"),
            env: root.join("env"),
            venv: root.join("env").join("venv"),
            input: root.join("input"),
            tmp: root.join("tmp"),
            root,
        }
    }
}
impl Manager {
    /// Hold a place under `--max-sessions` for a session about to be created: the sessions
    /// recorded and those being created count, checked and reserved in one step, so
    /// concurrent creates can never exceed the cap.
    /// Count a session `caller` is about to create against the server's cap and the
    /// tenant's (`tenant_max`), in one step with the sessions already recorded, so
    /// concurrent creates cannot pass either cap.
    pub(super) fn reserve_create(
        &self,
        caller: &Caller,
        tenant_max: Option<usize>,
    ) -> Result<CreateReservation<'_>, EngineError> {
        let mut creating = self
            .creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let owner = caller.id().to_owned();
        if let Some(limit) = tenant_max {
            let owned = self.store.count_owned(&owner).map_err(db_error)?
                + creating.get(&owner).copied().unwrap_or(0);
            if owned >= limit as u64 {
                return Err(EngineError::new(
                    ErrorKind::Quota,
                    format!(
                        "Tenant `{owner}` has {owned} sessions (or being created), the most a tenant may have ({limit})"
                    ),
                )
                .with_hint(
                    "delete a session you no longer need (list_sessions, delete_session); the operator can raise `[tenants] max_sessions`, or this tenant's own in `[tenants.NAME]`",
                ));
            }
        }
        let count = self.store.count().map_err(db_error)? + creating.values().sum::<u64>();
        if count >= self.settings.max_sessions as u64 {
            return Err(EngineError {
                kind: ErrorKind::Quota,
                message: format!(
                    "There are already {count} sessions (or being created), the most this server allows ({})",
                    self.settings.max_sessions
                ),
                hint: Some("delete a session you no longer need (list_sessions, delete_session); the operator can raise --max-sessions".into()),
            });
        }
        *creating.entry(owner.clone()).or_default() += 1;
        Ok(CreateReservation {
            manager: self,
            owner,
        })
    }

    /// Where the session of `row` is on the host: in its tenant's share.
    ///
    /// # Errors
    /// The share cannot be reached (it could not be mounted at start, and says why).
    pub(super) fn paths(&self, row: &SessionRow) -> Result<SessionPaths, EngineError> {
        match self.disk.dir_of(&row.owner) {
            Some(Ok(share)) => Ok(SessionPaths::under(share.join(&row.id))),
            Some(Err(why)) => Err(self.disk.share_unusable(&why)),
            None => Err(EngineError::new(
                ErrorKind::Unavailable,
                format!("The files of session `{}` are missing", row.id),
            )
            .with_hint("delete the session (delete_session) and create a new one")),
        }
    }

    /// The session `id` of `caller`: another caller's session is not found, exactly as one
    /// that never existed.
    pub(super) fn row(&self, caller: &Caller, id: &str) -> Result<SessionRow, EngineError> {
        self.any_row(id).and_then(|row| {
            caller
                .owns(&row.owner)
                .then_some(row)
                .ok_or_else(|| no_session(id))
        })
    }

    /// The session `id`, whoever owns it (the server's own work: reaping, deleting).
    pub(super) fn any_row(&self, id: &str) -> Result<SessionRow, EngineError> {
        if !valid_id(id) {
            return Err(no_session(id));
        }
        self.store
            .get(id)
            .map_err(db_error)?
            .ok_or_else(|| no_session(id))
    }

    /// The slot of an existing session (made on first use after a start).
    pub(super) fn slot(&self, row: &SessionRow) -> Arc<Slot> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots
            .entry(row.id.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    state: tokio::sync::Mutex::new(SlotState {
                        cells: row.executions,
                        // Cells ran before, in an interpreter this process never had.
                        lost: (row.executions > 0).then(|| {
                            "the server restarted since the session's last call".to_owned()
                        }),
                        ..SlotState::default()
                    }),
                    install: Mutex::new(InstallStatus {
                        session_id: row.id.clone(),
                        state: InstallState::None,
                        requested: Vec::new(),
                        started_at: None,
                        finished_at: None,
                        error: None,
                        log_tail: String::new(),
                        packages: packages_of(row),
                    }),
                    installing: AtomicBool::new(false),
                    doomed: Mutex::new(CancellationToken::new()),
                    last_used: AtomicU64::new(row.last_used_at),
                    owner: row.owner.clone(),
                })
            })
            .clone()
    }

    /// Whether each session known in memory has a running interpreter.
    pub(super) fn running(&self) -> HashMap<String, bool> {
        let slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots
            .iter()
            .map(|(id, slot)| {
                let running = match slot.state.try_lock() {
                    Ok(mut state) => state
                        .interpreter
                        .as_mut()
                        .is_some_and(LiveSandbox::is_alive),
                    // Busy: a call is running in it.
                    Err(_) => true,
                };
                (id.clone(), running)
            })
            .collect()
    }

    /// Before the session `starting` (of tenant `owner`) starts an interpreter: stop idle
    /// ones until one more stays within `max_interpreters`, chosen by [`to_stop`]: the least
    /// recently used of the tenant running the most, so one tenant's sessions make room among
    /// themselves before they touch another tenant's (whose variables would be lost). A busy
    /// session (a call or an install holds it) is counted but never stopped; the run slots
    /// bound those.
    pub(super) async fn make_room(&self, starting: &str, owner: &str) {
        let max = self.settings.max_interpreters.max(1);
        let slots: Vec<(String, Arc<Slot>)> = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(id, _)| id.as_str() != starting)
            .map(|(id, slot)| (id.clone(), Arc::clone(slot)))
            .collect();
        let mut running = Vec::new();
        for (id, slot) in slots {
            let idle = match slot.state.try_lock() {
                Ok(mut state) => {
                    if !state
                        .interpreter
                        .as_mut()
                        .is_some_and(LiveSandbox::is_alive)
                    {
                        continue;
                    }
                    true
                }
                Err(_) => false,
            };
            running.push(Running {
                owner: slot.owner.clone(),
                last_used: slot.last_used.load(Ordering::Relaxed),
                idle,
                session: (id, slot),
            });
        }
        for n in to_stop(&running, owner, max) {
            let (id, slot) = &running[n].session;
            if let Ok(mut state) = slot.state.try_lock() {
                state
                    .stop(&format!(
                        "its interpreter was stopped to make room for another session's (at most {max} run at once; an idle one of the tenant running the most is stopped, the least recently used first)"
                    ))
                    .await;
                tracing::info!(session = %id, "stopped an idle interpreter to make room");
            }
        }
    }

    pub(super) fn forget(&self, id: &str) {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id);
    }

    /// A note for a call's result when `owner`'s share of the sessions' disk is full after
    /// it.
    pub(super) fn disk_note(&self, owner: &str) -> Option<String> {
        let (_, free) = self.disk.usage(owner)?;
        (free < 1 << 20).then(|| {
            format!(
                "your share of the sessions' disk is full ({}, --tenant-sessions-max-disk, enforced while calls run; other tenants have shares of their own): writes fail with ENOSPC (No space left on device); delete files (run_command with `rm`) or sessions",
                crate::ids::human_bytes(self.disk.share_of(owner))
            )
        })
    }

    /// What `owner`'s sessions use of its share: measured in its image when the kernel
    /// bounds it, else as last measured after each call.
    pub(super) fn tenant_used(&self, owner: &str) -> u64 {
        self.disk.usage(owner).map_or_else(
            || self.store.owned_bytes(owner).unwrap_or(0),
            |(used, _)| used,
        )
    }

    /// Between calls: refuse a call of `owner` when its sessions use its whole share, or all
    /// sessions the whole disk (what holds without a kernel bound; with one, a full share
    /// refuses writes by itself).
    pub(super) fn check_disk(&self, owner: &str) -> Result<(), EngineError> {
        let mine = self.store.owned_bytes(owner).map_err(db_error)?;
        let share = self.disk.share_of(owner);
        if mine >= share {
            return Err(EngineError::new(
                ErrorKind::Quota,
                format!(
                    "Your sessions use {} of disk, at or over your share of {} (--tenant-sessions-max-disk)",
                    crate::ids::human_bytes(mine),
                    crate::ids::human_bytes(share)
                ),
            )
            .with_hint(
                "delete files (run_command with `rm`) or whole sessions (delete_session); the operator can raise --tenant-sessions-max-disk",
            ));
        }
        let used = self.store.total_bytes().map_err(db_error)?;
        if used >= self.settings.max_disk_bytes {
            return Err(EngineError {
                kind: ErrorKind::Quota,
                message: format!(
                    "Sessions use {} of disk, at or over their limit of {}",
                    crate::ids::human_bytes(used),
                    crate::ids::human_bytes(self.settings.max_disk_bytes)
                ),
                hint: Some(
                    "delete files (run_command with `rm`) or whole sessions (delete_session); the operator can raise --sessions-max-disk".into(),
                ),
            });
        }
        Ok(())
    }

    /// Give `owner`'s share of the disk back when it has no session left and none is being
    /// created (see [`SessionDisk::release`]).
    pub(super) async fn release_share_if_unused(self: &Arc<Self>, owner: &str) {
        let manager = Arc::clone(self);
        let owner = owner.to_owned();
        let _ = tokio::task::spawn_blocking(move || {
            // Decided under the shares' lock, which a create takes (after counting itself in
            // `creating`) to get the share it writes in.
            manager.disk.release(&manager.store, &owner, || {
                manager
                    .creating
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(&owner)
                    .is_none_or(|count| *count == 0)
            });
        })
        .await;
    }

    /// After a call: measure the workspace again (the call may have written to it) and record
    /// the session's last use, its size and (`ran_cell`) one more cell, in one write.
    /// The measure is host work for `caller` (a walk of the workspace).
    pub(super) async fn used(
        self: &Arc<Self>,
        calls: &crate::lifecycle::Calls,
        caller: &Caller,
        id: &str,
        ran_cell: bool,
    ) {
        let manager = Arc::clone(self);
        let id = id.to_owned();
        let _ = calls
            .on_host(caller, "measure the session's files", move || {
                manager.measure(&id, ran_cell);
            })
            .await;
    }

    /// [`Manager::used`], blocking: for a caller already on a blocking thread.
    pub(super) fn measure(&self, id: &str, ran_cell: bool) {
        let Ok(Some(row)) = self.store.get(id) else {
            return;
        };
        let Ok(paths) = self.paths(&row) else {
            return;
        };
        let (bytes, partial) = files::tree_bytes(&paths.work);
        if let Some(note) = partial {
            tracing::warn!(session = %id, "{note}");
        }
        let _ = self.store.touch_measured(id, now_secs(), ran_cell, bytes);
    }
}
impl SessionService {
    pub(super) fn session_manager(&self) -> Result<&Arc<Manager>, EngineError> {
        self.sessions.inner.as_ref().map_err(unavailable)
    }

    pub(super) fn session_sandbox(&self) -> Result<&Arc<Sandbox>, EngineError> {
        self.sandbox.as_ref().map_err(unavailable)
    }

    /// The interpreter a session was made with (it must still exist on this host).
    pub(super) fn session_interpreter(&self, row: &SessionRow) -> Result<Interpreter, EngineError> {
        self.planner.interpreters()
            .all()
            .iter()
            .find(|i| i.executable.as_os_str() == row.interpreter.as_str())
            .cloned()
            .ok_or_else(|| EngineError {
                kind: ErrorKind::Unavailable,
                message: format!(
                    "The interpreter of session `{}` (`{}`, Python {}) is no longer available on this host",
                    row.id, row.interpreter, row.python_version
                ),
                hint: Some(
                    "reinstall that Python, or delete the session and create a new one".into(),
                ),
            })
    }

    /// Create a session: a workspace, a venv with `dependencies`, and (on first use) a live
    /// interpreter.
    ///
    /// # Errors
    /// Invalid arguments, caps reached, no interpreter, a failed install.
    pub(crate) async fn create_session(
        &self,
        caller: &Caller,
        request: CreateSession,
    ) -> Result<SessionInfo, EngineError> {
        self.calls.refuse_if_stopping()?;
        let manager = self.session_manager()?;
        self.session_sandbox()?;
        if let Some(name) = &request.name
            && (name.len() > 200 || name.chars().any(char::is_control))
        {
            return Err(EngineError {
                kind: ErrorKind::Invalid,
                message:
                    "The session name must be at most 200 characters, without control characters"
                        .into(),
                hint: Some("use a short label such as \"sales-analysis\"".into()),
            });
        }
        // A session is held to its whole profile: network, packages and tenants here; its
        // limits, subprocesses, read-only /work and imports by its interpreter's sandbox
        // (see `start_interpreter`). Its network is the one-shot rule's: the profile's unless
        // the caller declines or narrows it; fixed for the session's life.
        let tenant = self.calls.tenant(caller);
        let parsed: Vec<pep508_rs::Requirement> = request
            .dependencies
            .iter()
            .filter_map(|spec| spec.parse().ok())
            .collect();
        let policy = crate::policy::CallPolicy::decide(
            &self.config,
            crate::policy::CallKind::SessionStart,
            &tenant,
            &crate::policy::Asked {
                profile: request.profile.as_deref(),
                network: request.network,
                allowed_domains: &request.allowed_domains,
                requirements: &parsed,
                ..crate::policy::Asked::default()
            },
        )
        .map_err(|refusal| refusal.error)?;
        let network = policy.network.is_some();
        let network_names = match policy.network {
            Some(snakebox_sandbox::Names::Only(list)) if !request.allowed_domains.is_empty() => {
                list
            }
            _ => Vec::new(),
        };
        let reservation = manager.reserve_create(caller, tenant.max_sessions)?;
        manager.check_disk(caller.id())?;
        let requirements = Self::parse_requirements(&request.dependencies)?;
        self.planner
            .provide_python(request.python_version.as_deref(), None)
            .await?;
        let interpreter = self
            .planner
            .pick_interpreter(request.python_version.as_deref(), None)?;
        let id = new_session_id();
        // The tenant's share of the disk: made and reserved with its first session.
        let share = {
            let manager = Arc::clone(manager);
            let owner = caller.id().to_owned();
            super::blocking("open your share of the sessions' disk", move || {
                manager.disk.acquire(&manager.store, &owner)
            })
            .await
            .and_then(|acquired| acquired)
        };
        let built = match share {
            Ok(share) => {
                let paths = SessionPaths::under(share.join(&id));
                match self
                    .build_session(caller, &paths, &interpreter, &requirements)
                    .await
                {
                    Ok(built) => Ok((built, paths)),
                    Err(err) => {
                        let _ = crate::tree::remove(&paths.root);
                        Err(err)
                    }
                }
            }
            Err(err) => Err(err),
        };
        let ((packages, venv_bytes), paths) = match built {
            Ok(built) => built,
            Err(err) => {
                // A share made for this session alone is given back.
                drop(reservation);
                manager.release_share_if_unused(caller.id()).await;
                return Err(err);
            }
        };
        let now = now_secs();
        let row = SessionRow {
            id: id.clone(),
            name: request.name,
            interpreter: interpreter.executable.display().to_string(),
            python_version: interpreter.version.to_string(),
            base_requirements: requirements.clone(),
            requirements,
            packages: packages
                .iter()
                .map(|p| (p.name.clone(), p.version.clone()))
                .collect(),
            venv_bytes,
            work_bytes: 0,
            created_at: now,
            last_used_at: now,
            executions: 0,
            network,
            network_names,
            owner: caller.id().to_owned(),
            profile: Some(policy.profile.clone()),
        };
        if let Err(err) = manager.store.insert(&row) {
            let _ = crate::tree::remove(&paths.root);
            drop(reservation);
            manager.release_share_if_unused(caller.id()).await;
            return Err(db_error(err));
        }
        drop(reservation);
        tracing::info!(session = %id, python = %row.python_version, "session created");
        Ok(self.session_info(manager, &row, false))
    }

    pub(super) fn session_info(
        &self,
        _manager: &Manager,
        row: &SessionRow,
        running: bool,
    ) -> SessionInfo {
        SessionInfo {
            session_id: row.id.clone(),
            name: row.name.clone(),
            python_version: row.python_version.clone(),
            created_at: row.created_at,
            last_used_at: row.last_used_at,
            requested_packages: row.requirements.clone(),
            packages: packages_of(row),
            size_bytes: row.venv_bytes + row.work_bytes,
            interpreter_running: running,
            network: self.session_network(row),
            allowed_domains: row.network_names.clone(),
            executions: row.executions,
            profile: row.profile_name(),
        }
    }

    /// Whether a session's code has network now (see [`crate::policy::session_has_network`]).
    pub(super) fn session_network(&self, row: &SessionRow) -> bool {
        crate::policy::session_has_network(&self.config, &super::interpreter::session_facts(row))
    }

    /// The names a session's code may reach now (see [`crate::policy::session_names`]).
    pub(super) fn session_names(&self, row: &SessionRow) -> Option<snakebox_sandbox::Names> {
        crate::policy::session_names(&self.config, &super::interpreter::session_facts(row))
    }

    /// Every session.
    ///
    /// # Errors
    /// When sessions are unavailable.
    pub(crate) async fn list_sessions(&self, caller: &Caller) -> Result<SessionList, EngineError> {
        let manager = self.session_manager()?;
        let mut rows = manager.store.list().map_err(db_error)?;
        rows.retain(|row| caller.owns(&row.owner));
        let running = manager.running();
        let sessions = rows
            .iter()
            .map(|row| self.session_info(manager, row, running.get(&row.id) == Some(&true)))
            .collect();
        Ok(SessionList {
            sessions,
            max_sessions: manager.settings.max_sessions,
            max_disk_bytes: manager.settings.max_disk_bytes,
            used_disk_bytes: manager.store.total_bytes().map_err(db_error)?,
            tenant_max_disk_bytes: manager.disk.share_of(caller.id()),
            tenant_used_disk_bytes: manager.tenant_used(caller.id()),
            idle_stop_seconds: manager.settings.idle_stop.as_secs(),
            idle_delete_seconds: manager.settings.idle_delete.as_secs(),
        })
    }

    /// Delete a session: its interpreter (a running call ends now), files and packages.
    ///
    /// # Errors
    /// No such session.
    pub(crate) async fn delete_session(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(), EngineError> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, id)?;
        delete(manager, &row.id).await
    }

    /// Reset a session to the state it was created in: a new interpreter, an empty workspace,
    /// only the packages given at creation. The id stays.
    ///
    /// # Errors
    /// No such session, a failed install.
    pub(crate) async fn reset_session(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<SessionInfo, EngineError> {
        let manager = self.session_manager()?;
        let row = manager.row(caller, id)?;
        let interpreter = self.session_interpreter(&row)?;
        let slot = manager.slot(&row);
        replace_doomed(&slot);
        let mut state = slot.state.lock().await;
        state.stop("the session was reset").await;
        state.lost = None;
        state.cells = 0;
        state.known_files = None;
        let paths = manager.paths(&row)?;
        let dirs = [paths.work.clone(), paths.env.clone(), paths.tmp.clone()];
        super::blocking_io("clear the session's files", move || {
            dirs.iter().try_for_each(|dir| crate::tree::remove(dir))
        })
        .await?;
        let (packages, venv_bytes) = self
            .build_session(caller, &paths, &interpreter, &row.base_requirements)
            .await?;
        let now = now_secs();
        manager.store.reset(&row.id, now).map_err(db_error)?;
        let packages: Vec<(String, String)> = packages
            .iter()
            .map(|p| (p.name.clone(), p.version.clone()))
            .collect();
        manager
            .store
            .set_packages(&row.id, &row.base_requirements, &packages, venv_bytes)
            .map_err(db_error)?;
        drop(state);
        let row = manager.row(caller, id)?;
        Ok(self.session_info(manager, &row, false))
    }
}

/// Remove session directories that have no record: a server killed while it was creating a
/// session leaves one, which nothing would list, count or ever remove (issue 12). Only when
/// no other server uses the data directory: one may be creating a session right now.
fn sweep_orphans(root: &Path, disk: &SessionDisk, store: &Store) {
    for dir in std::iter::once(root.to_path_buf()).chain(disk.dirs()) {
        let Ok(entries) = fs_err::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            if !is_dir || !id.starts_with("s-") || !super::valid_id(id) {
                continue;
            }
            if let Ok(None) = store.get(id) {
                tracing::warn!(session = %id, "removing the files of a session that was never recorded (its server stopped while creating it)");
                if let Err(err) = crate::tree::remove(&entry.path()) {
                    tracing::warn!(session = %id, %err, "could not remove an unrecorded session's files");
                }
            }
        }
    }
}

pub(super) fn replace_doomed(slot: &Slot) {
    let mut doomed = slot
        .doomed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    doomed.cancel();
    *doomed = CancellationToken::new();
}
/// Delete a session: running calls end, the interpreter stops, files and record go.
pub(super) async fn delete(manager: &Arc<Manager>, id: &str) -> Result<(), EngineError> {
    let row = manager.any_row(id)?;
    let slot = manager.slot(&row);
    replace_doomed(&slot);
    let mut state = slot.state.lock().await;
    state.stop("the session was deleted").await;
    state.deleted = true;
    manager.store.delete(id).map_err(db_error)?;
    manager.forget(id);
    // A share that cannot be reached keeps the files (its image is not touched); the record
    // is gone, and the orphans' sweep removes them once the share opens again.
    let root = manager.paths(&row).map(|paths| paths.root);
    drop(state);
    if let Ok(root) = root {
        super::blocking_io("delete the session's files", move || {
            crate::tree::remove(&root)
        })
        .await?;
    }
    manager.release_share_if_unused(&row.owner).await;
    tracing::info!(session = %id, "session deleted");
    Ok(())
}
/// Stop idle interpreters and delete sessions unused for too long, until the manager goes.
pub(super) async fn reap_loop(manager: Weak<Manager>) {
    let period = match manager.upgrade() {
        Some(m) => {
            (m.settings.idle_stop / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
        }
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(manager) = manager.upgrade() else {
            return;
        };
        reap(&manager).await;
    }
}
pub(super) async fn reap(manager: &Arc<Manager>) {
    let now = now_secs();
    let slots: Vec<(String, Arc<Slot>)> = manager
        .slots
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(id, slot)| (id.clone(), Arc::clone(slot)))
        .collect();
    let idle_stop = manager.settings.idle_stop.as_secs();
    for (id, slot) in slots {
        let idle = now.saturating_sub(slot.last_used.load(Ordering::Relaxed));
        if idle < idle_stop {
            continue;
        }
        // A busy session is not idle; try again next time.
        if let Ok(mut state) = slot.state.try_lock()
            && state.interpreter.is_some()
        {
            state
                .stop(&format!(
                    "its interpreter was idle for more than {idle_stop} s and was stopped"
                ))
                .await;
            tracing::info!(session = %id, "stopped an idle interpreter");
        }
    }
    let idle_delete = manager.settings.idle_delete.as_secs();
    let Ok(rows) = manager.store.list() else {
        return;
    };
    for row in rows {
        if now.saturating_sub(row.last_used_at) < idle_delete {
            continue;
        }
        let busy = manager
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&row.id)
            .is_some_and(|slot| {
                slot.installing.load(Ordering::SeqCst) || slot.state.try_lock().is_err()
            });
        if !busy {
            match delete(manager, &row.id).await {
                Ok(()) => tracing::info!(session = %row.id, "deleted an unused session"),
                Err(err) => {
                    tracing::warn!(session = %row.id, error = %err.message, "could not delete an unused session")
                }
            }
        }
    }
}

/// A session's running interpreter, as [`SessionManager::make_room`] weighs it.
struct Running<T> {
    owner: String,
    last_used: u64,
    /// Whether it may be stopped: no call or install holds the session.
    idle: bool,
    session: T,
}

/// Which of `running` to stop (indices, in order) so that tenant `starter` may start one more
/// interpreter within `max`: each time, an idle one of the tenant running the most (the
/// starter winning a tie, so a tenant at its fair part replaces its own), the least recently
/// used of them first. Another tenant's is stopped only while that tenant runs more than the
/// starter: a tenant never loses one to a tenant running as many or more. When none may be
/// stopped (the starter's own are busy) the new one starts past `max`, as when all are busy:
/// the run slots bound those.
fn to_stop<T>(running: &[Running<T>], starter: &str, max: usize) -> Vec<usize> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for r in running {
        *counts.entry(r.owner.as_str()).or_default() += 1;
    }
    let mut total = running.len();
    let mut stopped: Vec<usize> = Vec::new();
    while total >= max {
        let victim = running
            .iter()
            .enumerate()
            .filter(|(n, r)| {
                let count = |owner: &str| counts.get(owner).copied().unwrap_or(0);
                r.idle
                    && !stopped.contains(n)
                    && (r.owner == starter || count(&r.owner) > count(starter))
            })
            .max_by_key(|(_, r)| {
                (
                    counts.get(r.owner.as_str()).copied().unwrap_or(0),
                    r.owner == starter,
                    std::cmp::Reverse(r.last_used),
                )
            });
        let Some((n, r)) = victim else { break };
        stopped.push(n);
        if let Some(count) = counts.get_mut(r.owner.as_str()) {
            *count -= 1;
        }
        total -= 1;
    }
    stopped
}

#[cfg(test)]
mod tests {
    use super::{Running, to_stop};

    fn running(list: &[(&str, u64, bool)]) -> Vec<Running<()>> {
        list.iter()
            .map(|&(owner, last_used, idle)| Running {
                owner: owner.into(),
                last_used,
                idle,
                session: (),
            })
            .collect()
    }

    #[test]
    fn a_tenant_running_the_most_makes_room_from_its_own_least_recently_used() {
        // The quiet tenant's interpreter is the least recently used of all, yet the noisy
        // tenant, running three, replaces its own oldest.
        let r = running(&[
            ("quiet", 1, true),
            ("noisy", 5, true),
            ("noisy", 3, true),
            ("noisy", 9, true),
        ]);
        assert_eq!(to_stop(&r, "noisy", 4), vec![2]);
        // The quiet tenant starting a second one takes the noisy tenant's oldest too.
        assert_eq!(to_stop(&r, "quiet", 4), vec![2]);
    }

    #[test]
    fn at_equal_counts_the_starter_replaces_its_own() {
        let r = running(&[
            ("a", 1, true),
            ("a", 2, true),
            ("b", 3, true),
            ("b", 4, true),
        ]);
        assert_eq!(to_stop(&r, "b", 4), vec![2]);
        assert_eq!(to_stop(&r, "a", 4), vec![0]);
    }

    #[test]
    fn busy_interpreters_count_but_are_never_stopped() {
        // The noisy tenant's are all busy: the quiet tenant's idle one is not taken for it
        // (it runs fewer); the noisy one starts past the limit, bounded by the run slots.
        let r = running(&[("quiet", 1, true), ("noisy", 5, false), ("noisy", 3, false)]);
        assert!(to_stop(&r, "noisy", 3).is_empty());
        // The quiet tenant's own idle one makes room for its next.
        assert_eq!(to_stop(&r, "quiet", 3), vec![0]);
        let all_busy = running(&[("noisy", 5, false), ("noisy", 3, false)]);
        assert!(to_stop(&all_busy, "noisy", 2).is_empty());
    }

    #[test]
    fn within_the_limit_nothing_is_stopped_and_past_it_enough_are() {
        let r = running(&[("a", 1, true), ("b", 2, true)]);
        assert!(to_stop(&r, "a", 3).is_empty());
        // A tenant running none may take from those running more than it.
        assert_eq!(to_stop(&r, "c", 2), vec![0]);
        // A lowered limit: every idle one of a tenant running more than the starter goes.
        assert_eq!(to_stop(&r, "c", 1).len(), 2);
    }
}
