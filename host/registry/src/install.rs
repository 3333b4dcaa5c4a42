//! Installing, restoring, updating and removing plugins: the operator's side of `clawcage
//! plugins` (publishing is `publish`). An install resolves the reference to a manifest digest,
//! checks the signature on that digest before anything else is downloaded, downloads the
//! component checked against its digest, writes the plugin directory (component and
//! `plugin.toml`) beside the others and records it in `plugins.lock`. The lock wins over the
//! registry: an installed plugin is replaced only by `update`, which shows what changed and
//! refuses a plugin asking for more than was accepted unless the operator accepts it; `restore`
//! fetches exactly the locked digests. Installing never grants anything: the operator's
//! `[plugins.grants.NAME]` still decides.

use std::path::{Path, PathBuf};

use clawcage_sandbox::plugin::{
    Capabilities, LockedPlugin, MANIFEST_FILE, PluginLock, parse_manifest, read_lock,
    read_manifest, write_lock,
};
use serde::Serialize;

use crate::artifact::{ImageManifest, PluginArtifact};
use crate::client::{RegistryClient, RegistryLimits};
use crate::credentials::{credential_files, lookup};
use crate::digest::Digest;
use crate::reference::Reference;
use crate::signature::{TrustedKeys, Verdict, verify};

/// What `signed_by` says of a plugin the operator allowed unsigned.
pub const UNSIGNED: &str = "unsigned";

/// Where plugins go and what an install trusts.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The plugins directory (`[plugins] dir`).
    pub plugins_dir: PathBuf,
    /// `[plugins] trusted_keys`, read.
    pub trusted: TrustedKeys,
    /// `[plugins] allow_unsigned`.
    pub allow_unsigned: Vec<String>,
    /// The registry credentials files to search.
    pub credential_files: Vec<PathBuf>,
    /// Sizes and times.
    pub limits: RegistryLimits,
}

impl Settings {
    /// The credentials files of this process's environment and home directory.
    pub fn default_credential_files() -> Vec<PathBuf> {
        let env = |name: &str| std::env::var(name).ok();
        let home = std::env::var_os("HOME").map(PathBuf::from);
        credential_files(&env, home.as_deref())
    }
}

/// A plugin fetched and checked, not yet written.
#[derive(Debug)]
pub struct Fetched {
    /// The reference, pinned to the digest it resolved to.
    pub reference: Reference,
    /// The artifact.
    pub artifact: PluginArtifact,
    /// The component's bytes, digest checked.
    pub component: Vec<u8>,
    /// `key sha256:...` or [`UNSIGNED`].
    pub signed_by: String,
    /// Things the operator should know.
    pub warnings: Vec<String>,
}

impl Fetched {
    /// What the plugin asks for.
    pub fn asked(&self) -> &Capabilities {
        &self.artifact.plugin.capabilities
    }
}

