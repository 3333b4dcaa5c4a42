//! `clawcage skills list` as an operator runs it, against a real workspace and a real user
//! skills directory (`$XDG_CONFIG_HOME/clawcage/skills`): usable skills, the skipped ones with
//! their reasons, the user skill that shadows a workspace one, the ignored grant claims; and
//! `clawcage run`, whose system prompt offers the same skills to a scripted model on 127.0.0.1.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Output};

use clawcage_tests::cli_state::shared_state_dir as state_dir;
use clawcage_tests::llm_server::{LlmServer, anthropic};
use serde_json::Value;

/// A credential the process holds, which a skill's text repeats.
const SECRET: &str = "sk-ant-skills-secret-value";

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A workspace and a user configuration directory holding skills of every kind.
struct Layout {
    workspace: tempfile::TempDir,
    config_home: tempfile::TempDir,
}

fn layout() -> Layout {
    let workspace = tempfile::tempdir().unwrap();
    let config_home = tempfile::tempdir().unwrap();
    let skills = workspace.path().join("skills");
    write(
        &skills.join("csv-sum/SKILL.md"),
        "---\nname: csv-sum\ndescription: Sum a column of a CSV file.\nrequires: {programs: [awk]}\n---\nRun awk.\n",
    );
    write(
        &skills.join("broken/SKILL.md"),
        "---\nname: broken\ndescription: Sum: a column\n---\n",
    );
    write(
        &skills.join("needs-tool/SKILL.md"),
        "---\nname: needs-tool\ndescription: Needs a program nobody has.\nmetadata: {\"openclaw\": {\"requires\": {\"bins\": [\"no-such-program\"]}}}\n---\n",
    );
    write(
        &skills.join("greedy/SKILL.md"),
        "---\nname: greedy\ndescription: Wants everything.\nallowed-tools: [exec]\nhosts: ['*']\n---\n",
    );
    write(
        &skills.join("leaky/SKILL.md"),
        &format!("---\nname: leaky\ndescription: Uses the key {SECRET}.\n---\n"),
    );
    write(
        &skills.join("style/SKILL.md"),
        "---\nname: style\ndescription: The workspace's idea of style.\n---\n",
    );
    write(
        &config_home.path().join("clawcage/skills/style/SKILL.md"),
        "---\nname: style\ndescription: The house style.\n---\nWrite short sentences.\n",
    );
    Layout {
        workspace,
        config_home,
    }
}

fn clawcage(layout: &Layout, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(args)
        .arg("--workspace")
        .arg(layout.workspace.path())
        .arg("--state-dir")
        .arg(state_dir())
        .env("XDG_CONFIG_HOME", layout.config_home.path())
        .env("ANTHROPIC_API_KEY", SECRET)
        .env_remove("RUST_LOG")
        .output()
        .expect("clawcage runs")
}

fn find<'a>(skills: &'a [Value], name: &str, source: &str) -> &'a Value {
    skills
        .iter()
        .find(|skill| skill["name"] == name && skill["source"] == source)
        .unwrap_or_else(|| panic!("{name} ({source}) not in {skills:#?}"))
}

