//! The example tools written in Python (componentize-py) and JavaScript (componentize-js),
//! built by `examples/build.sh` into plugins and loaded through the plugin loader and the
//! registry like any third-party tool: their specs, a successful call, a tool error, a schema
//! refusal, and (Python, which reads files) an escape refused by the sandbox. Each test skips with
//! a printed reason only when its toolchain cannot be installed.

use std::path::Path;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::plugin::HOST_SECRET_ENV;
use clawcage_sandbox::{FsMode, Limits, PluginLoader, PluginsSection};
use clawcage_tests::toolchains::{example_plugin, skip};
use clawcage_tests::{grants, sandbox};
use serde_json::Value;

/// A registry with the one plugin in `plugin_dir` (linked into a fresh plugins directory),
/// granted what `operator` says, over `workspace`.
async fn registry_with(plugin_dir: &Path, operator: &str, workspace: &Path) -> ToolRegistry {
    let plugins = tempfile::tempdir().unwrap();
    let name = plugin_dir.file_name().unwrap();
    std::os::unix::fs::symlink(plugin_dir, plugins.path().join(name)).unwrap();
    let mut config: PluginsSection = toml::from_str(operator).unwrap();
    config.dir = Some(plugins.path().to_path_buf());
    let base = grants(workspace, FsMode::ReadWrite, Limits::default());
    let no_env = |_: &str| None;
    let report = PluginLoader {
        sandbox: &sandbox(),
        config: &config,
        base: &base,
        host_secrets: HOST_SECRET_ENV.iter().map(|s| s.to_string()).collect(),
        host_env: &no_env,
    }
    .load_all()
    .await;
    assert!(report.refused.is_empty(), "{report:#?}");
    let mut registry = ToolRegistry::new();
    for plugin in report.loaded {
        for tool in plugin.tools {
            registry.register(std::sync::Arc::new(tool)).unwrap();
        }
    }
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_counts_words_inside_the_workspace_only() {
    let plugin = match example_plugin("python") {
        Ok(plugin) => plugin,
        Err(reason) => {
            return skip(
                "the_python_example_counts_words_inside_the_workspace_only",
                &reason,
            );
        }
    };
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(
        workspace.path().join("poem.txt"),
        "The cat sat.\nThe cat ran!\nA dog sat",
    )
    .unwrap();
    let registry = registry_with(
        &plugin,
        "[grants.py-text-stats]\nworkspace = \"ro\"\n",
        workspace.path(),
    )
    .await;
    let tool = registry.get("text_stats").expect("text_stats is listed");
    assert_eq!(tool.origin(), "plugin:py-text-stats@0.1.0");
    assert!(
        tool.grants_summary().contains("(ro)"),
        "{}",
        tool.grants_summary()
    );
    assert_eq!(
        tool.spec().input_schema["required"],
        serde_json::json!(["path"])
    );

    let output = registry
        .execute("text_stats", r#"{"path": "poem.txt", "top": 2}"#)
        .await
        .unwrap();
    let stats: Value = serde_json::from_str(&output.text).unwrap();
    assert_eq!(stats["lines"], 3);
    assert_eq!(stats["words"], 9);
    assert_eq!(stats["characters"], 35);
    assert_eq!(
        stats["top_words"],
        serde_json::json!([{"word": "the", "count": 2}, {"word": "cat", "count": 2}])
    );

    // An absolute path inside the workspace names the same file.
    let absolute = workspace.path().canonicalize().unwrap().join("poem.txt");
    let args = serde_json::json!({"path": absolute}).to_string();
    assert!(registry.execute("text_stats", &args).await.is_ok());

    // A tool error from Python code reaches the caller with its text.
    let missing = registry
        .execute("text_stats", r#"{"path": "absent.txt"}"#)
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), "failed");
    assert!(
        missing.message().contains("absent.txt: no such file"),
        "{missing}"
    );

    // Escapes are refused by the sandbox, whatever the Python code does.
    for escape in ["/etc/passwd", "../../../../etc/passwd"] {
        let args = serde_json::json!({"path": escape}).to_string();
        let error = registry.execute("text_stats", &args).await.unwrap_err();
        assert_ne!(error.kind(), "invalid_args", "{escape}: {error}");
        assert!(!error.message().contains("root:"), "{escape}: {error}");
    }

    // The schema is checked before the component runs.
    let bad = registry
        .execute("text_stats", r#"{"path": "poem.txt", "top": 500}"#)
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), "invalid_args");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_example_runs_with_no_grant_at_all() {
    let plugin = match example_plugin("js") {
        Ok(plugin) => plugin,
        Err(reason) => return skip("the_javascript_example_runs_with_no_grant_at_all", &reason),
    };
    let workspace = tempfile::tempdir().unwrap();
    let registry = registry_with(&plugin, "", workspace.path()).await;
    assert_eq!(registry.names(), ["json_pick", "slugify"]);
    let slugify = registry.get("slugify").unwrap();
    assert_eq!(slugify.origin(), "plugin:js-tools@0.1.0");
    assert!(
        slugify.grants_summary().starts_with("no files"),
        "{}",
        slugify.grants_summary()
    );

    let slug = registry
        .execute("slugify", r#"{"text": "Hello, World: MCP & Wasm!"}"#)
        .await
        .unwrap();
    assert_eq!(slug.text, "hello-world-mcp-wasm");
    let underscored = registry
        .execute(
            "slugify",
            r#"{"text": "  Many   spaces ", "separator": "_"}"#,
        )
        .await
        .unwrap();
    assert_eq!(underscored.text, "many_spaces");

    let picked = registry
        .execute(
            "json_pick",
            r#"{"document": "{\"servers\": [{\"name\": \"alpha\", \"port\": 80}]}", "path": "servers.0"}"#,
        )
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&picked.text).unwrap(),
        serde_json::json!({"name": "alpha", "port": 80})
    );

    // Errors thrown by JavaScript code keep their kind and text.
    let missing = registry
        .execute("json_pick", r#"{"document": "{\"a\": {}}", "path": "a.b"}"#)
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), "failed");
    assert_eq!(missing.message(), "`a` has no key or index `b`");
    let nothing = registry
        .execute("slugify", r#"{"text": "!!!"}"#)
        .await
        .unwrap_err();
    assert_eq!(nothing.kind(), "invalid_args");
    assert!(
        nothing.message().contains("no letters or digits"),
        "{nothing}"
    );
    let bad_separator = registry
        .execute("slugify", r#"{"text": "x", "separator": "/"}"#)
        .await
        .unwrap_err();
    assert_eq!(bad_separator.kind(), "invalid_args");
}