/// Resolves `reference`, checks its signature, then downloads its component. Progress goes to
/// `progress`, one line at a time.
pub async fn fetch(
    settings: &Settings,
    reference: &Reference,
    progress: &mut dyn FnMut(String),
) -> Result<Fetched, String> {
    let found = lookup(&settings.credential_files, reference.credentials_key());
    let mut warnings = found.warnings;
    let client = RegistryClient::new(reference, found.credentials, settings.limits);
    progress(format!("resolving {reference}"));
    let manifest = client
        .manifest(&reference.repository, &reference.manifest_reference())
        .await
        .map_err(|error| format!("{reference}: {error}"))?;
    let pinned = reference.pinned(&manifest.digest);
    let image = ImageManifest::parse(&manifest.bytes, manifest.content_type.as_deref())
        .map_err(|error| format!("{reference} is not a plugin: {error}"))?;
    let artifact = PluginArtifact::read(
        manifest.digest.clone(),
        image,
        &reference.repository,
        reference.tag.as_deref(),
    )
    .map_err(|error| format!("{reference} is not a plugin: {error}"))?;
    let name = artifact.plugin.name.clone();
    if !artifact.described {
        warnings.push(format!(
            "{reference} carries no plugin manifest (annotation {}): it installs as `{name}`, asking for nothing",
            crate::artifact::PLUGIN_ANNOTATION
        ));
    }
    progress(format!("checking the signature of {}", manifest.digest));
    let verdict = verify(
        &client,
        &reference.repository,
        &manifest.digest,
        &settings.trusted,
    )
    .await
    .map_err(|error| format!("{reference}: the signature could not be checked: {error}"))?;
    let signed_by = match verdict {
        Verdict::Trusted { key } => format!("key {key}"),
        Verdict::Untrusted { why } if settings.allow_unsigned.contains(&name) => {
            warnings.push(format!(
                "{name} has no signature by a trusted key ({why}); installed because [plugins] allow_unsigned names it"
            ));
            UNSIGNED.to_string()
        }
        Verdict::Untrusted { why } => {
            return Err(format!(
                "{reference} ({}) is refused: it is not signed by a trusted key: {why}. Add its publisher's public key to [plugins] trusted_keys, or, to install it unsigned, add \"{name}\" to [plugins] allow_unsigned",
                manifest.digest
            ));
        }
    };
    let layer = &artifact.component;
    let digest = layer
        .checked_digest()
        .map_err(|error| format!("{reference}: its component layer: {error}"))?;
    progress(format!(
        "downloading {name} {} ({})",
        artifact.plugin.version,
        human_bytes(layer.size)
    ));
    let component = client
        .blob(
            &reference.repository,
            &digest,
            layer.size,
            &format!("the component of {name}"),
        )
        .await
        .map_err(|error| format!("{reference}: {error}"))?;
    if !clawcage_sandbox::plugin::is_component(&component) {
        return Err(format!(
            "{reference}: its layer is not a WebAssembly component; a plugin is a component"
        ));
    }
    Ok(Fetched {
        reference: pinned,
        artifact,
        component,
        signed_by,
        warnings,
    })
}

/// The name of the file whose lock makes one `clawcage plugins` command at a time change a
/// plugins directory (hidden: the loader skips it).
const GUARD_FILE: &str = ".plugins.lock.guard";

/// Holds the plugins directory for one command that changes it; released when dropped. A second
/// command waits (and says so) rather than losing the first one's lock entry.
async fn hold_directory(
    plugins_dir: &Path,
    progress: &mut dyn FnMut(String),
) -> Result<std::fs::File, String> {
    std::fs::create_dir_all(plugins_dir)
        .map_err(|error| format!("cannot create {}: {error}", plugins_dir.display()))?;
    let path = plugins_dir.join(GUARD_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|error| format!("cannot open {}: {error}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            progress(format!(
                "waiting for another clawcage plugins command on {}",
                plugins_dir.display()
            ));
            tokio::task::spawn_blocking(move || file.lock().map(|()| file))
                .await
                .map_err(|error| format!("cannot wait for {}: {error}", path.display()))?
                .map_err(|error| format!("cannot lock {}: {error}", path.display()))
        }
        Err(std::fs::TryLockError::Error(error)) => {
            Err(format!("cannot lock {}: {error}", path.display()))
        }
    }
}

/// What an install did.
#[derive(Debug)]
pub struct Installed {
    /// The lock entry written (or already there).
    pub locked: LockedPlugin,
    /// Whether it was there already, at the same digest.
    pub already: bool,
    /// Things the operator should know.
    pub warnings: Vec<String>,
    /// The plugin's description.
    pub description: Option<String>,
}

