//! Registry credentials from the files Docker, Podman and skopeo keep them in: `$REGISTRY_AUTH_FILE`,
//! `$XDG_RUNTIME_DIR/containers/auth.json`, then `$DOCKER_CONFIG/config.json` (default
//! `~/.docker/config.json`). An entry is keyed by the registry's host (and port); the first file
//! with an entry for the registry wins. Credentials are bound to that one host: the client adds
//! them only to requests for it. Credential helpers (`credsStore`, `credHelpers`) are programs
//! clawcage does not run; a registry whose credentials live only there is pulled anonymously, and
//! the warning says so.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

/// Largest credentials file read, in bytes.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// A user name and password for one registry. Printing it shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    password: String,
    /// The file they came from, for messages.
    pub source: PathBuf,
}

impl Credentials {
    /// Credentials from `source`.
    pub fn new(username: &str, password: &str, source: &Path) -> Self {
        Self {
            username: username.to_string(),
            password: password.to_string(),
            source: source.to_path_buf(),
        }
    }

    /// The `Authorization` value for HTTP Basic authentication.
    pub(crate) fn basic_header(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .field("source", &self.source)
            .finish()
    }
}

/// What looking up a registry's credentials found.
#[derive(Debug, Default)]
pub struct Found {
    /// The credentials, when a file has an entry for the registry.
    pub credentials: Option<Credentials>,
    /// Things the operator should know (a file that could not be read, a helper not run).
    pub warnings: Vec<String>,
}

#[derive(Deserialize, Default)]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// The credentials files to search, in order, given the environment (`env`) and home directory.
pub fn credential_files(env: &dyn Fn(&str) -> Option<String>, home: Option<&Path>) -> Vec<PathBuf> {
    let set = |name: &str| env(name).filter(|value| !value.is_empty());
    let mut files = Vec::new();
    if let Some(file) = set("REGISTRY_AUTH_FILE") {
        files.push(PathBuf::from(file));
    }
    if let Some(runtime) = set("XDG_RUNTIME_DIR") {
        files.push(Path::new(&runtime).join("containers").join("auth.json"));
    }
    match set("DOCKER_CONFIG") {
        Some(dir) => files.push(Path::new(&dir).join("config.json")),
        None => {
            if let Some(home) = home {
                files.push(home.join(".docker").join("config.json"));
            }
        }
    }
    files
}

/// The credentials `files` hold for `registry` (`host[:port]`).
pub fn lookup(files: &[PathBuf], registry: &str) -> Found {
    let mut found = Found::default();
    for path in files {
        let bytes = match clawcage_core::files::read_regular_file(
            path,
            MAX_FILE_BYTES,
            clawcage_core::files::Symlinks::Follow,
        ) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => {
                found.warnings.push(format!(
                    "the credentials file {} cannot be read: {error}",
                    path.display()
                ));
                continue;
            }
        };
        let file: AuthFile = match serde_json::from_slice(&bytes) {
            Ok(file) => file,
            Err(error) => {
                found.warnings.push(format!(
                    "the credentials file {} is not valid JSON ({error}); it is not used",
                    path.display()
                ));
                continue;
            }
        };
        let entry = file
            .auths
            .iter()
            .find(|(key, _)| normalise_key(key) == registry);
        if let Some((_, entry)) = entry {
            match decode(entry) {
                Ok(Some((username, password))) => {
                    found.credentials = Some(Credentials::new(&username, &password, path));
                    return found;
                }
                Ok(None) => {}
                Err(why) => found.warnings.push(format!(
                    "the entry for {registry} in {} is not used: {why}",
                    path.display()
                )),
            }
        }
        let helper = file
            .cred_helpers
            .iter()
            .find(|(key, _)| normalise_key(key) == registry)
            .map(|(_, helper)| helper.clone())
            .or(file.creds_store);
        if let Some(helper) = helper {
            found.warnings.push(format!(
                "{} keeps credentials in the docker-credential-{helper} helper, which clawcage does not run; {registry} is asked anonymously (write an \"auths\" entry for it, e.g. with a REGISTRY_AUTH_FILE of its own)",
                path.display()
            ));
        }
    }
    found
}

/// A key of `auths` as a registry host: `https://host:port/v1/` → `host:port`.
fn normalise_key(key: &str) -> String {
    let without_scheme = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    without_scheme
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

fn decode(entry: &AuthEntry) -> Result<Option<(String, String)>, String> {
    if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
        return Ok(Some((username.clone(), password.clone())));
    }
    if let Some(auth) = entry.auth.as_deref().filter(|auth| !auth.is_empty()) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| "its \"auth\" is not base64".to_string())?;
        let text = String::from_utf8(bytes).map_err(|_| "its \"auth\" is not UTF-8".to_string())?;
        let Some((username, password)) = text.split_once(':') else {
            return Err("its \"auth\" is not base64 of user:password".to_string());
        };
        return Ok(Some((username.to_string(), password.to_string())));
    }
    if entry.identity_token.is_some() {
        return Err(
            "identity tokens are not supported; log in with a user name and password".to_string(),
        );
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    #[test]
    fn the_first_file_with_an_entry_for_the_registry_wins() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("auth.json");
        let second = dir.path().join("config.json");
        std::fs::write(&first, r#"{"auths":{"other.example":{"auth":"eDp5"}}}"#).unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret:with-colon");
        std::fs::write(
            &second,
            format!(r#"{{"auths":{{"https://127.0.0.1:5000/v1/":{{"auth":"{auth}"}}}}}}"#),
        )
        .unwrap();
        let found = lookup(&[first.clone(), second.clone()], "127.0.0.1:5000");
        let credentials = found.credentials.unwrap();
        assert_eq!(credentials.username, "robot");
        assert_eq!(credentials.source, second);
        assert!(!format!("{credentials:?}").contains("s3cret"));
        let expected = base64::engine::general_purpose::STANDARD.encode("robot:s3cret:with-colon");
        assert_eq!(credentials.basic_header(), format!("Basic {expected}"));
        assert!(
            lookup(&[first, second], "127.0.0.1:5001")
                .credentials
                .is_none()
        );
    }

    #[test]
    fn helpers_and_bad_files_are_warned_about_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(&file, r#"{"credsStore":"desktop"}"#).unwrap();
        let found = lookup(std::slice::from_ref(&file), "ghcr.io");
        assert!(found.credentials.is_none());
        assert!(
            found.warnings[0].contains("docker-credential-desktop"),
            "{:?}",
            found.warnings
        );
        std::fs::write(&file, "{not json").unwrap();
        assert!(lookup(&[file], "ghcr.io").warnings[0].contains("not valid JSON"));
    }

    #[test]
    fn the_files_follow_the_environment() {
        let env = |name: &str| match name {
            "REGISTRY_AUTH_FILE" => Some("/a/auth.json".to_string()),
            "DOCKER_CONFIG" => Some("/d".to_string()),
            _ => None,
        };
        assert_eq!(
            credential_files(&env, Some(Path::new("/home/u"))),
            vec![
                PathBuf::from("/a/auth.json"),
                PathBuf::from("/d/config.json")
            ]
        );
        let none = |_: &str| None;
        assert_eq!(
            credential_files(&none, Some(Path::new("/home/u"))),
            vec![PathBuf::from("/home/u/.docker/config.json")]
        );
    }
}
