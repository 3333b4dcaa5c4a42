//! A real OCI registry for the plugin installation tests: `docker-registry` (the CNCF
//! distribution registry, Debian's package) started on 127.0.0.1 on a free port, without TLS or
//! authentication, storing in a temporary directory, waited for until `GET /v2/` answers 200,
//! and killed when dropped; `wkg` (installed once per process by `tests/registry/setup.sh`) to
//! push components into it as publishers do, and `skopeo` to read back what it stored, each run
//! with an empty configuration so that no credentials of the machine are read. When a tool
//! cannot be installed (exit status 3 of the script, or no `docker-registry` on PATH) the caller
//! gets `Err(reason)`, or `None` after [`toolchains::skip`] said why, which fails the test under
//! CI.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::toolchains::{self, repo_root};

/// How long the registry may take to answer `GET /v2/`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How often a start is tried again when another process took the free port first.
const START_ATTEMPTS: usize = 3;

/// The `wkg` binary `tests/registry/setup.sh` installed (once per process; the script also
/// checks that `docker-registry` and `skopeo` are on PATH). `Err` says why it cannot be had
/// (the script's exit status 3); any other failure of the script panics.
pub fn wkg() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY.get_or_init(run_setup).clone()
}

/// [`wkg`], or `None` after [`toolchains::skip`] said why `test` is skipped (a failure under
/// CI).
pub fn wkg_or_skip(test: &str) -> Option<PathBuf> {
    match wkg() {
        Ok(wkg) => Some(wkg),
        Err(reason) => {
            toolchains::skip(test, &reason);
            None
        }
    }
}

/// Runs `tests/registry/setup.sh` and returns the path it printed last.
fn run_setup() -> Result<PathBuf, String> {
    let script = repo_root().join("tests").join("registry").join("setup.sh");
    toolchains::setup_script_path(&script, &[])
}

/// `skopeo` on PATH, or why not.
pub fn skopeo() -> Result<PathBuf, String> {
    on_path("skopeo")
        .ok_or_else(|| "skopeo is not installed (Debian: apt-get install skopeo)".to_string())
}

/// `docker-registry` on PATH, or why not.
pub fn registry_binary() -> Result<PathBuf, String> {
    on_path("docker-registry").ok_or_else(|| {
        "docker-registry is not installed (Debian: apt-get install docker-registry)".to_string()
    })
}

/// The first executable file called `name` in a directory of PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// A running `docker-registry` on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct OciRegistry {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    /// Whether it asks for a user name and password (HTTP Basic, from an htpasswd file).
    authenticated: bool,
}

impl OciRegistry {
    /// A registry for `test`, or `None` after saying why it is skipped.
    pub fn start(test: &str) -> Option<OciRegistry> {
        Self::start_as(test, None)
    }

    /// A registry for `test` that lets in only `user` with `password` (HTTP Basic; the htpasswd
    /// file made with `htpasswd -B`), or `None` after saying why it is skipped.
    pub fn start_with_login(test: &str, user: &str, password: &str) -> Option<OciRegistry> {
        Self::start_as(test, Some((user, password)))
    }

    fn start_as(test: &str, login: Option<(&str, &str)>) -> Option<OciRegistry> {
        let binary = match registry_binary() {
            Ok(binary) => binary,
            Err(reason) => {
                toolchains::skip(test, &reason);
                return None;
            }
        };
        let dir = tempfile::tempdir()
            .unwrap_or_else(|error| panic!("cannot make the registry's directory: {error}"));
        if let Some((user, password)) = login {
            let made = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output();
            let entry = match made {
                Ok(output) if output.status.success() => output.stdout,
                Ok(output) => panic!(
                    "htpasswd failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                ),
                Err(error) => {
                    toolchains::skip(
                        test,
                        &format!("htpasswd (Debian: apache2-utils) cannot run: {error}"),
                    );
                    return None;
                }
            };
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, entry)
                .unwrap_or_else(|error| panic!("cannot write {}: {error}", file.display()));
        }
        let mut registry = OciRegistry {
            dir,
            port: 0,
            child: None,
            authenticated: login.is_some(),
        };
        for attempt in 1..=START_ATTEMPTS {
            match registry.launch(&binary) {
                Ok(()) => return Some(registry),
                Err(log) if attempt < START_ATTEMPTS && log.contains("address already in use") => {
                    continue;
                }
                Err(log) => panic!("docker-registry did not start:\n{log}"),
            }
        }
        panic!("docker-registry did not start after {START_ATTEMPTS} attempts");
    }

