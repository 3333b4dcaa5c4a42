//! The operator's plugins: load them with the sandbox's [`PluginLoader`] and add each plugin's
//! tools to the registry all together or not at all. What became of each plugin is returned as a
//! [`PluginReport`] for the front end to show.

use std::sync::Arc;

use clawcage_agent::ToolRegistry;
use clawcage_core::Tool as _;
use clawcage_sandbox::plugin::HOST_SECRET_ENV;
use clawcage_sandbox::{
    Grants, PluginLoader, PluginReport, PluginsSection, RefusedPlugin, Sandbox,
};

/// Loads the plugins named by `config` under `base` grants into `registry`. A plugin whose tools
/// cannot all be registered (a name already taken, a schema the registry refuses) is refused
/// whole; nothing a plugin does stops the others or the bundled tools.
pub async fn load_into(
    registry: &mut ToolRegistry,
    sandbox: &Arc<Sandbox>,
    config: &PluginsSection,
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
            if let Err(error) = trial.register_checked(Arc::new(tool.clone())) {
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
    report
}
