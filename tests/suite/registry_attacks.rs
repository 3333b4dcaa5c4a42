//! What a hostile or broken registry can do to `clawcage plugins install`, each against a
//! registry on loopback that speaks the real distribution protocol and misbehaves on purpose: a
//! blob whose bytes do not match its digest, a manifest whose stated digest lies, a layer larger
//! than the limit (never downloaded), a blob longer than its descriptor, a blob that stalls
//! halfway, redirects to plain http elsewhere and to internal addresses, an image index, a huge
//! manifest; credentials that must reach the registry and nothing else (not a redirect's target,
//! not a token service on another host); and signatures checked offline in cosign's format, made
//! and checked against `openssl` as well.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use clawcage_registry::install::{self, Settings};
use clawcage_registry::signature::{self, PublicKey, SigningKey, Verdict};
use clawcage_registry::{Digest, Reference, RegistryClient, RegistryLimits, TrustedKeys};
use clawcage_sandbox::components::fixtures;
use clawcage_tests::fake_registry::{
    FakeRegistry, FakeTokenServer, OCI_MANIFEST, component_config, component_manifest,
    sha256_digest,
};

fn probe() -> Vec<u8> {
    std::fs::read(fixtures::PROBE).unwrap()
}

fn settings(dir: &Path, allow_unsigned: &[&str], credentials: Vec<std::path::PathBuf>) -> Settings {
    Settings {
        plugins_dir: dir.join("plugins"),
        trusted: TrustedKeys::default(),
        allow_unsigned: allow_unsigned.iter().map(|name| name.to_string()).collect(),
        credential_files: credentials,
        limits: RegistryLimits {
            request_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(3),
            ..RegistryLimits::default()
        },
    }
}

fn reference(registry: &FakeRegistry, repo_and_tag: &str) -> Reference {
    Reference::parse(&format!("oci://{}/{repo_and_tag}", registry.host())).unwrap()
}

fn fetch(settings: &Settings, reference: &Reference) -> Result<install::Fetched, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(install::fetch(settings, reference, &mut |_| {}))
}

fn blob_requests(registry: &FakeRegistry, digest: &str) -> usize {
    registry
        .requests()
        .iter()
        .filter(|request| {
            request.method == "GET" && request.path.ends_with(&format!("/blobs/{digest}"))
        })
        .count()
}