    /// Writes the configuration for a fresh free port and starts the registry; `Err` with the
    /// log when it exited before answering.
    fn launch(&mut self, binary: &Path) -> Result<(), String> {
        self.port = free_port();
        let storage = self.dir.path().join("storage");
        std::fs::create_dir_all(&storage)
            .unwrap_or_else(|error| panic!("cannot make {}: {error}", storage.display()));
        let config = self.dir.path().join("config.yml");
        // Filesystem storage in the temporary directory, deletes allowed, plain HTTP on loopback,
        // no authentication, a fixed upload secret (none makes it log a warning), and no upload
        // purging (a background job the tests do not need).
        let text = format!(
            "version: 0.1\n\
             log:\n  level: info\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n  \
             maintenance:\n    uploadpurging:\n      enabled: false\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: clawcage-tests\n",
            storage = storage.display(),
            port = self.port,
        );
        let text = if self.authenticated {
            format!(
                "{text}auth:\n  htpasswd:\n    realm: clawcage-tests\n    path: {}\n",
                self.dir.path().join("htpasswd").display()
            )
        } else {
            text
        };
        std::fs::write(&config, text)
            .unwrap_or_else(|error| panic!("cannot write {}: {error}", config.display()));
        let log_path = self.log_path();
        let log = std::fs::File::create(&log_path)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", log_path.display()));
        let log_err = log
            .try_clone()
            .unwrap_or_else(|error| panic!("cannot share {}: {error}", log_path.display()));
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        // The registry overrides its configuration with REGISTRY_* variables; none may leak in.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("REGISTRY_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // With a login, the base answers 401 and a challenge: it is up all the same.
            let ready = if self.authenticated { "401" } else { "200" };
            if base_answers(self.port, ready) {
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "docker-registry exited ({status}) before answering:\n{}",
                    self.log()
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "docker-registry did not answer GET /v2/ with {ready} within {START_TIMEOUT:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `127.0.0.1:PORT`, the registry part of a reference (`127.0.0.1:PORT/REPO:TAG`).
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The directory the registry stores in (`docker/registry/v2/...` beneath it).
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// What the registry logged (one line per request at `info`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap_or_else(|error| panic!("no free port: {error}"))
}

/// Whether `GET /v2/` on 127.0.0.1:`port` answers with `status` (such as `200`).
fn base_answers(port: u16, status: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request =
        format!("GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let status_line = response.split(|byte| *byte == b'\n').next().unwrap_or(&[]);
    let mut words = status_line.split(|byte| *byte == b' ');
    words
        .next()
        .is_some_and(|version| version.starts_with(b"HTTP/1."))
        && words.next() == Some(status.as_bytes())
}

/// A command of `program` that reads no configuration or credentials of the machine: `HOME`,
/// the XDG directories and `DOCKER_CONFIG` point into `scratch` (fresh and empty), and
/// `REGISTRY_AUTH_FILE` and wkg's `WKG_OCI_*` variables (credentials, insecure hosts) are unset.
fn isolated(program: &Path, scratch: &Path) -> Command {
    let mut command = Command::new(program);
    for dir in ["home", "config", "cache", "data", "docker", "runtime"] {
        let path = scratch.join(dir);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|error| panic!("cannot make {}: {error}", path.display()));
    }
    command
        .stdin(Stdio::null())
        .env("HOME", scratch.join("home"))
        .env("XDG_CONFIG_HOME", scratch.join("config"))
        .env("XDG_CACHE_HOME", scratch.join("cache"))
        .env("XDG_DATA_HOME", scratch.join("data"))
        .env("XDG_RUNTIME_DIR", scratch.join("runtime"))
        .env("DOCKER_CONFIG", scratch.join("docker"))
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("WKG_OCI_USERNAME")
        .env_remove("WKG_OCI_PASSWORD")
        .env_remove("WKG_OCI_INSECURE")
        // wkg's errors carry no backtrace, whatever the test process was run with.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    command
}

/// A fresh empty directory for one command's configuration.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|error| panic!("cannot make a scratch directory: {error}"))
}

/// `wkg oci push 127.0.0.1:PORT/{repo_and_tag} {file} --insecure 127.0.0.1:PORT
/// [--annotation K=V]...`, with no configuration or credentials of the machine. The caller
/// judges the output (`status`, `stderr`).
pub fn wkg_push(
    wkg: &Path,
    registry: &OciRegistry,
    repo_and_tag: &str,
    file: &Path,
    annotations: &[(&str, &str)],
) -> Output {
    let scratch = scratch();
    let mut command = isolated(wkg, scratch.path());
    command
        .args(["oci", "push"])
        .arg(format!("{}/{repo_and_tag}", registry.host()))
        .arg(file)
        .args(["--insecure", &registry.host()]);
    for (key, value) in annotations {
        command.arg("--annotation").arg(format!("{key}={value}"));
    }
    command
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", wkg.display()))
}

/// [`wkg_push`] that must succeed: a panic with wkg's output and the registry's log otherwise.
pub fn wkg_push_ok(
    wkg: &Path,
    registry: &OciRegistry,
    repo_and_tag: &str,
    file: &Path,
    annotations: &[(&str, &str)],
) {
    let output = wkg_push(wkg, registry, repo_and_tag, file, annotations);
    if !output.status.success() {
        panic!(
            "wkg oci push {repo_and_tag} {} failed ({}):\n{}{}\nregistry log:\n{}",
            file.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            registry.log()
        );
    }
}

/// `wkg oci pull 127.0.0.1:PORT/{repo_and_tag} -o {out} --insecure 127.0.0.1:PORT`, with no
/// configuration or credentials of the machine.
pub fn wkg_pull(wkg: &Path, registry: &OciRegistry, repo_and_tag: &str, out: &Path) -> Output {
    let scratch = scratch();
    let mut command = isolated(wkg, scratch.path());
    command
        .args(["oci", "pull"])
        .arg(format!("{}/{repo_and_tag}", registry.host()))
        .arg("-o")
        .arg(out)
        .args(["--insecure", &registry.host()]);
    command
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", wkg.display()))
}

/// The manifest stored under `127.0.0.1:PORT/{repo_and_tag}` (a tag, or `@sha256:...`), exactly
/// as the registry serves it: `skopeo inspect --raw --tls-verify=false --no-creds`. `Err` is
/// skopeo's error output. Panics when skopeo is not installed ([`wkg`] succeeding means it is).
pub fn skopeo_inspect_raw(registry: &OciRegistry, repo_and_tag: &str) -> Result<String, String> {
    skopeo_inspect(registry, repo_and_tag, &["--raw"])
}

/// The config blob of the manifest under `127.0.0.1:PORT/{repo_and_tag}`, exactly as stored:
/// `skopeo inspect --config --raw`. `Err` is skopeo's error output.
pub fn skopeo_inspect_config(registry: &OciRegistry, repo_and_tag: &str) -> Result<String, String> {
    skopeo_inspect(registry, repo_and_tag, &["--config", "--raw"])
}

fn skopeo_inspect(
    registry: &OciRegistry,
    repo_and_tag: &str,
    flags: &[&str],
) -> Result<String, String> {
    let skopeo = skopeo().unwrap_or_else(|reason| panic!("{reason}"));
    let scratch = scratch();
    let output = isolated(&skopeo, scratch.path())
        .arg("inspect")
        .args(flags)
        .args(["--tls-verify=false", "--no-creds"])
        .arg(format!("docker://{}/{repo_and_tag}", registry.host()))
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", skopeo.display()));
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "skopeo inspect {} {repo_and_tag} failed ({}): {}",
            flags.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
