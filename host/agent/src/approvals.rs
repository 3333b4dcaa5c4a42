//! Approvals: a person in the loop for what the agent runs. The [`ApprovalBroker`] is the
//! sandbox's [`ApprovalGate`]: before an exec call runs it gets the call's plan, decides what the
//! operator's policy covers (`[approvals] exec` = deny / allowlist / full, the allowlist, safe
//! bins, earlier allow-always decisions in `<state-dir>/approvals.json`) and, when `ask` says so,
//! sends an [`ApprovalRequest`] to every connected operator front end whose filter matches the
//! session (`chat` inline, the gateway, channels, ACP) and waits for the first decision or the
//! timeout (a denial). With no front end connected, `ask_fallback` decides. The call's other work
//! and the session's other sessions do not wait: only this tool call does. Every request and
//! decision goes to the audit log (the plan's digest, never its text).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clawcage_core::approval::{
    AllowEntry, ApprovalDecision, ApprovalGate, ApprovedExec, AskMode, Coverage, ExecMode,
    ExecPlan, ExecPolicy, GateAnswer, GateFuture, WriteRequest,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::audit::{AuditLog, AuditRecord, args_digest};

/// The `tool` of a request about a host off the network allow-list.
pub const NETWORK_TOOL: &str = "network";
/// The `kind` of a kept allow-always decision about a command.
const EXEC_KIND: &str = "exec";
/// The `kind` of a kept allow-always decision about a host.
const NETWORK_KIND: &str = "network";
/// The `tool` of a request to change something under a read-only workspace.
pub const WRITE_TOOL: &str = "write";
/// The `kind` of a kept allow-always decision about a path (written under a read-only workspace).
const WRITE_KIND: &str = "write";

/// The default time an operator has to answer: 30 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Requests waiting at once; more are denied at once (a flood cannot queue work for a person).
const MAX_PENDING: usize = 64;
/// Bytes of `approvals.json` read.
const MAX_STORE_BYTES: u64 = 4 << 20;

/// The operator's approvals settings (`[approvals]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalSettings {
    /// The exec policy: mode, configured allowlist, safe bins.
    pub exec: ExecPolicy,
    /// When to ask a person.
    pub ask: AskMode,
    /// What decides when asking is needed but no operator front end is connected.
    pub ask_fallback: ExecMode,
    /// How long a request waits; then it is denied.
    pub timeout: Duration,
    /// Whether a web request to a host off the network allow-list is asked instead of refused.
    pub network_ask: bool,
    /// Whether a change under a read-only workspace is asked instead of refused.
    pub write_ask: bool,
}

impl Default for ApprovalSettings {
    fn default() -> Self {
        ApprovalSettings {
            exec: ExecPolicy {
                mode: ExecMode::Full,
                allow: Vec::new(),
                safe_bins: clawcage_core::approval::DEFAULT_SAFE_BINS
                    .iter()
                    .map(|bin| bin.to_string())
                    .collect(),
            },
            ask: AskMode::Off,
            ask_fallback: ExecMode::Deny,
            timeout: DEFAULT_TIMEOUT,
            network_ask: false,
            write_ask: false,
        }
    }
}

/// A session's own exec mode and ask mode, over the configuration's (`/approvals` in chat,
/// `exec.approval.policy` over the gateway). Its sub-agents (`KEY/sub-N`) follow it too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionPolicy {
    /// The session's exec mode; the configuration's when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecMode>,
    /// The session's ask mode; the configuration's when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<AskMode>,
}

impl SessionPolicy {
    /// Reads `exec deny|allowlist|full` and `ask off|on-miss|always` pairs (either or both, in
    /// any order), as `/approvals` takes them.
    pub fn parse(words: &[&str]) -> Result<SessionPolicy, String> {
        let usage =
            "use: exec deny|allowlist|full, ask off|on-miss|always (either or both), or reset";
        let mut policy = SessionPolicy::default();
        let mut rest = words;
        while let [key, value, tail @ ..] = rest {
            match *key {
                "exec" => {
                    policy.exec = Some(
                        value
                            .parse()
                            .map_err(|valid| format!("exec {value:?} is not a mode; {valid}"))?,
                    )
                }
                "ask" => {
                    policy.ask = Some(
                        value
                            .parse()
                            .map_err(|valid| format!("ask {value:?} is not a mode; {valid}"))?,
                    )
                }
                other => return Err(format!("{other:?} is not a setting; {usage}")),
            }
            rest = tail;
        }
        if !rest.is_empty() || policy == SessionPolicy::default() {
            return Err(usage.to_string());
        }
        Ok(policy)
    }
}

/// One request to the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// The request's id (`apr-…`), used to answer it.
    pub id: String,
    /// The session whose tool call waits, when it runs for one.
    pub session_key: Option<String>,
    /// The id of the model's tool call this request gates (`toolu_…`), when it is known: a front
    /// end shows the question on that call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool (`exec`).
    pub tool: String,
    /// What the call would run.
    pub plan: ExecPlan,
    /// Why the policy alone did not allow it, one line per command.
    pub reasons: Vec<String>,
    /// When the request is denied unanswered, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

impl ApprovalRequest {
    /// The request as lines for a terminal or a chat message.
    pub fn describe(&self) -> String {
        if self.tool == NETWORK_TOOL {
            return format!("{} wants to reach:\n  {}", self.tool, self.plan.command);
        }
        if self.tool == WRITE_TOOL {
            return format!(
                "a tool wants to write in the read-only workspace:\n  {}",
                self.plan.command
            );
        }
        let mut text = format!("{} wants to run:", self.tool);
        for command in &self.plan.commands {
            text.push_str("\n  ");
            text.push_str(&command.display());
        }
        if self.plan.commands.is_empty() {
            text.push_str("\n  ");
            text.push_str(&self.plan.command);
        }
        for write in &self.plan.writes {
            text.push_str("\n  ");
            text.push_str(&write.display());
        }
        text
    }
}