/// Installs the plugin `reference` names. A plugin already installed from the registry stays as
/// locked: installing it again at another digest is refused (that is `update`).
pub async fn install(
    settings: &Settings,
    reference: &Reference,
    progress: &mut dyn FnMut(String),
) -> Result<Installed, String> {
    let _held = hold_directory(&settings.plugins_dir, progress).await?;
    let lock = read_lock(&settings.plugins_dir)?;
    let fetched = fetch(settings, reference, progress).await?;
    let name = fetched.artifact.plugin.name.clone();
    if let Some(locked) = lock.get(&name) {
        if locked.digest == fetched.artifact.digest.to_string() {
            let locked = locked.clone();
            if installed_state(&settings.plugins_dir, &locked) != State::Intact {
                write_plugin(&settings.plugins_dir, &fetched)?;
            }
            return Ok(Installed {
                locked,
                already: true,
                warnings: fetched.warnings,
                description: fetched.artifact.plugin.description.clone(),
            });
        }
        return Err(format!(
            "{name} is already installed from {} at {}, and {reference} is {}. The lock keeps the installed one; run `clawcage plugins update {name}` to move to the new one (what changes is shown first)",
            locked.source, locked.digest, fetched.artifact.digest
        ));
    }
    let dir = settings.plugins_dir.join(&name);
    if dir.exists() {
        return Err(format!(
            "{} exists and was not installed from a registry; remove it first (or install this plugin under another name)",
            dir.display()
        ));
    }
    let locked = write_plugin(&settings.plugins_dir, &fetched)?;
    let mut lock = lock;
    lock.put(locked.clone());
    write_lock(&settings.plugins_dir, &lock)?;
    Ok(Installed {
        locked,
        already: false,
        warnings: fetched.warnings,
        description: fetched.artifact.plugin.description.clone(),
    })
}

/// The state of an installed plugin's files against its lock entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The component and manifest are the locked ones.
    Intact,
    /// Its directory or component is missing.
    Missing,
    /// Its component or manifest is not the locked one.
    Changed,
}

impl State {
    /// A word for listings.
    pub fn word(self) -> &'static str {
        match self {
            State::Intact => "installed",
            State::Missing => "missing",
            State::Changed => "changed",
        }
    }
}

/// Whether the files of `locked` in `plugins_dir` are the locked ones.
pub fn installed_state(plugins_dir: &Path, locked: &LockedPlugin) -> State {
    let manifest_path = plugins_dir.join(&locked.name).join(MANIFEST_FILE);
    let Ok(manifest) = read_manifest(&manifest_path) else {
        return if manifest_path.exists() {
            State::Changed
        } else {
            State::Missing
        };
    };
    let component = plugins_dir.join(&locked.name).join(&manifest.component);
    let Ok(bytes) = std::fs::read(&component) else {
        return State::Missing;
    };
    let intact = manifest.name == locked.name
        && manifest.sha256 == locked.component_sha256
        && Digest::of(&bytes).hex() == locked.component_sha256
        && manifest
            .capabilities
            .beyond(&locked.capabilities)
            .is_empty();
    if intact {
        State::Intact
    } else {
        State::Changed
    }
}

/// What restoring one locked plugin did.
#[derive(Debug)]
pub struct Restored {
    /// The plugin's name.
    pub name: String,
    /// Its state before.
    pub before: State,
    /// Things the operator should know.
    pub warnings: Vec<String>,
}

/// Makes every plugin of the lock what the lock says: each missing or changed one fetched again
/// by its locked digest, whatever its tag points to now.
pub async fn restore(
    settings: &Settings,
    progress: &mut dyn FnMut(String),
) -> Result<Vec<Restored>, String> {
    let _held = hold_directory(&settings.plugins_dir, progress).await?;
    let lock = read_lock(&settings.plugins_dir)?;
    let mut restored = Vec::new();
    for locked in &lock.plugins {
        let before = installed_state(&settings.plugins_dir, locked);
        if before == State::Intact {
            restored.push(Restored {
                name: locked.name.clone(),
                before,
                warnings: Vec::new(),
            });
            continue;
        }
        let source = Reference::parse(&locked.source)?;
        let digest = Digest::parse(&locked.digest)?;
        let fetched = fetch(settings, &source.pinned(&digest), progress).await?;
        check_same_plugin(&fetched, locked)?;
        write_plugin(&settings.plugins_dir, &fetched)?;
        restored.push(Restored {
            name: locked.name.clone(),
            before,
            warnings: fetched.warnings,
        });
    }
    Ok(restored)
}

