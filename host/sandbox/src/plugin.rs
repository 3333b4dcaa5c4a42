//! Third-party tool plugins: a component with a TOML manifest in the operator's plugins directory.
//! The manifest says what the plugin is (name, version, the SHA-256 of its component) and what it
//! asks for (workspace access, network hosts, environment names); the operator's config says what
//! each plugin is granted. A plugin runs with the intersection of both, never more, and with
//! nothing at all when the operator granted it nothing. This module parses and checks manifests,
//! verifies digests on the very bytes it then compiles, decides the effective grant (refusing
//! environment names that are or look like secrets), and loads each plugin through the
//! [`Sandbox`] — so a component importing an interface that is not granted is refused there with
//! the reason. One bad plugin is reported and skipped; it never stops the others from loading.

use std::collections::BTreeMap;
use std::path::{Component as PathComponent, Path, PathBuf};
use std::sync::Arc;

use clawcage_core::files::{Symlinks, read_regular_file};
use clawcage_core::{BoxFuture, Tool, ToolError, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::env::{EnvGrant, check_name};
use crate::grants::{FsMode, Grants, WorkspaceGrant};
use crate::network::{AllowList, NetworkPolicy};
use crate::sandbox::{LoadError, Sandbox};
use crate::tool::WasmTool;

/// The manifest's file name inside a plugin directory.
pub const MANIFEST_FILE: &str = "plugin.toml";

/// Largest manifest read, in bytes.
const MAX_MANIFEST_BYTES: u64 = 64 << 10;
/// Largest component read, in bytes (a Python component is about 20 MiB).
const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// Environment variables of the host that hold its own credentials (the model providers' API
/// keys). They are never passed to a plugin, whatever the operator's grant says.
pub const HOST_SECRET_ENV: &[&str] = clawcage_core::CREDENTIAL_ENV;

/// Name endings that mark an environment variable as a likely secret. Such a name is passed only
/// when the operator lists it in `allow_secret_env` as well as in `env`.
pub const SECRET_LIKE_SUFFIXES: &[&str] = &["_KEY", "_TOKEN", "_SECRET", "_PASSWORD"];

/// Workspace access, as a manifest asks for it or an operator grants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum WorkspaceAccess {
    /// No files.
    #[serde(rename = "none")]
    None,
    /// Read-only.
    #[serde(rename = "ro")]
    ReadOnly,
    /// Read-write.
    #[serde(rename = "rw")]
    ReadWrite,
}

impl WorkspaceAccess {
    fn mode(self) -> Option<FsMode> {
        match self {
            WorkspaceAccess::None => None,
            WorkspaceAccess::ReadOnly => Some(FsMode::ReadOnly),
            WorkspaceAccess::ReadWrite => Some(FsMode::ReadWrite),
        }
    }
}

/// A plugin's manifest (`plugin.toml`, or `NAME.toml` beside its component). Unknown keys are an
/// error.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The plugin's name: 1-64 characters of `a-z`, `0-9`, `_` and `-`. The operator's grant is
    /// keyed by it.
    pub name: String,
    /// The plugin's version, shown in `clawcage tools` and the audit log.
    pub version: String,
    /// What the plugin is for (optional).
    #[serde(default)]
    pub description: Option<String>,
    /// The component file, relative to the manifest's directory.
    pub component: PathBuf,
    /// Lowercase hex SHA-256 of the component file.
    pub sha256: String,
    /// What the plugin asks for.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// What a plugin asks for in its manifest (`[capabilities]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// The workspace: `"ro"` or `"rw"`; absent for none. It is the only directory a plugin can be
    /// granted.
    #[serde(default)]
    pub workspace: Option<WorkspaceAccess>,
    /// Hosts (`name` or `name:port`) the plugin wants to reach.
    #[serde(default)]
    pub network: Vec<String>,
    /// Names of host environment variables the plugin wants to read.
    #[serde(default)]
    pub env: Vec<String>,
}

