//! The compiled-artifact cache: Cranelift's output for each component, stored on disk so only the
//! first start pays for compilation, and beside it what the host learnt by running the component
//! once (its tool specs and imports, or a multicall program's names), so later starts know a
//! component's tools without loading its code at all. An entry's key covers the component's
//! SHA-256 (computed at build time for bundled components), the wasmtime version and the engine's
//! configuration, so a changed component or engine never loads a stale entry. Entries are written
//! atomically (`clawcage_core::files::write_atomically`) and artifacts are mapped from the file,
//! not copied, when loaded.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use clawcage_core::files::{Symlinks, read_regular_file, write_atomically};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The wasmtime release this crate is pinned to; part of every cache key.
pub const WASMTIME_VERSION: &str = "48.0.8";

/// Where compiled components are kept, or nowhere.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: Option<PathBuf>,
}

/// Whether a component came from the cache or was compiled now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a cached artifact.
    Hit,
    /// Compiled now (and stored, if the cache is on).
    Compiled,
}

impl ArtifactCache {
    /// A cache in `dir` (created on first store).
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
        }
    }

    /// No cache: every load compiles.
    pub fn disabled() -> Self {
        Self { dir: None }
    }

    /// The cache directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The key of `bytes` compiled by `engine`: see [`ArtifactCache::key_for_digest`].
    pub fn key(engine: &Engine, bytes: &[u8]) -> String {
        Self::key_for_digest(engine, &sha256_hex(bytes))
    }

    /// The key of the component whose hex SHA-256 is `sha256` compiled by `engine`: hex SHA-256
    /// of that digest, the wasmtime version and the engine's compatibility hash. Cheap: bundled
    /// components have their digest computed at build time.
    pub fn key_for_digest(engine: &Engine, sha256: &str) -> String {
        let mut engine_hasher = DefaultHasher::new();
        engine
            .precompile_compatibility_hash()
            .hash(&mut engine_hasher);
        let mut digest = Sha256::new();
        digest.update(sha256.as_bytes());
        digest.update(WASMTIME_VERSION.as_bytes());
        digest.update(engine_hasher.finish().to_le_bytes());
        hex::encode(digest.finalize())
    }

    /// What was recorded beside the artifact of `key` under `kind` (e.g. `describe`), if the
    /// cache is on and holds a readable record.
    pub(crate) fn record(&self, key: &str, kind: &str) -> Option<Vec<u8>> {
        let path = self.dir.as_ref()?.join(format!("{key}.{kind}.json"));
        match read_regular_file(&path, RECORD_MAX_BYTES, Symlinks::Refuse) {
            Ok(bytes) => Some(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                tracing::warn!(path = %path.display(), "ignoring an unreadable cache record ({error})");
                None
            }
        }
    }

    /// Records `bytes` beside the artifact of `key` under `kind`; a failure is logged, never
    /// fatal (the next start learns it again).
    pub(crate) fn store_record(&self, key: &str, kind: &str, bytes: &[u8]) {
        let Some(dir) = &self.dir else {
            return;
        };
        let path = dir.join(format!("{key}.{kind}.json"));
        if let Err(error) = write_atomically(&path, bytes, false) {
            tracing::warn!(
                path = %path.display(),
                "could not write the component cache ({error}); the next start learns it again"
            );
        }
    }

    /// Whether a compiled artifact for `key` is on disk.
    pub fn has_artifact(&self, key: &str) -> bool {
        self.dir
            .as_ref()
            .is_some_and(|dir| dir.join(format!("{key}.cwasm")).is_file())
    }

    /// The component for `bytes`: from the cache when a valid entry exists, else compiled (and
    /// stored). A damaged entry is replaced; a cache that cannot be written is logged and
    /// skipped, never fatal.
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        self.load_keyed(engine, &Self::key(engine, bytes), bytes)
    }

    /// [`ArtifactCache::load`] with the key already known.
    pub fn load_keyed(
        &self,
        engine: &Engine,
        key: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let Some(dir) = &self.dir else {
            return Ok((Component::new(engine, bytes)?, CacheOutcome::Compiled));
        };
        let path = dir.join(format!("{key}.cwasm"));
        if path.exists() {
            match deserialize(engine, &path) {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(error) => tracing::warn!(
                    path = %path.display(),
                    "ignoring a damaged compiled-component cache entry ({error}); recompiling"
                ),
            }
        }
        let component = Component::new(engine, bytes)?;
        if let Err(error) = store(&path, &component) {
            tracing::warn!(
                dir = %dir.display(),
                "could not write the compiled-component cache ({error}); the next start compiles again"
            );
        }
        Ok((component, CacheOutcome::Compiled))
    }
}

/// Records beside an artifact are small JSON documents; anything larger is not one of ours.
const RECORD_MAX_BYTES: u64 = 16 << 20;

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[allow(
    unsafe_code,
    reason = "loading precompiled code is unsafe by wasmtime's contract"
)]
fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file was produced by `Component::serialize` of an engine with the same
    // compatibility hash (it is part of the file name) and written atomically by `store`, into a
    // directory owned by the operator. wasmtime additionally checks the header and engine
    // settings and refuses a mismatch.
    unsafe { Component::deserialize_file(engine, path) }
}

fn store(path: &Path, component: &Component) -> anyhow::Result<()> {
    let bytes = component.serialize()?;
    write_atomically(path, &bytes, false)?;
    Ok(())
}
