//! Loading the plugins of one directory: finding the manifests, reading each component and
//! checking its digest on the very bytes then compiled, binding the decided grant to this
//! process's workspace, limits and environment, and loading the component through the
//! [`Sandbox`] — turning a refused import into a reason in the terms of the manifest and the
//! operator's grant. Each plugin that fails is one [`RefusedPlugin`]; the others still load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawcage_core::files::{Symlinks, read_regular_file};
use clawcage_core::{BoxFuture, Tool, ToolError, ToolOutput, ToolSpec};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::env::EnvGrant;
use crate::grants::{Grants, WorkspaceGrant};
use crate::network::{AllowList, NetworkPolicy};
use crate::sandbox::{LoadError, Sandbox};
use crate::tool::WasmTool;

use super::decide::{Decision, decide};
use super::lock::{LOCK_FILE, LockedPlugin, PluginLock, lock_path, read_lock};
use super::manifest::{MANIFEST_FILE, Manifest, PluginsSection, read_manifest};

/// Largest component read, in bytes (a Python component is about 20 MiB).
const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// Where a plugin was found: its manifest, and the directory its component path is relative to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginLocation {
    /// The manifest file.
    pub manifest: PathBuf,
}

impl PluginLocation {
    fn base_dir(&self) -> &Path {
        self.manifest.parent().unwrap_or(Path::new("."))
    }
}

/// A plugin that could not be loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedPlugin {
    /// The manifest (or directory) in question.
    pub path: PathBuf,
    /// The plugin's name and version, when the manifest was readable.
    pub name: Option<String>,
    /// What went wrong and what to do about it.
    pub reason: String,
}

impl std::fmt::Display for RefusedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(name) => write!(
                f,
                "plugin {name} ({}): {}",
                self.path.display(),
                self.reason
            ),
            None => write!(f, "plugin at {}: {}", self.path.display(), self.reason),
        }
    }
}

/// A plugin that loaded: its identity, its effective grant and its tools.
#[derive(Debug, Clone)]
pub struct LoadedPlugin {
    /// The manifest's name.
    pub name: String,
    /// The manifest's version.
    pub version: String,
    /// The component's SHA-256, as verified.
    pub sha256: String,
    /// The manifest file.
    pub manifest: PathBuf,
    /// The effective grant, in one line.
    pub grants: String,
    /// What was asked for and not granted.
    pub notes: Vec<String>,
    /// The plugin's tools, bound to the effective grant.
    pub tools: Vec<PluginTool>,
}

impl LoadedPlugin {
    /// `plugin:NAME@VERSION`.
    pub fn origin(&self) -> String {
        origin(&self.name, &self.version)
    }
}

fn origin(name: &str, version: &str) -> String {
    format!("plugin:{name}@{version}")
}

/// What loading a plugins directory found.
#[derive(Debug, Clone, Default)]
pub struct PluginReport {
    /// The plugins that loaded, sorted by manifest path.
    pub loaded: Vec<LoadedPlugin>,
    /// The plugins that did not, with the reason.
    pub refused: Vec<RefusedPlugin>,
    /// Remarks about the configuration itself (e.g. a grant naming no installed plugin).
    pub warnings: Vec<String>,
}

/// One tool of a plugin: a [`WasmTool`] whose description of its grants also names the network
/// hosts the plugin was granted.
#[derive(Debug, Clone)]
pub struct PluginTool {
    inner: WasmTool,
    grants: String,
}

impl PluginTool {
    /// The sandboxed tool itself.
    pub fn wasm(&self) -> &WasmTool {
        &self.inner
    }
}

impl Tool for PluginTool {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        self.inner.call(args)
    }

    fn origin(&self) -> String {
        self.inner.origin()
    }

    fn grants_summary(&self) -> String {
        self.grants.clone()
    }

    fn grants_json(&self) -> Value {
        self.inner.grants_json()
    }
}

/// Loads every plugin of one directory with the operator's grants.
pub struct PluginLoader<'a> {
    /// The engine to load into.
    pub sandbox: &'a Arc<Sandbox>,
    /// The operator's `[plugins]` section.
    pub config: &'a PluginsSection,
    /// The grants every tool of this process runs under (workspace, limits); a plugin's grant is
    /// never wider.
    pub base: &'a Grants,
    /// Environment names that are never passed (the host's own credentials).
    pub host_secrets: Vec<String>,
    /// Reads a host environment variable (the process environment, or a fixed map in tests).
    pub host_env: &'a (dyn Fn(&str) -> Option<String> + Sync),
}

