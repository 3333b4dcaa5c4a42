//! The compiled-artifact cache: Cranelift's output for each component, stored on disk so only the
//! first start pays for compilation, and beside it what the host learnt by running the component
//! once (its tool specs and imports, or a multicall program's names), so later starts know a
//! component's tools without loading its code at all. An entry's key covers the component's
//! SHA-256 (computed at build time for bundled components), the wasmtime version and the engine's
//! configuration, so a changed component or engine never loads a stale entry. Entries are written
//! atomically (`clawcage_core::files::write_atomically`).
//!
//! Every entry is sealed: an HMAC-SHA256 under a secret key kept in the cache directory
//! (`seal.key`, readable by its owner only, who must be the user running clawcage) covers the
//! entry's key, its kind and every byte of it. A load reads the entry into memory, checks the
//! seal on exactly those bytes and only then hands them to wasmtime, so an entry written or
//! changed by anyone without the secret — another user who can write the directory, a cache
//! copied from elsewhere, a valid artifact of another component moved under this key, a change
//! made between the check and the use — is never run or believed: it is compiled or learnt again
//! and replaced.
//!
//! Checking the seal means reading and hashing megabytes on every start, so once an artifact has
//! passed it, the cache vouches for that very file in a sealed record beside it: its device,
//! inode, size and modification and change times, taken from the open file that was checked.
//! A later start maps the artifact (no read, no hash, no copy) when the file it opened is the one
//! vouched for and only its owner — the user running clawcage — can write it. Whoever else could
//! change it must replace it (a new inode and change time, which no one but root can set back)
//! or be that user; a copied cache, a file moved under another key and a replaced file all fail
//! the comparison and are checked in full again.

use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use clawcage_core::files::{
    Symlinks, open_regular_file, read_opened, read_regular_file, write_atomically,
};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The wasmtime release this crate is pinned to; part of every cache key.
pub const WASMTIME_VERSION: &str = "48.0.8";

