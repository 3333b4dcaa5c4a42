//! `clawcage plugins`: installing plugins from an OCI registry (signature checked, digest pinned
//! in `plugins.lock`), restoring, updating, listing and removing them, and publishing one (signed)
//! for tool authors. The work is `clawcage_registry::install`'s; this module reads the
//! configuration it needs, words each outcome, and shows beside what a plugin asks for what the
//! operator's configuration actually grants it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;
use clawcage_registry::install::{self, Settings, State};
use clawcage_registry::{Reference, RegistryLimits, SigningKey, TrustedKeys};
use clawcage_runtime::Options;
use clawcage_sandbox::plugin::{Capabilities, HOST_SECRET_ENV, PluginsSection, decide};

use crate::Failure;

/// `clawcage plugins ...`.
#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// Install plugins from an OCI registry, or, with no reference, restore every plugin of
    /// plugins.lock exactly as locked
    ///
    ///     clawcage plugins install oci://ghcr.io/acme/weather:1.2.0
    ///
    /// The reference's manifest digest must carry a signature by a key in [plugins]
    /// trusted_keys (cosign's format; `clawcage plugins push --key` makes one), unless [plugins]
    /// allow_unsigned names the plugin. Every blob is checked against its digest; the plugin is
    /// written into [plugins] dir and its digest recorded in plugins.lock, which later starts
    /// hold it to, whatever the tag points to then. Installing grants nothing: what the plugin
    /// gets is still what [plugins.grants.NAME] gives it, shown here beside what it asks for.
    /// Plain http is used only for a registry on loopback; credentials come from the Docker or
    /// Podman credentials file and go only to the registry they are for.
    #[command(verbatim_doc_comment)]
    Install {
        /// oci://REGISTRY/REPOSITORY:TAG or oci://REGISTRY/REPOSITORY@sha256:DIGEST.
        references: Vec<String>,
        /// Seconds each request to the registry may take, its download included.
        #[arg(long, value_name = "SECONDS", default_value_t = 300)]
        timeout: u64,
    },
    /// Move a plugin's lock to what its tag points to now, showing what changed (digest,
    /// version, asked grants). A new version asking for more grants than were accepted is
    /// refused unless --accept-grants is given.
    Update {
        /// The plugin's name.
        name: String,
        /// Accept the grants the new version asks for beyond the accepted ones.
        #[arg(long)]
        accept_grants: bool,
        /// Seconds each request to the registry may take.
        #[arg(long, value_name = "SECONDS", default_value_t = 300)]
        timeout: u64,
    },
    /// List the plugins installed from a registry: name, version, source, digest, signer, and
    /// whether their files are the locked ones.
    List {
        /// Print JSON: one object per plugin with the lock's fields and state.
        #[arg(long)]
        json: bool,
    },
    /// Remove a plugin installed from a registry: its directory and its lock entry.
    Remove {
        /// The plugin's name.
        name: String,
    },
    /// Publish a plugin to an OCI registry, signed: its component as the one layer of a
    /// WebAssembly artifact (what `wkg oci pull` reads), its manifest as the annotation
    /// dev.clawcage.plugin
    ///
    ///     clawcage plugins push ./weather oci://ghcr.io/acme/weather:1.2.0 --key acme.key
    #[command(verbatim_doc_comment)]
    Push {
        /// The plugin's directory (with plugin.toml) or its manifest file.
        plugin: PathBuf,
        /// Where to publish: oci://REGISTRY/REPOSITORY:TAG.
        reference: String,
        /// The private key to sign with (PEM PKCS#8, ECDSA P-256; `clawcage plugins keygen`).
        #[arg(long, value_name = "FILE", required_unless_present = "unsigned")]
        key: Option<PathBuf>,
        /// Publish without a signature (installs then need [plugins] allow_unsigned).
        #[arg(long, conflicts_with = "key")]
        unsigned: bool,
        /// Seconds each request to the registry may take.
        #[arg(long, value_name = "SECONDS", default_value_t = 300)]
        timeout: u64,
    },
    /// Make a signing key pair: PREFIX.key (private, mode 0600) and PREFIX.pub (public, for
    /// [plugins] trusted_keys of those who install your plugins).
    Keygen {
        /// The files' path without extension, e.g. ./acme.
        prefix: PathBuf,
    },
}

/// Runs one `clawcage plugins` command.
pub(crate) async fn run(options: Options, command: PluginsCommand) -> Result<(), Failure> {
    match command {
        PluginsCommand::Install {
            references,
            timeout,
        } => {
            let (settings, section) = settings(&options, timeout)?;
            if references.is_empty() {
                restore(&settings).await
            } else {
                install_all(&settings, &section, &references).await
            }
        }
        PluginsCommand::Update {
            name,
            accept_grants,
            timeout,
        } => {
            let (settings, section) = settings(&options, timeout)?;
            update(&settings, &section, &name, accept_grants).await
        }
        PluginsCommand::List { json } => {
            let (settings, _) = settings(&options, 300)?;
            list(&settings, json)
        }
        PluginsCommand::Remove { name } => {
            let (settings, _) = settings(&options, 300)?;
            install::remove(&settings, &name, &mut progress())
                .await
                .map_err(usage)?;
            println!("removed {name}");
            Ok(())
        }
        PluginsCommand::Push {
            plugin,
            reference,
            key,
            unsigned: _,
            timeout,
        } => push(&plugin, &reference, key.as_deref(), timeout).await,
        PluginsCommand::Keygen { prefix } => keygen(&prefix),
    }
}