#[test]
fn a_good_artifact_installs_and_unsigned_ones_are_refused_before_any_download() {
    let registry = FakeRegistry::start();
    let pushed = registry.put_component("acme/probe", "1.0.0", &probe(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let refused = fetch(
        &settings(dir.path(), &[], vec![]),
        &reference(&registry, "acme/probe:1.0.0"),
    )
    .unwrap_err();
    assert!(refused.contains("not signed by a trusted key"), "{refused}");
    assert_eq!(
        blob_requests(&registry, &pushed.layer),
        0,
        "nothing is downloaded before the signature"
    );

    let fetched = fetch(
        &settings(dir.path(), &["probe"], vec![]),
        &reference(&registry, "acme/probe:1.0.0"),
    )
    .unwrap();
    assert_eq!(fetched.component, probe());
    assert_eq!(fetched.artifact.plugin.name, "probe");
    assert_eq!(
        fetched.reference.digest.as_ref().unwrap().to_string(),
        pushed.manifest
    );
}

#[test]
fn a_blob_whose_bytes_do_not_match_its_digest_is_refused() {
    let registry = FakeRegistry::start();
    let pushed = registry.put_component("acme/probe", "1", &probe(), &[]);
    let mut tampered = probe();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0xff;
    registry.put_blob_as("acme/probe", &pushed.layer, &tampered);
    let dir = tempfile::tempdir().unwrap();
    let error = fetch(
        &settings(dir.path(), &["probe"], vec![]),
        &reference(&registry, "acme/probe:1"),
    )
    .unwrap_err();
    assert!(
        error.contains(&format!("do not have its digest {}", pushed.layer)),
        "{error}"
    );
    assert!(!dir.path().join("plugins").exists());
}

#[test]
fn a_manifest_whose_stated_digest_lies_or_that_is_not_one_component_is_refused() {
    let registry = FakeRegistry::start();
    let wasm = probe();
    let config = component_config(&wasm);
    let config_digest = registry.put_blob("acme/probe", &config);
    let layer = registry.put_blob("acme/probe", &wasm);
    let manifest = component_manifest(
        (&config_digest, config.len()),
        (&layer, wasm.len()),
        "probe.wasm",
        &[],
    );
    let lie = sha256_digest(b"another manifest");
    registry.put_manifest_as("acme/probe", "lying", &lie, &manifest, OCI_MANIFEST);
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path(), &["probe"], vec![]);
    let error = fetch(&settings, &reference(&registry, "acme/probe:lying")).unwrap_err();
    assert!(
        error.contains(&format!(
            "says the manifest acme/probe:lying has digest {lie}"
        )),
        "{error}"
    );

    // Asked by digest, an answer of other bytes is refused.
    registry.put_manifest_as("acme/probe", &lie, &lie, &manifest, OCI_MANIFEST);
    let by_digest =
        Reference::parse(&format!("oci://{}/acme/probe@{lie}", registry.host())).unwrap();
    let error = fetch(&settings, &by_digest).unwrap_err();
    assert!(error.contains("with bytes of digest"), "{error}");

    let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    registry.put_manifest(
        "acme/probe",
        "index",
        index,
        "application/vnd.oci.image.index.v1+json",
    );
    let error = fetch(&settings, &reference(&registry, "acme/probe:index")).unwrap_err();
    assert!(error.contains("image index"), "{error}");

    let two_layers = String::from_utf8(component_manifest((&config_digest, config.len()), (&layer, wasm.len()), "probe.wasm", &[]))
        .unwrap()
        .replace("\"layers\":[", &format!("\"layers\":[{{\"mediaType\":\"application/wasm\",\"digest\":\"{layer}\",\"size\":{}}},", wasm.len()));
    registry.put_manifest("acme/probe", "two", two_layers.as_bytes(), OCI_MANIFEST);
    let error = fetch(&settings, &reference(&registry, "acme/probe:two")).unwrap_err();
    assert!(error.contains("2 application/wasm layers"), "{error}");

    let mut huge = manifest.clone();
    huge.pop();
    huge.extend(format!(",\"padding\":\"{}\"}}", "x".repeat(5 << 20)).bytes());
    registry.put_manifest("acme/probe", "huge", &huge, OCI_MANIFEST);
    let error = fetch(&settings, &reference(&registry, "acme/probe:huge")).unwrap_err();
    assert!(error.contains("is larger than"), "{error}");
}

#[test]
fn an_oversized_layer_is_never_downloaded_and_a_blob_longer_than_said_is_refused() {
    let registry = FakeRegistry::start();
    let wasm = probe();
    let config = component_config(&wasm);
    let config_digest = registry.put_blob("acme/probe", &config);
    let layer = registry.put_blob("acme/probe", &wasm);
    let oversized = component_manifest(
        (&config_digest, config.len()),
        (&layer, 300 << 20),
        "probe.wasm",
        &[],
    );
    registry.put_manifest("acme/probe", "big", &oversized, OCI_MANIFEST);
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path(), &["probe"], vec![]);
    let error = fetch(&settings, &reference(&registry, "acme/probe:big")).unwrap_err();
    assert!(error.contains("over the limit"), "{error}");
    assert_eq!(blob_requests(&registry, &layer), 0);

    // The descriptor says fewer bytes than the registry sends.
    let short = &wasm[..wasm.len() - 100];
    let short_digest = sha256_digest(short);
    registry.put_blob_as("acme/probe", &short_digest, &wasm);
    let longer = component_manifest(
        (&config_digest, config.len()),
        (&short_digest, short.len()),
        "probe.wasm",
        &[],
    );
    registry.put_manifest("acme/probe", "longer", &longer, OCI_MANIFEST);
    let error = fetch(&settings, &reference(&registry, "acme/probe:longer")).unwrap_err();
    assert!(error.contains("sent more than"), "{error}");
}

