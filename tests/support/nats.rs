//! A NATS server for the cluster tests and benchmarks: `nats-server` (installed once per process
//! by `tests/nats/setup.sh`, or the binary `NATS_SERVER` names; an older one the backend must
//! refuse by `setup.sh old` or `NATS_SERVER_OLD`) started on 127.0.0.1 on a free
//! port the server picks itself (`-p -1`, read back from its ports file), with JetStream storing
//! in a temporary directory, waited for until it accepts connections, and killed when dropped.
//! It can be stopped and started again on the same port and store, as a server that went away
//! and came back. When the server cannot be installed (exit status 3 of the script) the caller
//! gets `None` after [`toolchains::skip`] said why, which fails the test under CI.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::toolchains::{self, repo_root};

/// How long a server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The `nats-server` binary: `NATS_SERVER`, else what `tests/nats/setup.sh` installed (once per
/// process). `Err` says why it cannot be had.
pub fn server_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| installed("NATS_SERVER", None))
        .clone()
}

/// A server older than the backend accepts (Debian's 2.9.10): `NATS_SERVER_OLD`, else what
/// `tests/nats/setup.sh old` installed (once per process).
pub fn old_server_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| installed("NATS_SERVER_OLD", Some("old")))
        .clone()
}

/// The binary `variable` names, else the path `tests/nats/setup.sh [argument]` printed; `Err`
/// when the script could not install it (its exit status 3); a panic on any other failure.
fn installed(variable: &str, argument: Option<&str>) -> Result<PathBuf, String> {
    if let Some(binary) = std::env::var_os(variable) {
        return Ok(PathBuf::from(binary));
    }
    let script = repo_root().join("tests").join("nats").join("setup.sh");
    crate::toolchains::setup_script_path(&script, argument.as_slice())
}

/// A running `nats-server`, killed on drop.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    jetstream: bool,
    store: tempfile::TempDir,
    port: u16,
    /// Further arguments (TLS, monitoring).
    extra: Vec<String>,
    /// The monitoring port, when it has one.
    monitor: Option<u16>,
    child: Option<Child>,
}

impl NatsServer {
    /// A server with JetStream for `test`, or `None` after saying why it is skipped.
    pub fn start(test: &str) -> Option<Self> {
        Self::start_with(test, true)
    }

    /// A server with JetStream (`jetstream`) or without, for `test`, or `None` after saying why
    /// it is skipped.
    pub fn start_with(test: &str, jetstream: bool) -> Option<Self> {
        Self::start_binary(test, server_binary(), jetstream)
    }

    /// Debian's nats-server 2.9.10 with JetStream, older than the backend accepts, for `test`,
    /// or `None` after saying why it is skipped.
    pub fn start_old(test: &str) -> Option<Self> {
        Self::start_binary(test, old_server_binary(), true)
    }

    fn start_binary(test: &str, binary: Result<PathBuf, String>, jetstream: bool) -> Option<Self> {
        let binary = match binary {
            Ok(binary) => binary,
            Err(reason) => {
                toolchains::skip(test, &reason);
                return None;
            }
        };
        let mut server = Self {
            binary,
            jetstream,
            store: tempfile::tempdir().expect("a temporary store directory"),
            port: 0,
            extra: Vec::new(),
            monitor: None,
            child: None,
        };
        server.launch();
        Some(server)
    }