#[test]
fn skills_list_json_shows_usable_and_skipped_skills_with_reasons() {
    let layout = layout();
    let output = clawcage(&layout, &["skills", "list", "--json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let dirs = listed["dirs"].as_array().unwrap();
    assert_eq!(dirs[0]["source"], "user");
    assert_eq!(
        Path::new(dirs[0]["path"].as_str().unwrap()),
        layout.config_home.path().join("clawcage/skills")
    );
    assert_eq!(dirs[1]["source"], "workspace");
    let skills = listed["skills"].as_array().unwrap();
    assert_eq!(skills.len(), 7, "{skills:#?}");
    assert_eq!(
        find(skills, "leaky", "workspace")["description"],
        "Uses the key [redacted: ANTHROPIC_API_KEY]."
    );
    assert!(!String::from_utf8_lossy(&output.stdout).contains(SECRET));

    let csv = find(skills, "csv-sum", "workspace");
    assert_eq!(csv["status"], "usable");
    assert_eq!(csv["description"], "Sum a column of a CSV file.");
    assert_eq!(csv["read_path"], "skills/csv-sum/SKILL.md");
    assert_eq!(csv["requires"], serde_json::json!(["awk"]));
    assert!(
        csv["path"]
            .as_str()
            .unwrap()
            .ends_with("/skills/csv-sum/SKILL.md")
    );

    let broken = find(skills, "broken", "workspace");
    assert_eq!(broken["status"], "skipped");
    assert!(
        broken["reason"]
            .as_str()
            .unwrap()
            .starts_with("the front matter is not valid YAML: line 3, column "),
        "{broken}"
    );
    assert_eq!(
        find(skills, "needs-tool", "workspace")["reason"],
        "requires program `no-such-program`, which is not installed; add no-such-program.wasm (a WASI program) to the directory of [exec] programs_dir"
    );
    let greedy = find(skills, "greedy", "workspace");
    assert_eq!(greedy["status"], "usable");
    assert_eq!(
        greedy["notes"][0],
        "ignored `allowed-tools`, `hosts`: a skill is instructions; its front matter cannot grant tools, hosts, paths or programs, nor change approvals or limits"
    );

    let mine = find(skills, "style", "user");
    assert_eq!(mine["status"], "usable");
    assert_eq!(mine["read_path"], Value::Null);
    assert_eq!(
        mine["notes"][0],
        "shadows workspace skill at skills/style/SKILL.md"
    );
    let theirs = find(skills, "style", "workspace");
    assert_eq!(theirs["status"], "skipped");
    assert!(
        theirs["reason"]
            .as_str()
            .unwrap()
            .starts_with("shadowed by the user skill style at "),
        "{theirs}"
    );
}

#[test]
fn skills_list_prints_each_skill_and_where_skills_are_looked_for() {
    let layout = layout();
    let output = clawcage(&layout, &["skills", "list"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.starts_with("Skills are looked for in:\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "  user       {}  (read)",
            layout.config_home.path().join("clawcage/skills").display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("4 usable of 7 found"), "{stdout}");
    assert!(
        stdout.contains(
            "leaky  (workspace, usable)\n    Uses the key [redacted: ANTHROPIC_API_KEY].\n"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains(SECRET), "{stdout}");
    assert!(
        stdout.contains("csv-sum  (workspace, usable)\n    Sum a column of a CSV file.\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(the agent reads skills/csv-sum/SKILL.md)\n    requires: awk\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("style  (user, usable)\n    The house style.\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("    note: shadows workspace skill at skills/style/SKILL.md\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "    skipped: requires program `no-such-program`, which is not installed; add no-such-program.wasm (a WASI program) to the directory of [exec] programs_dir\n"
        ),
        "{stdout}"
    );

    let empty = tempfile::tempdir().unwrap();
    let nothing = Layout {
        workspace: tempfile::tempdir().unwrap(),
        config_home: empty,
    };
    let output = clawcage(&nothing, &["skills", "list"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(stdout.contains("(not there)"), "{stdout}");
    assert!(stdout.contains("No skills yet."), "{stdout}");

    let help = Command::new(env!("CARGO_BIN_EXE_clawcage"))
        .args(["skills", "list", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("$XDG_CONFIG_HOME/clawcage/skills"), "{help}");
    assert!(help.contains("workspace's skills/ folder"), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_offers_the_usable_skills_in_the_system_prompt() {
    let layout = layout();
    let server = LlmServer::start(vec![anthropic::message(&[anthropic::text("ok")])]).await;
    let url = server.url().to_string();
    let workspace = layout.workspace.path().to_path_buf();
    let config_home = layout.config_home.path().to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .args(["run", "Say ok.", "--provider", "anthropic", "--model"])
            .args(["claude-test", "--base-url", &url, "--workspace"])
            .arg(&workspace)
            .arg("--state-dir")
            .arg(state_dir())
            .env("XDG_CONFIG_HOME", &config_home)
            .env("ANTHROPIC_API_KEY", SECRET)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let body = &server.bodies()[0];
    let system: String = match &body["system"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| block["text"].as_str())
            .collect(),
        _ => String::new(),
    };
    assert!(
        system.contains(
            "- csv-sum: Sum a column of a CSV file. (read_file `skills/csv-sum/SKILL.md`)"
        ),
        "{system}"
    );
    assert!(
        system.contains("- style: The house style. (user skill: its instructions are below)"),
        "{system}"
    );
    assert!(system.contains("Write short sentences."), "{system}");
    // The prompt goes out through the same scrubber as everything sent to the model.
    assert!(
        system.contains("- leaky: Uses the key [redacted: ANTHROPIC_API_KEY]."),
        "{system}"
    );
    assert!(!server.bodies()[0].to_string().contains(SECRET));
    for absent in ["broken", "needs-tool", "The workspace's idea of style"] {
        assert!(!system.contains(absent), "{absent} in {system}");
    }
    assert!(
        !system.contains(&layout.config_home.path().display().to_string()),
        "no host path of the user's in the prompt"
    );
}

/// A skill requiring `program`, as `folder` of `skills`.
fn requiring(skills: &Path, folder: &str, program: &str) {
    write(
        &skills.join(folder).join("SKILL.md"),
        &format!(
            "---\nname: {folder}\ndescription: Uses {program}.\nrequires: {{programs: [{program}]}}\n---\n"
        ),
    );
}

#[test]
fn requirements_are_met_by_installed_and_operator_programs_and_never_with_exec_off() {
    let workspace = tempfile::tempdir().unwrap();
    let config_home = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let state = clawcage_tests::cli_state::private_state_dir();
    let skills = workspace.path().join("skills");
    requiring(&skills, "py", "python3");
    requiring(&skills, "js", "qjs");
    requiring(&skills, "mine", "mytool");
    requiring(&skills, "text", "sed");
    // What `clawcage programs install python3` leaves, and the operator's programs directory;
    // names are all that is checked, no program is loaded.
    write(&state.path().join("programs/python3.wasm"), "not loaded");
    write(&outside.path().join("programs/mytool.wasm"), "not loaded");
    let config = outside.path().join("clawcage.toml");
    let list = |config_text: &str| {
        std::fs::write(&config, config_text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_clawcage"))
            .args(["skills", "list", "--json", "--config"])
            .arg(&config)
            .arg("--workspace")
            .arg(workspace.path())
            .arg("--state-dir")
            .arg(state.path())
            .env("XDG_CONFIG_HOME", config_home.path())
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
        listed["skills"].as_array().unwrap().clone()
    };

    let programs_dir = outside.path().join("programs");
    let skills = list(&format!(
        "[exec]\nprograms_dir = {:?}\n",
        programs_dir.display().to_string()
    ));
    for usable in ["py", "mine", "text"] {
        assert_eq!(
            find(&skills, usable, "workspace")["status"],
            "usable",
            "{skills:#?}"
        );
    }
    assert_eq!(
        find(&skills, "js", "workspace")["reason"],
        "requires program `qjs`, which is not installed; `clawcage programs install qjs`"
    );

    let skills = list("[exec]\nenabled = false\n");
    for name in ["py", "js", "mine", "text"] {
        let skill = find(&skills, name, "workspace");
        assert_eq!(skill["status"], "skipped");
        assert!(
            skill["reason"]
                .as_str()
                .unwrap()
                .ends_with("but exec is turned off ([exec] enabled = false), so no program runs"),
            "{skill}"
        );
    }
}