/// What an operator front end hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorEvent {
    /// A tool call waits for a decision.
    Requested(ApprovalRequest),
    /// A request was decided (by someone, or by its timeout): stop showing it.
    Resolved {
        /// The request.
        id: String,
        /// The decision.
        decision: ApprovalDecision,
        /// Who decided (`chat`, `gateway:<client>`, `timeout`).
        by: String,
    },
}

/// Which requests an operator front end wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorFilter {
    /// Every request, with or without a session.
    All,
    /// Requests of this session and of its sub-agents (`KEY/sub-N`).
    Session(String),
}

impl OperatorFilter {
    /// Whether a request of `session_key` (`None`: of no session) is one this operator wants.
    pub fn accepts(&self, session_key: Option<&str>) -> bool {
        match (self, session_key) {
            (OperatorFilter::All, _) => true,
            (OperatorFilter::Session(mine), Some(key)) => {
                key == mine
                    || key
                        .strip_prefix(mine.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            }
            (OperatorFilter::Session(_), None) => false,
        }
    }
}

/// Why a decision was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// No request with this id waits (it was decided, timed out or never existed).
    #[error(
        "no approval request `{0}` is waiting (it was already decided, it timed out, or the id is wrong)"
    )]
    Unknown(String),
    /// The approvals file could not be read or written.
    #[error("{0}")]
    Store(String),
}

/// An allow-always decision kept in `approvals.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredApproval {
    /// Its id (`apv-…`), used to revoke it.
    pub id: String,
    /// `exec`.
    pub kind: String,
    /// The program and the glob over its arguments.
    #[serde(flatten)]
    pub entry: AllowEntry,
    /// When it was decided, RFC 3339.
    pub created: String,
    /// The session it was decided for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl StoredApproval {
    /// What it allows, as listings show it: `rm -r build` for a command, the allow-list entry
    /// (`docs.example:8443`) for a host.
    pub fn rule(&self) -> String {
        if self.kind == NETWORK_KIND || self.kind == WRITE_KIND {
            self.entry.program.clone()
        } else {
            self.entry.to_string()
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StoreFile {
    version: u32,
    approvals: Vec<StoredApproval>,
}

/// `<state-dir>/approvals.json`: allow-always decisions, read again at every use (another
/// process may have revoked one), changed under a lock file and written atomically, mode 0600.
#[derive(Debug, Clone)]
pub struct ApprovalStore {
    path: PathBuf,
}

impl ApprovalStore {
    /// The store in `state_dir`.
    pub fn in_state_dir(state_dir: &Path) -> ApprovalStore {
        ApprovalStore {
            path: crate::StateDir::new(state_dir).approvals(),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every stored decision.
    pub fn list(&self) -> Result<Vec<StoredApproval>, ApprovalError> {
        Ok(self.read()?.approvals)
    }

    /// Adds decisions; an entry already stored is not added twice.
    pub fn add(&self, entries: Vec<StoredApproval>) -> Result<(), ApprovalError> {
        self.change(|file| {
            for entry in entries {
                if !file
                    .approvals
                    .iter()
                    .any(|stored| stored.kind == entry.kind && stored.entry == entry.entry)
                {
                    file.approvals.push(entry);
                }
            }
            Ok(())
        })
    }

    /// Removes the decision `id` and returns it.
    pub fn revoke(&self, id: &str) -> Result<StoredApproval, ApprovalError> {
        let mut removed = None;
        self.change(|file| {
            let position = file
                .approvals
                .iter()
                .position(|stored| stored.id == id)
                .ok_or_else(|| {
                    ApprovalError::Store(format!(
                        "no stored approval `{id}`; `clawcage approvals list` shows the ids"
                    ))
                })?;
            removed = Some(file.approvals.remove(position));
            Ok(())
        })?;
        removed.ok_or_else(|| ApprovalError::Unknown(id.to_string()))
    }

    fn read(&self) -> Result<StoreFile, ApprovalError> {
        let text = match clawcage_core::files::read_regular_text(
            &self.path,
            MAX_STORE_BYTES,
            clawcage_core::files::Symlinks::Refuse,
        ) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(StoreFile {
                    version: 1,
                    approvals: Vec::new(),
                });
            }
            Err(error) => {
                return Err(ApprovalError::Store(format!(
                    "cannot read {}: {error}",
                    self.path.display()
                )));
            }
        };
        serde_json::from_str(&text).map_err(|error| {
            ApprovalError::Store(format!(
                "{} is not a valid approvals file ({error}); fix or remove it",
                self.path.display()
            ))
        })
    }

    fn change(
        &self,
        edit: impl FnOnce(&mut StoreFile) -> Result<(), ApprovalError>,
    ) -> Result<(), ApprovalError> {
        let failed = |what: &str, error: std::io::Error| {
            ApprovalError::Store(format!("cannot {what} {}: {error}", self.path.display()))
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|error| failed("create the directory of", error))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("approvals.lock"))
            .map_err(|error| failed("lock", error))?;
        lock.lock().map_err(|error| failed("lock", error))?;
        let mut file = self.read()?;
        edit(&mut file)?;
        file.version = 1;
        let bytes = serde_json::to_vec_pretty(&file)
            .map_err(|error| ApprovalError::Store(error.to_string()))?;
        clawcage_core::files::write_atomically(&self.path, &bytes, true)
            .map_err(|error| failed("write", error))
    }
}

struct Pending {
    request: ApprovalRequest,
    answer: oneshot::Sender<(ApprovalDecision, String)>,
}

struct Operator {
    id: u64,
    filter: OperatorFilter,
    events: mpsc::UnboundedSender<OperatorEvent>,
}

#[derive(Default)]
struct State {
    pending: HashMap<String, Pending>,
    operators: Vec<Operator>,
    next_operator: u64,
}

struct Inner {
    settings: ApprovalSettings,
    /// Sessions' own modes, by session key.
    sessions: Mutex<HashMap<String, SessionPolicy>>,
    store: Option<ApprovalStore>,
    audit: Mutex<AuditSink>,
    state: Mutex<State>,
}

/// Where requests and decisions are recorded: an open log, a log opened at the first record (so
/// a process that never asks creates no file), or nowhere.
enum AuditSink {
    Open(Arc<AuditLog>),
    Later(PathBuf),
    Nowhere,
}

/// The approvals broker; cheap to clone (one shared state).
#[derive(Clone)]
pub struct ApprovalBroker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApprovalBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalBroker")
            .field("settings", &self.inner.settings)
            .finish()
    }
}

