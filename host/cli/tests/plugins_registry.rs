//! Plugins from an OCI registry as the operator and the tool author meet them, against a real
//! registry (Debian's docker-registry, distribution 2.8) on loopback: `clawcage plugins keygen`,
//! `push` (signed), `install` (the signature checked, the digest locked), `list`, `update`,
//! `remove` and the restore from the lock; the Python and JavaScript examples published and
//! installed from the registry and called; interop with `wkg` (a component it pushed installs and
//! runs; what clawcage pushed it pulls back) and `skopeo inspect`; and the attacks a registry
//! can make that this layer must catch: a signature by an untrusted key, a manifest swapped after
//! signing (with and without the old signature copied over), a tag moved after the lock was
//! written, a new version asking for more grants, files changed after the install.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clawcage_registry::signature::signature_tag;
use clawcage_registry::{Digest, Reference, RegistryClient, RegistryLimits};
use clawcage_sandbox::components::fixtures;
use clawcage_tests::registry::{
    OciRegistry, skopeo_inspect_config, skopeo_inspect_raw, wkg_or_skip, wkg_pull, wkg_push_ok,
};
use clawcage_tests::toolchains::{example_plugin, skip};
use sha2::Digest as _;

/// A workspace, a plugins directory, a key pair and a configuration outside the workspace.
struct Fixture {
    root: tempfile::TempDir,
}

