//! Publishing a plugin, for tool authors (`clawcage plugins push`): its component as the one
//! layer of a WebAssembly artifact in the layout `wkg` reads, its manifest as the artifact's
//! `dev.clawcage.plugin` annotation, and, with a key, a cosign-format signature of the manifest's
//! digest beside it.

use std::path::{Path, PathBuf};

use clawcage_sandbox::plugin::read_manifest;

use crate::artifact::{IMAGE_MANIFEST, PublishedPlugin, WASM_CONFIG, publication};
use crate::client::{RegistryClient, RegistryLimits};
use crate::credentials::lookup;
use crate::digest::Digest;
use crate::install::human_bytes;
use crate::reference::Reference;
use crate::signature::{SigningKey, publish};

/// What publishing did.
#[derive(Debug)]
pub struct Pushed {
    /// The reference, pinned to the pushed manifest.
    pub reference: Reference,
    /// The signature's tag, when signed.
    pub signature_tag: Option<String>,
}

/// Publishes the plugin whose manifest is `manifest_path` (its component beside it, digest
/// checked) as `reference` (which must name a tag), signed with `key` when given.
pub async fn push(
    manifest_path: &Path,
    reference: &Reference,
    key: Option<&SigningKey>,
    credential_files: &[PathBuf],
    limits: RegistryLimits,
    progress: &mut dyn FnMut(String),
) -> Result<Pushed, String> {
    let Some(tag) = &reference.tag else {
        return Err(format!(
            "{reference} names no tag; a plugin is published under a tag, e.g. :1.0.0"
        ));
    };
    if reference.digest.is_some() {
        return Err(format!(
            "{reference} names a digest; publish to a tag alone"
        ));
    }
    let manifest = read_manifest(manifest_path)
        .map_err(|error| format!("{}: {error}", manifest_path.display()))?;
    let base = manifest_path.parent().unwrap_or(Path::new("."));
    let component_path = base.join(&manifest.component);
    let component = clawcage_core::files::read_regular_file(
        &component_path,
        limits.blob_bytes,
        clawcage_core::files::Symlinks::Follow,
    )
    .map_err(|error| {
        format!(
            "the component {} cannot be read: {error}",
            component_path.display()
        )
    })?;
    if Digest::of(&component).hex() != manifest.sha256 {
        return Err(format!(
            "{} does not have the sha256 its manifest gives ({}); rebuild it or fix the manifest",
            component_path.display(),
            manifest.sha256
        ));
    }
    let plugin = PublishedPlugin {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        description: manifest.description.clone(),
        capabilities: manifest.capabilities.clone(),
    };
    let publication = publication(&plugin, &component)?;
    let found = lookup(credential_files, reference.credentials_key());
    let client = RegistryClient::new(reference, found.credentials, limits);
    let repository = &reference.repository;
    let failed = |error: crate::client::RegistryError| format!("{reference}: {error}");
    progress(format!(
        "uploading {} {} ({})",
        plugin.name,
        plugin.version,
        human_bytes(component.len() as u64)
    ));
    client
        .push_blob(repository, &component, "the component")
        .await
        .map_err(failed)?;
    client
        .push_blob(repository, &publication.config, "the config")
        .await
        .map_err(failed)?;
    debug_assert!(WASM_CONFIG.starts_with("application/"));
    client
        .push_manifest(repository, tag, &publication.manifest, IMAGE_MANIFEST)
        .await
        .map_err(failed)?;
    let pinned = reference.pinned(&publication.digest);
    let signature_tag = match key {
        Some(key) => {
            progress(format!(
                "signing {} with key {}",
                publication.digest,
                key.public().id
            ));
            Some(
                publish(
                    &client,
                    repository,
                    &reference.docker_reference(),
                    &publication.digest,
                    key,
                )
                .await
                .map_err(failed)?,
            )
        }
        None => None,
    };
    Ok(Pushed {
        reference: pinned,
        signature_tag,
    })
}
