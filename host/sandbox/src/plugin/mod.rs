//! Third-party tool plugins: a component with a TOML manifest in the operator's plugins directory.
//! The manifest says what the plugin is (name, version, the SHA-256 of its component) and what it
//! asks for (workspace access, network hosts, environment names); the operator's config says what
//! each plugin is granted. A plugin runs with the intersection of both, never more, and with
//! nothing at all when the operator granted it nothing. This module parses and checks manifests,
//! verifies digests on the very bytes it then compiles, decides the effective grant (refusing
//! environment names that are or look like secrets), and loads each plugin through the
//! [`Sandbox`](crate::Sandbox) — so a component importing an interface that is not granted is
//! refused there with the reason. One bad plugin is reported and skipped; it never stops the
//! others from loading.
//!
//! Here: `component` what a component's bytes import and export; `manifest` the two TOML inputs (the plugin's manifest, the operator's `[plugins]`
//! section) and their checks; `decide` the effective grant; `lock` the record of the plugins
//! installed from a registry (`plugins.lock`), which the loader holds each of them to; `loader`
//! finding, verifying and loading the plugins of a directory.

mod component;
mod decide;
mod loader;
mod lock;
mod manifest;

pub use component::{component_names, is_component};
pub use decide::{Decision, HOST_SECRET_ENV, SECRET_LIKE_SUFFIXES, decide, looks_like_secret};
pub use loader::{
    LoadedPlugin, PluginLoader, PluginLocation, PluginReport, PluginTool, RefusedPlugin,
};
pub use lock::{LOCK_FILE, LockedPlugin, PluginLock, lock_path, parse_lock, read_lock, write_lock};
pub use manifest::{
    Capabilities, MANIFEST_FILE, Manifest, OperatorGrant, PluginsSection, WorkspaceAccess,
    check_capabilities, check_plugin_name, check_version, parse_manifest, read_manifest,
};
