//! The front's `kubernetes` directory (`snakebox serve --directory kubernetes`): the Kubernetes
//! API, through agent-sandbox's claims, says which agent holds what.
//!
//! - A new session gets a `SandboxClaim` of its own, from the warm pool of its (profile ×
//!   Python) template. The front waits until the claim is Ready, makes the session on the
//!   agent at the pod IP its status reports, then labels the claim with the session. The
//!   claim is deleted when the session is; `lifecycle.shutdownTime` is the hard cap, after
//!   which agent-sandbox's controller deletes it.
//! - One-shot runs of a tenant go to its runner claim (one per tenant, named after it), made
//!   on the first run and deleted after an idle time ([`KubernetesSettings::runner_idle_ttl`])
//!   with no run from any front (each front marks the claim used, at most every quarter of
//!   that time).
//! - The front holds no state of its own: a cache of snakebox's claims in the namespace, kept
//!   by one list and then one watch (re-watched from the last version when a watch ends,
//!   listed again when the API answers `410 Gone`), and rebuilt the same way after a restart.
//!   A session another front made a moment ago and this one has not seen yet is looked up by
//!   its label before it is called unknown.
//! - Failures are loud: a claim not Ready in time is deleted and reported with what its status
//!   said and where to look; a session whose claim was deleted (its hard cap) or whose pod
//!   changed address answers `session_lost`.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, Client, Config, ResourceExt};
use snakebox_engine::{Caller, CreateSession, EngineError, EngineHost, ErrorKind};
use snakebox_wire::{Directory, FrontKey, Placement, RemoteEngine, lost_session};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::SandboxClaim;
use crate::generate::{self, KIND_RUNNER, KIND_SESSION};
use crate::names::{
    self, ANNOTATION_AGENT, ANNOTATION_LAST_USED, ANNOTATION_SESSION, ANNOTATION_TENANT,
    LABEL_KIND, LABEL_MANAGED_BY, LABEL_SESSION, MANAGED_BY,
};

/// How a front uses the Kubernetes API (`[front]` and `serve --directory kubernetes`).
#[derive(Debug, Clone)]
pub struct KubernetesSettings {
    /// The namespace of the claims and warm pools; `None`: the kubeconfig's (or the pod's own).
    pub namespace: Option<String>,
    /// The port the agents listen on in their pods (the templates' `--listen`).
    pub agent_port: u16,
    /// How long a claim may take to become Ready before the call that needs it fails.
    pub ready_timeout: Duration,
    /// A tenant's runner claim is deleted after this long without a one-shot run.
    pub runner_idle_ttl: Duration,
    /// Every claim's `lifecycle.shutdownTime`: its hard cap, from its creation.
    pub max_claim_age: Duration,
    /// The engine profile of a session that names none, and of runner claims.
    pub default_profile: String,
    /// The Python version of a session that names none, and of runner claims.
    pub default_python: String,
}

impl KubernetesSettings {
    /// The defaults: port 8700, Ready within 60 s, runners idle 15 min, claims at most 24 h.
    #[must_use]
    pub fn new(default_profile: &str, default_python: &str) -> KubernetesSettings {
        KubernetesSettings {
            namespace: None,
            agent_port: 8700,
            ready_timeout: Duration::from_secs(60),
            runner_idle_ttl: Duration::from_secs(15 * 60),
            max_claim_age: Duration::from_secs(24 * 60 * 60),
            default_profile: default_profile.into(),
            default_python: default_python.into(),
        }
    }
}

/// How long a watch asks the API server to keep it open.
const WATCH_SECONDS: u32 = 290;
/// The longest wait between two tries to reach the API.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Sessions remembered as lost (their claim deleted by someone else) at most.
const MAX_LOST: usize = 10_000;

/// The directory of a front on Kubernetes. Made by [`KubernetesDirectory::connect`]; its
/// watch runs until [`KubernetesDirectory::stop`] (or the last handle is dropped).
pub struct KubernetesDirectory {
    api: Api<SandboxClaim>,
    namespace: String,
    cluster: String,
    settings: KubernetesSettings,
    key: Arc<FrontKey>,
    host: Arc<dyn EngineHost>,
    state: Mutex<State>,
    /// Bumped on every change to the cache.
    changed: watch::Sender<u64>,
    stop: CancellationToken,
    /// This directory, for the tasks it starts.
    me: std::sync::Weak<KubernetesDirectory>,
}

