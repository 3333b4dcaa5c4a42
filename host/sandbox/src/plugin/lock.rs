//! `plugins.lock`, beside the plugins: for each plugin installed from a registry, where it came
//! from, the manifest digest it resolved to, the SHA-256 of its component and the grants the
//! operator accepted when it was installed. The loader holds a locked plugin to it: a component
//! whose digest is not the locked one, or a manifest asking for more than was accepted, is
//! refused, so what starts is exactly what was installed, whatever a tag points to now.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clawcage_core::files::{Symlinks, read_regular_file};
use serde::{Deserialize, Serialize};

use super::manifest::{Capabilities, check_capabilities, check_plugin_name, check_version};

/// The lock file's name inside the plugins directory.
pub const LOCK_FILE: &str = "plugins.lock";

/// The format this build writes and reads.
const LOCK_VERSION: u32 = 1;

/// Largest lock file read, in bytes.
const MAX_LOCK_BYTES: u64 = 1 << 20;

/// The comment at the head of every lock file written.
const HEADER: &str = "# Written by `clawcage plugins install` and `clawcage plugins update`; do not edit.\n\
# Each plugin loads only with the component digest and the grants recorded here.\n\n";

/// The whole lock file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PluginLock {
    /// The format, 1.
    pub version: u32,
    /// One entry per installed plugin, sorted by name.
    #[serde(default, rename = "plugin", skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<LockedPlugin>,
}

impl Default for PluginLock {
    fn default() -> Self {
        Self {
            version: LOCK_VERSION,
            plugins: Vec::new(),
        }
    }
}

/// One plugin installed from a registry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPlugin {
    /// The plugin's name; its directory in the plugins directory has the same name.
    pub name: String,
    /// The version it was published as.
    pub version: String,
    /// Where it is installed from: `oci://REGISTRY/REPOSITORY:TAG` (or `@sha256:...`).
    pub source: String,
    /// The digest of the artifact's manifest (`sha256:...`), what the source resolved to.
    pub digest: String,
    /// The lowercase hex SHA-256 of the component.
    pub component_sha256: String,
    /// Who signed it: `key SHA256:...` of a trusted key, or `unsigned` when the operator allowed
    /// that.
    pub signed_by: String,
    /// The grants the plugin asked for when the operator installed it.
    #[serde(default)]
    pub capabilities: Capabilities,
}

impl PluginLock {
    /// The entry of plugin `name`.
    pub fn get(&self, name: &str) -> Option<&LockedPlugin> {
        self.plugins.iter().find(|plugin| plugin.name == name)
    }

    /// Adds `plugin`, replacing the entry of the same name.
    pub fn put(&mut self, plugin: LockedPlugin) {
        self.plugins.retain(|known| known.name != plugin.name);
        self.plugins.push(plugin);
        self.plugins.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// Removes the entry of `name`; whether there was one.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.plugins.len();
        self.plugins.retain(|known| known.name != name);
        self.plugins.len() != before
    }
}

/// The lock file of the plugins directory `dir`.
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join(LOCK_FILE)
}

/// Reads and checks the lock file of `dir`; an empty lock when there is none.
pub fn read_lock(dir: &Path) -> Result<PluginLock, String> {
    let path = lock_path(dir);
    let bytes = match read_regular_file(&path, MAX_LOCK_BYTES, Symlinks::Refuse) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(PluginLock::default());
        }
        Err(error) => return Err(format!("{} cannot be read: {error}", path.display())),
    };
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    parse_lock(&text).map_err(|error| {
        format!(
            "{} is not valid: {error}; restore it from your backup or version control, or remove it and install the plugins again",
            path.display()
        )
    })
}

