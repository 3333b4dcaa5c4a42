//! `clawcage skills list`: the skills the agent's system prompt offers, from the workspace's
//! `skills/` folder and the user skills directory, each usable or skipped with its reason, read
//! by the same code that builds the prompt (`Runtime::skills`).

use clap::Subcommand;
use clawcage_agent::skills::{MAX_SKILLS, SkillStatus};
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
    if json {
        let text = serde_json::to_string_pretty(&skills)
            .map_err(|error| Failure::Tool(error.to_string()))?;
        outln!("{text}");
        return Ok(());
    }
    outln!("Skills are looked for in:");
    for dir in &skills.dirs {
        let state = if !dir.exists {
            "not there".to_string()
        } else if dir.notes.is_empty() {
            "read".to_string()
        } else {
            dir.notes.join("; ")
        };
        outln!(
            "  {:<9}  {}  ({state})",
            dir.source.label(),
            dir.path.display()
        );
    }
    if skills.skills.is_empty() {
        outln!();
        outln!(
            "No skills yet. Add one as skills/NAME/SKILL.md in the workspace (front matter with name and description, then instructions)."
        );
        return Ok(());
    }
    let usable = skills.usable().count();
    outln!();
    outln!(
        "{usable} usable of {} found (at most {MAX_SKILLS} are offered):",
        skills.skills.len()
    );
    for skill in &skills.skills {
        let status = match skill.status {
            SkillStatus::Usable => "usable",
            SkillStatus::Skipped => "skipped",
        };
        outln!();
        outln!("{}  ({}, {status})", skill.name, skill.source.label());
        if let Some(description) = &skill.description {
            outln!("    {description}");
        }
        match &skill.read_path {
            Some(read_path) => outln!(
                "    path: {}  (the agent reads {read_path})",
                skill.path.display()
            ),
            None => outln!("    path: {}", skill.path.display()),
        }
        let mut requires: Vec<String> = skill.requires.clone();
        if !skill.requires_any.is_empty() {
            requires.push(format!("one of {}", skill.requires_any.join(" ")));
        }
        if !requires.is_empty() {
            outln!("    requires: {}", requires.join(", "));
        }
        if let Some(reason) = &skill.reason {
            outln!("    skipped: {reason}");
        }
        for note in &skill.notes {
            outln!("    note: {note}");
        }
    }
    Ok(())
}