impl Fixture {
    fn new(config_rest: &str) -> Fixture {
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

    fn config(&self, rest: &str) {
        std::fs::write(
            self.path("clawcage.toml"),
            format!("[plugins]\ndir = \"plugins\"\ntrusted_keys = [\"keys/acme.pub\"]\n{rest}"),
        )
        .unwrap();
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    fn run(&self, args: &[&str]) -> Output {
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

    fn ok(&self, args: &[&str]) -> String {
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
    fn fails(&self, args: &[&str]) -> String {
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

    fn lock(&self) -> String {
        std::fs::read_to_string(self.path("plugins/plugins.lock")).unwrap_or_default()
    }

    /// A plugin directory of the probe fixture with `manifest_rest` after its name and version.
    fn probe_plugin(&self, folder: &str, version: &str, capabilities: &str) -> PathBuf {
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

fn oci(registry: &OciRegistry, repo_and_tag: &str) -> String {
    format!("oci://{}/{repo_and_tag}", registry.host())
}

/// The `digest` of `name` in the lock text.
fn locked_digest(lock: &str, name: &str) -> String {
    let parsed = clawcage_sandbox::plugin::parse_lock(lock).unwrap();
    parsed.get(name).unwrap().digest.clone()
}

#[test]
fn the_examples_are_published_signed_installed_from_the_registry_and_called() {
    let Some(registry) = OciRegistry::start("examples from a registry") else {
        return;
    };
    let Some(wkg) = wkg_or_skip("examples from a registry") else {
        return;
    };
    let mut examples = Vec::new();
    for language in ["python", "js"] {
        match example_plugin(language) {
            Ok(dir) => examples.push(dir),
            Err(reason) => skip(&format!("the {language} example from a registry"), &reason),
        }
    }
    if examples.is_empty() {
        return;
    }
    let fixture = Fixture::new("[plugins.grants.py-text-stats]\nworkspace = \"ro\"\n");
    let key = fixture.path("keys/acme.key");
    let mut references = Vec::new();
    for example in &examples {
        let name = example.file_name().unwrap().to_str().unwrap().to_string();
        let repo_and_tag = format!("examples/{name}:0.1.0");
        let reference = oci(&registry, &repo_and_tag);
        let pushed = fixture.ok(&[
            "plugins",
            "push",
            example.to_str().unwrap(),
            &reference,
            "--key",
            key.to_str().unwrap(),
        ]);
        assert!(
            pushed.contains(&format!("pushed {reference}@sha256:")),
            "{pushed}"
        );
        assert!(pushed.contains("signed by key sha256:"), "{pushed}");

        // skopeo reads it as a well-formed OCI artifact in the WebAssembly layout.
        let raw = skopeo_inspect_raw(&registry, &repo_and_tag).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(manifest["schemaVersion"], 2, "{raw}");
        assert_eq!(
            manifest["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        assert_eq!(
            manifest["config"]["mediaType"],
            "application/vnd.wasm.config.v0+json"
        );
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1, "{raw}");
        assert_eq!(layers[0]["mediaType"], "application/wasm");
        let published = manifest["annotations"]["dev.clawcage.plugin"]
            .as_str()
            .unwrap();
        assert!(
            published.contains(&format!("\"name\":\"{name}\"")),
            "{published}"
        );
        let config: serde_json::Value =
            serde_json::from_str(&skopeo_inspect_config(&registry, &repo_and_tag).unwrap())
                .unwrap();
        assert_eq!(config["architecture"], "wasm", "{config}");
        assert_eq!(config["os"], "wasip2", "{config}");
        let exports = config["component"]["exports"].as_array().unwrap();
        assert!(
            exports
                .iter()
                .any(|export| export.as_str().unwrap().starts_with("clawcage:tool/tool")),
            "{config}"
        );

        // wkg pulls back exactly the component that was published.
        let pulled = fixture.path(&format!("{name}.pulled.wasm"));
        let output = wkg_pull(&wkg, &registry, &repo_and_tag, &pulled);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let manifest_file =
            clawcage_sandbox::plugin::read_manifest(&example.join("plugin.toml")).unwrap();
        assert_eq!(
            std::fs::read(&pulled).unwrap(),
            std::fs::read(example.join(&manifest_file.component)).unwrap()
        );
        references.push(reference);
    }

    let mut args = vec!["plugins", "install"];
    args.extend(references.iter().map(String::as_str));
    let installed = fixture.ok(&args);
    let lock = fixture.lock();
    for example in &examples {
        let name = example.file_name().unwrap().to_str().unwrap();
        assert!(
            installed.contains(&format!("installed {name} 0.1.0 from")),
            "{installed}"
        );
        assert!(lock.contains(&format!("name = \"{name}\"")), "{lock}");
    }
    assert!(installed.contains("signed by  key sha256:"), "{installed}");
    if installed.contains("installed py-text-stats") {
        assert!(installed.contains("asks for   workspace ro"), "{installed}");
        assert!(installed.contains("granted    workspace ro"), "{installed}");
    }
    let listed = fixture.ok(&["plugins", "list"]);
    assert_eq!(
        listed.matches("  installed  oci://").count(),
        examples.len(),
        "{listed}"
    );
    // Nothing the installs left in the directory (the lock, its guard) is taken for a plugin.
    let tools = fixture.run(&["tools"]);
    let stderr = String::from_utf8_lossy(&tools.stderr);
    assert!(!stderr.contains("clawcage: plugin"), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    std::fs::write(
        fixture.path("workspace/hello.txt"),
        "hello hello brave new world\n",
    )
    .unwrap();
    for example in &examples {
        match example.file_name().unwrap().to_str().unwrap() {
            "py-text-stats" => {
                let out = fixture.ok(&["call", "text_stats", r#"{"path": "hello.txt", "top": 1}"#]);
                let stats: serde_json::Value = serde_json::from_str(&out).unwrap();
                assert_eq!(stats["words"], 5, "{stats}");
            }
            "js-tools" => {
                let out = fixture.ok(&["call", "slugify", r#"{"text": "From A Registry"}"#]);
                assert!(out.contains("from-a-registry"), "{out}");
            }
            other => panic!("unexpected example {other}"),
        }
    }
}

#[test]
fn a_component_pushed_with_wkg_installs_and_runs_when_allowed_unsigned() {
    let Some(registry) = OciRegistry::start("wkg interop") else {
        return;
    };
    let Some(wkg) = wkg_or_skip("wkg interop") else {
        return;
    };
    let fixture =
        Fixture::new("[plugins.grants.probe]\nworkspace = \"ro\"\nenv = [\"PROBE_GREETING\"]\n");
    let published = r#"{"name": "probe", "version": "3.1.0", "capabilities": {"workspace": "rw", "env": ["PROBE_GREETING"]}}"#;
    wkg_push_ok(
        &wkg,
        &registry,
        "tools/probe:3.1.0",
        Path::new(fixtures::PROBE),
        &[("dev.clawcage.plugin", published)],
    );
    let reference = oci(&registry, "tools/probe:3.1.0");

    // wkg cannot sign: refused until the operator allows this plugin unsigned.
    let refused = fixture.fails(&["plugins", "install", &reference]);
    assert!(refused.contains("not signed by a trusted key"), "{refused}");
    assert!(refused.contains("no signature is published"), "{refused}");
    assert!(refused.contains("allow_unsigned"), "{refused}");
    assert!(!fixture.path("plugins/probe").exists());
    assert!(fixture.lock().is_empty());

    fixture.config("allow_unsigned = [\"probe\"]\n[plugins.grants.probe]\nworkspace = \"ro\"\nenv = [\"PROBE_GREETING\"]\n");
    let output = fixture.run(&["plugins", "install", &reference]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("installed because [plugins] allow_unsigned names it"),
        "{stderr}"
    );
    assert!(stdout.contains("signed by  unsigned"), "{stdout}");
    assert!(
        stdout.contains("asks for   workspace rw; env PROBE_GREETING"),
        "{stdout}"
    );
    assert!(
        stdout.contains("granted    workspace ro; env PROBE_GREETING"),
        "{stdout}"
    );
    assert!(
        stdout.contains("asked for the workspace rw, granted ro"),
        "{stdout}"
    );

    let out = fixture.ok(&["call", "probe", r#"{"read": "in.txt", "write": "out.txt"}"#]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["read"]["ok"], "hello hello world\n", "{report}");
    assert!(
        report["write"]["error"].is_string(),
        "granted read-only: {report}"
    );
    assert_eq!(report["env"]["PROBE_GREETING"], "hi");
    let tools = fixture.ok(&["tools"]);
    assert!(tools.contains("plugin:probe@3.1.0"), "{tools}");

    // A component without clawcage's annotation installs too, named after its repository,
    // asking for nothing.
    wkg_push_ok(
        &wkg,
        &registry,
        "other/bare-probe:0.2.0",
        Path::new(fixtures::PROBE),
        &[],
    );
    fixture.config("allow_unsigned = [\"probe\", \"bare-probe\"]\n");
    let output = fixture.run(&[
        "plugins",
        "install",
        &oci(&registry, "other/bare-probe:0.2.0"),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("installed bare-probe 0.2.0"), "{stdout}");
    assert!(stdout.contains("asks for   nothing"), "{stdout}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("carries no plugin manifest"));
}

#[test]
fn the_lock_wins_over_a_moved_tag_and_an_update_shows_and_gates_new_grants() {
    let Some(registry) = OciRegistry::start("the lock wins") else {
        return;
    };
    let fixture = Fixture::new("[plugins.grants.probe]\nworkspace = \"ro\"\n");
    let key = fixture.path("keys/acme.key");
    let key = key.to_str().unwrap();
    let stable = oci(&registry, "tools/probe:stable");
    let v1 = fixture.probe_plugin("src-v1", "1.0.0", "workspace = \"ro\"\n");
    fixture.ok(&[
        "plugins",
        "push",
        v1.to_str().unwrap(),
        &stable,
        "--key",
        key,
    ]);
    let installed = fixture.ok(&["plugins", "install", &stable]);
    assert!(installed.contains("installed probe 1.0.0"), "{installed}");
    let first = locked_digest(&fixture.lock(), "probe");

    // The tag moves to a version that asks for more.
    let v2 = fixture.probe_plugin(
        "src-v2",
        "2.0.0",
        "workspace = \"ro\"\nenv = [\"PROBE_GREETING\"]\n",
    );
    fixture.ok(&[
        "plugins",
        "push",
        v2.to_str().unwrap(),
        &stable,
        "--key",
        key,
    ]);

    // Installing the tag again does not move the lock.
    let refused = fixture.fails(&["plugins", "install", &stable]);
    assert!(refused.contains("already installed"), "{refused}");
    assert!(
        refused.contains("clawcage plugins update probe"),
        "{refused}"
    );
    assert_eq!(locked_digest(&fixture.lock(), "probe"), first);

    // A lost plugin directory comes back as locked, not as the tag says now.
    std::fs::remove_dir_all(fixture.path("plugins/probe")).unwrap();
    assert!(
        fixture
            .ok(&["plugins", "list"])
            .contains("probe 1.0.0  missing")
    );
    let tools = fixture.run(&["tools"]);
    let stderr = String::from_utf8_lossy(&tools.stderr);
    assert!(
        stderr.contains("probe is in plugins.lock but not installed"),
        "{stderr}"
    );
    let restored = fixture.ok(&["plugins", "install"]);
    assert!(
        restored.contains("probe: restored (it was missing)"),
        "{restored}"
    );
    let manifest = std::fs::read_to_string(fixture.path("plugins/probe/plugin.toml")).unwrap();
    assert!(manifest.contains("version = \"1.0.0\""), "{manifest}");
    assert!(fixture.ok(&["tools"]).contains("plugin:probe@1.0.0"));

    // Files changed after the install: the loader refuses them, a restore puts them back.
    std::fs::write(
        fixture.path("plugins/probe/plugin.toml"),
        manifest.replace("workspace = \"ro\"", "workspace = \"rw\""),
    )
    .unwrap();
    let output = fixture.run(&["tools"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("asks for the workspace rw beyond what was accepted"),
        "{stderr}"
    );
    assert!(
        fixture
            .ok(&["plugins", "list"])
            .contains("probe 1.0.0  changed")
    );
    assert!(
        fixture
            .ok(&["plugins", "install"])
            .contains("probe: restored (its files had changed)")
    );
    assert!(fixture.ok(&["tools"]).contains("plugin:probe@1.0.0"));

    // An update shows the new grants and needs them accepted.
    let refused = fixture.fails(&["plugins", "update", "probe"]);
    assert!(
        refused.contains("asks for more than was accepted: env PROBE_GREETING"),
        "{refused}"
    );
    assert!(refused.contains("--accept-grants"), "{refused}");
    assert_eq!(locked_digest(&fixture.lock(), "probe"), first);
    let updated = fixture.ok(&["plugins", "update", "probe", "--accept-grants"]);
    let second = locked_digest(&fixture.lock(), "probe");
    assert_ne!(second, first);
    assert!(updated.contains("version    1.0.0 -> 2.0.0"), "{updated}");
    assert!(
        updated.contains(&format!("digest     {first} -> {second}")),
        "{updated}"
    );
    assert!(
        updated.contains("asks for more: env PROBE_GREETING"),
        "{updated}"
    );
    assert!(
        updated.contains("asked for env PROBE_GREETING, not granted"),
        "{updated}"
    );
    assert!(
        fixture
            .ok(&["plugins", "update", "probe"])
            .contains("is up to date")
    );
    assert!(fixture.ok(&["tools"]).contains("plugin:probe@2.0.0"));

    let removed = fixture.ok(&["plugins", "remove", "probe"]);
    assert!(removed.contains("removed probe"));
    assert!(!fixture.path("plugins/probe").exists());
    assert!(!fixture.lock().contains("probe"), "{}", fixture.lock());
    let not_there = fixture.run(&["plugins", "remove", "probe"]);
    assert_eq!(not_there.status.code(), Some(2));
}

#[test]
fn untrusted_signatures_and_manifests_swapped_after_signing_are_refused() {
    let Some(registry) = OciRegistry::start("swapped manifests") else {
        return;
    };
    let fixture = Fixture::new("");
    let acme = fixture.path("keys/acme.key");
    let stranger = fixture.path("keys/stranger.key");
    let plugin = fixture.probe_plugin("src", "1.0.0", "");

    // Signed, but by a key the operator does not trust.
    let by_stranger = oci(&registry, "tools/probe:stranger");
    fixture.ok(&[
        "plugins",
        "push",
        plugin.to_str().unwrap(),
        &by_stranger,
        "--key",
        stranger.to_str().unwrap(),
    ]);
    let refused = fixture.fails(&["plugins", "install", &by_stranger]);
    assert!(
        refused.contains("signed by a key not in [plugins] trusted_keys"),
        "{refused}"
    );
    assert!(!fixture.path("plugins/probe").exists());

    // Signed by the trusted key, then the tag is pointed at another manifest.
    let tag = oci(&registry, "tools/probe:1");
    let pushed = fixture.ok(&[
        "plugins",
        "push",
        plugin.to_str().unwrap(),
        &tag,
        "--key",
        acme.to_str().unwrap(),
    ]);
    let signed = Digest::parse(
        pushed
            .split('@')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap(),
    )
    .unwrap();
    let swapped = fixture.probe_plugin("swapped", "1.0.1", "workspace = \"rw\"\n");
    fixture.ok(&[
        "plugins",
        "push",
        swapped.to_str().unwrap(),
        &tag,
        "--unsigned",
    ]);
    let refused = fixture.fails(&["plugins", "install", &tag]);
    assert!(refused.contains("no signature is published"), "{refused}");

    // The old signature copied to the new digest's signature tag does not help.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reference = Reference::parse(&tag).unwrap();
    runtime.block_on(async {
        let client = RegistryClient::new(&reference, None, RegistryLimits::default());
        let now = client.manifest("tools/probe", "1").await.unwrap().digest;
        assert_ne!(now, signed);
        let signature = client
            .manifest("tools/probe", &signature_tag(&signed))
            .await
            .unwrap();
        client
            .push_manifest(
                "tools/probe",
                &signature_tag(&now),
                &signature.bytes,
                "application/vnd.oci.image.manifest.v1+json",
            )
            .await
            .unwrap();
    });
    let refused = fixture.fails(&["plugins", "install", &tag]);
    assert!(
        refused.contains(&format!(
            "a trusted key signed {signed}, not this artifact's"
        )),
        "{refused}"
    );
    assert!(fixture.lock().is_empty());

    // The signed digest itself still installs, by digest.
    let pinned = format!("{}@{signed}", oci(&registry, "tools/probe"));
    let installed = fixture.ok(&["plugins", "install", &pinned]);
    assert!(installed.contains("installed probe 1.0.0"), "{installed}");
    // Installed by digest, it is restored by that digest and has no tag to update to.
    std::fs::remove_dir_all(fixture.path("plugins/probe")).unwrap();
    let restored = fixture.ok(&["plugins", "install"]);
    assert!(restored.contains("probe: restored"), "{restored}");
    let no_tag = fixture.fails(&["plugins", "update", "probe"]);
    assert!(no_tag.contains("installed by digest"), "{no_tag}");
}

#[test]
fn bad_references_and_missing_configuration_are_usage_errors() {
    let fixture = Fixture::new("");
    for bad in [
        "ghcr.io/acme/tool:1",
        "oci://ghcr.io/acme/tool",
        "oci://ghcr.io/Acme/tool:1",
    ] {
        let output = fixture.run(&["plugins", "install", bad]);
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("oci://"),
            "{bad}"
        );
    }
    std::fs::write(fixture.path("clawcage.toml"), "").unwrap();
    let output = fixture.run(&["plugins", "list"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("set [plugins] dir"));
    let exists = fixture.run(&[
        "plugins",
        "keygen",
        fixture.path("keys/acme").to_str().unwrap(),
    ]);
    assert_eq!(exists.status.code(), Some(2));
    let private = std::fs::metadata(fixture.path("keys/acme.key")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(private.permissions().mode() & 0o777, 0o600);
}

#[test]
fn what_a_publisher_wrote_cannot_restyle_the_terminal_or_fake_a_line() {
    let Some(registry) = OciRegistry::start("publisher text") else {
        return;
    };
    let fixture = Fixture::new("allow_unsigned = [\"probe\"]\n");
    let dir = fixture.probe_plugin("src", "1.0.0", "");
    let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        manifest.replace(
            "Reports what it can reach.",
            "Harmless.\\u001b[2J\\u001b]0;owned\\u0007\\n  signed by  key sha256:trusted",
        ),
    )
    .unwrap();
    let reference = oci(&registry, "tools/probe:1.0.0");
    fixture.ok(&[
        "plugins",
        "push",
        dir.to_str().unwrap(),
        &reference,
        "--unsigned",
    ]);
    let output = fixture.run(&["plugins", "install", &reference]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !stdout.contains('\u{1b}') && !stdout.contains('\u{7}'),
        "{stdout:?}"
    );
    assert!(
        stdout.contains("Harmless.␛[2J␛]0;owned␇   signed by  key sha256:trusted"),
        "{stdout}"
    );
    let signed_lines: Vec<&str> = stdout
        .lines()
        .filter(|line| line.trim_start().starts_with("signed by"))
        .collect();
    assert_eq!(signed_lines, ["  signed by  unsigned"], "{stdout}");
}

#[test]
fn a_registry_that_asks_for_a_login_gets_the_credentials_file_entry_for_it_alone() {
    let Some(registry) =
        OciRegistry::start_with_login("registry login", "robot", "s3cret-registry-pw")
    else {
        return;
    };
    let fixture = Fixture::new("");
    let plugin = fixture.probe_plugin("src", "1.0.0", "");
    let key = fixture.path("keys/acme.key");
    let reference = oci(&registry, "private/probe:1.0.0");

    // No credentials: the registry's refusal says how to log in.
    let refused = fixture.fails(&[
        "plugins",
        "push",
        plugin.to_str().unwrap(),
        &reference,
        "--key",
        key.to_str().unwrap(),
    ]);
    assert!(refused.contains("asks for credentials"), "{refused}");
    assert!(refused.contains("login"), "{refused}");

    // An entry in ~/.docker/config.json for this registry (and one for another host, unused).
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret-registry-pw");
    let other = base64::engine::general_purpose::STANDARD.encode("robot:other-host-pw");
    std::fs::create_dir_all(fixture.path("home/.docker")).unwrap();
    std::fs::write(
        fixture.path("home/.docker/config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{auth}"}}, "127.0.0.1:1": {{"auth": "{other}"}}}}}}"#,
            registry.host()
        ),
    )
    .unwrap();
    fixture.ok(&[
        "plugins",
        "push",
        plugin.to_str().unwrap(),
        &reference,
        "--key",
        key.to_str().unwrap(),
    ]);
    let installed = fixture.ok(&["plugins", "install", &reference]);
    assert!(installed.contains("installed probe 1.0.0"), "{installed}");
    assert!(installed.contains("signed by  key sha256:"), "{installed}");
    assert!(fixture.ok(&["tools"]).contains("plugin:probe@1.0.0"));

    // A wrong password is named as refused, without the password.
    std::fs::write(
        fixture.path("home/.docker/config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#,
            registry.host(),
            base64::engine::general_purpose::STANDARD.encode("robot:wrong-pw")
        ),
    )
    .unwrap();
    std::fs::remove_dir_all(fixture.path("plugins/probe")).unwrap();
    let refused = fixture.fails(&["plugins", "install"]);
    assert!(refused.contains("refused the credentials"), "{refused}");
    assert!(
        !refused.contains("wrong-pw") && !refused.contains("s3cret"),
        "{refused}"
    );
}