/// The cache: snakebox's claims as the watch last said, and what is derived from them.
#[derive(Default)]
struct State {
    /// The agents' port, to know a claim's agent by its address.
    agent_port: u16,
    claims: HashMap<String, SandboxClaim>,
    /// Session id → its claim's name.
    sessions: HashMap<String, String>,
    /// One client per agent address, kept while a claim names it.
    agents: HashMap<String, Arc<RemoteEngine>>,
    /// Sessions whose claim went away without this front deleting it: their tenant, and why.
    lost: HashMap<String, (String, String)>,
    /// Claims this front is deleting (their going is no loss).
    deleting: HashSet<String>,
    /// Claims this front made and has not bound or given up yet.
    pending: HashSet<String>,
    /// When this front last used a claim, and last said so on the claim.
    used: HashMap<String, (Instant, Option<Instant>)>,
    /// The first list has been read.
    synced: bool,
    /// What went wrong last when listing or watching, with its hint; `None` once it works.
    problem: Option<String>,
    lists: u64,
    watches: u64,
}

/// Whether `incoming` is at least as new as `known`. Resource versions are opaque to clients
/// in general; every API server in use makes them etcd revisions, integers that grow, so two
/// that parse are compared and anything else counts as newer. It matters for the answers to a
/// create or a patch, which can arrive after the watch has already delivered a later change.
fn not_older(incoming: &SandboxClaim, known: &SandboxClaim) -> bool {
    let version = |claim: &SandboxClaim| {
        claim
            .metadata
            .resource_version
            .as_deref()
            .and_then(|version| version.parse::<u64>().ok())
    };
    match (version(incoming), version(known)) {
        (Some(incoming), Some(known)) => incoming >= known,
        _ => true,
    }
}

impl State {
    fn insert(&mut self, claim: SandboxClaim) {
        let name = claim.name_any();
        if let Some(known) = self.claims.get(&name)
            && !not_older(&claim, known)
        {
            return;
        }
        if let Some(session) = session_of(&claim) {
            self.sessions.insert(session.to_owned(), name.clone());
            self.lost.remove(session);
        }
        self.claims.insert(name, claim);
    }

    fn remove(&mut self, name: &str) {
        let Some(claim) = self.claims.remove(name) else {
            return;
        };
        let ours = self.deleting.remove(name);
        // The agent's client goes with the last claim naming its address.
        if let Some(ip) = claim.pod_ips().first() {
            let url = format!("http://{}", SocketAddr::new(*ip, self.agent_port));
            let named = self
                .claims
                .values()
                .any(|other| other.pod_ips().first() == Some(ip));
            if !named {
                self.agents.remove(&url);
            }
        }
        self.pending.remove(name);
        self.used.remove(name);
        if let Some(session) = session_of(&claim) {
            self.sessions.remove(session);
            if !ours {
                if self.lost.len() >= MAX_LOST {
                    self.lost.clear();
                }
                self.lost.insert(
                    session.to_owned(),
                    (
                        tenant_of(&claim).unwrap_or_default().to_owned(),
                        format!(
                            "its sandbox claim `{name}` was deleted (its lifecycle.shutdownTime passed, or it was deleted by hand)"
                        ),
                    ),
                );
            }
        }
    }