fn usage(message: String) -> Failure {
    Failure::Usage(format!("clawcage: {}", crate::render::sanitize(&message)))
}

fn failed(message: String) -> Failure {
    Failure::Tool(format!("clawcage: {}", crate::render::sanitize(&message)))
}

/// Text a registry or a publisher wrote, as one line safe for a terminal: control characters
/// made visible, line breaks made spaces, so it can neither restyle the screen nor fake a line of
/// this command's own report.
fn one_line(text: &str) -> String {
    crate::render::sanitize(&text.replace(['\n', '\r', '\t'], " ")).into_owned()
}

fn limits(timeout: u64) -> Result<RegistryLimits, Failure> {
    if timeout == 0 {
        return Err(usage("--timeout must be at least 1 second".to_string()));
    }
    Ok(RegistryLimits {
        request_timeout: Duration::from_secs(timeout),
        connect_timeout: Duration::from_secs(timeout.min(10)),
        ..RegistryLimits::default()
    })
}

/// The plugins directory, trusted keys and allowed unsigned plugins of the configuration.
fn settings(options: &Options, timeout: u64) -> Result<(Settings, PluginsSection), Failure> {
    let located = clawcage_runtime::locate(options)?;
    located.check_trust()?;
    let section = located.config.plugins.clone();
    let Some(plugins_dir) = section.dir.clone() else {
        return Err(usage(
            "no plugins directory is configured; set [plugins] dir in clawcage.toml (outside the workspace), e.g.\n\n    [plugins]\n    dir = \"plugins\"".to_string(),
        ));
    };
    let workspace = located.workspace.path();
    for key in &section.trusted_keys {
        if clawcage_runtime::trust::is_inside(key, workspace) {
            return Err(usage(format!(
                "[plugins] trusted_keys names {}, inside the workspace, where a tool could replace it; keep trusted keys outside the workspace",
                key.display()
            )));
        }
    }
    let trusted = TrustedKeys::read(&section.trusted_keys).map_err(usage)?;
    let settings = Settings {
        plugins_dir,
        trusted,
        allow_unsigned: section.allow_unsigned.clone(),
        credential_files: Settings::default_credential_files(),
        limits: limits(timeout)?,
    };
    Ok((settings, section))
}

fn progress() -> impl FnMut(String) {
    |line: String| clawcage_runtime::tell!("clawcage: {}", one_line(&line))
}

async fn install_all(
    settings: &Settings,
    section: &PluginsSection,
    references: &[String],
) -> Result<(), Failure> {
    let references = references
        .iter()
        .map(|text| Reference::parse(text).map_err(usage))
        .collect::<Result<Vec<_>, _>>()?;
    let mut progress = progress();
    for reference in &references {
        let installed = install::install(settings, reference, &mut progress)
            .await
            .map_err(failed)?;
        for warning in &installed.warnings {
            clawcage_runtime::tell!("clawcage: warning: {}", one_line(warning));
        }
        let locked = &installed.locked;
        if installed.already {
            println!(
                "{} {} is already installed from {} ({})",
                locked.name, locked.version, locked.source, locked.digest
            );
            continue;
        }
        println!(
            "installed {} {} from {}",
            locked.name, locked.version, locked.source
        );
        if let Some(description) = &installed.description {
            println!("  {}", one_line(description));
        }
        println!("  digest     {}", locked.digest);
        println!("  signed by  {}", locked.signed_by);
        show_grants(section, &locked.name, &locked.capabilities);
    }
    Ok(())
}

/// What `name` asks for and what the configuration grants it.
fn show_grants(section: &PluginsSection, name: &str, asked: &Capabilities) {
    println!("  asks for   {}", asked.describe());
    let host_secrets: Vec<String> = HOST_SECRET_ENV
        .iter()
        .map(|name| name.to_string())
        .collect();
    let grant = section.grants.get(name);
    let decision = decide(asked, grant, &host_secrets);
    let granted = Capabilities {
        workspace: decision.workspace.map(|mode| match mode {
            clawcage_sandbox::FsMode::ReadOnly => {
                clawcage_sandbox::plugin::WorkspaceAccess::ReadOnly
            }
            clawcage_sandbox::FsMode::ReadWrite => {
                clawcage_sandbox::plugin::WorkspaceAccess::ReadWrite
            }
        }),
        network: decision.network.clone(),
        env: decision.env.clone(),
    };
    println!(
        "  granted    {} (by your [plugins.grants.{name}])",
        granted.describe()
    );
    for note in &decision.notes {
        println!("             {note}");
    }
    if grant.is_none() && asked.describe() != "nothing" {
        println!("             to grant it, add [plugins.grants.{name}] to your configuration");
    }
}

