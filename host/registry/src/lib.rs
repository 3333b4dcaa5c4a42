//! Plugins from an OCI registry: `clawcage plugins install oci://REGISTRY/REPOSITORY:TAG` pulls a
//! component published in the WebAssembly OCI layout, checks a cosign-format signature on its
//! manifest digest against the operator's trusted keys, checks every blob against its digest, and
//! pins what it installed in `plugins.lock`; `clawcage plugins push` publishes and signs one.
//! Every request goes through the sandbox's policy-checked HTTP client, under size and time
//! limits, with credentials sent only to the registry they belong to. Installing never grants a
//! plugin anything: the operator's configuration still decides.
//!
//! Here: `reference` the `oci://` names; `digest` content digests; `credentials` the Docker and
//! Podman credentials files; `client` the distribution protocol; `artifact` the manifest layout
//! and the plugin manifest it carries; `signature` keys, signing and verifying; `install` installing, restoring,
//! updating and removing; `publish` pushing.

pub mod artifact;
pub mod client;
pub mod credentials;
pub mod digest;
pub mod install;
pub mod publish;
pub mod reference;
pub mod signature;

pub use client::{RegistryClient, RegistryError, RegistryLimits};
pub use digest::Digest;
pub use install::{Settings, human_bytes};
pub use reference::Reference;
pub use signature::{PublicKey, SigningKey, TrustedKeys};