    /// Replace the whole cache with a fresh list: what is gone from it is removed as if
    /// deleted.
    fn replace(&mut self, claims: Vec<SandboxClaim>) {
        let fresh: HashSet<String> = claims.iter().map(ResourceExt::name_any).collect();
        let gone: Vec<String> = self
            .claims
            .keys()
            .filter(|name| !fresh.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
        for claim in claims {
            self.insert(claim);
        }
    }
}

fn session_of(claim: &SandboxClaim) -> Option<&str> {
    claim
        .annotations()
        .get(ANNOTATION_SESSION)
        .map(String::as_str)
}

fn tenant_of(claim: &SandboxClaim) -> Option<&str> {
    claim
        .annotations()
        .get(ANNOTATION_TENANT)
        .map(String::as_str)
}

fn kind_of(claim: &SandboxClaim) -> Option<&str> {
    claim.labels().get(LABEL_KIND).map(String::as_str)
}

/// A claim's readiness in words, for an error: its Ready condition's reason and message.
fn claim_status(claim: Option<&SandboxClaim>) -> String {
    let Some(claim) = claim else {
        return "the front has not seen the claim in the API's answers".into();
    };
    match claim.ready_condition() {
        None => "no Ready condition yet (the controller has not acted on it)".into(),
        Some(ready) if ready.status == "True" => "Ready, but its status names no pod IP".into(),
        Some(ready) => format!(
            "Ready is {} ({}: {})",
            ready.status, ready.reason, ready.message
        ),
    }
}

/// A random id for a claim made before its session exists.
fn reservation() -> String {
    let mut bytes = [0_u8; 8];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl KubernetesDirectory {
    /// Connect to the cluster (the kubeconfig in `KUBECONFIG` or `~/.kube/config`, else the
    /// pod's service account) and start the watch of snakebox's claims. Does not wait for the
    /// API to answer: until it does, the front is not ready and says why.
    ///
    /// # Errors
    /// When there is no configuration to reach a cluster with.
    pub async fn connect(
        settings: KubernetesSettings,
        key: Arc<FrontKey>,
        host: Arc<dyn EngineHost>,
    ) -> Result<Arc<KubernetesDirectory>, EngineError> {
        let config = Config::infer().await.map_err(|err| {
            EngineError::invalid(
                format!("Could not find how to reach a Kubernetes cluster: {err}"),
                "run the front in a pod with a service account, or set KUBECONFIG to a kubeconfig file (for a front outside the cluster)",
            )
        })?;
        let cluster = config.cluster_url.to_string();
        let namespace = settings
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(|err| {
            EngineError::invalid(
                format!("Could not make a Kubernetes client for `{cluster}`: {err}"),
                "check the kubeconfig's cluster address and certificates",
            )
        })?;
        let api = Api::namespaced(client, &namespace);
        let (changed, _) = watch::channel(0);
        let directory = Arc::new_cyclic(|me| KubernetesDirectory {
            api,
            namespace,
            cluster,
            key,
            host,
            state: Mutex::new(State {
                agent_port: settings.agent_port,
                ..State::default()
            }),
            changed,
            stop: CancellationToken::new(),
            settings,
            me: me.clone(),
        });
        tracing::info!(
            cluster = %directory.cluster,
            namespace = %directory.namespace,
            "the directory is the Kubernetes API (agent-sandbox claims)"
        );
        tokio::spawn(Self::reflect(Arc::downgrade(&directory)));
        tokio::spawn(Self::reap(Arc::downgrade(&directory)));
        // A moment for the first list, so that a front is ready as it starts when the API
        // answers; one that does not is said by readiness, not waited for.
        let first = directory.settings.ready_timeout.min(Duration::from_secs(5));
        if tokio::time::timeout(first, directory.synced())
            .await
            .is_err()
        {
            tracing::warn!(cluster = %directory.cluster, "the Kubernetes API has not answered yet");
        }
        Ok(directory)
    }

    /// The namespace the claims are in.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Stop the watch and the reaper.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn selector() -> String {
        format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
    }

    /// The watch of snakebox's claims: list, then watch from the list's version; a watch that
    /// ends is opened again from the last version seen; `410 Gone` (that version is too old)
    /// lists again. Ends when the directory stops or is dropped.
    async fn reflect(this: std::sync::Weak<KubernetesDirectory>) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let Some(directory) = this.upgrade() else {
                return;
            };
            let stop = directory.stop.clone();
            let outcome = tokio::select! {
                () = stop.cancelled() => return,
                outcome = directory.list_and_watch() => outcome,
            };
            match outcome {
                Ok(()) => backoff = Duration::from_millis(200),
                Err(problem) => {
                    tracing::warn!(problem = %problem, "the watch of sandbox claims failed; trying again");
                    directory.state().problem = Some(problem);
                    directory.bump();
                    drop(directory);
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// One list and the watches after it. `Ok` when a relist is due (`410 Gone`); `Err` with
    /// what went wrong otherwise.
    async fn list_and_watch(&self) -> Result<(), String> {
        let list = self
            .api
            .list(&ListParams::default().labels(&Self::selector()))
            .await
            .map_err(|err| self.api_problem("list", &err))?;
        let mut version = list.metadata.resource_version.clone().unwrap_or_default();
        {
            let mut state = self.state();
            state.replace(list.items);
            state.synced = true;
            state.problem = None;
            state.lists += 1;
            tracing::debug!(claims = state.claims.len(), %version, "listed sandbox claims");
        }
        self.bump();
        loop {
            let params = WatchParams::default()
                .labels(&Self::selector())
                .timeout(WATCH_SECONDS)
                .disable_bookmarks();
            let stream = self
                .api
                .watch(&params, &version)
                .await
                .map_err(|err| self.api_problem("watch", &err))?;
            self.state().watches += 1;
            let mut stream = std::pin::pin!(stream);
            loop {
                let event = match stream.try_next().await {
                    Ok(Some(event)) => event,
                    // The server ended the watch (its timeout, a restart): watch again from
                    // the last version seen.
                    Ok(None) => break,
                    Err(err) => {
                        tracing::debug!(%err, "a watch of sandbox claims broke off; watching again");
                        break;
                    }
                };
                match event {
                    WatchEvent::Added(claim) | WatchEvent::Modified(claim) => {
                        version = claim.resource_version().unwrap_or(version);
                        self.state().insert(claim);
                    }
                    WatchEvent::Deleted(claim) => {
                        version = claim.resource_version().unwrap_or(version);
                        self.state().remove(&claim.name_any());
                    }
                    WatchEvent::Bookmark(bookmark) => {
                        version = bookmark.metadata.resource_version;
                    }
                    WatchEvent::Error(status) if status.code == 410 => {
                        tracing::info!(
                            message = %status.message,
                            "the watch's version is too old (410 Gone); listing again"
                        );
                        return Ok(());
                    }
                    WatchEvent::Error(status) => {
                        return Err(format!(
                            "The watch of sandbox claims in `{}` failed ({}): {}\nhint: check the front's permissions (watch on sandboxclaims)",
                            self.namespace, status.code, status.message
                        ));
                    }
                }
                self.bump();
            }
        }
    }

    /// A Kubernetes error as one line and a hint.
    fn api_problem(&self, action: &str, err: &kube::Error) -> String {
        let error = self.api_error(action, err);
        match error.hint {
            Some(hint) => format!("{}\nhint: {hint}", error.message),
            None => error.message,
        }
    }

    /// A Kubernetes error as the engine's, with what to do.
    fn api_error(&self, action: &str, err: &kube::Error) -> EngineError {
        let namespace = &self.namespace;
        match err {
            kube::Error::Api(status) if status.code == 403 => EngineError::new(
                ErrorKind::Unavailable,
                format!(
                    "The Kubernetes API refused to {action} sandbox claims in the namespace `{namespace}`: {}",
                    status.message
                ),
            )
            .with_hint(
                "give the front's service account the Role in deploy/kubernetes/front.yaml (get, list, watch, create, patch, delete on sandboxclaims), bound in this namespace",
            ),
            kube::Error::Api(status) if status.code == 404 && action != "delete" => {
                EngineError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "The Kubernetes API has no sandbox claims (`{}/{}`) to {action} in the namespace `{namespace}`: {}",
                        crate::EXTENSIONS_GROUP,
                        crate::VERSION,
                        status.message
                    ),
                )
                .with_hint(
                    "install agent-sandbox with its extensions (v0.5, API v1beta1) in the cluster, and check --namespace",
                )
            }
            kube::Error::Api(status) => EngineError::new(
                ErrorKind::Unavailable,
                format!(
                    "The Kubernetes API refused to {action} a sandbox claim in the namespace `{namespace}` ({}): {}",
                    status.code, status.message
                ),
            )
            .with_hint("see the API server's message; `kubectl get sandboxclaims -n NAMESPACE -l app.kubernetes.io/managed-by=snakebox` shows snakebox's claims"),
            other => EngineError::new(
                ErrorKind::Unavailable,
                format!(
                    "Could not reach the Kubernetes API at `{}` to {action} sandbox claims: {other}",
                    self.cluster
                ),
            )
            .with_hint("check that the API server is up and that this front can reach it (its kubeconfig, or the pod's network policy)"),
        }
    }

    /// The client of the agent in `claim`'s pod, when the claim is Ready.
    fn agent_of(&self, state: &mut State, claim: &SandboxClaim) -> Option<Arc<RemoteEngine>> {
        if !claim.is_ready() {
            return None;
        }
        let ip: IpAddr = *claim.pod_ips().first()?;
        let port = self.settings.agent_port;
        let url = format!("http://{}", SocketAddr::new(ip, port));
        if let Some(agent) = state.agents.get(&url) {
            return Some(Arc::clone(agent));
        }
        let name = generate::agent_name(ip, port);
        match RemoteEngine::new(&name, &url, Arc::clone(&self.key), Arc::clone(&self.host)) {
            Ok(agent) => {
                let agent = Arc::new(agent);
                state.agents.insert(url, Arc::clone(&agent));
                Some(agent)
            }
            Err(err) => {
                tracing::warn!(%url, %err, "a claim names an address the front cannot call");
                None
            }
        }
    }

    /// Wait until the claim `name` is Ready (as the watch says), at most the ready timeout.
    /// A claim that is not is deleted, and the error says what its status said last.
    async fn wait_ready(&self, name: &str, pool: &str) -> Result<Arc<RemoteEngine>, EngineError> {
        let mut changes = self.changed.subscribe();
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.settings.ready_timeout;
        loop {
            {
                let mut state = self.state();
                if let Some(claim) = state.claims.get(name).cloned()
                    && let Some(agent) = self.agent_of(&mut state, &claim)
                {
                    tracing::debug!(
                        claim = name,
                        ms = started.elapsed().as_millis(),
                        "claim Ready"
                    );
                    return Ok(agent);
                }
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = tokio::time::sleep_until(deadline) => break,
                () = self.stop.cancelled() => break,
            }
        }
        let (status, problem) = {
            let state = self.state();
            (claim_status(state.claims.get(name)), state.problem.clone())
        };
        self.delete_claim(name).await;
        let namespace = &self.namespace;
        let mut message = format!(
            "The sandbox claim `{name}` (namespace `{namespace}`, warm pool `{pool}`) was not Ready within {} s: {status}; the claim was deleted",
            self.settings.ready_timeout.as_secs()
        );
        if let Some(problem) = problem {
            message.push_str(&format!(" (the watch of claims: {problem})"));
        }
        Err(EngineError::new(ErrorKind::Unavailable, message).with_hint(format!(
            "the warm pool may be empty, missing or failing: `kubectl get sandboxwarmpool {pool} -n {namespace}` (READY), `kubectl get sandboxclaims -n {namespace} -l {LABEL_MANAGED_BY}={MANAGED_BY}`; more replicas, or a longer --claim-ready-timeout, help a pool that is only slow"
        )))
    }

    /// Create `claim`; one that exists already (another front made it) is fine.
    async fn create_claim(&self, claim: &SandboxClaim) -> Result<(), EngineError> {
        match self.api.create(&PostParams::default(), claim).await {
            Ok(made) => {
                self.state().insert(made);
                self.bump();
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(err) => Err(self.api_error("create", &err)),
        }
    }

    /// Delete the claim `name` (a claim already gone is fine).
    async fn delete_claim(&self, name: &str) {
        {
            let mut state = self.state();
            state.deleting.insert(name.to_owned());
            state.pending.remove(name);
        }
        match self.api.delete(name, &DeleteParams::background()).await {
            Ok(_) => tracing::debug!(claim = name, "deleted a sandbox claim"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                let problem = self.api_problem("delete", &err);
                tracing::warn!(claim = name, %problem, "could not delete a sandbox claim; its lifecycle.shutdownTime will end it");
            }
        }
        self.state().remove(name);
        self.bump();
    }

    /// Merge `patch` into the claim `name`.
    async fn patch_claim(&self, name: &str, patch: &serde_json::Value) -> Result<(), EngineError> {
        let patched = self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|err| self.api_error("patch", &err))?;
        self.state().insert(patched);
        self.bump();
        Ok(())
    }

    /// The hard cap of a claim made now.
    fn shutdown_at(&self) -> Timestamp {
        let age = SignedDuration::try_from(self.settings.max_claim_age)
            .unwrap_or(SignedDuration::from_hours(24));
        Timestamp::now()
            .checked_add(age)
            .unwrap_or_else(|_| Timestamp::now())
    }

    /// The name of the warm pool (and template) of a profile and a Python version.
    fn pool(&self, profile: Option<&str>, python: Option<&str>) -> String {
        names::template_name(
            profile.unwrap_or(&self.settings.default_profile),
            python.unwrap_or(&self.settings.default_python),
        )
    }

    /// Note a use of the claim `name`; say so on the claim (for the other fronts' reapers) at
    /// most every quarter of the idle TTL.
    fn mark_used(&self, name: &str) {
        let now = Instant::now();
        let due = {
            let mut state = self.state();
            let entry = state.used.entry(name.to_owned()).or_insert((now, None));
            entry.0 = now;
            let due = entry.1.is_none_or(|marked| {
                now.duration_since(marked) >= self.settings.runner_idle_ttl / 4
            });
            if due {
                entry.1 = Some(now);
            }
            due
        };
        if let (true, Some(this)) = (due, self.me.upgrade()) {
            let name = name.to_owned();
            tokio::spawn(async move {
                let patch = serde_json::json!({
                    "metadata": { "annotations": { ANNOTATION_LAST_USED: Timestamp::now().to_string() } }
                });
                if let Err(err) = this.patch_claim(&name, &patch).await {
                    tracing::debug!(claim = %name, %err, "could not mark a claim used");
                }
            });
        }
    }

    /// Every so often: delete runner claims idle past their TTL (by this front's uses and the
    /// `last-used` mark of every front), and session claims a front made but never bound
    /// (it stopped while making the session).
    async fn reap(this: std::sync::Weak<KubernetesDirectory>) {
        loop {
            let Some(directory) = this.upgrade() else {
                return;
            };
            let every = (directory.settings.runner_idle_ttl / 4)
                .clamp(Duration::from_millis(250), Duration::from_secs(30));
            let stop = directory.stop.clone();
            drop(directory);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let Some(directory) = this.upgrade() else {
                return;
            };
            for name in directory.idle_claims() {
                tracing::info!(claim = %name, "deleting an idle runner claim");
                directory.delete_claim(&name).await;
            }
        }
    }

    /// The claims the reaper deletes now.
    fn idle_claims(&self) -> Vec<String> {
        let now = Timestamp::now();
        let ttl = SignedDuration::try_from(self.settings.runner_idle_ttl).unwrap_or_default();
        let unbound_after = SignedDuration::try_from(self.settings.ready_timeout * 2)
            .unwrap_or_default()
            + SignedDuration::from_secs(60);
        let state = self.state();
        let mut idle = Vec::new();
        for (name, claim) in &state.claims {
            if state.deleting.contains(name) || state.pending.contains(name) {
                continue;
            }
            let created = claim
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|time| time.0);
            let older_than = |age: SignedDuration| {
                created.is_some_and(|created| now.duration_since(created) > age)
            };
            match kind_of(claim) {
                Some(KIND_RUNNER) => {
                    if let Some((used, _)) = state.used.get(name)
                        && used.elapsed() < self.settings.runner_idle_ttl
                    {
                        continue;
                    }
                    let marked = claim
                        .annotations()
                        .get(ANNOTATION_LAST_USED)
                        .and_then(|text| text.parse::<Timestamp>().ok())
                        .or(created);
                    if marked.is_some_and(|marked| now.duration_since(marked) > ttl) {
                        idle.push(name.clone());
                    }
                }
                Some(KIND_SESSION) if session_of(claim).is_none() && older_than(unbound_after) => {
                    idle.push(name.clone());
                }
                _ => {}
            }
        }
        idle
    }