async fn restore(settings: &Settings) -> Result<(), Failure> {
    let mut progress = progress();
    let restored = install::restore(settings, &mut progress)
        .await
        .map_err(failed)?;
    if restored.is_empty() {
        println!(
            "plugins.lock in {} lists no plugin; install one with `clawcage plugins install oci://REGISTRY/REPOSITORY:TAG`",
            settings.plugins_dir.display()
        );
    }
    for plugin in restored {
        for warning in &plugin.warnings {
            clawcage_runtime::tell!("clawcage: warning: {}", one_line(warning));
        }
        match plugin.before {
            State::Intact => println!("{}: as locked", plugin.name),
            State::Missing => println!("{}: restored (it was missing)", plugin.name),
            State::Changed => println!("{}: restored (its files had changed)", plugin.name),
        }
    }
    Ok(())
}

async fn update(
    settings: &Settings,
    section: &PluginsSection,
    name: &str,
    accept_grants: bool,
) -> Result<(), Failure> {
    let mut progress = progress();
    let updated = install::update(settings, name, accept_grants, &mut progress)
        .await
        .map_err(failed)?;
    for warning in &updated.warnings {
        clawcage_runtime::tell!("clawcage: warning: {}", one_line(warning));
    }
    let (old, new) = (&updated.old, &updated.new);
    if old.digest == new.digest {
        println!("{name} {} is up to date ({})", old.version, old.digest);
        return Ok(());
    }
    println!("updated {name} from {}", new.source);
    println!("  version    {} -> {}", old.version, new.version);
    println!("  digest     {} -> {}", old.digest, new.digest);
    println!("  signed by  {}", new.signed_by);
    if !updated.more.is_empty() {
        println!(
            "  asks for more: {} (accepted with --accept-grants)",
            updated.more.join(", ")
        );
    }
    if !updated.fewer.is_empty() {
        println!("  asks for less: {}", updated.fewer.join(", "));
    }
    show_grants(section, name, &new.capabilities);
    Ok(())
}

fn list(settings: &Settings, json: bool) -> Result<(), Failure> {
    let listed = install::list(&settings.plugins_dir).map_err(usage)?;
    if json {
        let text =
            serde_json::to_string_pretty(&listed).map_err(|error| failed(error.to_string()))?;
        println!("{text}");
        return Ok(());
    }
    if listed.is_empty() {
        println!(
            "no plugin is installed from a registry in {} (`clawcage tools` lists every plugin loaded)",
            settings.plugins_dir.display()
        );
        return Ok(());
    }
    for plugin in &listed {
        let locked = &plugin.locked;
        println!(
            "{} {}  {}  {}",
            locked.name,
            locked.version,
            plugin.state.word(),
            locked.source
        );
        println!("  digest {}  signed by {}", locked.digest, locked.signed_by);
        println!("  asks for {}", locked.capabilities.describe());
        if plugin.state != State::Intact {
            println!("  run `clawcage plugins install` to restore it as locked");
        }
    }
    Ok(())
}

async fn push(
    plugin: &Path,
    reference: &str,
    key: Option<&Path>,
    timeout: u64,
) -> Result<(), Failure> {
    let reference = Reference::parse(reference).map_err(usage)?;
    let manifest = if plugin.is_dir() {
        plugin.join(clawcage_sandbox::plugin::MANIFEST_FILE)
    } else {
        plugin.to_path_buf()
    };
    let key = key.map(SigningKey::read).transpose().map_err(usage)?;
    let mut progress = progress();
    let pushed = clawcage_registry::publish::push(
        &manifest,
        &reference,
        key.as_ref(),
        &Settings::default_credential_files(),
        limits(timeout)?,
        &mut progress,
    )
    .await
    .map_err(failed)?;
    println!("pushed {}", pushed.reference);
    match (&pushed.signature_tag, &key) {
        (Some(tag), Some(key)) => println!("  signed by key {} (tag {tag})", key.public().id),
        _ => println!("  unsigned: installing it needs [plugins] allow_unsigned"),
    }
    Ok(())
}

fn keygen(prefix: &Path) -> Result<(), Failure> {
    let private = prefix.with_extension("key");
    let public = prefix.with_extension("pub");
    for path in [&private, &public] {
        if path.exists() {
            return Err(usage(format!(
                "{} exists; choose another prefix or move it",
                path.display()
            )));
        }
    }
    let (private_pem, key) = SigningKey::generate().map_err(failed)?;
    write_private(&private, &private_pem)
        .map_err(|error| failed(format!("cannot write {}: {error}", private.display())))?;
    std::fs::write(&public, key.public().to_pem())
        .map_err(|error| failed(format!("cannot write {}: {error}", public.display())))?;
    println!(
        "wrote {} (keep it secret) and {}",
        private.display(),
        public.display()
    );
    println!("  key id {}", key.public().id);
    Ok(())
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}
