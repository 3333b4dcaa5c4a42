//! The security boundary of clawcage and the only crate that depends on wasmtime. It owns the
//! engine (pooling allocator, epoch interruption), the compiled-artifact cache, the capability
//! [`Grants`] and [`WasmTool`], which runs one tool of a component in a fresh store and instance
//! per call (made ahead of the call, used once). Nothing a tool returns or does reaches the host except through the WIT contract in
//! `wit/`; a trap, timeout or exhausted memory comes back as [`clawcage_core::ToolError::Failed`].
//! Third-party [`plugin`]s are verified and granted here too, so every grant decision lives in
//! this crate.

mod adapter;
mod asked_writes;
mod bindings;
pub mod bundled;
pub mod cache;
mod clock;
mod directory_listing;
pub mod env;
pub mod grants;
mod host;
pub mod install;
mod load_once;
pub mod network;
pub mod plugin;
mod prepared;
mod process;
mod program_store;
pub mod programs;
pub mod progress;
mod sandbox;
mod scheduler;
mod special_files;
mod tool;
mod wasi_context;
mod workspace_text;

pub use bundled::{BundledComponent, ComponentCode, DamagedComponent};
pub use cache::{ArtifactCache, CacheOutcome};
pub use env::{EnvError, EnvGrant};
pub use grants::{ExecGrant, FsMode, GrantError, Grants, Limits, WorkspaceGrant};
pub use network::{AllowList, NetworkLimits, NetworkPolicy, Secret, SecretValue};
pub use plugin::{
    LoadedPlugin, PluginLoader, PluginReport, PluginTool, PluginsSection, RefusedPlugin,
};
pub use programs::{ProgramCatalog, ProgramDirs};
pub use progress::CompileProgress;
pub use sandbox::{LoadError, LoadedComponent, Sandbox, SandboxOptions};
pub use tool::WasmTool;
pub use workspace_text::{LineRange, WorkspaceTextError};

/// The components built from `tools-wasm/` by this crate's build script.
pub mod components {
    include!(concat!(env!("OUT_DIR"), "/components.rs"));
}