    /// Wait for the first list (at most the ready timeout), so that a front that has just
    /// started does not call a session unknown that its claims hold.
    async fn synced(&self) -> Result<(), EngineError> {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + self.settings.ready_timeout;
        loop {
            let problem = {
                let state = self.state();
                if state.synced {
                    return Ok(());
                }
                state.problem.clone()
            };
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    let problem = problem.unwrap_or_else(|| "no answer".into());
                    return Err(EngineError::new(
                        ErrorKind::Unavailable,
                        format!("The front has not read the sandbox claims of `{}` yet: {problem}", self.namespace),
                    ).with_hint("check that the Kubernetes API answers (`/readyz` of the front says why not)"));
                }
            }
        }
        Err(
            EngineError::new(ErrorKind::Unavailable, "The front is stopping")
                .with_hint("call again in a moment"),
        )
    }

    /// A session's claim, fresh from the API by its label (a session another front made that
    /// this one's watch has not delivered yet).
    async fn look_up(&self, session_id: &str) -> Result<(), EngineError> {
        let selector = format!(
            "{},{LABEL_SESSION}={}",
            Self::selector(),
            names::session_label(session_id)
        );
        let list = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|err| self.api_error("list", &err))?;
        let mut state = self.state();
        for claim in list.items {
            if session_of(&claim) == Some(session_id) {
                state.insert(claim);
            }
        }
        Ok(())
    }

    /// How many times the claims were listed (the first list and each relist after `410
    /// Gone`) and watched; for tests and `/metrics`.
    #[must_use]
    pub fn counts(&self) -> (u64, u64) {
        let state = self.state();
        (state.lists, state.watches)
    }
}

