//! Plugins from an OCI registry as the operator meets them, against a real registry (Debian's
//! docker-registry, distribution 2.8) on loopback: `install` (the signature checked, the digest
//! locked), `list`, `update`, `remove` and the restore from the lock, and the attacks a registry
//! can make that this layer must catch: a signature by an untrusted key, a manifest swapped after
//! signing (with and without the old signature copied over), a tag moved after the lock was
//! written, a new version asking for more grants, files changed after the install. Publishing,
//! interop and logins are in `plugins_publish.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

mod registry_fixture;

use clawcage_registry::signature::signature_tag;
use clawcage_registry::{Digest, Reference, RegistryClient, RegistryLimits};
use clawcage_tests::registry::OciRegistry;
use registry_fixture::{Fixture, oci};

/// The `digest` of `name` in the lock text.
fn locked_digest(lock: &str, name: &str) -> String {
    let parsed = clawcage_sandbox::plugin::parse_lock(lock).unwrap();
    parsed.get(name).unwrap().digest.clone()
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