#[test]
fn a_registry_that_stalls_mid_blob_is_given_up_on_at_the_time_limit() {
    let registry = FakeRegistry::start();
    let pushed = registry.put_component("acme/probe", "1", &probe(), &[]);
    registry.stall_blob(&pushed.layer, 1000);
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let error = fetch(
        &settings(dir.path(), &["probe"], vec![]),
        &reference(&registry, "acme/probe:1"),
    )
    .unwrap_err();
    let waited = started.elapsed();
    assert!(error.contains("the component of probe"), "{error}");
    assert!(
        waited >= Duration::from_secs(2),
        "gave up after {waited:?}: {error}"
    );
    assert!(waited < Duration::from_secs(20), "waited {waited:?}");
}

#[test]
fn redirects_to_plain_http_elsewhere_or_to_internal_addresses_are_refused() {
    for (location, expected) in [
        ("http://8.8.8.8/blob", "plain http"),
        ("https://10.1.2.3/blob", "10.1.2.3"),
        (
            "https://169.254.169.254/latest/meta-data",
            "169.254.169.254",
        ),
        ("https://[fd00::1]/blob", "fd00::1"),
        ("file:///etc/passwd", "only http:// and https://"),
    ] {
        let registry = FakeRegistry::start();
        let pushed = registry.put_component("acme/probe", "1", &probe(), &[]);
        registry.redirect_blob(&pushed.layer, location);
        let dir = tempfile::tempdir().unwrap();
        let error = fetch(
            &settings(dir.path(), &["probe"], vec![]),
            &reference(&registry, "acme/probe:1"),
        )
        .unwrap_err();
        assert!(error.contains(expected), "{location}: {error}");
        assert!(!dir.path().join("plugins").exists());
    }
}

