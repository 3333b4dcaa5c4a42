//! Signatures in cosign's format, made and checked offline with a key pair: a "simple signing"
//! payload naming the artifact's manifest digest, signed with ECDSA P-256 over SHA-256 (ASN.1
//! DER, base64 in the layer annotation `dev.cosignproject.cosign/signature`), stored as the tag
//! `sha256-HEX.sig` beside the artifact. So `cosign sign --key` signatures verify here, and these
//! verify with `cosign verify --key`. Keys are PEM: public keys as SubjectPublicKeyInfo
//! (`cosign.pub`), private keys as unencrypted PKCS#8 (`clawcage plugins keygen` makes a pair;
//! `cosign import-key-pair` takes it). A signature counts only when a trusted key verifies it and
//! its payload names exactly the digest being installed.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _,
    UnparsedPublicKey,
};
use serde::{Deserialize, Serialize};

use crate::artifact::{Descriptor, IMAGE_MANIFEST, ImageManifest};
use crate::client::{RegistryClient, RegistryError};
use crate::digest::Digest;

/// The media type of a signature's payload.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The claim type of an image signature.
const SIGNATURE_TYPE: &str = "cosign container image signature";
/// The config media type of a signature manifest.
const SIGNATURE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Largest payload read.
const MAX_PAYLOAD_BYTES: u64 = 64 << 10;
/// Most signatures looked at on one artifact.
const MAX_SIGNATURES: usize = 16;

/// The DER header of a P-256 SubjectPublicKeyInfo, before the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The tag a signature of `digest` is stored under.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// A public key that signatures are checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    point: Vec<u8>,
    /// `sha256:HEX` of the key's DER encoding: how the key is named in messages and the lock.
    pub id: String,
}

impl PublicKey {
    /// Parses a PEM `PUBLIC KEY` (an ECDSA P-256 SubjectPublicKeyInfo).
    pub fn from_pem(text: &str) -> Result<PublicKey, String> {
        let der = pem_block(text, "PUBLIC KEY")?;
        let point = der
            .strip_prefix(&P256_SPKI_PREFIX[..])
            .filter(|point| point.len() == 65 && point[0] == 4)
            .ok_or_else(|| {
                "it is not an ECDSA P-256 public key (the kind `cosign generate-key-pair` and `clawcage plugins keygen` make)".to_string()
            })?;
        Ok(PublicKey {
            point: point.to_vec(),
            id: Digest::of(&der).to_string(),
        })
    }

    /// Reads the PEM file at `path`.
    pub fn read(path: &Path) -> Result<PublicKey, String> {
        let text = read_small_text(path)?;
        PublicKey::from_pem(&text).map_err(|error| format!("the key {}: {error}", path.display()))
    }

    /// The PEM text.
    pub fn to_pem(&self) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        pem("PUBLIC KEY", &der)
    }

    /// Whether `signature` (ASN.1 DER) is this key's signature of `payload`.
    pub fn verifies(&self, payload: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.point)
            .verify(payload, signature)
            .is_ok()
    }
}

/// A private key that signs.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    public: PublicKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &self.public.id)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Parses a PEM `PRIVATE KEY` (unencrypted PKCS#8, ECDSA P-256).
    pub fn from_pem(text: &str) -> Result<SigningKey, String> {
        if text.contains("ENCRYPTED") {
            return Err(
                "it is an encrypted key; give an unencrypted PKCS#8 key (`clawcage plugins keygen` makes one; `openssl pkcs8 -topk8 -nocrypt` converts one)".to_string(),
            );
        }
        let der = pem_block(text, "PRIVATE KEY")?;
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der, &SystemRandom::new())
                .map_err(|_| "it is not an ECDSA P-256 private key in PKCS#8".to_string())?;
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(pair.public_key().as_ref());
        let public = PublicKey {
            point: pair.public_key().as_ref().to_vec(),
            id: Digest::of(&spki).to_string(),
        };
        Ok(SigningKey { pair, public })
    }

    /// Reads the PEM file at `path`.
    pub fn read(path: &Path) -> Result<SigningKey, String> {
        let text = read_small_text(path)?;
        SigningKey::from_pem(&text).map_err(|error| format!("the key {}: {error}", path.display()))
    }

    /// A new key pair: the private key's PEM and the key.
    pub fn generate() -> Result<(String, SigningKey), String> {
        let document =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &SystemRandom::new())
                .map_err(|_| {
                    "no key could be generated (the system's random source failed)".to_string()
                })?;
        let text = pem("PRIVATE KEY", document.as_ref());
        let key = SigningKey::from_pem(&text)?;
        Ok((text, key))
    }

    /// The public half.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The ASN.1 DER signature of `payload`.
    pub fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        self.pair
            .sign(&SystemRandom::new(), payload)
            .map(|signature| signature.as_ref().to_vec())
            .map_err(|_| "the payload could not be signed".to_string())
    }
}

