//! The [`ApprovalBroker`]: the sandbox's approval gate. It decides what the policy covers, asks
//! the connected operators for the rest, waits for the first decision or the timeout, keeps
//! allow-always decisions in the store and records every request and decision in the audit log.
//! It is one file (over 700 lines) because it is one type's behaviour: deciding, asking,
//! withdrawing and recording all work on the broker's one shared state.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clawcage_core::approval::{
    AllowEntry, ApprovalDecision, ApprovalGate, ApprovedExec, AskMode, Coverage, ExecMode,
    ExecPlan, ExecPolicy, GateAnswer, GateFuture, WriteRequest,
};
use tokio::sync::{mpsc, oneshot};

use super::store::{ApprovalStore, StoredApproval};
use super::*;
use crate::audit::{AuditLog, AuditRecord, args_digest};

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