/// Parses and checks lock text.
pub fn parse_lock(text: &str) -> Result<PluginLock, String> {
    let lock: PluginLock = toml::from_str(text).map_err(|error| error.to_string())?;
    if lock.version != LOCK_VERSION {
        return Err(format!(
            "it is format {} and this clawcage reads format {LOCK_VERSION}",
            lock.version
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for plugin in &lock.plugins {
        check_plugin_name(&plugin.name)?;
        check_version(&plugin.version)?;
        check_capabilities(&plugin.capabilities)?;
        if !names.insert(plugin.name.as_str()) {
            return Err(format!("plugin {} is listed twice", plugin.name));
        }
        if !is_sha256_hex(&plugin.component_sha256) {
            return Err(format!(
                "the component_sha256 of {} is not 64 lowercase hex digits",
                plugin.name
            ));
        }
        let digest_ok = plugin
            .digest
            .strip_prefix("sha256:")
            .is_some_and(is_sha256_hex);
        if !digest_ok {
            return Err(format!(
                "the digest of {} is not sha256: and 64 lowercase hex digits",
                plugin.name
            ));
        }
    }
    Ok(lock)
}

/// Writes `lock` as the lock file of `dir`, atomically (a temporary file renamed over it).
pub fn write_lock(dir: &Path, lock: &PluginLock) -> Result<(), String> {
    let path = lock_path(dir);
    let text = toml::to_string(lock)
        .map_err(|error| format!("the lock file cannot be written: {error}"))?;
    let temporary = dir.join(format!(".{LOCK_FILE}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(HEADER.as_bytes())?;
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&temporary, &path));
    written.map_err(|error| {
        let _ = std::fs::remove_file(&temporary);
        format!("cannot write {}: {error}", path.display())
    })
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;
    use crate::plugin::WorkspaceAccess;

    fn entry(name: &str) -> LockedPlugin {
        LockedPlugin {
            name: name.to_string(),
            version: "1.0.0".to_string(),
            source: format!("oci://127.0.0.1:5000/tools/{name}:1.0.0"),
            digest: format!("sha256:{}", "a".repeat(64)),
            component_sha256: "b".repeat(64),
            signed_by: "unsigned".to_string(),
            capabilities: Capabilities {
                workspace: Some(WorkspaceAccess::ReadOnly),
                network: vec!["api.example.com".to_string()],
                env: Vec::new(),
            },
        }
    }

    #[test]
    fn a_written_lock_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let mut lock = PluginLock::default();
        lock.put(entry("zeta"));
        lock.put(entry("alpha"));
        write_lock(dir.path(), &lock).unwrap();
        let read = read_lock(dir.path()).unwrap();
        assert_eq!(read, lock);
        assert_eq!(read.plugins[0].name, "alpha");
        assert!(
            std::fs::read_to_string(lock_path(dir.path()))
                .unwrap()
                .starts_with("# Written by")
        );
    }

    #[test]
    fn a_missing_lock_is_empty_and_a_bad_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_lock(dir.path()).unwrap(), PluginLock::default());
        std::fs::write(
            lock_path(dir.path()),
            "version = 1\n[[plugin]]\nname = \"../x\"\n",
        )
        .unwrap();
        let error = read_lock(dir.path()).unwrap_err();
        assert!(error.contains("is not valid"), "{error}");
        let doubled = format!(
            "{}\n{}",
            toml::to_string(&PluginLock {
                version: 1,
                plugins: vec![entry("a")]
            })
            .unwrap(),
            toml::to_string(&PluginLock {
                version: 1,
                plugins: vec![entry("a")]
            })
            .unwrap()
            .replace("version = 1\n", "")
        );
        assert!(parse_lock(&doubled).unwrap_err().contains("twice"));
        let bad_digest = toml::to_string(&PluginLock {
            version: 1,
            plugins: vec![entry("a")],
        })
        .unwrap()
        .replace("sha256:aaaa", "sha512:aaaa");
        assert!(parse_lock(&bad_digest).unwrap_err().contains("digest"));
        assert!(
            parse_lock("version = 2\n")
                .unwrap_err()
                .contains("format 2")
        );
    }
}