    /// A server with JetStream that speaks only TLS, with a certificate for 127.0.0.1 issued by
    /// a certificate authority made for it (by the `openssl` command), for `test`; with the path
    /// of that authority's PEM certificate. `None` after saying why it is skipped.
    pub fn start_tls(test: &str) -> Option<(Self, PathBuf)> {
        let mut server = Self::start(test)?;
        server.kill();
        let dir = server.store.path().join("tls");
        std::fs::create_dir_all(&dir).expect("the TLS directory");
        let openssl = |args: &[&str]| {
            Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .output()
                .map_err(|error| format!("cannot run openssl: {error}"))
                .and_then(|output| {
                    if output.status.success() {
                        Ok(())
                    } else {
                        Err(format!(
                            "openssl {} failed: {}",
                            args.join(" "),
                            String::from_utf8_lossy(&output.stderr)
                        ))
                    }
                })
        };
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("the certificate's extensions");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let made = openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=clawcage test CA",
                ],
            ]
            .concat(),
        )
        .and_then(|()| {
            openssl(
                &[
                    &["req"][..],
                    &ec,
                    &[
                        "-keyout",
                        "server.key",
                        "-out",
                        "server.csr",
                        "-subj",
                        "/CN=127.0.0.1",
                    ],
                ]
                .concat(),
            )
        })
        .and_then(|()| {
            openssl(&[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "1",
                "-extfile",
                "server.ext",
            ])
        });
        if let Err(reason) = made {
            toolchains::skip(test, &reason);
            return None;
        }
        let path = |name: &str| dir.join(name).display().to_string();
        server.extra = vec![
            "--tls".into(),
            "--tlscert".into(),
            path("server.pem"),
            "--tlskey".into(),
            path("server.key"),
        ];
        server.launch();
        Some((server, dir.join("ca.pem")))
    }

    /// A server with JetStream and its monitoring endpoint on `monitor_port` (`/varz`, read by
    /// [`NatsServer::traffic`]), for `test`; `None` after saying why it is skipped.
    pub fn start_monitored(test: &str, monitor_port: u16) -> Option<Self> {
        let mut server = Self::start(test)?;
        server.kill();
        server.extra = vec!["-m".into(), monitor_port.to_string()];
        server.monitor = Some(monitor_port);
        server.launch();
        Some(server)
    }

    /// Messages and bytes into and out of the server so far (`/varz`'s `in_msgs`, `out_msgs`,
    /// `in_bytes`, `out_bytes`), for a server started with [`NatsServer::start_monitored`].
    pub fn traffic(&self) -> [u64; 4] {
        use std::io::{Read as _, Write as _};
        let port = self
            .monitor
            .expect("the server was started with monitoring");
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the monitoring port");
        stream
            .write_all(b"GET /varz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("the request is sent");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .expect("the response is read");
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let varz: serde_json::Value = serde_json::from_str(body).expect("/varz is JSON");
        ["in_msgs", "out_msgs", "in_bytes", "out_bytes"]
            .map(|field| varz[field].as_u64().unwrap_or_default())
    }

    /// Three servers with JetStream routed into one cluster (`clawcage`, servers `n0`..`n2`),
    /// for `test`; `None` after saying why it is skipped. [`NatsServer::urls`] names them all.
    pub fn start_cluster(test: &str) -> Option<Vec<Self>> {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .map(|address| address.port())
                .expect("a free port")
        };
        let binary = match server_binary() {
            Ok(binary) => binary,
            Err(reason) => {
                toolchains::skip(test, &reason);
                return None;
            }
        };
        // The ports are free when picked, but another socket may take one before its server
        // binds it (an outgoing connection's ephemeral port among them): then the whole cluster
        // starts again on new ports.
        let mut tries = 0;
        'cluster: loop {
            tries += 1;
            let client: Vec<u16> = (0..3).map(|_| free()).collect();
            let routes: Vec<u16> = (0..3).map(|_| free()).collect();
            let mut nodes: Vec<Self> = Vec::new();
            for index in 0..3 {
                let others: Vec<String> = (0..3)
                    .filter(|other| *other != index)
                    .map(|other| format!("nats://127.0.0.1:{}", routes[other]))
                    .collect();
                let mut server = Self {
                    binary: binary.clone(),
                    jetstream: true,
                    store: tempfile::tempdir().expect("a temporary store directory"),
                    port: client[index],
                    extra: vec![
                        "-n".into(),
                        format!("n{index}"),
                        "--cluster_name".into(),
                        "clawcage".into(),
                        "--cluster".into(),
                        format!("nats://127.0.0.1:{}", routes[index]),
                        "--routes".into(),
                        others.join(","),
                    ],
                    monitor: None,
                    child: None,
                };
                if let Err(why) = server.try_launch() {
                    assert!(tries < 5, "{why}");
                    eprintln!(
                        "a NATS cluster node did not start; starting the cluster again: {why}"
                    );
                    continue 'cluster;
                }
                nodes.push(server);
            }
            return Some(nodes);
        }
    }

    /// The client URLs of `nodes`, as one connection string.
    pub fn urls(nodes: &[NatsServer]) -> String {
        nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The directory JetStream stores in.
    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }

    /// Kills the server at once (its store stays).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stalls the server (SIGSTOP): its connections stay open and every request waits, as on
    /// a server that hangs; [`NatsServer::resume`] lets it go on.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets a server stalled by [`NatsServer::pause`] go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, signal: &str) {
        let Some(child) = &self.child else {
            panic!("the NATS server on port {} is not running", self.port);
        };
        let sent = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal} failed");
    }

    /// Starts the server again on the same port and store, after [`NatsServer::kill`].
    pub fn restart(&mut self) {
        self.kill();
        // Its port may be held for a moment by another socket (a connection's ephemeral port):
        // tried again for a few seconds.
        for _ in 0..20 {
            match self.try_launch() {
                Ok(()) => return,
                Err(why) if why.contains("address already in use") => {
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(why) => panic!("{why}"),
            }
        }
        self.launch();
    }

    fn launch(&mut self) {
        self.try_launch().unwrap_or_else(|why| panic!("{why}"));
    }

    /// Starts the server and waits until it accepts connections, or says why it did not.
    fn try_launch(&mut self) -> Result<(), String> {
        let ports_dir = self.store.path().join("ports");
        let _ = std::fs::remove_dir_all(&ports_dir);
        std::fs::create_dir_all(&ports_dir).expect("the ports file directory");
        let port = if self.port == 0 {
            "-1".to_string()
        } else {
            self.port.to_string()
        };
        let mut command = Command::new(&self.binary);
        command
            .args(["-a", "127.0.0.1", "-p", &port, "--ports_file_dir"])
            .arg(&ports_dir)
            .arg("-l")
            .arg(self.store.path().join("server.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.jetstream {
            command
                .arg("-js")
                .arg("-sd")
                .arg(self.store.path().join("js"));
        }
        command.args(&self.extra);
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", self.binary.display()));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(port) = read_port(&ports_dir)
                && TcpStream::connect(("127.0.0.1", port)).is_ok()
            {
                self.port = port;
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "nats-server exited ({status}) before accepting connections:\n{}",
                    self.log()
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "nats-server did not accept connections within {START_TIMEOUT:?}:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
        Ok(())
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.store.path().join("server.log")).unwrap_or_default()
    }
}

/// The client port in a ports file (`{"nats":["nats://127.0.0.1:PORT"]}`) in `dir`.
fn read_port(dir: &Path) -> Option<u16> {
    let entry = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .find(|entry| entry.file_name().to_string_lossy().ends_with(".ports"))?;
    let text = std::fs::read_to_string(entry.path()).ok()?;
    let ports: serde_json::Value = serde_json::from_str(&text).ok()?;
    let url = ports["nats"].as_array()?.first()?.as_str()?;
    url.rsplit(':').next()?.parse().ok()
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
