//! `clawcage skills list`: the skills the agent's system prompt offers, from the workspace's
//! `skills/` folder and the user skills directory, each usable or skipped with its reason, read
//! by the same code that builds the prompt (`Runtime::skills`).

use clap::Subcommand;
use clawcage_agent::skills::{MAX_SKILLS, SkillStatus, Skills};
use clawcage_runtime::Options;

use crate::Failure;

/// `clawcage skills ...`.
#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// List every skill folder found: name, description, SKILL.md path, source (workspace or
    /// user) and whether the agent is offered it, or why not.
    ///
    /// Skills are looked for in the workspace's skills/ folder and in the user skills directory,
    /// $XDG_CONFIG_HOME/clawcage/skills (usually ~/.config/clawcage/skills). Each skill is a
    /// folder with a SKILL.md: YAML front matter with `name` and `description`, optionally the
    /// programs it needs (`requires: {programs: [python3]}`, or OpenClaw's `metadata:
    /// {"openclaw": {"requires": {"bins": [python3]}}}`), then markdown instructions. A user
    /// skill wins over a workspace skill of the same name. A skill is instructions only: it
    /// grants no tool, host, path or program, and its scripts run through exec in the sandbox.
    #[command(verbatim_doc_comment)]
    List {
        /// Print JSON: {"dirs": [...], "skills": [...]}, each skill with name, description,
        /// path, read_path, source, requires, requires_any, status ("usable" or "skipped"),
        /// reason and notes.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `command`.
pub async fn run(options: Options, command: SkillsCommand) -> Result<(), Failure> {
    match command {
        SkillsCommand::List { json } => list(options, json).await,
    }
}

async fn list(options: Options, json: bool) -> Result<(), Failure> {
    let runtime = crate::open(options).await?;
    let skills = runtime.skills().await;
    // What skills' files say leaves the process scrubbed of every secret value, like the
    // prompt built from them.
    let redactor = runtime.redactor();
    let text = if json {
        serde_json::to_string_pretty(&skills).map_err(|error| Failure::Tool(error.to_string()))?
    } else {
        listing(&skills).join("\n")
    };
    outln!("{}", redactor.redact(&text));
    Ok(())
}

/// The listing's lines: where skills are looked for, then each skill.
fn listing(skills: &Skills) -> Vec<String> {
    let mut lines = vec!["Skills are looked for in:".to_string()];
    for dir in &skills.dirs {
        let state = if !dir.exists {
            "not there".to_string()
        } else if dir.notes.is_empty() {
            "read".to_string()
        } else {
            dir.notes.join("; ")
        };
        lines.push(format!(
            "  {:<9}  {}  ({state})",
            dir.source.label(),
            dir.path.display()
        ));
    }
    lines.push(String::new());
    if skills.skills.is_empty() {
        lines.push(
            "No skills yet. Add one as skills/NAME/SKILL.md in the workspace (front matter with name and description, then instructions).".to_string(),
        );
        return lines;
    }
    lines.push(format!(
        "{} usable of {} found (at most {MAX_SKILLS} are offered):",
        skills.usable().count(),
        skills.skills.len()
    ));
    for skill in &skills.skills {
        let status = match skill.status {
            SkillStatus::Usable => "usable",
            SkillStatus::Skipped => "skipped",
        };
        lines.push(String::new());
        lines.push(format!(
            "{}  ({}, {status})",
            skill.name,
            skill.source.label()
        ));
        if let Some(description) = &skill.description {
            lines.push(format!("    {description}"));
        }
        lines.push(match &skill.read_path {
            Some(read_path) => format!(
                "    path: {}  (the agent reads {read_path})",
                skill.path.display()
            ),
            None => format!(
                "    path: {}  (outside the workspace: its instructions go into the prompt whole)",
                skill.path.display()
            ),
        });
        let mut requires: Vec<String> = skill.requires.clone();
        if !skill.requires_any.is_empty() {
            requires.push(format!("one of {}", skill.requires_any.join(" ")));
        }
        if !requires.is_empty() {
            lines.push(format!("    requires: {}", requires.join(", ")));
        }
        if let Some(reason) = &skill.reason {
            lines.push(format!("    skipped: {reason}"));
        }
        for note in &skill.notes {
            lines.push(format!("    note: {note}"));
        }
    }
    lines
}