/// `[plugins]` in the operator's config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsConfig {
    /// The plugins directory; relative paths are relative to the config file.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// `[plugins.grants.NAME]`: what each plugin is granted. A plugin without an entry is granted
    /// nothing beyond running.
    #[serde(default)]
    pub grants: BTreeMap<String, OperatorGrant>,
}

/// What the operator grants one plugin (`[plugins.grants.NAME]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorGrant {
    /// `"none"`, `"ro"` or `"rw"` (absent: none). Never wider than the workspace's own mode.
    #[serde(default)]
    pub workspace: Option<WorkspaceAccess>,
    /// Hosts (`name` or `name:port`) the plugin may reach.
    #[serde(default)]
    pub network: Vec<String>,
    /// Host environment variables the plugin may read.
    #[serde(default)]
    pub env: Vec<String>,
    /// Names in `env` that look like secrets (`*_KEY`, `*_TOKEN`, `*_SECRET`, `*_PASSWORD`) and
    /// are to be passed all the same.
    #[serde(default)]
    pub allow_secret_env: Vec<String>,
}

impl PluginsConfig {
    /// Checks the operator's grants: every plugin name, host and variable name well-formed.
    pub fn validate(&self) -> Result<(), String> {
        for (plugin, grant) in &self.grants {
            let place = format!("[plugins.grants.{plugin}]");
            check_plugin_name(plugin).map_err(|error| format!("{place}: {error}"))?;
            for host in &grant.network {
                check_host(host).map_err(|error| format!("{place} network: {error}"))?;
            }
            for name in grant.env.iter().chain(&grant.allow_secret_env) {
                check_name(name).map_err(|error| format!("{place} env: {error}"))?;
            }
        }
        Ok(())
    }
}

/// The effective grant of one plugin, before it is bound to a workspace directory: what both the
/// manifest asks for and the operator grants, with the reasons for everything asked and not given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// Workspace access, if any.
    pub workspace: Option<FsMode>,
    /// Hosts both sides name.
    pub network: Vec<String>,
    /// Environment names both sides name and that passed the secret rule.
    pub env: Vec<String>,
    /// What was asked for and not granted, one sentence each.
    pub notes: Vec<String>,
}

/// Whether `name` looks like a secret by its ending (`_KEY`, `_TOKEN`, `_SECRET`, `_PASSWORD`,
/// any case) or is one of those words alone.
pub fn looks_like_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_LIKE_SUFFIXES
        .iter()
        .any(|suffix| upper.ends_with(suffix) || upper == suffix[1..])
}