/// The keys the operator trusts (`[plugins] trusted_keys`).
#[derive(Debug, Clone, Default)]
pub struct TrustedKeys {
    keys: Vec<PublicKey>,
}

impl TrustedKeys {
    /// Reads every key file; the first unreadable one is the error.
    pub fn read(paths: &[std::path::PathBuf]) -> Result<TrustedKeys, String> {
        let keys = paths
            .iter()
            .map(|path| {
                PublicKey::read(path).map_err(|error| format!("[plugins] trusted_keys: {error}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TrustedKeys { keys })
    }

    /// These keys.
    pub fn new(keys: Vec<PublicKey>) -> TrustedKeys {
        TrustedKeys { keys }
    }

    /// Whether no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[derive(Serialize, Deserialize)]
struct Payload {
    critical: Critical,
    optional: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The payload a signature of `digest` (of the image `docker_reference`) signs.
pub fn payload(docker_reference: &str, digest: &Digest) -> Vec<u8> {
    let payload = Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: docker_reference.to_string(),
            },
            image: Image {
                docker_manifest_digest: digest.to_string(),
            },
            kind: SIGNATURE_TYPE.to_string(),
        },
        optional: None,
    };
    serde_json::to_vec(&payload).unwrap_or_default()
}

/// What the signatures of an artifact amount to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A trusted key signed exactly this digest.
    Trusted {
        /// The key's id.
        key: String,
    },
    /// No trusted signature; why, in a sentence.
    Untrusted {
        /// Why.
        why: String,
    },
}

/// Checks the signatures published for `digest` in `repository` against `keys`.
pub async fn verify(
    client: &RegistryClient,
    repository: &str,
    digest: &Digest,
    keys: &TrustedKeys,
) -> Result<Verdict, RegistryError> {
    let tag = signature_tag(digest);
    let fetched = match client.manifest(repository, &tag).await {
        Ok(fetched) => fetched,
        Err(RegistryError::NotFound(_)) => {
            return Ok(Verdict::Untrusted {
                why: format!("no signature is published for it (no tag {tag})"),
            });
        }
        Err(error) => return Err(error),
    };
    let manifest = ImageManifest::parse(&fetched.bytes, fetched.content_type.as_deref())
        .map_err(|error| RegistryError::Failed(format!("its signature tag {tag}: {error}")))?;
    let mut reasons = Vec::new();
    let layers = manifest
        .layers
        .iter()
        .filter(|layer| layer.media_type == SIMPLE_SIGNING)
        .take(MAX_SIGNATURES);
    for layer in layers {
        let Some(signature) = layer
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(SIGNATURE_ANNOTATION))
        else {
            continue;
        };
        let Ok(signature) = base64::engine::general_purpose::STANDARD.decode(signature.trim())
        else {
            reasons.push("a signature is not base64".to_string());
            continue;
        };
        let Ok(payload_digest) = layer.checked_digest() else {
            reasons.push("a signature's payload has no sha256 digest".to_string());
            continue;
        };
        if layer.size > MAX_PAYLOAD_BYTES {
            reasons.push("a signature's payload is too large".to_string());
            continue;
        }
        let payload = client
            .blob(
                repository,
                &payload_digest,
                layer.size,
                "a signature's payload",
            )
            .await?;
        let Some(key) = keys
            .keys
            .iter()
            .find(|key| key.verifies(&payload, &signature))
        else {
            reasons.push(if keys.is_empty() {
                "it is signed, but no key is trusted ([plugins] trusted_keys is empty)".to_string()
            } else {
                "it is signed by a key not in [plugins] trusted_keys".to_string()
            });
            continue;
        };
        match serde_json::from_slice::<Payload>(&payload) {
            Ok(claims) if claims.critical.kind != SIGNATURE_TYPE => {
                reasons.push(format!(
                    "a signature's payload is of type {:?}",
                    claims.critical.kind
                ));
            }
            Ok(claims) if claims.critical.image.docker_manifest_digest != digest.to_string() => {
                reasons.push(format!(
                    "a trusted key signed {}, not this artifact's {digest} (the manifest was changed after signing)",
                    claims.critical.image.docker_manifest_digest
                ));
            }
            Ok(_) => {
                return Ok(Verdict::Trusted {
                    key: key.id.clone(),
                });
            }
            Err(error) => reasons.push(format!("a signature's payload is malformed ({error})")),
        }
    }
    if reasons.is_empty() {
        reasons.push(format!("its signature tag {tag} holds no signature"));
    }
    reasons.dedup();
    Ok(Verdict::Untrusted {
        why: reasons.join("; "),
    })
}

/// Signs `digest` (of `docker_reference` in `repository`) with `key` and publishes the
/// signature under its tag, beside any signatures already there.
pub async fn publish(
    client: &RegistryClient,
    repository: &str,
    docker_reference: &str,
    digest: &Digest,
    key: &SigningKey,
) -> Result<String, RegistryError> {
    let payload = payload(docker_reference, digest);
    let signature = key.sign(&payload).map_err(RegistryError::Failed)?;
    let payload_digest = client
        .push_blob(repository, &payload, "the signature's payload")
        .await?;
    let tag = signature_tag(digest);
    let mut layers = match client.manifest(repository, &tag).await {
        Ok(existing) => ImageManifest::parse(&existing.bytes, existing.content_type.as_deref())
            .map(|manifest| manifest.layers)
            .unwrap_or_default(),
        Err(RegistryError::NotFound(_)) => Vec::new(),
        Err(error) => return Err(error),
    };
    let mut layer = Descriptor::of(SIMPLE_SIGNING, &payload);
    layer.annotations = Some(BTreeMap::from([(
        SIGNATURE_ANNOTATION.to_string(),
        base64::engine::general_purpose::STANDARD.encode(&signature),
    )]));
    layers.retain(|known| known.digest != payload_digest.to_string());
    layers.push(layer);
    let diff_ids: Vec<&str> = layers.iter().map(|layer| layer.digest.as_str()).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "",
        "config": {},
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .map_err(|error| RegistryError::Failed(error.to_string()))?;
    client
        .push_blob(repository, &config, "the signature's config")
        .await?;
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(IMAGE_MANIFEST.to_string()),
        config: Descriptor::of(SIGNATURE_CONFIG, &config),
        layers,
        annotations: None,
    };
    let bytes =
        serde_json::to_vec(&manifest).map_err(|error| RegistryError::Failed(error.to_string()))?;
    client
        .push_manifest(repository, &tag, &bytes, IMAGE_MANIFEST)
        .await?;
    Ok(tag)
}

