//! The agent side of clawcage: the [`ToolRegistry`] an agent may call, the model
//! [`provider`]s, the ReAct [`AgentLoop`], [`Sessions`] with one lane and one JSONL transcript
//! per session key, the inbound [`MessageBus`], the outbound [`MessageTool`], the
//! [`SubagentManager`] with its `spawn` and `subagents` tools, the [`CronService`] behind the
//! `cron` tool, and the [`audit`]
//! log that records every call made through an [`AuditedRegistry`]. It depends on
//! `clawcage-core` only, never on the sandbox: tools reach it as `clawcage_core::Tool` objects,
//! so agent logic is tested without compiling wasm, and the sandbox cannot be bypassed from here.

pub mod agent_loop;
pub mod approvals;
pub mod audit;
pub mod budget;
pub mod bus;
pub mod compaction;
pub mod context;
pub mod cron;
pub mod events;
pub mod inbox;
pub mod memory;
pub mod message_tool;
pub mod notifications;
pub mod provider;
pub mod registry;
pub mod runs;
pub mod session;
pub mod skills;
pub mod state_dir;
pub mod subagent;
pub mod transcript;

pub use agent_loop::{
    AgentConfig, AgentError, AgentLoop, TurnEnd, TurnObserver, TurnOutcome, Verdict,
};
pub use approvals::{
    ApprovalBroker, ApprovalError, ApprovalRequest, ApprovalSettings, ApprovalStore, OperatorEvent,
    OperatorFilter, OperatorHandle, SessionPolicy,
};
pub use audit::{AuditLog, AuditRecord, AuditedRegistry};
pub use budget::{Budget, BudgetConfig, Metered, budget_account, charged_to};
pub use bus::{BusError, Delivery, MessageBus, Subscription};
pub use compaction::{Compaction, CompactionReason, Journaled, TurnJournal};
pub use context::{ContextPolicy, ModelWindow, TokenEstimator, WindowSource, context_window};
pub use cron::{CronOptions, CronService};
pub use inbox::{FileInbox, LaneInbox};
pub use message_tool::{MessageTool, OutboundMessage, SendCallback};
pub use notifications::{NotificationFront, NotificationRoute};
pub use provider::{Provider, ProviderError, ProviderEvents};
pub use registry::{RegistryError, ToolRegistry};
pub use session::{LaneInput, PendingTurn, Sessions, current_session_key};
pub use state_dir::StateDir;
pub use subagent::{
    SpawnError, SubagentConfig, SubagentManager, SubagentRecord, SubagentSetup, SubagentStatus,
};
pub use transcript::{JsonlTranscripts, TranscriptReplay, TranscriptStore};
