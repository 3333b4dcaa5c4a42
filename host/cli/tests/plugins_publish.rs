//! Plugins from an OCI registry as the tool author and other tools meet them, against a real
//! registry (Debian's docker-registry, distribution 2.8) on loopback: `clawcage plugins keygen`
//! and `push` (signed); the Python and JavaScript examples published, read back by `skopeo
//! inspect` and `wkg oci pull`, installed from the registry and called; a component `wkg`
//! pushed installs and runs; a registry that asks for a login gets the credentials file's entry
//! for it; what a publisher wrote reaches the terminal inert. The operator's side (lock, update,
//! signatures refused) is in `plugins_registry.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

mod registry_fixture;

use std::path::Path;

use clawcage_sandbox::components::fixtures;
use clawcage_tests::registry::{
    OciRegistry, skopeo_inspect_config, skopeo_inspect_raw, wkg_or_skip, wkg_pull, wkg_push_ok,
};
use clawcage_tests::toolchains::{example_plugin, skip};
use registry_fixture::{Fixture, oci};

/// A registry and `wkg` for `test`, or `None` after saying why it is skipped (a failure under CI).
fn registry_and_wkg(test: &str) -> Option<(OciRegistry, std::path::PathBuf)> {
    let registry = OciRegistry::start(test)?;
    let wkg = wkg_or_skip(test)?;
    Some((registry, wkg))
}

#[test]
fn the_examples_are_published_signed_installed_from_the_registry_and_called() {
    let Some((registry, wkg)) = registry_and_wkg("examples from a registry") else {
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
    let Some((registry, wkg)) = registry_and_wkg("wkg interop") else {
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
