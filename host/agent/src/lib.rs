//! The agent side of clawcage. Today it holds the [`ToolRegistry`]: the set of tools one agent may
//! call, with the argument check that runs before any tool and the `exclude` that narrows it. It
//! depends on `clawcage-core` only, never on the sandbox, so agent logic is tested without wasm.

pub mod registry;

pub use registry::{RegistryError, ToolRegistry};
