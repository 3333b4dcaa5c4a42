//! The approvals contract between the sandbox and the agent: what a command line will run (the
//! [`ExecPlan`] the exec component reports before anything runs), the operator's exec policy
//! (`deny` / `allowlist` / `full`, allowlist entries, safe bins), the unwrapping of wrapper
//! programs (`timeout rm` is `rm`; `coreutils rm` is `rm`), and the [`ApprovalGate`] the sandbox
//! asks before an exec call and the [`ApprovedExec`] it checks every program against while the
//! call runs. Plain types and pure functions, so the rules are unit-tested without a runtime; the
//! agent crate implements the gate (the broker that asks a person). One file each: `plan`,
//! `glob`, `policy`, `unwrap`, `gate`, and their `tests`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

mod gate;
mod glob;
mod plan;
mod policy;
#[cfg(test)]
mod tests;
mod unwrap;

pub use gate::*;
pub use glob::*;
pub use plan::*;
pub use policy::*;
pub use unwrap::*;