impl PluginLoader<'_> {
    /// Loads the plugins of the configured directory. Nothing here fails as a whole: each
    /// problem is one entry of [`PluginReport::refused`] or [`PluginReport::warnings`].
    pub async fn load_all(&self) -> PluginReport {
        let mut report = PluginReport::default();
        let Some(dir) = &self.config.dir else {
            for name in self.config.grants.keys() {
                report.warnings.push(format!(
                    "[plugins.grants.{name}] is set but [plugins] dir is not, so no plugin is loaded"
                ));
            }
            return report;
        };
        let locations = match discover(dir) {
            Ok(found) => found,
            Err(refused) => {
                report.refused.push(refused);
                return report;
            }
        };
        // A lock that cannot be read could hide a changed plugin: none of the directory loads.
        let lock = match read_lock(dir) {
            Ok(lock) => lock,
            Err(reason) => {
                report.refused.push(RefusedPlugin {
                    path: lock_path(dir),
                    name: None,
                    reason: format!("no plugin of this directory is loaded: {reason}"),
                });
                return report;
            }
        };
        let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
        for location in locations {
            match self.load_one(&location, &seen, &lock).await {
                Ok(plugin) => {
                    seen.insert(plugin.name.clone(), plugin.manifest.clone());
                    report.loaded.push(plugin);
                }
                Err(refused) => {
                    if let Some(name) = &refused.name {
                        // Keep the name taken, so a later duplicate is not loaded in its place.
                        let bare = name.split('@').next().unwrap_or(name).to_string();
                        seen.entry(bare)
                            .or_insert_with(|| location.manifest.clone());
                    }
                    report.refused.push(refused);
                }
            }
        }
        for locked in &lock.plugins {
            if !seen.contains_key(&locked.name) {
                report.warnings.push(format!(
                    "{} is in {LOCK_FILE} but not installed in {}; run `clawcage plugins install` to restore it as locked",
                    locked.name,
                    dir.display()
                ));
            }
        }
        for name in self.config.grants.keys() {
            if !seen.contains_key(name) {
                report.warnings.push(format!(
                    "[plugins.grants.{name}] names no plugin in {}",
                    dir.display()
                ));
            }
        }
        report
    }

    async fn load_one(
        &self,
        location: &PluginLocation,
        seen: &BTreeMap<String, PathBuf>,
        lock: &PluginLock,
    ) -> Result<LoadedPlugin, RefusedPlugin> {
        let refuse = |name: Option<String>, reason: String| RefusedPlugin {
            path: location.manifest.clone(),
            name,
            reason,
        };
        let manifest = read_manifest(&location.manifest).map_err(|reason| refuse(None, reason))?;
        let id = format!("{}@{}", manifest.name, manifest.version);
        if let Some(first) = seen.get(&manifest.name) {
            return Err(refuse(
                Some(id),
                format!(
                    "another plugin named `{}` is already installed at {}; plugin names must be unique",
                    manifest.name,
                    first.display()
                ),
            ));
        }

        let component_path = location.base_dir().join(&manifest.component);
        let bytes =
            read_component(&component_path).map_err(|reason| refuse(Some(id.clone()), reason))?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != manifest.sha256 {
            return Err(refuse(
                Some(id),
                format!(
                    "digest mismatch: the manifest says sha256 {} but {} has sha256 {actual}; the component is not the one the manifest describes (reinstall the plugin, or update sha256 if you built it yourself)",
                    manifest.sha256,
                    component_path.display()
                ),
            ));
        }
        if let Some(locked) = lock.get(&manifest.name) {
            check_against_lock(&manifest, &actual, locked)
                .map_err(|reason| refuse(Some(id.clone()), reason))?;
        }

        let decision = decide(
            &manifest.capabilities,
            self.config.grants.get(&manifest.name),
            &self.host_secrets,
        );
        let (grants, mut notes) = self.bind(&manifest.name, &decision);
        notes.splice(0..0, decision.notes.iter().cloned());

        // The digest was checked on these very bytes: they are compiled under it.
        let loaded = self
            .sandbox
            .load_code(
                &manifest.name,
                &origin(&manifest.name, &manifest.version),
                crate::sandbox::Code::Shared(std::sync::Arc::from(bytes)),
                &actual,
                grants,
            )
            .await
            .map_err(|error| refuse(Some(id.clone()), plugin_load_error(&manifest, &error)))?;
        let mut summary = String::new();
        let tools: Vec<PluginTool> = loaded
            .into_tools()
            .into_iter()
            .map(|tool| {
                let grants = tool.grants().describe();
                summary.clone_from(&grants);
                PluginTool {
                    inner: tool,
                    grants,
                }
            })
            .collect();
        Ok(LoadedPlugin {
            name: manifest.name,
            version: manifest.version,
            sha256: actual,
            manifest: location.manifest.clone(),
            grants: summary,
            notes,
            tools,
        })
    }

    /// The decision bound to this process's workspace and limits, with the host's values of the
    /// granted environment names.
    fn bind(&self, plugin_name: &str, decision: &Decision) -> (Grants, Vec<String>) {
        let mut notes = Vec::new();
        let mut asked = Grants::none().with_limits(self.base.limits);
        asked.workspace = match (&self.base.workspace, decision.workspace) {
            (Some(base), Some(mode)) => WorkspaceGrant::new(base.path(), mode).ok(),
            _ => None,
        };
        if let (Some(base), Some(mode)) = (&self.base.workspace, decision.workspace)
            && base.mode() < mode
        {
            notes.push(format!(
                "granted the workspace {}, narrowed to {} like every tool of this run",
                mode.as_str(),
                base.mode().as_str()
            ));
        }
        let mut vars = Vec::new();
        for name in &decision.env {
            match (self.host_env)(name) {
                Some(value) => vars.push((name.clone(), value)),
                None => notes.push(format!("env {name} is granted but not set on the host")),
            }
        }
        // The names were checked when the manifest was read.
        let env = EnvGrant::new(vars).unwrap_or_default();
        let mut grants = self.base.narrowed_by(&asked).with_env(env);
        // The hosts both manifest and operator list, and nothing else: a network policy of its
        // own (no secrets: those belong to the host's tools), with the usual address checks.
        if !decision.network.is_empty() {
            match AllowList::parse(decision.network.iter().map(String::as_str)) {
                Ok(allow) => {
                    grants = grants.with_network(
                        NetworkPolicy::new(allow).with_grant_key(&format!(
                            "[plugins.grants.{}] network in clawcage.toml (and the plugin manifest's [capabilities] network)",
                            plugin_name
                        )),
                    );
                }
                Err(error) => notes.push(format!("network not granted: {error}")),
            }
        }
        (grants, notes)
    }
}