/// A credentials file with `user:password` for `registry`.
fn credentials_file(dir: &Path, registry: &str) -> std::path::PathBuf {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("robot:hunter2-registry-only");
    let path = dir.join("auth.json");
    std::fs::write(
        &path,
        format!(r#"{{"auths":{{"{registry}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    path
}

#[test]
fn credentials_go_to_their_registry_and_not_to_where_it_redirects() {
    let registry = FakeRegistry::start();
    let elsewhere = FakeTokenServer::start("not-a-blob");
    registry.require_basic("robot", "hunter2-registry-only");
    let pushed = registry.put_component("acme/probe", "1", &probe(), &[]);
    registry.redirect_blob(&pushed.layer, &elsewhere.url("/blob"));
    let dir = tempfile::tempdir().unwrap();
    let file = credentials_file(dir.path(), &registry.host());
    let error = fetch(
        &settings(dir.path(), &["probe"], vec![file]),
        &reference(&registry, "acme/probe:1"),
    )
    .unwrap_err();
    // The other host answered (so the redirect was followed) with something that is not the blob.
    assert!(error.contains("the component of probe"), "{error}");
    let there = elsewhere.requests();
    assert_eq!(there.len(), 1, "{there:?}");
    assert_eq!(there[0].header("authorization"), None, "{there:?}");
    let here = registry.requests();
    assert!(
        here.iter().any(|request| request
            .header("authorization")
            .is_some_and(|value| value.starts_with("Basic "))),
        "the registry itself got the credentials: {here:?}"
    );
    assert!(!error.contains("hunter2"), "{error}");
}

#[test]
fn a_token_service_on_another_host_gets_no_credentials() {
    let registry = FakeRegistry::start();
    let tokens = FakeTokenServer::start("tok-abc123");
    registry.require_bearer(&tokens.realm(), "tok-abc123");
    registry.put_component("acme/probe", "1", &probe(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = credentials_file(dir.path(), &registry.host());
    let fetched = fetch(
        &settings(dir.path(), &["probe"], vec![file]),
        &reference(&registry, "acme/probe:1"),
    )
    .unwrap();
    assert_eq!(fetched.component, probe());
    let asked = tokens.requests();
    assert!(!asked.is_empty());
    assert!(
        asked
            .iter()
            .all(|request| request.header("authorization").is_none()),
        "{asked:?}"
    );
    assert!(
        asked[0]
            .path
            .contains("scope=repository%3Aacme%2Fprobe%3Apull"),
        "{asked:?}"
    );
    let here = registry.requests();
    assert!(
        here.iter()
            .any(|request| request.header("authorization") == Some("Bearer tok-abc123"))
    );
    assert!(here.iter().all(|request| {
        !request
            .header("authorization")
            .is_some_and(|value| value.starts_with("Basic "))
    }));
}

#[test]
fn a_basic_registry_without_credentials_says_how_to_log_in() {
    let registry = FakeRegistry::start();
    registry.require_basic("robot", "pw");
    registry.put_component("acme/probe", "1", &probe(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let error = fetch(
        &settings(dir.path(), &["probe"], vec![]),
        &reference(&registry, "acme/probe:1"),
    )
    .unwrap_err();
    assert!(error.contains("asks for credentials"), "{error}");
    assert!(error.contains("login"), "{error}");
    let wrong = dir.path().join("wrong.json");
    std::fs::write(
        &wrong,
        format!(
            r#"{{"auths":{{"{}":{{"username":"robot","password":"nope"}}}}}}"#,
            registry.host()
        ),
    )
    .unwrap();
    let error = fetch(
        &settings(dir.path(), &["probe"], vec![wrong]),
        &reference(&registry, "acme/probe:1"),
    )
    .unwrap_err();
    assert!(error.contains("refused the credentials"), "{error}");
}

/// Publishes a cosign-format signature of `digest` by `key` into the fake registry by hand.
fn sign_into(
    registry: &FakeRegistry,
    repo: &str,
    signed: &Digest,
    stored_under: &Digest,
    key: &SigningKey,
) {
    use base64::Engine as _;
    let payload = signature::payload(&format!("{}/{repo}", registry.host()), signed);
    let payload_digest = registry.put_blob(repo, &payload);
    let signature = base64::engine::general_purpose::STANDARD.encode(key.sign(&payload).unwrap());
    let config = b"{}";
    let config_digest = registry.put_blob(repo, config);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{
            "mediaType": signature::SIMPLE_SIGNING,
            "digest": payload_digest,
            "size": payload.len(),
            "annotations": {signature::SIGNATURE_ANNOTATION: signature},
        }],
    });
    registry.put_manifest(
        repo,
        &signature::signature_tag(stored_under),
        manifest.to_string().as_bytes(),
        OCI_MANIFEST,
    );
}

#[test]
fn signatures_count_only_by_a_trusted_key_over_exactly_this_digest() {
    let registry = FakeRegistry::start();
    let pushed = registry.put_component("acme/probe", "1", &probe(), &[]);
    let digest = Digest::parse(&pushed.manifest).unwrap();
    let (_, trusted) = SigningKey::generate().unwrap();
    let (_, stranger) = SigningKey::generate().unwrap();
    let keys = TrustedKeys::new(vec![trusted.public().clone()]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = RegistryClient::new(
        &reference(&registry, "acme/probe:1"),
        None,
        RegistryLimits::default(),
    );
    let verdict = |keys: &TrustedKeys| {
        runtime
            .block_on(signature::verify(&client, "acme/probe", &digest, keys))
            .unwrap()
    };

    assert!(
        matches!(verdict(&keys), Verdict::Untrusted { why } if why.contains("no signature is published"))
    );
    sign_into(&registry, "acme/probe", &digest, &digest, &stranger);
    assert!(
        matches!(verdict(&keys), Verdict::Untrusted { why } if why.contains("not in [plugins] trusted_keys"))
    );
    assert!(
        matches!(verdict(&TrustedKeys::default()), Verdict::Untrusted { why } if why.contains("no key is trusted"))
    );

    // A trusted signature of another digest, stored under this one's tag.
    let other = Digest::of(b"the manifest that was signed");
    sign_into(&registry, "acme/probe", &other, &digest, &trusted);
    assert!(
        matches!(verdict(&keys), Verdict::Untrusted { why } if why.contains(&format!("signed {other}, not this artifact's {digest}")))
    );

    sign_into(&registry, "acme/probe", &digest, &digest, &trusted);
    assert_eq!(
        verdict(&keys),
        Verdict::Trusted {
            key: trusted.public().id.clone()
        }
    );
}

/// `openssl` with `args` (the caller judges the status).
fn openssl(args: &[&str]) -> std::process::Output {
    std::process::Command::new("openssl")
        .args(args)
        .output()
        .unwrap_or_else(|error| {
            if std::env::var("CI").is_ok_and(|value| value == "true") {
                panic!("openssl is missing under CI ({error}); .ci/run installs it");
            }
            panic!("openssl cannot run ({error}); install it (Debian: openssl)");
        })
}

#[test]
fn signatures_are_ecdsa_p256_as_openssl_makes_and_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    // A key made by openssl signs here; its signature verifies with openssl.
    let made = openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &path("key.pem"),
    ]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let public = openssl(&[
        "pkey",
        "-in",
        &path("key.pem"),
        "-pubout",
        "-out",
        &path("pub.pem"),
    ]);
    assert!(public.status.success());
    let key = SigningKey::read(Path::new(&path("key.pem"))).unwrap();
    let from_openssl = PublicKey::read(Path::new(&path("pub.pem"))).unwrap();
    assert_eq!(&from_openssl, key.public());
    let payload = signature::payload("127.0.0.1:5000/acme/probe", &Digest::of(b"m"));
    std::fs::write(path("payload"), &payload).unwrap();
    std::fs::write(path("ours.sig"), key.sign(&payload).unwrap()).unwrap();
    let verified = openssl(&[
        "dgst",
        "-sha256",
        "-verify",
        &path("pub.pem"),
        "-signature",
        &path("ours.sig"),
        &path("payload"),
    ]);
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );

    // openssl's signature verifies here; a changed payload does not.
    let signed = openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        &path("key.pem"),
        "-out",
        &path("theirs.sig"),
        &path("payload"),
    ]);
    assert!(signed.status.success());
    let theirs = std::fs::read(path("theirs.sig")).unwrap();
    assert!(from_openssl.verifies(&payload, &theirs));
    let mut changed = payload.clone();
    changed[0] ^= 1;
    assert!(!from_openssl.verifies(&changed, &theirs));

    // A public key written here is read by openssl as the same P-256 key.
    let (_, generated) = SigningKey::generate().unwrap();
    std::fs::write(path("gen.pub"), generated.public().to_pem()).unwrap();
    let text = openssl(&["pkey", "-pubin", "-in", &path("gen.pub"), "-text", "-noout"]);
    assert!(text.status.success());
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("P-256"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
}

#[test]
fn a_second_command_waits_for_the_first_on_the_plugins_directory() {
    let registry = FakeRegistry::start();
    registry.put_component("acme/probe", "1", &probe(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path(), &["probe"], vec![]);
    std::fs::create_dir_all(&settings.plugins_dir).unwrap();
    // Another command holds the directory.
    let guard = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(settings.plugins_dir.join(".plugins.lock.guard"))
        .unwrap();
    guard.lock().unwrap();
    let (said, heard) = std::sync::mpsc::channel::<String>();
    let reference = reference(&registry, "acme/probe:1");
    let installing = {
        let settings = settings.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(install::install(&settings, &reference, &mut |line| {
                let _ = said.send(line);
            }))
        })
    };
    let first = heard.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        first.contains("waiting for another clawcage plugins command"),
        "{first}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !installing.is_finished(),
        "the install went on while the directory was held"
    );
    assert!(!settings.plugins_dir.join("plugins.lock").exists());
    guard.unlock().unwrap();
    let installed = installing.join().unwrap().unwrap();
    assert_eq!(installed.locked.name, "probe");
    let lock = clawcage_sandbox::plugin::read_lock(&settings.plugins_dir).unwrap();
    assert!(lock.get("probe").is_some());
}