impl ApprovalBroker {
    /// A broker with `settings`, allow-always decisions in `store` (none kept without one) and
    /// requests and decisions recorded in `audit`.
    pub fn new(
        settings: ApprovalSettings,
        store: Option<ApprovalStore>,
        audit: Option<Arc<AuditLog>>,
    ) -> ApprovalBroker {
        ApprovalBroker {
            inner: Arc::new(Inner {
                settings,
                sessions: Mutex::new(HashMap::new()),
                store,
                audit: Mutex::new(match audit {
                    Some(log) => AuditSink::Open(log),
                    None => AuditSink::Nowhere,
                }),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// This broker recording in the audit log at `path`, opened at the first record (when it
    /// records nowhere yet).
    pub fn with_audit_path(self, path: PathBuf) -> ApprovalBroker {
        let mut sink = self
            .inner
            .audit
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if matches!(*sink, AuditSink::Nowhere) {
            *sink = AuditSink::Later(path);
        }
        drop(sink);
        self
    }

    /// The settings.
    pub fn settings(&self) -> &ApprovalSettings {
        &self.inner.settings
    }

    /// Sets session `key`'s own modes (and its sub-agents'); `None` goes back to the
    /// configuration's. Recorded in the audit log.
    pub fn set_session_policy(&self, key: &str, policy: Option<SessionPolicy>) {
        let mut sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match policy {
            Some(policy) => sessions.insert(key.to_string(), policy),
            None => sessions.remove(key),
        };
        drop(sessions);
        let plan = ExecPlan {
            command: serde_json::to_string(&policy).unwrap_or_default(),
            ..ExecPlan::default()
        };
        self.audit(
            Some(key),
            "approvals",
            &plan,
            "session-policy-set",
            Duration::ZERO,
        );
    }

    /// The exec mode and ask mode that apply to session `key` (its own, else its parent's for a
    /// sub-agent, else the configuration's), and whether they are the session's own.
    pub fn effective(&self, key: Option<&str>) -> (ExecMode, AskMode, bool) {
        let settings = &self.inner.settings;
        let own = key.and_then(|key| {
            let sessions = self
                .inner
                .sessions
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut candidate = Some(key);
            while let Some(current) = candidate {
                if let Some(policy) = sessions.get(current) {
                    return Some(*policy);
                }
                candidate = current.rsplit_once('/').map(|(parent, _)| parent);
            }
            None
        });
        match own {
            Some(own) => (
                own.exec.unwrap_or(settings.exec.mode),
                own.ask.unwrap_or(settings.ask),
                true,
            ),
            None => (settings.exec.mode, settings.ask, false),
        }
    }

    /// The allow-always store, if any.
    pub fn store(&self) -> Option<&ApprovalStore> {
        self.inner.store.as_ref()
    }

    /// Registers an operator front end: it hears the requests `filter` accepts (those already
    /// waiting first) until the handle is dropped. While one is registered for a session, its
    /// requests are asked instead of going to `ask_fallback`.
    pub fn operator(&self, filter: OperatorFilter) -> OperatorHandle {
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut state = self.lock();
        for pending in state.pending.values() {
            if filter.accepts(pending.request.session_key.as_deref()) {
                let _ = sender.send(OperatorEvent::Requested(pending.request.clone()));
            }
        }
        let id = state.next_operator;
        state.next_operator += 1;
        state.operators.push(Operator {
            id,
            filter,
            events: sender,
        });
        OperatorHandle {
            broker: self.clone(),
            id,
            events: receiver,
        }
    }

    /// The requests waiting now.
    pub fn pending(&self) -> Vec<ApprovalRequest> {
        let mut requests: Vec<ApprovalRequest> = self
            .lock()
            .pending
            .values()
            .map(|pending| pending.request.clone())
            .collect();
        requests.sort_by_key(|request| request.expires_at_ms);
        requests
    }

    /// Decides request `id`. `by` names who decided, for the audit log and the other front ends.
    pub fn resolve(
        &self,
        id: &str,
        decision: ApprovalDecision,
        by: &str,
    ) -> Result<(), ApprovalError> {
        let pending = self
            .lock()
            .pending
            .remove(id)
            .ok_or_else(|| ApprovalError::Unknown(id.to_string()))?;
        let _ = pending.answer.send((decision, by.to_string()));
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn broadcast(&self, session_key: Option<&str>, event: &OperatorEvent) {
        let mut state = self.lock();
        state.operators.retain(|operator| {
            !operator.filter.accepts(session_key) || operator.events.send(event.clone()).is_ok()
        });
    }

    fn has_operator(&self, session_key: Option<&str>) -> bool {
        self.lock()
            .operators
            .iter()
            .any(|operator| operator.filter.accepts(session_key) && !operator.events.is_closed())
    }

    /// The policy with the stored allow-always decisions added.
    fn policy(&self) -> Result<ExecPolicy, String> {
        let mut policy = self.inner.settings.exec.clone();
        if let Some(store) = &self.inner.store {
            let stored = store.list().map_err(|error| error.to_string())?;
            policy.allow.extend(
                stored
                    .into_iter()
                    .filter(|stored| stored.kind == EXEC_KIND)
                    .map(|stored| stored.entry),
            );
        }
        Ok(policy)
    }

    fn audit(
        &self,
        session: Option<&str>,
        tool: &str,
        plan: &ExecPlan,
        verdict: &str,
        waited: Duration,
    ) {
        let audit = {
            let mut sink = self
                .inner
                .audit
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let AuditSink::Later(path) = &*sink {
                *sink = match AuditLog::open(path) {
                    Ok(log) => AuditSink::Open(Arc::new(log)),
                    Err(error) => {
                        tracing::warn!(
                            "cannot open the audit log {} for approvals: {error}",
                            path.display()
                        );
                        AuditSink::Nowhere
                    }
                };
            }
            match &*sink {
                AuditSink::Open(log) => log.clone(),
                _ => return,
            }
        };
        let record = AuditRecord {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            session: session.unwrap_or("-").to_string(),
            tool: tool.to_string(),
            origin: None,
            args_sha256: args_digest(&serde_json::to_value(plan).unwrap_or_default()),
            grants: None,
            verdict: verdict.to_string(),
            duration_ms: waited.as_secs_f64() * 1000.0,
        };
        if let Err(error) = audit.append(&record) {
            tracing::warn!("cannot write the approval to the audit log: {error}");
        }
    }

    /// The decision on one exec plan.
    async fn decide(&self, tool: String, plan: Option<ExecPlan>) -> GateAnswer {
        let session = crate::session::current_session_key();
        let (mode, ask_mode, _) = self.effective(session.as_deref());
        let plan = plan.unwrap_or_default();
        if mode == ExecMode::Deny {
            self.audit(
                session.as_deref(),
                &tool,
                &plan,
                "denied-by-policy",
                Duration::ZERO,
            );
            return GateAnswer::Denied(
                "denied by the operator: running commands is disabled here ([approvals] exec = \"deny\"); do the task with the other tools or ask the user".to_string(),
            );
        }
        let policy = match self.policy().map(|policy| ExecPolicy { mode, ..policy }) {
            Ok(policy) => policy,
            Err(error) => {
                tracing::warn!("{error}");
                return GateAnswer::Denied(format!(
                    "the operator's approvals could not be read ({error})"
                ));
            }
        };
        // Every program and every write by redirection: an allowlist entry covers running a
        // program, never a file written through the shell.
        let reasons = policy.misses(&plan);
        let ask = match ask_mode {
            AskMode::Off => false,
            AskMode::OnMiss => !reasons.is_empty(),
            AskMode::Always => true,
        };
        // What an answer allows: the plan's commands, and its writes by redirection for this
        // call only (an allowlist has no entry for them, so they are never kept).
        let allowed = |policy: ExecPolicy, plan: Option<&ExecPlan>| {
            GateAnswer::Allowed(Arc::new(ApprovedExec {
                policy,
                approved: plan.map(|plan| plan.commands.clone()).unwrap_or_default(),
                approved_writes: plan.map(|plan| plan.writes.clone()).unwrap_or_default(),
            }))
        };
        if !ask {
            return if reasons.is_empty() {
                allowed(policy, None)
            } else {
                self.audit(
                    session.as_deref(),
                    &tool,
                    &plan,
                    "denied-by-policy",
                    Duration::ZERO,
                );
                let instead = if plan.writes.is_empty() {
                    "Use only allowed programs"
                } else {
                    "Use only allowed programs and read their output instead of redirecting it into a file"
                };
                GateAnswer::Denied(format!(
                    "denied by the operator's exec policy (allowlist): {}. {instead}, or ask the user to allow this one",
                    reasons.join("; ")
                ))
            };
        }
        if !self.has_operator(session.as_deref()) {
            return self.fallback(session.as_deref(), &tool, &plan, policy, reasons);
        }
        let (decision, by) = match self
            .ask_operator(session.clone(), &tool, plan.clone(), reasons.clone())
            .await
        {
            Ok(answer) => answer,
            Err(message) => return GateAnswer::Denied(message),
        };
        match decision {
            ApprovalDecision::Deny if by == "timeout" => GateAnswer::Denied(format!(
                "denied by the operator: nobody approved the command within {} s; do not retry it unless the user asks",
                self.inner.settings.timeout.as_secs()
            )),
            ApprovalDecision::Deny => GateAnswer::Denied(
                "denied by the operator: the user refused this command; do not run it again, ask the user what to do instead".to_string(),
            ),
            ApprovalDecision::AllowOnce => allowed(policy, Some(&plan)),
            ApprovalDecision::AllowAlways => {
                if let Some(store) = &self.inner.store {
                    let created =
                        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                    let entries: Vec<StoredApproval> = plan
                        .commands
                        .iter()
                        .filter(|command| matches!(policy.covers_planned(command), Coverage::Miss(_)))
                        .filter_map(AllowEntry::exactly)
                        .map(|entry| StoredApproval {
                            id: format!("apv-{}", random_id()),
                            kind: EXEC_KIND.to_string(),
                            entry,
                            created: created.clone(),
                            session: session.clone(),
                        })
                        .collect();
                    if let Err(error) = store.add(entries) {
                        tracing::warn!("the allow-always decision was not kept: {error}");
                    }
                }
                allowed(policy, Some(&plan))
            }
        }
    }

    /// Sends a request to the operators that follow `session` and waits for the first decision
    /// or the timeout (a denial by `timeout`); records both in the audit log.
    async fn ask_operator(
        &self,
        session: Option<String>,
        tool: &str,
        plan: ExecPlan,
        reasons: Vec<String>,
    ) -> Result<(ApprovalDecision, String), String> {
        let started = Instant::now();
        let id = format!("apr-{}", random_id());
        let expires_at_ms =
            u64::try_from((chrono::Utc::now() + self.inner.settings.timeout).timestamp_millis())
                .unwrap_or(0);
        let request = ApprovalRequest {
            id: id.clone(),
            session_key: session.clone(),
            tool_call_id: crate::agent_loop::current_tool_call_id(),
            tool: tool.to_string(),
            plan: plan.clone(),
            reasons: reasons.clone(),
            expires_at_ms,
        };
        let (sender, receiver) = oneshot::channel();
        {
            let mut state = self.lock();
            if state.pending.len() >= MAX_PENDING {
                drop(state);
                self.audit(
                    session.as_deref(),
                    tool,
                    &plan,
                    "denied-too-many-requests",
                    Duration::ZERO,
                );
                return Err(format!(
                    "{MAX_PENDING} approval requests are already waiting for the operator; wait for them to be answered"
                ));
            }
            state.pending.insert(
                id.clone(),
                Pending {
                    request: request.clone(),
                    answer: sender,
                },
            );
        }
        self.audit(
            session.as_deref(),
            tool,
            &plan,
            "approval-requested",
            Duration::ZERO,
        );
        self.broadcast(session.as_deref(), &OperatorEvent::Requested(request));
        // If the call is dropped while it waits (the turn interrupted, the client gone), the
        // request is withdrawn: no front end keeps showing it, nobody can answer it.
        let mut withdraw = Withdraw {
            broker: self.clone(),
            id: id.clone(),
            session: session.clone(),
            armed: true,
        };
        let (decision, by) = match tokio::time::timeout(self.inner.settings.timeout, receiver).await
        {
            Ok(Ok(answer)) => answer,
            _ => {
                self.lock().pending.remove(&id);
                (ApprovalDecision::Deny, "timeout".to_string())
            }
        };
        withdraw.armed = false;
        self.broadcast(
            session.as_deref(),
            &OperatorEvent::Resolved {
                id: id.clone(),
                decision,
                by: by.clone(),
            },
        );
        let verdict = match (decision, by.as_str()) {
            (ApprovalDecision::Deny, "timeout") => "approval-timed-out".to_string(),
            (decision, by) => format!("{} by {by}", decision.as_str()),
        };
        self.audit(session.as_deref(), tool, &plan, &verdict, started.elapsed());
        Ok((decision, by))
    }

    fn fallback(
        &self,
        session: Option<&str>,
        tool: &str,
        plan: &ExecPlan,
        policy: ExecPolicy,
        reasons: Vec<String>,
    ) -> GateAnswer {
        let settings = &self.inner.settings;
        let name = settings.ask_fallback.as_str();
        let allow = match settings.ask_fallback {
            ExecMode::Deny => false,
            ExecMode::Allowlist => reasons.is_empty(),
            ExecMode::Full => true,
        };
        if allow {
            self.audit(
                session,
                tool,
                plan,
                &format!("allowed-by-fallback-{name}"),
                Duration::ZERO,
            );
            let policy = if settings.ask_fallback == ExecMode::Full {
                ExecPolicy {
                    mode: ExecMode::Full,
                    ..policy
                }
            } else {
                policy
            };
            GateAnswer::Allowed(Arc::new(ApprovedExec {
                policy,
                approved: Vec::new(),
                approved_writes: Vec::new(),
            }))
        } else {
            self.audit(
                session,
                tool,
                plan,
                &format!("denied-by-fallback-{name}"),
                Duration::ZERO,
            );
            GateAnswer::Denied(format!(
                "this command needs the operator's approval and no operator is connected to give it ([approvals] ask_fallback = \"{name}\"){}",
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(": {}", reasons.join("; "))
                }
            ))
        }
    }
}

impl ApprovalBroker {
    /// The decision on one request to the host `entry` names, off the network allow-list.
    async fn decide_network(&self, entry: String) -> Result<(), String> {
        let session = crate::session::current_session_key();
        let refused = format!(
            "requests to {entry} need the operator's approval and no operator is connected to give it; to allow it for good, add \"{entry}\" to [network] allow"
        );
        let what = format!("the request to {entry}");
        let request = BeyondGrants {
            tool: NETWORK_TOOL,
            kind: NETWORK_KIND,
            command: entry.clone(),
            keys: vec![entry],
            refused,
            what,
        };
        self.decide_request(session, request).await
    }

    /// The decision on one change under a read-only workspace, for `session`.
    async fn decide_write(
        &self,
        session: Option<String>,
        request: WriteRequest,
    ) -> Result<(), String> {
        let described = request.describe();
        let refused = format!(
            "the workspace is read-only: {described} needs the operator's approval and no operator is connected to give it"
        );
        let what = format!("the write ({described})");
        let request = BeyondGrants {
            tool: WRITE_TOOL,
            kind: WRITE_KIND,
            command: described,
            keys: request.paths,
            refused,
            what,
        };
        self.decide_request(session, request).await
    }

    /// One request beyond the grants: allowed at once when every one of its keys is kept in
    /// `approvals.json`; otherwise asked of an operator, or decided by the fallback. An
    /// allow-always answer keeps each key.
    async fn decide_request(
        &self,
        session: Option<String>,
        request: BeyondGrants,
    ) -> Result<(), String> {
        let BeyondGrants {
            tool,
            kind,
            command,
            keys,
            refused,
            what,
        } = request;
        let plan = ExecPlan {
            command,
            ..ExecPlan::default()
        };
        if let Some(store) = &self.inner.store {
            let stored = store.list().map_err(|error| error.to_string())?;
            if !keys.is_empty()
                && keys.iter().all(|key| {
                    stored
                        .iter()
                        .any(|kept| kept.kind == kind && &kept.entry.program == key)
                })
            {
                return Ok(());
            }
        }
        if !self.has_operator(session.as_deref()) {
            if self.inner.settings.ask_fallback == ExecMode::Full {
                self.audit(
                    session.as_deref(),
                    tool,
                    &plan,
                    "allowed-by-fallback-full",
                    Duration::ZERO,
                );
                return Ok(());
            }
            self.audit(
                session.as_deref(),
                tool,
                &plan,
                "denied-by-fallback",
                Duration::ZERO,
            );
            return Err(refused);
        }
        let (decision, by) = self
            .ask_operator(session.clone(), tool, plan, Vec::new())
            .await?;
        match decision {
            ApprovalDecision::Deny if by == "timeout" => Err(format!(
                "denied by the operator: nobody approved {what} within {} s",
                self.inner.settings.timeout.as_secs()
            )),
            ApprovalDecision::Deny => Err(format!(
                "denied by the operator: the user refused {what}; do not retry it"
            )),
            ApprovalDecision::AllowOnce => Ok(()),
            ApprovalDecision::AllowAlways => {
                if let Some(store) = &self.inner.store {
                    let created =
                        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                    let kept = keys
                        .into_iter()
                        .map(|key| StoredApproval {
                            id: format!("apv-{}", random_id()),
                            kind: kind.to_string(),
                            entry: AllowEntry {
                                program: key,
                                args: None,
                            },
                            created: created.clone(),
                            session: session.clone(),
                        })
                        .collect();
                    if let Err(error) = store.add(kept) {
                        tracing::warn!("the allow-always decision was not kept: {error}");
                    }
                }
                Ok(())
            }
        }
    }
}

impl ApprovalGate for ApprovalBroker {
    fn active(&self) -> bool {
        let (mode, ask, _) = self.effective(crate::session::current_session_key().as_deref());
        mode != ExecMode::Full || ask != AskMode::Off
    }

    fn asks_network(&self) -> bool {
        self.inner.settings.network_ask
    }

    fn review_network(&self, entry: &str) -> clawcage_core::approval::RequestGateFuture {
        let broker = self.clone();
        let entry = entry.to_string();
        Box::pin(async move { broker.decide_network(entry).await })
    }

    fn write_reviewer(&self) -> Option<clawcage_core::approval::WriteReviewer> {
        if !self.inner.settings.write_ask {
            return None;
        }
        let broker = self.clone();
        let session = crate::session::current_session_key();
        Some(Arc::new(move |request: WriteRequest| {
            let broker = broker.clone();
            let session = session.clone();
            Box::pin(async move { broker.decide_write(session, request).await })
        }))
    }

    fn review(&self, tool: &str, plan: Option<ExecPlan>) -> GateFuture {
        let broker = self.clone();
        let tool = tool.to_string();
        Box::pin(async move { broker.decide(tool, plan).await })
    }
}

/// A request beyond the grants (a host off the allow-list, a write under a read-only workspace).
struct BeyondGrants {
    /// The request's `tool`: `network` or `write`.
    tool: &'static str,
    /// The `kind` its allow-always decisions are kept under.
    kind: &'static str,
    /// What the operator is shown.
    command: String,
    /// What an allow-always answer keeps (hosts, paths); all kept means allowed.
    keys: Vec<String>,
    /// The sentence for the model when nobody can be asked.
    refused: String,
    /// The request in a denial's words ("the request to docs.example").
    what: String,
}

/// Withdraws a waiting request when the call waiting for it is dropped.
struct Withdraw {
    broker: ApprovalBroker,
    id: String,
    session: Option<String>,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if self.armed && self.broker.lock().pending.remove(&self.id).is_some() {
            self.broker.broadcast(
                self.session.as_deref(),
                &OperatorEvent::Resolved {
                    id: self.id.clone(),
                    decision: ApprovalDecision::Deny,
                    by: "withdrawn".to_string(),
                },
            );
        }
    }
}

/// A connected operator front end: it receives requests and decides them. Dropping it
/// disconnects it.
pub struct OperatorHandle {
    broker: ApprovalBroker,
    id: u64,
    events: mpsc::UnboundedReceiver<OperatorEvent>,
}

impl std::fmt::Debug for OperatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorHandle")
            .field("id", &self.id)
            .finish()
    }
}

impl OperatorHandle {
    /// The next event; `None` never happens while the broker lives.
    pub async fn next(&mut self) -> Option<OperatorEvent> {
        self.events.recv().await
    }

