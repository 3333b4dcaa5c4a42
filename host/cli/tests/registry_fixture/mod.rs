//! What the plugin registry tests share: a workspace, a plugins directory, two key pairs and a
//! configuration outside the workspace, the `clawcage` binary run against them with none of the
//! machine's credentials, and the `oci://` reference of a repository on a test registry.

use std::path::PathBuf;
use std::process::{Command, Output};

use clawcage_sandbox::components::fixtures;
use clawcage_tests::registry::OciRegistry;
use sha2::Digest as _;

/// A workspace, a plugins directory, a key pair and a configuration outside the workspace.
pub struct Fixture {
    pub root: tempfile::TempDir,
}

impl Fixture {
    pub fn new(config_rest: &str) -> Fixture {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("workspace")).unwrap();
        std::fs::write(root.path().join("workspace/in.txt"), "hello hello world\n").unwrap();
        std::fs::create_dir_all(root.path().join("keys")).unwrap();
        let fixture = Fixture { root };
        fixture.config(config_rest);
        fixture.ok(&[
            "plugins",
            "keygen",
            fixture.path("keys/acme").to_str().unwrap(),
        ]);
        fixture.ok(&[
            "plugins",
            "keygen",
            fixture.path("keys/stranger").to_str().unwrap(),
        ]);
        fixture
    }

    pub fn config(&self, rest: &str) {
        std::fs::write(
            self.path("clawcage.toml"),
            format!("[plugins]\ndir = \"plugins\"\ntrusted_keys = [\"keys/acme.pub\"]\n{rest}"),
        )
        .unwrap();
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .args(args)
            .arg("--workspace")
            .arg(self.path("workspace"))
            .arg("--config")
            .arg(self.path("clawcage.toml"))
            .arg("--state-dir")
            .arg(clawcage_tests::cli_state::shared_state_dir())
            .env_remove("RUST_LOG")
            // No credentials of the machine's.
            .env("HOME", self.path("home"))
            .env_remove("DOCKER_CONFIG")
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("XDG_RUNTIME_DIR")
            .env("PROBE_GREETING", "hi")
            .output()
            .expect("clawcage runs")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "clawcage {args:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The command fails with exit status 1; its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert_eq!(
            output.status.code(),
            Some(1),
            "clawcage {args:?}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    pub fn lock(&self) -> String {
        std::fs::read_to_string(self.path("plugins/plugins.lock")).unwrap_or_default()
    }

    /// A plugin directory of the probe fixture with `manifest_rest` after its name and version.
    pub fn probe_plugin(&self, folder: &str, version: &str, capabilities: &str) -> PathBuf {
        let dir = self.path(folder);
        std::fs::create_dir_all(&dir).unwrap();
        let component = std::fs::read(fixtures::PROBE).unwrap();
        std::fs::write(dir.join("probe.wasm"), &component).unwrap();
        std::fs::write(
            dir.join("plugin.toml"),
            format!(
                "name = \"probe\"\nversion = \"{version}\"\ndescription = \"Reports what it can reach.\"\ncomponent = \"probe.wasm\"\nsha256 = \"{}\"\n\n[capabilities]\n{capabilities}",
                hex::encode(sha2::Sha256::digest(&component))
            ),
        )
        .unwrap();
        dir
    }
}

pub fn oci(registry: &OciRegistry, repo_and_tag: &str) -> String {
    format!("oci://{}/{repo_and_tag}", registry.host())
}
