//! The OCI artifact a plugin is published as: the layout for WebAssembly components that the
//! Bytecode Alliance's tooling (`wkg`, `oci-wasm`) reads and writes: an OCI image manifest whose
//! config is `application/vnd.wasm.config.v0+json` and whose single layer is the component
//! (`application/wasm`). The plugin's own manifest (name, version, description, the grants it
//! asks for) travels as one line of JSON in the manifest annotation `dev.clawcage.plugin` (one
//! line, so tools that pass annotations on a command line can set it), so it is
//! covered by the manifest's digest, and so by a signature over that digest. A component
//! published without it (e.g. by `wkg oci push`) installs as a plugin that asks for nothing.

use std::collections::BTreeMap;

use clawcage_sandbox::plugin::{
    Capabilities, check_capabilities, check_plugin_name, check_version,
};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;

/// The OCI image manifest media type.
pub const IMAGE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The OCI image index media type (refused: a plugin is one component).
pub const IMAGE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// The config media type of a WebAssembly artifact.
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a WebAssembly component or module.
pub const WASM_LAYER: &str = "application/wasm";
/// The manifest annotation carrying the plugin's manifest.
pub const PLUGIN_ANNOTATION: &str = "dev.clawcage.plugin";
/// The standard annotations set on publishing.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// The version annotation.
pub const VERSION_ANNOTATION: &str = "org.opencontainers.image.version";
/// The description annotation.
pub const DESCRIPTION_ANNOTATION: &str = "org.opencontainers.image.description";

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What the content is.
    pub media_type: String,
    /// Its digest.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl Descriptor {
    /// A descriptor of `bytes` as `media_type`.
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: Digest::of(bytes).to_string(),
            size: bytes.len() as u64,
            annotations: None,
        }
    }

    /// The digest, checked.
    pub fn checked_digest(&self) -> Result<Digest, String> {
        Digest::parse(&self.digest)
    }
}

/// An OCI image manifest (schema 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`IMAGE_MANIFEST`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layers.
    pub layers: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl ImageManifest {
    /// Parses manifest bytes; an index or another kind of manifest is refused with what it is.
    pub fn parse(bytes: &[u8], content_type: Option<&str>) -> Result<ImageManifest, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Kind {
            #[serde(default)]
            media_type: Option<String>,
            #[serde(default)]
            schema_version: Option<u32>,
        }
        let kind: Kind = serde_json::from_slice(bytes)
            .map_err(|error| format!("the registry's manifest is not valid JSON ({error})"))?;
        let media_type = kind
            .media_type
            .as_deref()
            .or(content_type)
            .unwrap_or(IMAGE_MANIFEST);
        if media_type == IMAGE_INDEX || media_type.contains("manifest.list") {
            return Err(
                "it is an image index (several artifacts), not one component; name the component's own manifest by its digest"
                    .to_string(),
            );
        }
        if media_type != IMAGE_MANIFEST || kind.schema_version != Some(2) {
            return Err(format!(
                "its manifest is {media_type} (schema {:?}); a plugin is published as an OCI image manifest ({IMAGE_MANIFEST})",
                kind.schema_version
            ));
        }
        serde_json::from_slice(bytes)
            .map_err(|error| format!("the registry's manifest is malformed ({error})"))
    }

    /// The manifest's annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// What a plugin's publisher says of it: the plugin manifest without the component's path and
/// digest (the artifact carries those).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedPlugin {
    /// The plugin's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// What it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// What it asks for.
    #[serde(default)]
    pub capabilities: Capabilities,
}

impl PublishedPlugin {
    /// Parses and checks the JSON of [`PLUGIN_ANNOTATION`].
    pub fn parse(text: &str) -> Result<PublishedPlugin, String> {
        let plugin: PublishedPlugin = serde_json::from_str(text).map_err(|error| {
            format!("its {PLUGIN_ANNOTATION} annotation is not a valid plugin manifest: {error}")
        })?;
        check_plugin_name(&plugin.name).map_err(|error| format!("its plugin {error}"))?;
        check_version(&plugin.version)?;
        check_capabilities(&plugin.capabilities)?;
        Ok(plugin)
    }

    /// The JSON text of the annotation.
    pub fn to_json(&self) -> Result<String, String> {
        serde_json::to_string(self)
            .map_err(|error| format!("the plugin manifest cannot be written: {error}"))
    }
}

/// A pulled manifest read as a plugin: the component's layer and what the publisher says.
#[derive(Debug, Clone)]
pub struct PluginArtifact {
    /// The manifest's digest.
    pub digest: Digest,
    /// The manifest.
    pub manifest: ImageManifest,
    /// The component's layer.
    pub component: Descriptor,
    /// The plugin as published; derived from the reference when the annotation is absent.
    pub plugin: PublishedPlugin,
    /// Whether the publisher described the plugin (the annotation was present).
    pub described: bool,
}