/// Where compiled components are kept, or nowhere.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: Option<PathBuf>,
    /// The secret that seals this cache's entries, read (or made) when first needed; `None`
    /// when it cannot be had, and then no entry is trusted.
    seal: Arc<OnceLock<Option<Seal>>>,
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
            seal: Arc::new(OnceLock::new()),
        }
    }

    /// No cache: every load compiles.
    pub fn disabled() -> Self {
        Self {
            dir: None,
            seal: Arc::new(OnceLock::new()),
        }
    }

    /// The secret of the cache in `dir`, read or made once per value.
    fn seal(&self, dir: &Path) -> Option<&Seal> {
        self.seal
            .get_or_init(|| match Seal::open(dir) {
                Ok(seal) => Some(seal),
                Err(error) => {
                    tracing::warn!(
                        dir = %dir.display(),
                        "the component cache's key cannot be read or made ({error}); nothing in the cache is used, so every start compiles: make the directory writable by this user only"
                    );
                    None
                }
            })
            .as_ref()
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
        Self::key_for_engine_hash(engine_hash(engine), sha256)
    }

    /// [`ArtifactCache::key_for_digest`] with the engine's [`engine_hash`] already known.
    pub(crate) fn key_for_engine_hash(engine_hash: u64, sha256: &str) -> String {
        let mut digest = Sha256::new();
        digest.update(sha256.as_bytes());
        digest.update(WASMTIME_VERSION.as_bytes());
        digest.update(engine_hash.to_le_bytes());
        hex::encode(digest.finalize())
    }

    /// What was recorded beside the artifact of `key` under `kind` (e.g. `describe`), if the
    /// cache is on and holds a readable record.
    pub(crate) fn record(&self, key: &str, kind: &str) -> Option<Vec<u8>> {
        let dir = self.dir.as_ref()?;
        let path = dir.join(format!("{key}.{kind}.json"));
        let sealed = match read_regular_file(&path, RECORD_MAX_BYTES, Symlinks::Refuse) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(path = %path.display(), "ignoring an unreadable cache record ({error})");
                return None;
            }
        };
        let seal = self.seal(dir)?;
        match seal.open_text(&sealed, &[RECORD_DOMAIN, key.as_bytes(), kind.as_bytes()]) {
            Some(record) => Some(record.to_vec()),
            None => {
                tracing::warn!(path = %path.display(), "ignoring a cache record that fails its seal check; it is learnt again");
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
        let Some(seal) = self.seal(dir) else {
            return;
        };
        let path = dir.join(format!("{key}.{kind}.json"));
        let sealed = seal.seal_text(bytes, &[RECORD_DOMAIN, key.as_bytes(), kind.as_bytes()]);
        if let Err(error) = write_atomically(&path, &sealed, false) {
            tracing::warn!(
                path = %path.display(),
                "could not write the component cache ({error}); the next start learns it again"
            );
        }
    }

    /// The artifact of `key` at `path`, if present. When the open file is the one the cache
    /// vouched for (see the module's description) and only its owner can write it, it is mapped
    /// as it is. Otherwise it is read whole into memory, its seal checked on those bytes, and
    /// only then given to wasmtime (which copies them into executable memory), so nothing that
    /// changes the file afterwards reaches the code that runs; the cache then vouches for it.
    /// `Ok(None)`: no entry.
    fn load_sealed(
        &self,
        engine: &Engine,
        seal: &Seal,
        key: &str,
        path: &Path,
    ) -> wasmtime::Result<Option<Component>> {
        let (file, metadata) = match open_regular_file(path, Symlinks::Refuse) {
            Ok(opened) => opened,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(wasmtime::Error::msg(format!("cannot read it: {error}"))),
        };
        let identity = FileIdentity::of(&metadata);
        let private = seal.owns_alone(&metadata);
        if private && self.vouched(key) == Some(identity) {
            return map_opened(engine, &file, path).map(Some);
        }
        let sealed = read_opened(file, &metadata, path, ARTIFACT_MAX_BYTES)
            .map_err(|error| wasmtime::Error::msg(format!("cannot read it: {error}")))?;
        let Some(artifact) = seal.open_entry(&sealed, &[ARTIFACT_DOMAIN, key.as_bytes()]) else {
            return Err(wasmtime::Error::msg(
                "it fails its seal check: it was not written by this cache, or was changed since",
            ));
        };
        let component = deserialize(engine, artifact)?;
        if private && let Ok(record) = serde_json::to_vec(&identity) {
            self.store_record(key, VOUCHED_RECORD, &record);
        }
        Ok(Some(component))
    }

    /// The file the cache vouched for as the artifact of `key`, if it did.
    fn vouched(&self, key: &str) -> Option<FileIdentity> {
        serde_json::from_slice(&self.record(key, VOUCHED_RECORD)?).ok()
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
        self.load_keyed_with(engine, key, || Ok(Cow::Borrowed(bytes)))
    }

    /// [`ArtifactCache::load_keyed`] for code that costs something to produce (a bundled
    /// component is decompressed): `code` is asked for only when the component must be compiled.
    pub fn load_keyed_with<'a>(
        &self,
        engine: &Engine,
        key: &str,
        code: impl FnOnce() -> wasmtime::Result<Cow<'a, [u8]>>,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let Some(dir) = &self.dir else {
            return Ok((Component::new(engine, code()?)?, CacheOutcome::Compiled));
        };
        let Some(seal) = self.seal(dir) else {
            return Ok((Component::new(engine, code()?)?, CacheOutcome::Compiled));
        };
        let path = dir.join(format!("{key}.cwasm"));
        match self.load_sealed(engine, seal, key, &path) {
            Ok(Some(component)) => return Ok((component, CacheOutcome::Hit)),
            Ok(None) => {}
            Err(error) => tracing::warn!(
                path = %path.display(),
                "ignoring a compiled-component cache entry ({error:#}); recompiling"
            ),
        }
        let component = Component::new(engine, code()?)?;
        if let Err(error) = store(seal, key, &path, &component) {
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

/// What of `engine`'s configuration decides whether an artifact it compiled can run in another:
/// part of every cache key. Hashing it walks the whole configuration, so a [`crate::Sandbox`]
/// computes it once.
pub(crate) fn engine_hash(engine: &Engine) -> u64 {
    let mut engine_hasher = DefaultHasher::new();
    engine
        .precompile_compatibility_hash()
        .hash(&mut engine_hasher);
    engine_hasher.finish()
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Largest compiled artifact read back (python3's is about 100 MB).
const ARTIFACT_MAX_BYTES: u64 = 2 << 30;

/// What each kind of sealed entry's tag covers first, so one kind is never taken for another.
const ARTIFACT_DOMAIN: &[u8] = b"clawcage compiled component";
const RECORD_DOMAIN: &[u8] = b"clawcage cache record";

/// The record in which the cache vouches for an artifact file it checked.
const VOUCHED_RECORD: &str = "vouched";

/// Which file, in which state: what a [`VOUCHED_RECORD`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct FileIdentity {
    device: u64,
    inode: u64,
    bytes: u64,
    modified_ns: i128,
    changed_ns: i128,
}

impl FileIdentity {
    #[cfg(unix)]
    fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt as _;
        let nanoseconds =
            |seconds: i64, nanos: i64| i128::from(seconds) * 1_000_000_000 + i128::from(nanos);
        FileIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
            bytes: metadata.len(),
            modified_ns: nanoseconds(metadata.mtime(), metadata.mtime_nsec()),
            changed_ns: nanoseconds(metadata.ctime(), metadata.ctime_nsec()),
        }
    }

    /// Without inodes and change times nothing is vouched for: every start checks the seal.
    #[cfg(not(unix))]
    fn of(_metadata: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            device: 0,
            inode: 0,
            bytes: 0,
            modified_ns: 0,
            changed_ns: 0,
        }
    }
}