fn read_small_text(path: &Path) -> Result<String, String> {
    let bytes = clawcage_core::files::read_regular_file(
        path,
        64 << 10,
        clawcage_core::files::Symlinks::Follow,
    )
    .map_err(|error| format!("the key {} cannot be read: {error}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| format!("the key {} is not PEM text", path.display()))
}

/// The DER inside the PEM block labelled `label`.
fn pem_block(text: &str, label: &str) -> Result<Vec<u8>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let body = text
        .split_once(&begin)
        .and_then(|(_, rest)| rest.split_once(&end))
        .map(|(body, _)| body)
        .ok_or_else(|| format!("it is not a PEM {label} (no {begin} line)"))?;
    let joined: String = body.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(joined)
        .map_err(|_| format!("its PEM {label} is not base64"))
}

fn pem(label: &str, der: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in encoded.as_bytes().chunks(64) {
        text.push_str(&String::from_utf8_lossy(line));
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    #[test]
    fn a_generated_key_signs_and_its_public_half_verifies() {
        let (private_pem, key) = SigningKey::generate().unwrap();
        let again = SigningKey::from_pem(&private_pem).unwrap();
        assert_eq!(again.public(), key.public());
        let public = PublicKey::from_pem(&key.public().to_pem()).unwrap();
        let digest = Digest::of(b"manifest");
        let payload = payload("127.0.0.1:5000/acme/tool", &digest);
        let signature = key.sign(&payload).unwrap();
        assert!(public.verifies(&payload, &signature));
        let mut other = payload.clone();
        other[10] ^= 1;
        assert!(!public.verifies(&other, &signature));
        let (_, stranger) = SigningKey::generate().unwrap();
        assert!(!stranger.public().verifies(&payload, &signature));
        let text = String::from_utf8(payload).unwrap();
        assert!(
            text.contains(&format!("\"docker-manifest-digest\":\"{digest}\"")),
            "{text}"
        );
        assert!(text.contains(SIGNATURE_TYPE));
    }

    #[test]
    fn keys_of_other_kinds_are_refused() {
        assert!(
            PublicKey::from_pem("nothing")
                .unwrap_err()
                .contains("not a PEM")
        );
        let rsa_like = pem("PUBLIC KEY", &[0x30, 0x03, 0x02, 0x01, 0x00]);
        assert!(
            PublicKey::from_pem(&rsa_like)
                .unwrap_err()
                .contains("P-256")
        );
        assert!(
            SigningKey::from_pem("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----")
                .unwrap_err()
                .contains("encrypted")
        );
        assert_eq!(
            signature_tag(&Digest::of(b"")),
            "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.sig"
        );
    }
}