/// The intersection of what `asked` and what `granted` allow. `host_secrets` are names that are
/// never passed; names that [look like secrets](looks_like_secret) pass only when the operator
/// lists them in `allow_secret_env`.
pub fn decide(
    asked: &Capabilities,
    granted: Option<&OperatorGrant>,
    host_secrets: &[String],
) -> Decision {
    let mut decision = Decision::default();
    let empty = OperatorGrant::default();
    let grant = match granted {
        Some(grant) => grant,
        None => {
            let asks_anything = asked.workspace.and_then(WorkspaceAccess::mode).is_some()
                || !asked.network.is_empty()
                || !asked.env.is_empty();
            if asks_anything {
                decision.notes.push(
                    "the operator's config has no grant for this plugin, so it gets nothing it asks for"
                        .to_string(),
                );
            }
            &empty
        }
    };

    let asked_mode = asked.workspace.and_then(WorkspaceAccess::mode);
    let granted_mode = grant.workspace.and_then(WorkspaceAccess::mode);
    decision.workspace = match (asked_mode, granted_mode) {
        (Some(asked), Some(granted)) => {
            if granted < asked {
                decision.notes.push(format!(
                    "asked for the workspace {}, granted {}",
                    asked.as_str(),
                    granted.as_str()
                ));
            }
            Some(asked.min(granted))
        }
        (Some(asked), None) => {
            if granted.is_some() {
                decision.notes.push(format!(
                    "asked for the workspace {}, not granted",
                    asked.as_str()
                ));
            }
            None
        }
        (None, _) => None,
    };

    for host in &asked.network {
        let wanted = host.to_ascii_lowercase();
        if grant
            .network
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(&wanted))
        {
            decision.network.push(wanted);
        } else if granted.is_some() {
            decision
                .notes
                .push(format!("asked for network host {host}, not granted"));
        }
    }

    for name in &asked.env {
        if !grant.env.contains(name) {
            if granted.is_some() {
                decision
                    .notes
                    .push(format!("asked for env {name}, not granted"));
            }
            continue;
        }
        if host_secrets.contains(name) {
            decision.notes.push(format!(
                "env {name} refused: it holds one of clawcage's own credentials, which never enter a sandbox"
            ));
            continue;
        }
        if looks_like_secret(name) && !grant.allow_secret_env.contains(name) {
            decision.notes.push(format!(
                "env {name} refused: its name looks like a secret; list it in allow_secret_env as well to pass it"
            ));
            continue;
        }
        decision.env.push(name.clone());
    }
    decision.network.sort();
    decision.network.dedup();
    decision.env.sort();
    decision.env.dedup();
    decision
}

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
    pub config: &'a PluginsConfig,
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
        let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
        for location in locations {
            match self.load_one(&location, &seen).await {
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

/// Reads and checks one manifest. It must be a regular file (a FIFO or a device is refused at
/// once, never waited on) of at most [`MAX_MANIFEST_BYTES`].
pub fn read_manifest(path: &Path) -> Result<Manifest, String> {
    let bytes = read_regular_file(path, MAX_MANIFEST_BYTES, Symlinks::Follow).map_err(|error| {
        match error.kind() {
            std::io::ErrorKind::NotFound => format!(
                "there is no {MANIFEST_FILE} in this directory; every plugin directory needs a manifest"
            ),
            // The message names the path and what is wrong (not a regular file, too large).
            std::io::ErrorKind::InvalidInput => format!(
                "the manifest cannot be used: {error}; a plugin's manifest is a small TOML file"
            ),
            _ => format!("the manifest {} cannot be read: {error}", path.display()),
        }
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("the manifest {} is not UTF-8 text", path.display()))?;
    parse_manifest(&text)
}

/// Parses and checks manifest text.
pub fn parse_manifest(text: &str) -> Result<Manifest, String> {
    let manifest: Manifest = toml::from_str(text).map_err(|error| {
        format!(
            "the manifest is malformed: {}",
            error.to_string().trim_end()
        )
    })?;
    check_plugin_name(&manifest.name).map_err(|error| format!("the manifest's {error}"))?;
    let version_ok = !manifest.version.is_empty()
        && manifest.version.len() <= 64
        && manifest
            .version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c));
    if !version_ok {
        return Err(format!(
            "the manifest's version {:?} must be 1-64 characters of letters, digits, `.`, `_`, `+` and `-`",
            manifest.version
        ));
    }
    let digest_ok = manifest.sha256.len() == 64
        && manifest
            .sha256
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if !digest_ok {
        return Err(format!(
            "the manifest's sha256 {:?} must be 64 lowercase hex digits (the output of `sha256sum COMPONENT`)",
            manifest.sha256
        ));
    }
    let plain_relative = manifest
        .component
        .components()
        .all(|part| matches!(part, PathComponent::Normal(_)))
        && manifest.component.components().next().is_some();
    if !plain_relative {
        return Err(format!(
            "the manifest's component {:?} must be a path inside the plugin's directory (no `..`, not absolute)",
            manifest.component
        ));
    }
    for host in &manifest.capabilities.network {
        check_host(host).map_err(|error| format!("the manifest's network: {error}"))?;
    }
    for name in &manifest.capabilities.env {
        check_name(name).map_err(|error| format!("the manifest's env: {error}"))?;
    }
    Ok(manifest)
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

/// A plugin name: 1-64 characters of `a-z`, `0-9`, `_` and `-`.
fn check_plugin_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name {name:?} must be 1-64 characters of a-z, 0-9, `_` and `-`"
        ))
    }
}