/// The artifact in the open `file`, mapped into memory by wasmtime. On Linux wasmtime opens the
/// open file itself (through `/proc/self/fd`), never the path again, so what it maps is the file
/// that was compared with the record.
#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "loading precompiled code is unsafe by wasmtime's contract"
)]
fn map_opened(engine: &Engine, file: &std::fs::File, _path: &Path) -> wasmtime::Result<Component> {
    use std::os::fd::AsRawFd as _;
    let opened = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    // SAFETY: the open file is the one this cache vouched for in a sealed record after checking
    // its seal (same device, inode, size, modification and change time: any change since would
    // have moved the change time, which only root can set), and only the user running clawcage
    // can write it. Its content is therefore what `store` wrote under this key: the output of
    // `Component::serialize` of an engine with the same compatibility hash (part of the key),
    // followed by the seal, which the ELF reader ignores. wasmtime checks the header and the
    // engine settings again and refuses a mismatch.
    unsafe { Component::deserialize_file(engine, opened) }
}

/// Elsewhere nothing is vouched for ([`Seal::owns_alone`]), so this is never reached: the
/// artifact is read and its seal checked on every start.
#[cfg(not(target_os = "linux"))]
fn map_opened(_engine: &Engine, _file: &std::fs::File, path: &Path) -> wasmtime::Result<Component> {
    Err(wasmtime::Error::msg(format!(
        "{} cannot be mapped on this system",
        path.display()
    )))
}

#[allow(
    unsafe_code,
    reason = "loading precompiled code is unsafe by wasmtime's contract"
)]
fn deserialize(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `artifact` carries a valid seal, so it is exactly what `store` wrote under this
    // key: the output of `Component::serialize` of an engine with the same compatibility hash
    // (part of the key). The bytes are in this process's memory, checked, and copied by
    // wasmtime, which also checks the header and engine settings and refuses a mismatch.
    unsafe { Component::deserialize(engine, artifact) }
}

fn store(seal: &Seal, key: &str, path: &Path, component: &Component) -> anyhow::Result<()> {
    let bytes = component.serialize()?;
    let sealed = seal.seal_entry(&bytes, &[ARTIFACT_DOMAIN, key.as_bytes()]);
    write_atomically(path, &sealed, false)?;
    Ok(())
}

/// The file in the cache directory that holds the sealing key.
const SEAL_KEY_FILE: &str = "seal.key";

/// Bytes of the key and of a seal (an HMAC-SHA256 tag).
const SEAL_BYTES: usize = 32;

/// The secret key that seals one cache directory's entries. Made from the system's random
/// source the first time the directory is used, kept in `seal.key` (mode 0600), and accepted
/// only from a regular file owned by the user running clawcage that no one else may read or
/// write: a key anyone else could read or have written is replaced, which invalidates every
/// entry sealed with it.
struct Seal {
    key: [u8; SEAL_BYTES],
    /// The user running clawcage, who owns the key.
    owner: u32,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(..)")
    }
}