    /// The next event if one is waiting.
    pub fn try_next(&mut self) -> Option<OperatorEvent> {
        self.events.try_recv().ok()
    }

    /// Decides request `id` as `by`.
    pub fn resolve(
        &self,
        id: &str,
        decision: ApprovalDecision,
        by: &str,
    ) -> Result<(), ApprovalError> {
        self.broker.resolve(id, decision, by)
    }

    /// The broker.
    pub fn broker(&self) -> &ApprovalBroker {
        &self.broker
    }
}

impl Drop for OperatorHandle {
    fn drop(&mut self) {
        let id = self.id;
        self.broker
            .lock()
            .operators
            .retain(|operator| operator.id != id);
    }
}

fn random_id() -> String {
    format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawcage_core::approval::{ArgMatch, PlannedArg, PlannedCommand};

    fn command(program: &str, args: &[&str]) -> PlannedCommand {
        PlannedCommand {
            program: Some(program.to_string()),
            written: program.to_string(),
            args: args
                .iter()
                .map(|arg| PlannedArg {
                    written: arg.to_string(),
                    matches: ArgMatch::Exact(arg.to_string()),
                })
                .collect(),
            redirections: Vec::new(),
        }
    }

    fn plan(commands: Vec<PlannedCommand>) -> Option<ExecPlan> {
        Some(ExecPlan {
            command: "test".to_string(),
            commands,
            writes: Vec::new(),
        })
    }

    fn settings(mode: ExecMode, ask: AskMode, allow: &[&str]) -> ApprovalSettings {
        let mut settings = ApprovalSettings::default();
        settings.exec.mode = mode;
        settings.exec.allow = allow
            .iter()
            .map(|entry| AllowEntry::parse(entry).expect("entry"))
            .collect();
        settings.ask = ask;
        settings
    }

    fn denied(answer: GateAnswer) -> String {
        match answer {
            GateAnswer::Denied(message) => message,
            GateAnswer::Allowed(_) => panic!("allowed"),
        }
    }

    fn allowed(answer: GateAnswer) -> Arc<ApprovedExec> {
        match answer {
            GateAnswer::Allowed(approved) => approved,
            GateAnswer::Denied(message) => panic!("denied: {message}"),
        }
    }

    #[tokio::test]
    async fn the_policy_alone_decides_when_asking_is_off() {
        let broker = ApprovalBroker::new(
            settings(ExecMode::Allowlist, AskMode::Off, &["ls"]),
            None,
            None,
        );
        assert!(broker.active());
        allowed(
            broker
                .review("exec", plan(vec![command("ls", &["-l"])]))
                .await,
        );
        let message = denied(
            broker
                .review("exec", plan(vec![command("rm", &["x"])]))
                .await,
        );
        assert!(
            message.contains("`rm x` is not on the allowlist"),
            "{message}"
        );
        let deny = ApprovalBroker::new(settings(ExecMode::Deny, AskMode::Off, &[]), None, None);
        assert!(denied(deny.review("exec", plan(vec![])).await).contains("exec = \"deny\""));
        let full = ApprovalBroker::new(ApprovalSettings::default(), None, None);
        assert!(!full.active());
    }

    #[tokio::test]
    async fn an_operator_decides_and_a_timeout_denies() {
        let mut config = settings(ExecMode::Allowlist, AskMode::OnMiss, &[]);
        config.timeout = Duration::from_millis(200);
        let broker = ApprovalBroker::new(config, None, None);
        // Nobody connected: the fallback (deny) decides at once.
        let message = denied(
            broker
                .review("exec", plan(vec![command("rm", &["x"])]))
                .await,
        );
        assert!(message.contains("no operator is connected"), "{message}");
        // The refusal reaches the model as `denied: …`: the message itself does not say it again.
        assert!(!message.starts_with("denied"), "{message}");

        let mut operator = broker.operator(OperatorFilter::All);
        let review = tokio::spawn(broker.review("exec", plan(vec![command("rm", &["x"])])));
        let Some(OperatorEvent::Requested(request)) = operator.next().await else {
            panic!("no request");
        };
        assert_eq!(request.plan.commands[0].display(), "rm x");
        operator
            .resolve(&request.id, ApprovalDecision::AllowOnce, "test")
            .expect("resolve");
        let approved = allowed(review.await.expect("join"));
        assert!(approved.check("rm", &["x".to_string()]).is_ok());
        assert!(approved.check("rm", &["y".to_string()]).is_err());
        assert!(matches!(
            operator.next().await,
            Some(OperatorEvent::Resolved { .. })
        ));
        // The id cannot be used twice.
        assert!(
            operator
                .resolve(&request.id, ApprovalDecision::AllowOnce, "test")
                .is_err()
        );

        // Unanswered: denied at the timeout.
        let message = denied(
            broker
                .review("exec", plan(vec![command("rm", &["x"])]))
                .await,
        );
        assert!(message.contains("nobody approved"), "{message}");
        assert!(broker.pending().is_empty());
    }

    /// `sort < notes.txt > copy.txt`: a safe bin and one write by redirection.
    fn sort_into_copy() -> Option<ExecPlan> {
        let mut sort = command("sort", &[]);
        sort.redirections = vec!["< notes.txt".into(), "> copy.txt".into()];
        Some(ExecPlan {
            command: "sort < notes.txt > copy.txt".to_string(),
            commands: vec![sort],
            writes: vec![clawcage_core::approval::PlannedWrite {
                redirection: "> copy.txt".into(),
                target: ArgMatch::Exact("copy.txt".into()),
            }],
        })
    }

    #[tokio::test]
    async fn a_write_by_redirection_is_refused_or_asked_and_approved_for_that_call_only() {
        // Refused by an allowlist without asking, for the write and not for a program.
        let broker = ApprovalBroker::new(
            settings(ExecMode::Allowlist, AskMode::Off, &["ls *", "cat *"]),
            None,
            None,
        );
        let message = denied(broker.review("exec", sort_into_copy()).await);
        assert!(
            message.contains(
                "`> copy.txt` writes a file, and writes by redirection are not on the allowlist"
            ),
            "{message}"
        );
        assert!(
            !message.contains("`cat`") && !message.contains("`sort"),
            "{message}"
        );
        // `sort < notes.txt` alone writes nothing: the safe bin passes.
        let read_only = sort_into_copy().map(|plan| ExecPlan {
            writes: Vec::new(),
            ..plan
        });
        let approved = allowed(broker.review("exec", read_only).await);
        assert!(approved.check_write("/ws/copy.txt", false).is_err());
        // Under `full` nothing changes (here decided by the fallback `full`).
        let mut config = settings(ExecMode::Full, AskMode::Always, &[]);
        config.ask_fallback = ExecMode::Full;
        let full_fallback = ApprovalBroker::new(config, None, None);
        let approved = allowed(full_fallback.review("exec", sort_into_copy()).await);
        assert!(approved.check_write("/ws/copy.txt", false).is_ok());
        // With nobody to ask and ask_fallback = "allowlist", the write is still refused.
        let mut config = settings(ExecMode::Allowlist, AskMode::OnMiss, &[]);
        config.ask_fallback = ExecMode::Allowlist;
        let fallback = ApprovalBroker::new(config, None, None);
        let message = denied(fallback.review("exec", sort_into_copy()).await);
        assert!(message.contains("`> copy.txt` writes a file"), "{message}");

        // Asked on a miss; allow-always approves the write for this call and keeps nothing
        // (the safe bin needed no entry, and a write by redirection has none).
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ApprovalStore::in_state_dir(dir.path());
        let broker = ApprovalBroker::new(
            settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
            Some(store.clone()),
            None,
        );
        let mut operator = broker.operator(OperatorFilter::All);
        let review = tokio::spawn(broker.review("exec", sort_into_copy()));
        let Some(OperatorEvent::Requested(request)) = operator.next().await else {
            panic!("no request");
        };
        assert_eq!(
            request.reasons,
            ["`> copy.txt` writes a file, and writes by redirection are not on the allowlist"]
        );
        assert!(
            request.describe().ends_with("writes a file: > copy.txt"),
            "{}",
            request.describe()
        );
        operator
            .resolve(&request.id, ApprovalDecision::AllowAlways, "test")
            .expect("resolve");
        let approved = allowed(review.await.expect("join"));
        assert!(approved.check_write("/ws/copy.txt", false).is_ok());
        assert!(approved.check_write("/ws/notes.txt", false).is_err());
        assert!(store.list().expect("list").is_empty());
        drop(operator);
        let message = denied(broker.review("exec", sort_into_copy()).await);
        assert!(message.contains("no operator is connected"), "{message}");
    }

    #[tokio::test]
    async fn allow_always_is_stored_and_revoke_removes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ApprovalStore::in_state_dir(dir.path());
        let broker = ApprovalBroker::new(
            settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
            Some(store.clone()),
            None,
        );
        let mut operator = broker.operator(OperatorFilter::All);
        let review =
            tokio::spawn(broker.review("exec", plan(vec![command("rm", &["-r", "build"])])));
        let Some(OperatorEvent::Requested(request)) = operator.next().await else {
            panic!("no request");
        };
        operator
            .resolve(&request.id, ApprovalDecision::AllowAlways, "test")
            .expect("resolve");
        allowed(review.await.expect("join"));
        let stored = store.list().expect("list");
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].entry.to_string(), "rm -r build");
        assert_eq!(stored[0].rule(), "rm -r build");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(store.path())
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // A new broker (a restart) allows it without asking; another command still asks.
        drop(operator);
        let restarted = ApprovalBroker::new(
            settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
            Some(store.clone()),
            None,
        );
        allowed(
            restarted
                .review("exec", plan(vec![command("rm", &["-r", "build"])]))
                .await,
        );
        denied(
            restarted
                .review("exec", plan(vec![command("rm", &["-r", "src"])]))
                .await,
        );
        store.revoke(&stored[0].id).expect("revoke");
        denied(
            restarted
                .review("exec", plan(vec![command("rm", &["-r", "build"])]))
                .await,
        );
        assert!(store.revoke("apv-missing").is_err());
    }

    #[tokio::test]
    async fn a_request_whose_call_is_dropped_is_withdrawn() {
        let broker = ApprovalBroker::new(
            settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
            None,
            None,
        );
        let mut operator = broker.operator(OperatorFilter::All);
        let review = tokio::spawn(broker.review("exec", plan(vec![command("rm", &["x"])])));
        let Some(OperatorEvent::Requested(request)) = operator.next().await else {
            panic!("no request");
        };
        review.abort();
        assert!(review.await.is_err());
        assert!(matches!(
            operator.next().await,
            Some(OperatorEvent::Resolved { id, by, .. }) if id == request.id && by == "withdrawn"
        ));
        assert!(broker.pending().is_empty());
        assert!(
            operator
                .resolve(&request.id, ApprovalDecision::AllowOnce, "late")
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_session_policy_applies_to_that_session_and_its_sub_agents_only() {
        let broker = ApprovalBroker::new(ApprovalSettings::default(), None, None);
        let strict = SessionPolicy::parse(&["exec", "deny"]).expect("valid");
        broker.set_session_policy("agent:main:cli:a", Some(strict));
        let review = |key: &'static str| {
            let broker = broker.clone();
            crate::session::with_session_key(key.to_string(), async move {
                (
                    broker.active(),
                    broker.review("exec", plan(vec![command("ls", &[])])).await,
                )
            })
        };
        let (active, answer) = review("agent:main:cli:a").await;
        assert!(active);
        assert!(denied(answer).contains("disabled"));
        let (active, answer) = review("agent:main:cli:a/sub-1").await;
        assert!(active);
        denied(answer);
        let (active, answer) = review("agent:main:cli:b").await;
        assert!(
            !active,
            "another session keeps the configuration's (full, no asking)"
        );
        allowed(answer);
        broker.set_session_policy("agent:main:cli:a", None);
        assert!(!review("agent:main:cli:a").await.0);
        for bad in [&["exec"][..], &["ask", "sometimes"], &["mode", "full"], &[]] {
            assert!(SessionPolicy::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            SessionPolicy::parse(&["ask", "always", "exec", "allowlist"]),
            Ok(SessionPolicy {
                exec: Some(ExecMode::Allowlist),
                ask: Some(AskMode::Always)
            })
        );
    }

    #[tokio::test]
    async fn a_session_operator_hears_its_session_and_its_sub_agents_only() {
        let filter = OperatorFilter::Session("agent:main:cli:local".to_string());
        assert!(filter.accepts(Some("agent:main:cli:local")));
        assert!(filter.accepts(Some("agent:main:cli:local/sub-1")));
        assert!(!filter.accepts(Some("agent:main:cli:localx")));
        assert!(!filter.accepts(Some("agent:main:web:other")));
        assert!(!filter.accepts(None));
        assert!(OperatorFilter::All.accepts(None));
    }

    #[test]
    fn a_corrupt_store_is_reported_not_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ApprovalStore::in_state_dir(dir.path());
        std::fs::write(store.path(), "{not json").expect("write");
        let error = store.list().expect_err("corrupt");
        assert!(
            error.to_string().contains("not a valid approvals file"),
            "{error}"
        );
    }
}