fn check_same_plugin(fetched: &Fetched, locked: &LockedPlugin) -> Result<(), String> {
    let component = Digest::of(&fetched.component);
    if fetched.artifact.plugin.name != locked.name || component.hex() != locked.component_sha256 {
        return Err(format!(
            "{} at {} is not the locked plugin {} (component {}); refused",
            fetched.reference, locked.digest, locked.name, locked.component_sha256
        ));
    }
    Ok(())
}

/// What an update found or did.
#[derive(Debug)]
pub struct Updated {
    /// The entry before.
    pub old: LockedPlugin,
    /// The entry after (equal to `old` when nothing changed).
    pub new: LockedPlugin,
    /// What the new version asks for beyond what was accepted.
    pub more: Vec<String>,
    /// What it no longer asks for.
    pub fewer: Vec<String>,
    /// Things the operator should know.
    pub warnings: Vec<String>,
}

/// Moves the lock of `name` to what its source's tag points to now, if that changed. A new
/// version asking for grants beyond the accepted ones is refused unless `accept_grants`.
pub async fn update(
    settings: &Settings,
    name: &str,
    accept_grants: bool,
    progress: &mut dyn FnMut(String),
) -> Result<Updated, String> {
    let _held = hold_directory(&settings.plugins_dir, progress).await?;
    let mut lock = read_lock(&settings.plugins_dir)?;
    let Some(old) = lock.get(name).cloned() else {
        return Err(not_locked(&lock, name));
    };
    let source = Reference::parse(&old.source)?;
    if source.tag.is_none() {
        return Err(format!(
            "{name} was installed by digest ({}); there is no tag to follow. Install another version with `clawcage plugins remove {name}` and `clawcage plugins install`",
            old.source
        ));
    }
    let fetched = fetch(settings, &source.unpinned(), progress).await?;
    if fetched.artifact.plugin.name != name {
        return Err(format!(
            "{} is now the plugin `{}`, not `{name}`; refused",
            old.source, fetched.artifact.plugin.name
        ));
    }
    let asked = fetched.asked().clone();
    let more = asked.beyond(&old.capabilities);
    let fewer = old.capabilities.beyond(&asked);
    if fetched.artifact.digest.to_string() == old.digest {
        if installed_state(&settings.plugins_dir, &old) != State::Intact {
            write_plugin(&settings.plugins_dir, &fetched)?;
        }
        return Ok(Updated {
            new: old.clone(),
            old,
            more: Vec::new(),
            fewer: Vec::new(),
            warnings: fetched.warnings,
        });
    }
    if !more.is_empty() && !accept_grants {
        return Err(format!(
            "{name} {} ({}) asks for more than was accepted: {}. Nothing was changed. To accept, run `clawcage plugins update {name} --accept-grants` (your [plugins.grants.{name}] still decides what it gets)",
            fetched.artifact.plugin.version,
            fetched.artifact.digest,
            more.join(", ")
        ));
    }
    let new = write_plugin(&settings.plugins_dir, &fetched)?;
    lock.put(new.clone());
    write_lock(&settings.plugins_dir, &lock)?;
    Ok(Updated {
        old,
        new,
        more,
        fewer,
        warnings: fetched.warnings,
    })
}

fn not_locked(lock: &PluginLock, name: &str) -> String {
    let names: Vec<&str> = lock
        .plugins
        .iter()
        .map(|plugin| plugin.name.as_str())
        .collect();
    if names.is_empty() {
        format!(
            "no plugin is installed from a registry, so there is no {name} to change (`clawcage plugins list` shows the plugins)"
        )
    } else {
        format!(
            "{name} is not installed from a registry; these are: {}",
            names.join(", ")
        )
    }
}