impl Drop for KubernetesDirectory {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[async_trait::async_trait]
impl Directory for KubernetesDirectory {
    async fn for_calls(&self, caller: &Caller) -> Result<Vec<Arc<RemoteEngine>>, EngineError> {
        let name = names::runner_claim_name(caller.id());
        let pool = self.pool(None, None);
        let existing = {
            let mut state = self.state();
            match state.claims.get(&name).cloned() {
                Some(claim) if tenant_of(&claim) == Some(caller.id()) => {
                    Some(self.agent_of(&mut state, &claim))
                }
                Some(_) => {
                    return Err(EngineError::internal(
                        format!("The runner claim `{name}` belongs to another tenant"),
                        "delete it: `kubectl delete sandboxclaim NAME`",
                    ));
                }
                None => None,
            }
        };
        let agent = match existing {
            Some(Some(agent)) => agent,
            Some(None) => self.wait_ready(&name, &pool).await?,
            None => {
                self.synced().await?;
                let claim = generate::runner_claim(caller.id(), &pool, self.shutdown_at());
                self.create_claim(&claim).await?;
                self.wait_ready(&name, &pool).await?
            }
        };
        self.mark_used(&name);
        Ok(vec![agent])
    }

    async fn place_session(
        &self,
        caller: &Caller,
        request: &CreateSession,
    ) -> Result<Placement, EngineError> {
        let pool = self.pool(
            request.profile.as_deref(),
            request.python_version.as_deref(),
        );
        let claim = generate::session_claim(&reservation(), caller.id(), &pool, self.shutdown_at());
        let name = claim.name_any();
        self.state().pending.insert(name.clone());
        if let Err(err) = self.create_claim(&claim).await {
            self.state().pending.remove(&name);
            return Err(err);
        }
        let agent = self.wait_ready(&name, &pool).await?;
        Ok(Placement {
            agents: vec![agent],
            ticket: Some(name),
        })
    }