impl Seal {
    /// The key of the cache in `dir`: read, or made and stored if missing or not trustworthy.
    fn open(dir: &Path) -> io::Result<Seal> {
        let path = dir.join(SEAL_KEY_FILE);
        match Self::read(dir, &path) {
            Ok(seal) => return Ok(seal),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), "replacing the component cache's key ({error}); every cached component is compiled again");
                Self::make(dir, &path, true)?;
                return Self::read(dir, &path);
            }
        }
        Self::make(dir, &path, false)?;
        Self::read(dir, &path)
    }

    fn read(dir: &Path, path: &Path) -> io::Result<Seal> {
        let bytes = read_regular_file(path, SEAL_BYTES as u64, Symlinks::Refuse)?;
        let owner = check_private(dir, path)?;
        let key = <[u8; SEAL_BYTES]>::try_from(bytes.as_slice()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, "the key has the wrong length")
        })?;
        Ok(Seal { key, owner })
    }

    /// Whether the file of `metadata` is owned by the user running clawcage and writable by no
    /// one else (no one but root could change it behind this process's back). Only on Linux,
    /// where an open file can be mapped by its descriptor: elsewhere nothing is vouched for.
    #[cfg(target_os = "linux")]
    fn owns_alone(&self, metadata: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        metadata.uid() == self.owner && metadata.mode() & 0o022 == 0
    }

    #[cfg(not(target_os = "linux"))]
    fn owns_alone(&self, _metadata: &std::fs::Metadata) -> bool {
        let _ = self.owner;
        false
    }

    /// Writes a new random key to `path`: without `replace`, only if none is there yet (a
    /// concurrent start may have made one, which is then used); with it, over what is there.
    fn make(dir: &Path, path: &Path, replace: bool) -> io::Result<()> {
        let mut key = [0u8; SEAL_BYTES];
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut key)
            .map_err(|_| io::Error::other("the system's random source failed"))?;
        std::fs::create_dir_all(dir)?;
        let temporary = dir.join(format!(".{SEAL_KEY_FILE}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_file(&temporary);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let written = (|| {
            use std::io::Write as _;
            let mut file = options.open(&temporary)?;
            file.write_all(&key)?;
            file.sync_all()?;
            drop(file);
            if replace {
                std::fs::rename(&temporary, path)
            } else {
                match std::fs::hard_link(&temporary, path) {
                    Err(error) if error.kind() != io::ErrorKind::AlreadyExists => Err(error),
                    _ => Ok(()),
                }
            }
        })();
        let _ = std::fs::remove_file(&temporary);
        written
    }

    /// The tag of `payload` for an entry named by `context`.
    fn tag(&self, payload: &[u8], context: &[&[u8]]) -> [u8; SEAL_BYTES] {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(context.len() * 2 + 1);
        for part in context {
            parts.push(part);
            parts.push(b"\0");
        }
        parts.push(payload);
        hmac_sha256(&self.key, &parts)
    }

    /// `payload` followed by its tag.
    fn seal_entry(&self, payload: &[u8], context: &[&[u8]]) -> Vec<u8> {
        let mut sealed = Vec::with_capacity(payload.len() + SEAL_BYTES);
        sealed.extend_from_slice(payload);
        sealed.extend_from_slice(&self.tag(payload, context));
        sealed
    }

    /// `payload` after a first line holding its tag in hex: a record stays readable text.
    fn seal_text(&self, payload: &[u8], context: &[&[u8]]) -> Vec<u8> {
        let mut sealed = hex::encode(self.tag(payload, context)).into_bytes();
        sealed.push(b'\n');
        sealed.extend_from_slice(payload);
        sealed
    }

    /// The payload of an entry sealed by [`Seal::seal_text`], if its tag is right.
    fn open_text<'a>(&self, sealed: &'a [u8], context: &[&[u8]]) -> Option<&'a [u8]> {
        let line = sealed.get(..SEAL_BYTES * 2 + 1)?;
        let payload = &sealed[line.len()..];
        let tag = hex::decode(line.strip_suffix(b"\n")?).ok()?;
        self.check(payload, context, &tag).then_some(payload)
    }

    /// The payload of a sealed entry, if its tag is right.
    fn open_entry<'a>(&self, sealed: &'a [u8], context: &[&[u8]]) -> Option<&'a [u8]> {
        let split = sealed.len().checked_sub(SEAL_BYTES)?;
        let (payload, tag) = sealed.split_at(split);
        self.check(payload, context, tag).then_some(payload)
    }

    /// Whether `tag` is the tag of `payload` in `context`.
    fn check(&self, payload: &[u8], context: &[&[u8]], tag: &[u8]) -> bool {
        let expected = self.tag(payload, context);
        if tag.len() != expected.len() {
            return false;
        }
        // Constant time: how much of a forged tag was right is not told by the time taken.
        let difference = expected
            .iter()
            .zip(tag)
            .fold(0u8, |difference, (a, b)| difference | (a ^ b));
        difference == 0
    }
}