impl PluginArtifact {
    /// Reads `manifest` (of digest `digest`, pulled for `repository:tag`) as a plugin.
    pub fn read(
        digest: Digest,
        manifest: ImageManifest,
        repository: &str,
        tag: Option<&str>,
    ) -> Result<PluginArtifact, String> {
        let wasm_layers: Vec<&Descriptor> = manifest
            .layers
            .iter()
            .filter(|layer| layer.media_type == WASM_LAYER)
            .collect();
        let [component] = wasm_layers.as_slice() else {
            return Err(format!(
                "it has {} {WASM_LAYER} layers; a plugin artifact has exactly one, the component",
                wasm_layers.len()
            ));
        };
        component.checked_digest()?;
        let component = (*component).clone();
        let (plugin, described) = match manifest.annotation(PLUGIN_ANNOTATION) {
            Some(text) => (PublishedPlugin::parse(text)?, true),
            None => (undescribed(&manifest, repository, tag)?, false),
        };
        Ok(PluginArtifact {
            digest,
            manifest,
            component,
            plugin,
            described,
        })
    }
}

/// A component published without a plugin manifest: named after the repository's last path
/// component, versioned by the version annotation or the tag, asking for nothing.
fn undescribed(
    manifest: &ImageManifest,
    repository: &str,
    tag: Option<&str>,
) -> Result<PublishedPlugin, String> {
    let last = repository.rsplit('/').next().unwrap_or(repository);
    let name: String = last
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .collect();
    check_plugin_name(&name).map_err(|error| {
        format!("it carries no {PLUGIN_ANNOTATION} annotation and its repository gives no usable plugin {error}")
    })?;
    let version = manifest
        .annotation(VERSION_ANNOTATION)
        .map(str::to_string)
        .or_else(|| tag.map(str::to_string))
        .unwrap_or_else(|| "0.0.0".to_string());
    check_version(&version)?;
    Ok(PublishedPlugin {
        name,
        version,
        description: manifest
            .annotation(DESCRIPTION_ANNOTATION)
            .map(str::to_string),
        capabilities: Capabilities::default(),
    })
}

/// The config blob of a WebAssembly component artifact, as `oci-wasm` writes it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig<'a> {
    created: &'a str,
    author: Option<&'a str>,
    architecture: &'a str,
    os: &'a str,
    layer_digests: Vec<String>,
    component: ComponentInfo,
}

#[derive(Debug, Serialize)]
struct ComponentInfo {
    exports: Vec<String>,
    imports: Vec<String>,
    target: Option<String>,
}

/// The blobs and manifest to publish `component` as `plugin`.
#[derive(Debug, Clone)]
pub struct Publication {
    /// The config blob.
    pub config: Vec<u8>,
    /// The manifest's bytes.
    pub manifest: Vec<u8>,
    /// The manifest's digest.
    pub digest: Digest,
}

/// Builds the artifact for `component` (a WebAssembly component) as `plugin`. The same inputs
/// give the same digest: the config's creation time is fixed.
pub fn publication(plugin: &PublishedPlugin, component: &[u8]) -> Result<Publication, String> {
    let (imports, exports) = clawcage_sandbox::plugin::component_names(component)?;
    let component_digest = Digest::of(component).to_string();
    let config = WasmConfig {
        created: "1970-01-01T00:00:00Z",
        author: None,
        architecture: "wasm",
        os: "wasip2",
        layer_digests: vec![component_digest],
        component: ComponentInfo {
            exports,
            imports,
            target: None,
        },
    };
    let config = serde_json::to_vec(&config).map_err(|error| error.to_string())?;
    let mut layer = Descriptor::of(WASM_LAYER, component);
    layer.annotations = Some(BTreeMap::from([(
        TITLE_ANNOTATION.to_string(),
        format!("{}.wasm", plugin.name),
    )]));
    let mut annotations = BTreeMap::from([
        (PLUGIN_ANNOTATION.to_string(), plugin.to_json()?),
        (TITLE_ANNOTATION.to_string(), plugin.name.clone()),
        (VERSION_ANNOTATION.to_string(), plugin.version.clone()),
    ]);
    if let Some(description) = &plugin.description {
        annotations.insert(DESCRIPTION_ANNOTATION.to_string(), description.clone());
    }
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(IMAGE_MANIFEST.to_string()),
        config: Descriptor::of(WASM_CONFIG, &config),
        layers: vec![layer],
        annotations: Some(annotations),
    };
    let manifest = serde_json::to_vec(&manifest).map_err(|error| error.to_string())?;
    Ok(Publication {
        config,
        digest: Digest::of(&manifest),
        manifest,
    })
}
