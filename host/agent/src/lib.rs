//! The agent side of clawcage. Today it holds the [`ToolRegistry`]: the set of tools one agent may
//! call, with the argument check that runs before any tool and the `exclude` that narrows it, and
//! the [`audit`] log that records every call made through an [`AuditedRegistry`]. It depends on
//! `clawcage-core` only, never on the sandbox, so agent logic is tested without wasm.

pub mod audit;
pub mod registry;

pub use audit::{AuditLog, AuditRecord, AuditedRegistry};
pub use registry::{RegistryError, ToolRegistry};