/// Why a plugin's component did not load, in terms of the plugin's manifest and grant: an
/// import it needs that was not granted names what the manifest asked for, what the operator
/// granted and the exact key that would change it.
fn plugin_load_error(manifest: &Manifest, error: &LoadError) -> String {
    let LoadError::UngrantedImport { import, .. } = error else {
        return error.to_string();
    };
    let name = &manifest.name;
    let key = format!("[plugins.grants.{name}]");
    if import.starts_with("clawcage:tool/http@") || import.starts_with("wasi:http/") {
        let asked = if manifest.capabilities.network.is_empty() {
            "its manifest asks for no network ([capabilities] network is empty)".to_string()
        } else {
            format!(
                "its manifest asks for {}",
                manifest.capabilities.network.join(", ")
            )
        };
        return format!(
            "it imports `{import}` (outbound HTTP) but was granted no network: {asked}, and {key} network grants none of it. To let it reach a host, list the host in {key} network in clawcage.toml (and in the manifest's [capabilities] network)"
        );
    }
    format!(
        "it imports `{import}`, which plugins are not granted: only WASI, `clawcage:tool/log` and, with {key} network, outbound HTTP are"
    )
}

/// The manifests of a plugins directory, sorted: `DIR/*/plugin.toml` and `DIR/*.toml`.
fn discover(dir: &Path) -> Result<Vec<PluginLocation>, RefusedPlugin> {
    let refused = |reason: String| RefusedPlugin {
        path: dir.to_path_buf(),
        name: None,
        reason,
    };
    let entries = std::fs::read_dir(dir).map_err(|error| {
        refused(format!(
            "the plugins directory cannot be read ({error}); create it or fix [plugins] dir in the config"
        ))
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden {
            continue;
        }
        if path.is_dir() {
            // A directory without a manifest is reported by `read_manifest`.
            found.push(PluginLocation {
                manifest: path.join(MANIFEST_FILE),
            });
        } else if path
            .extension()
            .is_some_and(|extension| extension == "toml")
        {
            found.push(PluginLocation { manifest: path });
        }
    }
    found.sort_by(|a, b| a.manifest.cmp(&b.manifest));
    Ok(found)
}

/// Holds a plugin installed from a registry to its lock entry: the same component, asking for
/// nothing the operator did not accept.
fn check_against_lock(
    manifest: &Manifest,
    actual: &str,
    locked: &LockedPlugin,
) -> Result<(), String> {
    if actual != locked.component_sha256 {
        return Err(format!(
            "its component has sha256 {actual}, but {LOCK_FILE} locked {} at {}; run `clawcage plugins install` to restore the locked one, or `clawcage plugins update {}` to move the lock",
            locked.component_sha256, locked.source, manifest.name
        ));
    }
    let more = manifest.capabilities.beyond(&locked.capabilities);
    if !more.is_empty() {
        return Err(format!(
            "its manifest asks for {} beyond what was accepted when it was installed ({LOCK_FILE}); run `clawcage plugins update {}` to review the new grants",
            more.join(", "),
            manifest.name
        ));
    }
    Ok(())
}

/// The component's bytes: a regular file (a FIFO or a device is refused at once, never waited
/// on) of at most [`MAX_COMPONENT_BYTES`].
fn read_component(path: &Path) -> Result<Vec<u8>, String> {
    read_regular_file(path, MAX_COMPONENT_BYTES, Symlinks::Follow).map_err(|error| {
        if error.kind() == std::io::ErrorKind::InvalidInput {
            // The message names the path and what is wrong (not a regular file, too large).
            format!("its component cannot be used: {error}; check `component` in the manifest")
        } else {
            format!(
                "its component {} cannot be read ({error}); check `component` in the manifest",
                path.display()
            )
        }
    })
}