/// Fails unless the key file at `path` is owned by the user running clawcage and neither
/// readable nor writable by anyone else; returns that user.
#[cfg(unix)]
fn check_private(dir: &Path, path: &Path) -> io::Result<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let key = std::fs::symlink_metadata(path)?;
    if key.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "its mode is {:o}: others may read or change it",
                key.mode() & 0o777
            ),
        ));
    }
    let owner = current_user(dir)?;
    if key.uid() != owner {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("it is owned by user {}, not {owner}", key.uid()),
        ));
    }
    Ok(owner)
}

#[cfg(not(unix))]
fn check_private(_dir: &Path, _path: &Path) -> io::Result<u32> {
    Ok(0)
}

/// The user this process runs as: the owner of `/proc/self` on Linux; elsewhere the owner of
/// the cache directory (a directory someone else owns is theirs to change anyway).
#[cfg(unix)]
fn current_user(dir: &Path) -> io::Result<u32> {
    use std::os::unix::fs::MetadataExt as _;
    #[cfg(target_os = "linux")]
    let _ = dir;
    #[cfg(target_os = "linux")]
    let probe = Path::new("/proc/self");
    #[cfg(not(target_os = "linux"))]
    let probe = dir;
    Ok(std::fs::metadata(probe)?.uid())
}

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts` under `key` (at most one block long).
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; SEAL_BYTES] {
    const BLOCK: usize = 64;
    let mut padded = [0u8; BLOCK];
    padded[..key.len().min(BLOCK)].copy_from_slice(&key[..key.len().min(BLOCK)]);
    let mut inner = Sha256::new();
    inner.update(padded.map(|byte| byte ^ 0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(padded.map(|byte| byte ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let tag = hmac_sha256(b"Jefe", &[b"what do ya ", b"want for nothing?"]);
        assert_eq!(
            hex::encode(tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 1: a 20-byte key of 0x0b.
        let tag = hmac_sha256(&[0x0b; 20], &[b"Hi There"]);
        assert_eq!(
            hex::encode(tag),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
    }

    #[test]
    fn an_entry_opens_only_with_its_key_context_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let seal = Seal::open(dir.path()).unwrap();
        let sealed = seal.seal_entry(b"payload", &[b"kind", b"key"]);
        assert_eq!(
            seal.open_entry(&sealed, &[b"kind", b"key"]),
            Some(&b"payload"[..])
        );
        assert_eq!(seal.open_entry(&sealed, &[b"kind", b"other"]), None);
        assert_eq!(seal.open_entry(&sealed, &[b"kin", b"dkey"]), None);
        let mut changed = sealed.clone();
        changed[0] ^= 1;
        assert_eq!(seal.open_entry(&changed, &[b"kind", b"key"]), None);
        assert_eq!(seal.open_entry(&sealed[..10], &[b"kind", b"key"]), None);
        let text = seal.seal_text(b"{\"names\":[]}", &[b"kind", b"key"]);
        assert_eq!(
            seal.open_text(&text, &[b"kind", b"key"]),
            Some(&b"{\"names\":[]}"[..])
        );
        assert!(std::str::from_utf8(&text).is_ok(), "a record stays text");
        let mut changed_text = text.clone();
        let last = changed_text.len() - 2;
        changed_text[last] = b'x';
        assert_eq!(seal.open_text(&changed_text, &[b"kind", b"key"]), None);
        assert_eq!(seal.open_text(&text, &[b"kind", b"other"]), None);
        let other = tempfile::tempdir().unwrap();
        let other = Seal::open(other.path()).unwrap();
        assert_eq!(other.open_entry(&sealed, &[b"kind", b"key"]), None);
        // The same directory gives the same key again.
        let again = Seal::open(dir.path()).unwrap();
        assert_eq!(again.key, seal.key);
    }

    #[cfg(unix)]
    #[test]
    fn a_key_others_may_read_is_replaced() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let first = Seal::open(dir.path()).unwrap();
        let path = dir.path().join(SEAL_KEY_FILE);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let second = Seal::open(dir.path()).unwrap();
        assert_ne!(first.key, second.key);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
