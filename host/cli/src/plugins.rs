//! The operator's plugins in the CLI: load them with the sandbox's [`PluginLoader`], add each
//! plugin's tools to the registry all together or not at all, report every refused plugin on
//! stderr, and print the plugins section of `clawcage tools`.

use std::sync::Arc;

use clawcage_agent::ToolRegistry;
use clawcage_core::Tool as _;
use clawcage_sandbox::plugin::HOST_SECRET_ENV;
use clawcage_sandbox::{Grants, PluginLoader, PluginReport, PluginsConfig, RefusedPlugin, Sandbox};

/// Loads the plugins named by `config` under `base` grants into `registry`. A plugin whose tools
/// cannot all be registered (a name already taken, a schema the registry refuses) is refused
/// whole; nothing a plugin does stops the others or the bundled tools.
pub async fn load_into(
    registry: &mut ToolRegistry,
    sandbox: &Arc<Sandbox>,
    config: &PluginsConfig,
    base: &Grants,
) -> PluginReport {
    let host_env = |name: &str| std::env::var(name).ok();
    let loader = PluginLoader {
        sandbox,
        config,
        base,
        host_secrets: HOST_SECRET_ENV
            .iter()
            .map(|name| name.to_string())
            .collect(),
        host_env: &host_env,
    };
    let mut report = loader.load_all().await;
    let mut kept = Vec::new();
    for plugin in std::mem::take(&mut report.loaded) {
        let mut trial = registry.clone();
        let mut problem = None;
        for tool in &plugin.tools {
            let name = &tool.spec().name;
            if let Some(existing) = trial.get(name) {
                problem = Some(format!(
                    "its tool `{name}` has the name of a tool already loaded from {}; tool names must be unique",
                    existing.origin()
                ));
                break;
            }
            if let Err(error) = trial.register(Arc::new(tool.clone())) {
                problem = Some(error.to_string());
                break;
            }
        }
        match problem {
            None => {
                *registry = trial;
                kept.push(plugin);
            }
            Some(reason) => report.refused.push(RefusedPlugin {
                path: plugin.manifest.clone(),
                name: Some(format!("{}@{}", plugin.name, plugin.version)),
                reason,
            }),
        }
    }
    report.loaded = kept;
    for refused in &report.refused {
        eprintln!("clawcage: {refused}");
    }
    for warning in &report.warnings {
        eprintln!("clawcage: warning: {warning}");
    }
    report
}

/// The plugins section of `clawcage tools`: each loaded plugin with its grant and what it was
/// not granted, then each refused plugin with the reason.
pub fn print_report(report: &PluginReport) {
    if report.loaded.is_empty() && report.refused.is_empty() {
        return;
    }
    println!();
    println!("plugins:");
    for plugin in &report.loaded {
        let tools: Vec<&str> = plugin
            .tools
            .iter()
            .map(|tool| tool.spec().name.as_str())
            .collect();
        println!(
            "  {} loaded from {} (sha256 {}): {}",
            plugin.origin(),
            plugin.manifest.display(),
            &plugin.sha256[..12],
            tools.join(", ")
        );
        println!("    grants: {}", plugin.grants);
        for note in &plugin.notes {
            println!("    note: {note}");
        }
    }
    for refused in &report.refused {
        println!("  refused: {refused}");
    }
}