/// Removes plugin `name`: its directory and its lock entry. A plugin not installed from a
/// registry is refused: its directory is the operator's own.
pub async fn remove(
    settings: &Settings,
    name: &str,
    progress: &mut dyn FnMut(String),
) -> Result<(), String> {
    let _held = hold_directory(&settings.plugins_dir, progress).await?;
    let mut lock = read_lock(&settings.plugins_dir)?;
    if lock.get(name).is_none() {
        return Err(not_locked(&lock, name));
    }
    let dir = settings.plugins_dir.join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(format!("cannot remove {}: {error}", dir.display())),
    }
    lock.remove(name);
    write_lock(&settings.plugins_dir, &lock)
}

/// One plugin installed from a registry, for `plugins list`.
#[derive(Debug, Serialize)]
pub struct Listed {
    /// The lock entry.
    #[serde(flatten)]
    pub locked: LockedPlugin,
    /// Its files against the lock.
    pub state: State,
}

/// The plugins of the lock, with the state of their files.
pub fn list(plugins_dir: &Path) -> Result<Vec<Listed>, String> {
    let lock = read_lock(plugins_dir)?;
    Ok(lock
        .plugins
        .into_iter()
        .map(|locked| Listed {
            state: installed_state(plugins_dir, &locked),
            locked,
        })
        .collect())
}

/// The `plugin.toml` an install writes.
#[derive(Serialize)]
struct WrittenManifest<'a> {
    name: &'a str,
    version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    component: String,
    sha256: &'a str,
    capabilities: &'a Capabilities,
}

/// Writes the plugin directory of `fetched` (replacing one of the same name whole) and returns
/// its lock entry.
fn write_plugin(plugins_dir: &Path, fetched: &Fetched) -> Result<LockedPlugin, String> {
    let plugin = &fetched.artifact.plugin;
    let component_sha256 = Digest::of(&fetched.component).hex().to_string();
    let component_file = format!("{}.wasm", plugin.name);
    let manifest = toml::to_string(&WrittenManifest {
        name: &plugin.name,
        version: &plugin.version,
        description: plugin.description.as_deref(),
        component: component_file.clone(),
        sha256: &component_sha256,
        capabilities: &plugin.capabilities,
    })
    .map_err(|error| format!("the plugin manifest cannot be written: {error}"))?;
    parse_manifest(&manifest)?;
    std::fs::create_dir_all(plugins_dir)
        .map_err(|error| format!("cannot create {}: {error}", plugins_dir.display()))?;
    let pid = std::process::id();
    let staging = plugins_dir.join(format!(".{}.installing-{pid}", plugin.name));
    let old = plugins_dir.join(format!(".{}.replaced-{pid}", plugin.name));
    let target = plugins_dir.join(&plugin.name);
    let written = (|| -> std::io::Result<()> {
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir(&staging)?;
        std::fs::write(staging.join(&component_file), &fetched.component)?;
        std::fs::write(
            staging.join(MANIFEST_FILE),
            format!(
                "# Installed from {} by `clawcage plugins install`.\n{manifest}",
                fetched.reference
            ),
        )?;
        if target.exists() {
            std::fs::rename(&target, &old)?;
        }
        std::fs::rename(&staging, &target)?;
        let _ = std::fs::remove_dir_all(&old);
        Ok(())
    })();
    written.map_err(|error| {
        let _ = std::fs::remove_dir_all(&staging);
        if !target.exists() && old.exists() {
            let _ = std::fs::rename(&old, &target);
        }
        format!("cannot write the plugin into {}: {error}", target.display())
    })?;
    Ok(LockedPlugin {
        name: plugin.name.clone(),
        version: plugin.version.clone(),
        // A tag is what `update` follows; a plugin installed by digest alone keeps its digest.
        source: if fetched.reference.tag.is_some() {
            fetched.reference.unpinned().to_string()
        } else {
            fetched.reference.to_string()
        },
        digest: fetched.artifact.digest.to_string(),
        component_sha256,
        signed_by: fetched.signed_by.clone(),
        capabilities: plugin.capabilities.clone(),
    })
}

/// `12.3 MB`, `850 kB`, `512 bytes`.
pub fn human_bytes(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1_000_000.0)
    } else if bytes >= 1_000 {
        format!("{} kB", bytes / 1_000)
    } else {
        format!("{bytes} bytes")
    }
}
