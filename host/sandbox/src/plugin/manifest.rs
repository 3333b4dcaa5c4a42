//! The two TOML inputs of a plugin and their checks: the plugin's manifest (`plugin.toml`, what
//! the plugin is and what it asks for) and the operator's `[plugins]` section (where plugins live
//! and what each is granted). Every name, version, digest, component path, host and environment
//! name is checked here, so what the rest of the module sees is well-formed.

use std::collections::BTreeMap;
use std::path::{Component as PathComponent, Path, PathBuf};

use clawcage_core::files::{Symlinks, read_regular_file};
use serde::{Deserialize, Serialize};

use crate::env::check_name;
use crate::grants::FsMode;

/// The manifest's file name inside a plugin directory.
pub const MANIFEST_FILE: &str = "plugin.toml";

/// Largest manifest read, in bytes.
const MAX_MANIFEST_BYTES: u64 = 64 << 10;

/// Workspace access, as a manifest asks for it or an operator grants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
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
    pub(super) fn mode(self) -> Option<FsMode> {
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// The workspace: `"ro"` or `"rw"`; absent for none. It is the only directory a plugin can be
    /// granted.
    #[serde(default)]
    pub workspace: Option<WorkspaceAccess>,
    /// Hosts (`name` or `name:port`) the plugin wants to reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<String>,
    /// Names of host environment variables the plugin wants to read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

impl Capabilities {
    /// What `self` asks for beyond `accepted`, one phrase each (`the workspace rw`, `network
    /// api.example.com`, `env NAME`); empty when `self` asks for nothing more.
    pub fn beyond(&self, accepted: &Capabilities) -> Vec<String> {
        let mut more = Vec::new();
        let asked = self.workspace.and_then(WorkspaceAccess::mode);
        let had = accepted.workspace.and_then(WorkspaceAccess::mode);
        if let Some(mode) = asked
            && had.is_none_or(|had| had < mode)
        {
            more.push(format!("the workspace {}", mode.as_str()));
        }
        for host in &self.network {
            if !accepted.network.contains(host) {
                more.push(format!("network {host}"));
            }
        }
        for name in &self.env {
            if !accepted.env.contains(name) {
                more.push(format!("env {name}"));
            }
        }
        more
    }

    /// One line: `workspace ro, network a.example, b.example, env NAME`, or `nothing`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(mode) = self.workspace.and_then(WorkspaceAccess::mode) {
            parts.push(format!("workspace {}", mode.as_str()));
        }
        if !self.network.is_empty() {
            parts.push(format!("network {}", self.network.join(", ")));
        }
        if !self.env.is_empty() {
            parts.push(format!("env {}", self.env.join(", ")));
        }
        if parts.is_empty() {
            "nothing".to_string()
        } else {
            parts.join("; ")
        }
    }
}

/// `[plugins]` in the operator's config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsSection {
    /// The plugins directory; relative paths are relative to the config file.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// `[plugins.grants.NAME]`: what each plugin is granted. A plugin without an entry is granted
    /// nothing beyond running.
    #[serde(default)]
    pub grants: BTreeMap<String, OperatorGrant>,
    /// Public keys (PEM files, ECDSA P-256 as `cosign generate-key-pair` writes them; relative
    /// paths are relative to the config file) whose signature a plugin installed from a registry
    /// must carry.
    #[serde(default)]
    pub trusted_keys: Vec<PathBuf>,
    /// Plugins (by name) that may be installed from a registry without a signature by a trusted
    /// key.
    #[serde(default)]
    pub allow_unsigned: Vec<String>,
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

impl PluginsSection {
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
        for plugin in &self.allow_unsigned {
            check_plugin_name(plugin)
                .map_err(|error| format!("[plugins] allow_unsigned: {error}"))?;
        }
        Ok(())
    }
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
    check_version(&manifest.version)
        .map_err(|error| format!("the manifest's {}", error.trim_start_matches("the ")))?;
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
    check_capabilities(&manifest.capabilities)?;
    Ok(manifest)
}

/// A plugin name: 1-64 characters of `a-z`, `0-9`, `_` and `-`.
/// Checks what a manifest asks for: every network host and environment name well-formed.
pub fn check_capabilities(capabilities: &Capabilities) -> Result<(), String> {
    for host in &capabilities.network {
        check_host(host).map_err(|error| format!("the manifest's network: {error}"))?;
    }
    for name in &capabilities.env {
        check_name(name).map_err(|error| format!("the manifest's env: {error}"))?;
    }
    Ok(())
}

/// Checks a version: 1-64 characters of letters, digits, `.`, `_`, `+` and `-`.
pub fn check_version(version: &str) -> Result<(), String> {
    let ok = !version.is_empty()
        && version.len() <= 64
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the version {version:?} must be 1-64 characters of letters, digits, `.`, `_`, `+` and `-`"
        ))
    }
}

/// Checks a plugin name: 1-64 characters of `a-z`, `0-9`, `_` and `-`.
pub fn check_plugin_name(name: &str) -> Result<(), String> {
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
    fn operator_grants_are_validated() {
        let config: PluginsSection = toml::from_str(
            "dir = \"plugins\"\n[grants.wc]\nworkspace = \"ro\"\nnetwork = [\"api.example.com\"]\nenv = [\"LANG\"]\n",
        )
        .unwrap();
        config.validate().unwrap();
        let bad: PluginsSection =
            toml::from_str("[grants.wc]\nnetwork = [\"http://x\"]\n").unwrap();
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("[plugins.grants.wc] network")
        );
        let bad_name: PluginsSection = toml::from_str("[grants.\"W C\"]\n").unwrap();
        assert!(bad_name.validate().is_err());
        assert!(toml::from_str::<PluginsSection>("[grants.wc]\nfiles = \"rw\"\n").is_err());
    }
}
