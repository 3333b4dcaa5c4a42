//! A `clawcage gateway` process for the CLI tests: started from the command a test builds, its
//! address read from the `WebSocket: ws://…` line it prints, everything it prints on stdout and
//! stderr kept (stderr is echoed as well, for a failing test's log), and stopped at the end with
//! SIGTERM (which must end it within 15 s) or killed; a dropped one is killed and reaped.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// How long a gateway may take to print its address (its first start may compile components).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A running `clawcage gateway`.
pub struct GatewayProcess {
    child: Child,
    /// Where its WebSocket and HTTP endpoints listen.
    pub addr: SocketAddr,
    output: Arc<Mutex<String>>,
    /// Kept open so the gateway can always write to its stdout.
    _stdout: mpsc::Receiver<String>,
}

impl GatewayProcess {
    /// Starts `command` (a `clawcage … gateway --bind 127.0.0.1:0 …` line) and waits for it to
    /// print its address.
    pub fn start(command: Command) -> GatewayProcess {
        Self::try_start(command).unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`GatewayProcess::start`], saying why it did not start instead of panicking (a standby
    /// that never serves, its cluster gone).
    pub fn try_start(command: Command) -> Result<GatewayProcess, String> {
        Self::try_start_telling(command, |_| {})
    }

    /// [`GatewayProcess::try_start`], telling `spawned` the process id as soon as it runs (a
    /// standby can then be killed while it waits).
    pub fn try_start_telling(
        command: Command,
        spawned: impl FnOnce(u32),
    ) -> Result<GatewayProcess, String> {
        Self::try_start_watching(command, spawned, |_| {})
    }

    /// [`GatewayProcess::try_start_telling`], telling `relaying` too where a host of a cluster
    /// accepts clients while it waits as a standby (it relays them to the active host).
    pub fn try_start_watching(
        mut command: Command,
        spawned: impl FnOnce(u32),
        relaying: impl FnOnce(SocketAddr),
    ) -> Result<GatewayProcess, String> {
        let mut relaying = Some(relaying);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("clawcage starts");
        spawned(child.id());
        let output = Arc::new(Mutex::new(String::new()));
        let (lines, stdout) = mpsc::channel();
        let out = child.stdout.take().expect("stdout is piped");
        let collected = output.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                lock(&collected).push_str(&format!("{line}\n"));
                let _ = lines.send(line);
            }
        });
        let mut err = child.stderr.take().expect("stderr is piped");
        let collected = output.clone();
        let stderr_read = std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(read) = err.read(&mut buffer) {
                if read == 0 {
                    return;
                }
                let text = String::from_utf8_lossy(&buffer[..read]).into_owned();
                eprint!("{text}");
                lock(&collected).push_str(&text);
            }
        });
        let mut seen = Vec::new();
        let addr = loop {
            let Ok(line) = stdout.recv_timeout(START_TIMEOUT) else {
                let _ = child.kill();
                let _ = child.wait();
                // Everything it said before it ended (why it stopped) is part of the error.
                let _ = stderr_read.join();
                return Err(format!(
                    "the gateway did not start; it printed {seen:?}\n{}",
                    lock(&output)
                ));
            };
            if let Some(rest) = line.strip_prefix("cluster: clients may connect at ws://")
                && let Some(addr) = rest.split('/').next().and_then(|addr| addr.parse().ok())
                && let Some(relaying) = relaying.take()
            {
                relaying(addr);
            }
            if let Some(rest) = line.strip_prefix("WebSocket: ws://") {
                match rest.split('/').next().and_then(|addr| addr.parse().ok()) {
                    Some(addr) => break addr,
                    None => return Err(format!("no address in {line:?}")),
                }
            }
            seen.push(line);
        };
        Ok(GatewayProcess {
            child,
            addr,
            output,
            _stdout: stdout,
        })
    }

    /// Everything it printed so far, stdout and stderr.
    pub fn output(&self) -> String {
        lock(&self.output).clone()
    }

    /// Sends SIGTERM and waits for it to exit; its exit status and everything it printed.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -TERM {pid} failed");
        for _ in 0..300 {
            if let Some(status) = self
                .child
                .try_wait()
                .expect("the gateway can be waited for")
            {
                // The readers finish with the pipes.
                std::thread::sleep(Duration::from_millis(100));
                return (status, self.output());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the gateway did not exit within 15 s of SIGTERM");
    }

    /// kill -9 (nothing to kill when it has exited); everything it printed.
    pub fn kill(mut self) -> String {
        let _ = self.child.kill();
        self.child.wait().expect("the gateway can be waited for");
        self.output()
    }

    /// Its exit status, if it has exited on its own (a gateway of a cluster stops when it
    /// cannot keep its lease).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lock(text: &Mutex<String>) -> std::sync::MutexGuard<'_, String> {
    text.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
