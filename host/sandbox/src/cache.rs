//! The compiled-artifact cache: Cranelift's output for each component, stored on disk so only the
//! first start pays for compilation. An entry's key covers the component's bytes, the wasmtime
//! version and the engine's configuration, so a changed component or engine never loads a stale
//! artifact. Entries are written atomically (temporary file, then rename).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};

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

    /// The key of `bytes` compiled by `engine`: hex SHA-256 of the bytes, the wasmtime version
    /// and the engine's compatibility hash.
    pub fn key(engine: &Engine, bytes: &[u8]) -> String {
        let mut engine_hasher = DefaultHasher::new();
        engine
            .precompile_compatibility_hash()
            .hash(&mut engine_hasher);
        let mut digest = Sha256::new();
        digest.update(bytes);
        digest.update(WASMTIME_VERSION.as_bytes());
        digest.update(engine_hasher.finish().to_le_bytes());
        hex::encode(digest.finalize())
    }

    /// The component for `bytes`: from the cache when a valid entry exists, else compiled (and
    /// stored). A damaged entry is replaced; a cache that cannot be written is logged and
    /// skipped, never fatal.
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let Some(dir) = &self.dir else {
            return Ok((Component::new(engine, bytes)?, CacheOutcome::Compiled));
        };
        let path = dir.join(format!("{}.cwasm", Self::key(engine, bytes)));
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
        if let Err(error) = store(dir, &path, &component) {
            tracing::warn!(
                dir = %dir.display(),
                "could not write the compiled-component cache ({error}); the next start compiles again"
            );
        }
        Ok((component, CacheOutcome::Compiled))
    }
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

fn store(dir: &Path, path: &Path, component: &Component) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let bytes = component.serialize()?;
    let mut temporary = tempfile::NamedTempFile::new_in(dir)?;
    temporary.write_all(&bytes)?;
    temporary.as_file().sync_all()?;
    temporary.persist(path)?;
    Ok(())
}