    async fn bind(
        &self,
        _caller: &Caller,
        session_id: &str,
        agent: &Arc<RemoteEngine>,
        placement: Placement,
    ) -> Result<(), EngineError> {
        let Some(name) = placement.ticket else {
            return Err(EngineError::internal(
                "A session was made without a claim",
                "report this: the kubernetes directory always claims before a session",
            ));
        };
        let patch = generate::session_binding(session_id, agent.name());
        let bound = self.patch_claim(&name, &patch).await;
        if bound.is_err() {
            self.delete_claim(&name).await;
        }
        self.state().pending.remove(&name);
        bound
    }

    async fn abandon(&self, _caller: &Caller, placement: Placement) {
        if let Some(name) = placement.ticket {
            self.delete_claim(&name).await;
        }
    }

    async fn holder(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<Option<Arc<RemoteEngine>>, EngineError> {
        self.synced().await?;
        let known = self.state().sessions.contains_key(session_id);
        if !known {
            self.look_up(session_id).await?;
        }
        let mut state = self.state();
        // A lost session is said lost to its own tenant only; to another, it is no session.
        if let Some((tenant, why)) = state.lost.get(session_id) {
            if tenant == caller.id() {
                return Err(lost_session(session_id, why));
            }
            return Ok(None);
        }
        let Some(name) = state.sessions.get(session_id).cloned() else {
            return Ok(None);
        };
        let Some(claim) = state.claims.get(&name).cloned() else {
            return Ok(None);
        };
        // Another tenant's session is, to this caller, no session at all.
        if tenant_of(&claim) != Some(caller.id()) {
            return Ok(None);
        }
        let Some(agent) = self.agent_of(&mut state, &claim) else {
            return Err(lost_session(
                session_id,
                &format!(
                    "its sandbox claim `{name}` is no longer Ready ({})",
                    claim_status(Some(&claim))
                ),
            ));
        };
        let made_on = claim.annotations().get(ANNOTATION_AGENT);
        if made_on.is_some_and(|made_on| made_on != agent.name()) {
            return Err(lost_session(
                session_id,
                &format!(
                    "its sandbox's pod was replaced (it was made on `{}`, the claim `{name}` now names `{}`)",
                    made_on.map_or("", String::as_str),
                    agent.name()
                ),
            ));
        }
        Ok(Some(agent))
    }

    async fn unbind(&self, _caller: &Caller, session_id: &str) {
        let name = self.state().sessions.get(session_id).cloned();
        if let Some(name) = name {
            self.delete_claim(&name).await;
        }
    }

    async fn holding(&self, caller: &Caller) -> Vec<Arc<RemoteEngine>> {
        if self.synced().await.is_err() {
            return Vec::new();
        }
        let mut state = self.state();
        let claims: Vec<SandboxClaim> = state
            .claims
            .values()
            .filter(|claim| tenant_of(claim) == Some(caller.id()))
            .filter(|claim| !state.deleting.contains(&claim.name_any()))
            .cloned()
            .collect();
        let mut agents: Vec<Arc<RemoteEngine>> = Vec::new();
        for claim in &claims {
            if let Some(agent) = self.agent_of(&mut state, claim)
                && !agents.iter().any(|known| known.url() == agent.url())
            {
                agents.push(agent);
            }
        }
        agents
    }

    /// Ready when the claims have been listed and the watch works; the agents are each a
    /// claim's matter (a claim not Ready is reported on the call that needs it).
    async fn readiness(&self) -> (bool, Vec<String>) {
        let state = self.state();
        match (&state.problem, state.synced) {
            (Some(problem), _) => (false, vec![problem.clone()]),
            (None, false) => (
                false,
                vec![format!(
                    "the sandbox claims of `{}` have not been listed yet\nhint: wait a moment; if it lasts, check that the Kubernetes API at `{}` answers",
                    self.namespace, self.cluster
                )],
            ),
            (None, true) => (true, Vec::new()),
        }
    }

    fn all(&self) -> Vec<Arc<RemoteEngine>> {
        self.state().agents.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, version: &str, session: Option<&str>) -> SandboxClaim {
        let shutdown = Timestamp::UNIX_EPOCH;
        let mut claim = match session {
            Some(session) => generate::claim_for_session(
                name,
                session,
                "10.0.0.1:8700",
                "acme",
                "pool",
                shutdown,
            ),
            None => generate::session_claim(name, "acme", "pool", shutdown),
        };
        claim.metadata.resource_version = Some(version.into());
        claim
    }

    #[test]
    fn an_older_answer_never_replaces_what_the_watch_said() {
        let mut state = State::default();
        let name = names::session_claim_name("r");
        state.insert(claim("r", "12", Some("s-1")));
        // The answer to the create, which the watch overtook.
        state.insert(claim("r", "10", None));
        assert_eq!(state.sessions.get("s-1"), Some(&name));
        assert_eq!(
            state.claims[&name].metadata.resource_version.as_deref(),
            Some("12")
        );
        // A newer one does; a version that is no number counts as newer.
        state.insert(claim("r", "13", None));
        assert_eq!(
            state.claims[&name].metadata.resource_version.as_deref(),
            Some("13")
        );
        state.insert(claim("r", "opaque", Some("s-1")));
        assert_eq!(
            state.claims[&name].metadata.resource_version.as_deref(),
            Some("opaque")
        );
    }

    #[test]
    fn a_claim_gone_by_someone_else_is_a_lost_session_and_ours_is_not() {
        let mut state = State::default();
        state.insert(claim("a", "1", Some("s-a")));
        state.insert(claim("b", "2", Some("s-b")));
        state.deleting.insert(names::session_claim_name("b"));
        state.remove(&names::session_claim_name("a"));
        state.remove(&names::session_claim_name("b"));
        assert!(state.sessions.is_empty());
        let (tenant, why) = &state.lost["s-a"];
        assert_eq!(tenant, "acme");
        assert!(why.contains("shutdownTime"), "{why}");
        assert!(!state.lost.contains_key("s-b"));
        // A list that no longer has a claim removes it the same way.
        state.insert(claim("c", "3", Some("s-c")));
        state.replace(vec![claim("d", "4", Some("s-d"))]);
        assert!(state.lost.contains_key("s-c"));
        assert_eq!(state.sessions.keys().collect::<Vec<_>>(), vec!["s-d"]);
        // A session found again is no longer lost.
        state.insert(claim("c", "5", Some("s-c")));
        assert!(!state.lost.contains_key("s-c"));
    }

    #[test]
    fn a_claims_status_is_said_in_words() {
        assert!(claim_status(None).contains("not seen"));
        let unbound = claim("r", "1", None);
        assert!(claim_status(Some(&unbound)).contains("no Ready condition"));
    }
}