/// A network host entry: a DNS name or IP address, optionally with `:port`; no scheme, path or
/// wildcard.
fn check_host(entry: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "{entry:?} is not a host: {why}; write `name` or `name:port`"
        ))
    };
    if entry.contains("://") || entry.contains('/') {
        return bad("no scheme or path");
    }
    if entry.contains('*') {
        return bad("wildcards are not supported, list each host");
    }
    let (host, port) = match entry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, Some(port)),
        _ => (entry, None),
    };
    if let Some(port) = port
        && port.parse::<u16>().map_or(true, |port| port == 0)
    {
        return bad("the port must be 1-65535");
    }
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.chars().all(|c| {
            c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '[' || c == ']' || c == ':'
        });
    if host_ok {
        Ok(())
    } else {
        bad("invalid characters")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn manifest(extra: &str) -> String {
        format!(
            "name = \"wc\"\nversion = \"1.2.0\"\ncomponent = \"wc.wasm\"\nsha256 = \"{DIGEST}\"\n{extra}"
        )
    }

    fn caps(workspace: Option<WorkspaceAccess>, network: &[&str], env: &[&str]) -> Capabilities {
        Capabilities {
            workspace,
            network: network.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn grant(
        workspace: Option<WorkspaceAccess>,
        network: &[&str],
        env: &[&str],
        allow_secret_env: &[&str],
    ) -> OperatorGrant {
        OperatorGrant {
            workspace,
            network: network.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|s| s.to_string()).collect(),
            allow_secret_env: allow_secret_env.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_good_manifest_parses() {
        let parsed = parse_manifest(&manifest(
            "description = \"words\"\n[capabilities]\nworkspace = \"ro\"\nnetwork = [\"api.example.com:443\"]\nenv = [\"LANG\"]\n",
        ))
        .unwrap();
        assert_eq!(parsed.name, "wc");
        assert_eq!(
            parsed.capabilities.workspace,
            Some(WorkspaceAccess::ReadOnly)
        );
        assert_eq!(parsed.capabilities.network, ["api.example.com:443"]);
    }

    #[test]
    fn malformed_manifests_say_what_is_wrong() {
        let cases = [
            ("name = ", "malformed"),
            (
                "name = \"wc\"\nversion = \"1\"\ncomponent = \"x.wasm\"\n",
                "missing field `sha256`",
            ),
            (&manifest("colour = \"red\"\n"), "unknown field `colour`"),
            (
                &manifest("[capabilities]\ndirectories = [\"/etc\"]\n"),
                "unknown field `directories`",
            ),
            (
                &manifest("[capabilities]\nworkspace = \"rwx\"\n"),
                "unknown variant `rwx`",
            ),
            (
                &manifest("").replace("\"wc\"", "\"Bad Name\""),
                "name \"Bad Name\"",
            ),
            (&manifest("").replace(DIGEST, "abc"), "64 lowercase hex"),
            (
                &manifest("").replace(DIGEST, &DIGEST.to_uppercase()),
                "64 lowercase hex",
            ),
            (
                &manifest("").replace("wc.wasm", "../x.wasm"),
                "inside the plugin",
            ),
            (
                &manifest("").replace("wc.wasm", "/etc/x.wasm"),
                "inside the plugin",
            ),
            (&manifest("").replace("1.2.0", "1 2"), "version"),
            (
                &manifest("[capabilities]\nnetwork = [\"https://x.com/\"]\n"),
                "no scheme",
            ),
            (
                &manifest("[capabilities]\nnetwork = [\"*.x.com\"]\n"),
                "wildcards",
            ),
            (
                &manifest("[capabilities]\nnetwork = [\"x.com:0\"]\n"),
                "port",
            ),
            (
                &manifest("[capabilities]\nenv = [\"A=B\"]\n"),
                "not a valid environment",
            ),
            (
                &manifest("[capabilities]\nenv = [\"PWD\"]\n"),
                "set by the sandbox",
            ),
        ];
        for (text, expected) in cases {
            let error = parse_manifest(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }

    #[test]
    fn the_effective_grant_is_the_intersection() {
        let asked = caps(
            Some(WorkspaceAccess::ReadWrite),
            &["api.example.com", "evil.example"],
            &["LANG", "TZ", "HOME"],
        );
        let granted = grant(
            Some(WorkspaceAccess::ReadOnly),
            &["API.example.com", "other.example"],
            &["LANG", "TZ", "USER"],
            &[],
        );
        let decision = decide(&asked, Some(&granted), &[]);
        assert_eq!(decision.workspace, Some(FsMode::ReadOnly));
        assert_eq!(decision.network, ["api.example.com"]);
        assert_eq!(decision.env, ["LANG", "TZ"]);
        let notes = decision.notes.join("\n");
        assert!(
            notes.contains("asked for the workspace rw, granted ro"),
            "{notes}"
        );
        assert!(
            notes.contains("network host evil.example, not granted"),
            "{notes}"
        );
        assert!(notes.contains("env HOME, not granted"), "{notes}");
        assert!(!notes.contains("USER"), "granted but not asked: {notes}");

        // The operator grants more than asked: the plugin still gets only what it asked for.
        let wide = grant(
            Some(WorkspaceAccess::ReadWrite),
            &["a.example"],
            &["LANG"],
            &[],
        );
        let narrow = decide(
            &caps(Some(WorkspaceAccess::ReadOnly), &[], &[]),
            Some(&wide),
            &[],
        );
        assert_eq!(narrow.workspace, Some(FsMode::ReadOnly));
        assert!(narrow.network.is_empty() && narrow.env.is_empty());
    }

    #[test]
    fn no_grant_means_nothing() {
        let asked = caps(Some(WorkspaceAccess::ReadWrite), &["a.example"], &["LANG"]);
        let decision = decide(&asked, None, &[]);
        assert_eq!(decision.workspace, None);
        assert!(decision.network.is_empty() && decision.env.is_empty());
        assert!(decision.notes[0].contains("no grant for this plugin"));
        assert_eq!(decide(&Capabilities::default(), None, &[]).notes.len(), 0);
    }

    #[test]
    fn secrets_need_an_explicit_second_listing_and_host_credentials_never_pass() {
        let asked = caps(
            None,
            &[],
            &[
                "GITHUB_TOKEN",
                "DB_PASSWORD",
                "api_key",
                "OPENAI_API_KEY",
                "LANG",
            ],
        );
        let granted = grant(
            None,
            &[],
            &[
                "GITHUB_TOKEN",
                "DB_PASSWORD",
                "api_key",
                "OPENAI_API_KEY",
                "LANG",
            ],
            &["GITHUB_TOKEN", "OPENAI_API_KEY"],
        );
        let host_secrets: Vec<String> = HOST_SECRET_ENV.iter().map(|s| s.to_string()).collect();
        let decision = decide(&asked, Some(&granted), &host_secrets);
        assert_eq!(decision.env, ["GITHUB_TOKEN", "LANG"]);
        let notes = decision.notes.join("\n");
        assert!(
            notes.contains("env DB_PASSWORD refused: its name looks like a secret"),
            "{notes}"
        );
        assert!(notes.contains("env api_key refused"), "{notes}");
        assert!(
            notes
                .contains("env OPENAI_API_KEY refused: it holds one of clawcage's own credentials"),
            "{notes}"
        );
        assert!(looks_like_secret("TOKEN") && !looks_like_secret("KEYBOARD_LAYOUT"));
    }

    #[test]
    fn operator_grants_are_validated() {
        let config: PluginsConfig = toml::from_str(
            "dir = \"plugins\"\n[grants.wc]\nworkspace = \"ro\"\nnetwork = [\"api.example.com\"]\nenv = [\"LANG\"]\n",
        )
        .unwrap();
        config.validate().unwrap();
        let bad: PluginsConfig = toml::from_str("[grants.wc]\nnetwork = [\"http://x\"]\n").unwrap();
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("[plugins.grants.wc] network")
        );
        let bad_name: PluginsConfig = toml::from_str("[grants.\"W C\"]\n").unwrap();
        assert!(bad_name.validate().is_err());
        assert!(toml::from_str::<PluginsConfig>("[grants.wc]\nfiles = \"rw\"\n").is_err());
    }
}
