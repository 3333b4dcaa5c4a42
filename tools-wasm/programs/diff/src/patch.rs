//! `patch`: apply a unified diff (plain or git-style, one file or many) read from standard
//! input, `-i FILE` or a second operand. `-p N` strips leading path components (without it,
//! git patches strip one and others keep only the file name, as GNU does), `-R` undoes the
//! patch, `--dry-run` only reports, `-F N` sets how many context lines may be let go (fuzz),
//! `-d DIR` works in DIR, `-E` removes files the patch empties, `-b` keeps `NAME.orig`.
//! Files are created (`--- /dev/null`), deleted (`+++ /dev/null`), renamed and copied (git).
//!
//! Safety comes first: every name in the patch is checked before anything is touched. A name
//! that is absolute, contains `..`, or goes through a symbolic link is refused (exit 2, nothing
//! written). Each file's hunks are applied in memory and the file is replaced (through a
//! temporary file and a rename) only when all of them fit; otherwise it is left as it was, the
//! failed hunks go to `NAME.rej` and the exit status is 1. It is one file (over 700 lines) because
//! it is one command whose stages feed each other (options, reading the patch, a plan with every
//! name checked, then carrying it out file by file), with hunk placement in `apply`.

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use diffy::Line;
use diffy::patch_set::{FileOperation, ParseOptions, PatchKind, PatchSet};

use crate::apply::{self, Hunk, Placement, Role};
use crate::diff::describe_error;

const USAGE: &str = "usage: patch [-p N] [-R] [--dry-run] [-F N] [-d DIR] [-E] [-b] [-s] \
[-i PATCHFILE] [ORIGFILE [PATCHFILE]]";

const APPLIED: i32 = 0;
const FAILED: i32 = 1;
const TROUBLE: i32 = 2;

#[derive(Debug)]
struct Options {
    strip: Option<usize>,
    reverse: bool,
    dry_run: bool,
    fuzz: usize,
    directory: Option<String>,
    remove_empty: bool,
    backup: bool,
    silent: bool,
    input: Option<String>,
    operands: Vec<String>,
    help: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            strip: None,
            reverse: false,
            dry_run: false,
            fuzz: 2,
            directory: None,
            remove_empty: false,
            backup: false,
            silent: false,
            input: None,
            operands: Vec::new(),
            help: false,
        }
    }
}

/// Run `patch` with `args` (the arguments after the program name); return the exit status.
pub fn main(args: &[String]) -> i32 {
    let options = match parse_args(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("patch: {message}\n{USAGE}");
            return TROUBLE;
        }
    };
    if options.help {
        println!("{USAGE}");
        return APPLIED;
    }
    if options.operands.len() > 2 {
        eprintln!("patch: extra operand: give at most the file to patch and the patch\n{USAGE}");
        return TROUBLE;
    }
    let patch_file = options
        .input
        .as_deref()
        .or(options.operands.get(1).map(String::as_str));
    let text = match read_patch(patch_file) {
        Ok(text) => text,
        Err(error) => {
            let name = patch_file.unwrap_or("standard input");
            eprintln!(
                "patch: **** cannot read the patch from {name}: {}",
                describe_error(&error)
            );
            return TROUBLE;
        }
    };
    if let Some(directory) = &options.directory
        && let Err(error) = std::env::set_current_dir(directory)
    {
        eprintln!(
            "patch: **** cannot change to directory {directory}: {}",
            describe_error(&error)
        );
        return TROUBLE;
    }
    let (changes, git) = match parse_patch(&text) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("patch: **** {message}");
            return TROUBLE;
        }
    };
    let plans = match plan(changes, git, &options) {
        Ok(plans) => plans,
        Err(message) => {
            eprintln!("patch: **** {message}");
            return TROUBLE;
        }
    };
    let stdout = io::stdout();
    let mut patcher = Patcher {
        options: &options,
        out: BufWriter::new(stdout.lock()),
        pending: HashMap::new(),
    };
    let mut status = APPLIED;
    for plan in &plans {
        match patcher.carry_out(plan) {
            Ok(outcome) => status = status.max(outcome),
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => {}
            Err(error) => {
                let _ = patcher.out.flush();
                eprintln!("patch: **** {}", describe_error(&error));
                status = TROUBLE;
            }
        }
    }
    let _ = patcher.out.flush();
    status
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let mut iter = args.iter();
    let mut only_operands = false;
    while let Some(arg) = iter.next() {
        if only_operands || arg == "-" || !arg.starts_with('-') {
            options.operands.push(arg.clone());
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            let mut value = || -> Result<String, String> {
                match inline.clone() {
                    Some(value) => Ok(value),
                    None => iter
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("option '--{name}' needs a value")),
                }
            };
            match name {
                "" => only_operands = true,
                "strip" => options.strip = Some(parse_number(&value()?, "-p")?),
                "input" => options.input = Some(value()?),
                "reverse" => options.reverse = true,
                "dry-run" | "check" => options.dry_run = true,
                "fuzz" => options.fuzz = parse_number(&value()?, "--fuzz")?,
                "directory" => options.directory = Some(value()?),
                "remove-empty-files" => options.remove_empty = true,
                "backup" => options.backup = true,
                "silent" | "quiet" => options.silent = true,
                "help" => options.help = true,
                "forward" | "force" | "batch" | "unified" | "no-backup-if-mismatch" => {}
                _ => return Err(format!("unrecognized option '{arg}'")),
            }
            continue;
        }
        let cluster = &arg[1..];
        for (index, flag) in cluster.char_indices() {
            let rest = &cluster[index + flag.len_utf8()..];
            let mut value = || -> Result<String, String> {
                if rest.is_empty() {
                    iter.next()
                        .cloned()
                        .ok_or_else(|| format!("option '-{flag}' needs a value"))
                } else {
                    Ok(rest.to_string())
                }
            };
            match flag {
                'p' => options.strip = Some(parse_number(&value()?, "-p")?),
                'i' => options.input = Some(value()?),
                'F' => options.fuzz = parse_number(&value()?, "-F")?,
                'd' => options.directory = Some(value()?),
                'R' => options.reverse = true,
                'E' => options.remove_empty = true,
                'b' => options.backup = true,
                's' => options.silent = true,
                'N' | 'f' | 't' | 'u' => {}
                _ => return Err(format!("invalid option -- '{flag}'")),
            }
            if matches!(flag, 'p' | 'i' | 'F' | 'd') {
                break;
            }
        }
    }
    Ok(options)
}

fn parse_number(text: &str, option: &str) -> Result<usize, String> {
    text.parse()
        .map_err(|_| format!("option {option} needs a whole number, not '{text}'"))
}

fn read_patch(name: Option<&str>) -> io::Result<Vec<u8>> {
    match name {
        Some(name) if name != "-" => fs::read(name),
        _ => {
            let mut text = Vec::new();
            io::stdin().lock().read_to_end(&mut text)?;
            Ok(text)
        }
    }
}

/// What one file's part of the patch asks for, with the names as the patch spells them.
#[derive(Debug, Clone, PartialEq)]
enum Operation {
    Modify { original: String, modified: String },
    Create(String),
    Delete(String),
    Rename { from: String, to: String },
    Copy { from: String, to: String },
}

/// One file's part of the patch.
#[derive(Debug)]
struct Change {
    operation: Operation,
    hunks: Vec<Hunk>,
    /// Set for a part patch cannot apply (a git binary diff), saying why.
    unsupported: Option<String>,
}

/// Parse the whole patch before anything is applied; a malformed part refuses all of it.
/// Also says whether it is a git patch (`diff --git` headers).
fn parse_patch(text: &[u8]) -> Result<(Vec<Change>, bool), String> {
    let git = text
        .split(|&byte| byte == b'\n')
        .any(|line| line.starts_with(b"diff --git "));
    let format = if git {
        ParseOptions::gitdiff()
    } else {
        ParseOptions::unidiff()
    };
    let mut changes = Vec::new();
    for parsed in PatchSet::parse_bytes(text, format) {
        let file_patch = parsed.map_err(|error| {
            let reason = error.to_string();
            if reason.ends_with("no valid patches found") {
                return "Only garbage was found in the patch input.".to_string();
            }
            let reason = reason.rsplit(": ").next().unwrap_or(&reason).to_string();
            let hint = if reason == "hunk header does not match hunk" {
                " (its lines do not add up to the counts in its @@ header, or it is cut short)"
            } else {
                ""
            };
            format!(
                "malformed patch in file part {} of the input: {reason}{hint}; nothing was changed",
                changes.len() + 1
            )
        })?;
        let operation = match file_patch.operation() {
            FileOperation::Modify { original, modified } => Operation::Modify {
                original: name_text(original)?,
                modified: name_text(modified)?,
            },
            FileOperation::Create(name) => Operation::Create(name_text(name)?),
            FileOperation::Delete(name) => Operation::Delete(name_text(name)?),
            FileOperation::Rename { from, to } => Operation::Rename {
                from: name_text(from)?,
                to: name_text(to)?,
            },
            FileOperation::Copy { from, to } => Operation::Copy {
                from: name_text(from)?,
                to: name_text(to)?,
            },
        };
        let (hunks, unsupported) = match file_patch.patch() {
            PatchKind::Text(patch) => (patch.hunks().iter().map(convert_hunk).collect(), None),
            PatchKind::Binary(_) => (
                Vec::new(),
                Some("git binary diffs are not supported".to_string()),
            ),
        };
        changes.push(Change {
            operation,
            hunks,
            unsupported,
        });
    }
    Ok((changes, git))
}

fn name_text(name: &[u8]) -> Result<String, String> {
    String::from_utf8(name.to_vec()).map_err(|_| {
        format!(
            "refusing a file name that is not UTF-8 ({}); nothing was changed",
            String::from_utf8_lossy(name)
        )
    })
}

fn convert_hunk(hunk: &diffy::Hunk<'_, [u8]>) -> Hunk {
    Hunk {
        old_start: hunk.old_range().start(),
        old_len: hunk.old_range().len(),
        new_start: hunk.new_range().start(),
        new_len: hunk.new_range().len(),
        lines: hunk
            .lines()
            .iter()
            .map(|line| match *line {
                Line::Context(text) => (Role::Context, text.to_vec()),
                Line::Delete(text) => (Role::Delete, text.to_vec()),
                Line::Insert(text) => (Role::Insert, text.to_vec()),
            })
            .collect(),
    }
}

/// What to do for one file, with names already stripped and checked.
#[derive(Debug)]
struct Plan {
    action: Action,
    hunks: Vec<Hunk>,
    unsupported: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Action {
    /// Patch the first of these names that exists (or create the last one when every hunk
    /// only adds lines).
    Modify(Vec<String>),
    Create(String),
    Delete(String),
    Rename {
        from: String,
        to: String,
    },
    Copy {
        from: String,
        to: String,
    },
}

/// Turn the parsed changes into checked plans: reverse them for `-R`, strip and check every
/// name. Any unsafe name refuses the whole patch before a file is touched. Without `-p`, a git
/// patch (or one whose names start `a/` and `b/`) strips one component.
fn plan(changes: Vec<Change>, git: bool, options: &Options) -> Result<Vec<Plan>, String> {
    let git_style = git
        || changes.iter().any(|change| {
            matches!(&change.operation, Operation::Modify { original, modified }
            if original.starts_with("a/") && modified.starts_with("b/"))
        });
    let strip = options.strip.or(git_style.then_some(1));
    let explicit = options.operands.first();
    let mut plans = Vec::with_capacity(changes.len());
    for change in changes {
        let mut operation = change.operation;
        let mut hunks = change.hunks;
        if options.reverse {
            operation = reverse(operation);
            hunks = hunks.iter().map(Hunk::reversed).collect();
        }
        let name = |raw: &str| target_name(raw, strip);
        let action = match explicit {
            // The file named on the command line is patched whatever the patch calls it.
            Some(file) => Action::Modify(vec![file.clone()]),
            None => match operation {
                Operation::Modify { original, modified } => {
                    let mut names = vec![name(&original)?];
                    let modified = name(&modified)?;
                    if !names.contains(&modified) {
                        names.push(modified);
                    }
                    Action::Modify(names)
                }
                Operation::Create(target) => Action::Create(name(&target)?),
                Operation::Delete(target) => Action::Delete(name(&target)?),
                Operation::Rename { from, to } => Action::Rename {
                    from: name(&from)?,
                    to: name(&to)?,
                },
                Operation::Copy { from, to } => Action::Copy {
                    from: name(&from)?,
                    to: name(&to)?,
                },
            },
        };
        if explicit.is_none() {
            for target in action_names(&action) {
                refuse_symbolic_links(target)?;
            }
        }
        plans.push(Plan {
            action,
            hunks,
            unsupported: change.unsupported,
        });
    }
    Ok(plans)
}

/// The operation `-R` carries out. A modified file keeps the order its names are tried in (the
/// old name first, as GNU patch does); only the hunks turn around.
fn reverse(operation: Operation) -> Operation {
    match operation {
        modify @ Operation::Modify { .. } => modify,
        Operation::Create(name) => Operation::Delete(name),
        Operation::Delete(name) => Operation::Create(name),
        Operation::Rename { from, to } => Operation::Rename { from: to, to: from },
        // Undoing a copy deletes the copy, which must still match the patched text.
        Operation::Copy { to, .. } => Operation::Delete(to),
    }
}

fn action_names(action: &Action) -> Vec<&String> {
    match action {
        Action::Modify(names) => names.iter().collect(),
        Action::Create(name) | Action::Delete(name) => vec![name],
        Action::Rename { from, to } | Action::Copy { from, to } => vec![from, to],
    }
}

/// The name to patch for a name in the patch: `strip` leading components removed (or, without
/// `-p`, only the file name kept), and refused when it could lead out of the working directory.
fn target_name(raw: &str, strip: Option<usize>) -> Result<String, String> {
    let name = match strip {
        Some(count) => strip_components(raw, count).ok_or_else(|| {
            format!(
                "cannot strip {count} leading component{} from '{raw}' (it has fewer); try a \
                 smaller -p; nothing was changed",
                if count == 1 { "" } else { "s" }
            )
        })?,
        None => raw.rsplit('/').next().unwrap_or(raw),
    };
    check_safe_name(name)?;
    Ok(name.to_string())
}

/// `name` with `count` leading components removed (`-p count`); a run of slashes counts as one.
fn strip_components(name: &str, count: usize) -> Option<&str> {
    let mut rest = name;
    for _ in 0..count {
        let slash = rest.find('/')?;
        rest = rest[slash..].trim_start_matches('/');
    }
    Some(rest)
}

/// Refuse names that are empty, absolute, or contain a `..` component.
fn check_safe_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." {
        return Err(
            "refusing to patch a file with an empty name (check the -p level); nothing was changed"
                .to_string(),
        );
    }
    if name.starts_with('/') {
        return Err(format!(
            "refusing to patch '{name}': absolute file names are not allowed, patch only edits \
             files under the working directory (strip the leading part with -p); nothing was \
             changed"
        ));
    }
    if name.split('/').any(|component| component == "..") {
        return Err(format!(
            "refusing to patch '{name}': its '..' would lead out of the working directory; \
             nothing was changed"
        ));
    }
    Ok(())
}

/// Refuse a name any existing component of which is a symbolic link: patch replaces regular
/// files only, and never writes through a link (which may point anywhere).
fn refuse_symbolic_links(name: &str) -> Result<(), String> {
    let mut path = PathBuf::new();
    for component in name
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
    {
        path.push(component);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(format!(
                    "refusing to patch '{name}': '{}' is a symbolic link, and patch edits only \
                     regular files (never through a link); nothing was changed",
                    path.display()
                ));
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// Carries out plans in order, remembering what earlier plans did to each file (so a dry run of
/// two parts touching one file sees the first part's result).
struct Patcher<'a, W: Write> {
    options: &'a Options,
    out: W,
    /// File contents as this run left them: `None` for a file it deleted.
    pending: HashMap<String, Option<Vec<u8>>>,
}

impl<W: Write> Patcher<'_, W> {
    fn carry_out(&mut self, plan: &Plan) -> io::Result<i32> {
        let verb = if self.options.dry_run {
            "checking"
        } else {
            "patching"
        };
        if let Some(why) = &plan.unsupported {
            let names = action_names(&plan.action);
            let name = names.last().map(|name| name.as_str()).unwrap_or("?");
            writeln!(self.out, "File {name}: {why}; skipping it.")?;
            return Ok(FAILED);
        }
        match &plan.action {
            Action::Modify(names) => {
                let existing = names.iter().find(|name| self.exists(name));
                let target = match existing {
                    Some(target) => target.clone(),
                    None if plan.hunks.iter().all(|hunk| hunk.old_len == 0) => {
                        names.last().cloned().unwrap_or_default()
                    }
                    None => {
                        writeln!(
                            self.out,
                            "can't find file to patch: {}\nNo file to patch.  Skipping patch.",
                            names.join(" or ")
                        )?;
                        self.say_ignored(plan.hunks.len())?;
                        return Ok(FAILED);
                    }
                };
                self.say(&format!("{verb} file {target}"))?;
                let Some(original) = self.read(&target)? else {
                    return Ok(TROUBLE);
                };
                let Some(result) = self.apply_all(&target, &original, &plan.hunks)? else {
                    return Ok(FAILED);
                };
                if result.is_empty() && self.options.remove_empty {
                    self.remove(&target)?;
                } else {
                    self.write(&target, result, Some(&original))?;
                }
                Ok(APPLIED)
            }
            Action::Create(target) => {
                self.say(&format!("{verb} file {target}"))?;
                if self.exists(target) {
                    let Some(current) = self.read(target)? else {
                        return Ok(TROUBLE);
                    };
                    if !current.is_empty() {
                        let reversed: Vec<Hunk> = plan.hunks.iter().map(Hunk::reversed).collect();
                        let undone = apply::apply(&current, &reversed, 0);
                        if undone.failures() == 0 && undone.text.is_empty() {
                            self.say_reversed(plan.hunks.len())?;
                        } else {
                            writeln!(
                                self.out,
                                "The next patch would create the file {target}, which already \
                                 exists!  Skipping patch."
                            )?;
                            self.say_ignored(plan.hunks.len())?;
                        }
                        return Ok(FAILED);
                    }
                }
                let Some(result) = self.apply_all(target, b"", &plan.hunks)? else {
                    return Ok(FAILED);
                };
                self.write(target, result, None)?;
                Ok(APPLIED)
            }
            Action::Delete(target) => {
                self.say(&format!("{verb} file {target}"))?;
                if !self.exists(target) {
                    writeln!(
                        self.out,
                        "The next patch would delete the file {target}, which does not exist!  \
                         Skipping patch."
                    )?;
                    self.say_ignored(plan.hunks.len())?;
                    return Ok(FAILED);
                }
                let Some(original) = self.read(target)? else {
                    return Ok(TROUBLE);
                };
                let Some(result) = self.apply_all(target, &original, &plan.hunks)? else {
                    return Ok(FAILED);
                };
                if result.is_empty() {
                    self.remove(target)?;
                    Ok(APPLIED)
                } else {
                    writeln!(
                        self.out,
                        "Not deleting file {target} as content differs from patch"
                    )?;
                    self.write(target, result, Some(&original))?;
                    Ok(FAILED)
                }
            }
            Action::Rename { from, to } | Action::Copy { from, to } => {
                let how = if matches!(plan.action, Action::Rename { .. }) {
                    "renamed"
                } else {
                    "copied"
                };
                self.say(&format!("{verb} file {to} ({how} from {from})"))?;
                if !self.exists(from) {
                    writeln!(
                        self.out,
                        "can't find file to patch: {from}\nSkipping patch."
                    )?;
                    self.say_ignored(plan.hunks.len())?;
                    return Ok(FAILED);
                }
                let Some(original) = self.read(from)? else {
                    return Ok(TROUBLE);
                };
                let Some(result) = self.apply_all(to, &original, &plan.hunks)? else {
                    return Ok(FAILED);
                };
                self.write(to, result, None)?;
                if how == "renamed" && from != to {
                    self.remove(from)?;
                }
                Ok(APPLIED)
            }
        }
    }

    /// Apply `hunks` to `original` for the file `target`, report each hunk that moved, needed
    /// fuzz or failed, and return the new text only when every hunk fitted. When none fits but
    /// the reverse does, the patch was already applied (or is reversed), and nothing is done.
    fn apply_all(
        &mut self,
        target: &str,
        original: &[u8],
        hunks: &[Hunk],
    ) -> io::Result<Option<Vec<u8>>> {
        let applied = apply::apply(original, hunks, self.options.fuzz);
        let failures = applied.failures();
        if failures > 0 {
            let reversed: Vec<Hunk> = hunks.iter().map(Hunk::reversed).collect();
            if !hunks.is_empty() && apply::apply(original, &reversed, 0).failures() == 0 {
                self.say_reversed(hunks.len())?;
                return Ok(None);
            }
        }
        for (index, placement) in applied.placements.iter().enumerate() {
            let number = index + 1;
            match *placement {
                Placement::Applied { line, offset, fuzz } if offset != 0 || fuzz != 0 => {
                    let mut message = format!("Hunk #{number} succeeded at {line}");
                    if fuzz != 0 {
                        message.push_str(&format!(" with fuzz {fuzz}"));
                    }
                    if offset != 0 {
                        let plural = if offset == 1 { "" } else { "s" };
                        message.push_str(&format!(" (offset {offset} line{plural})"));
                    }
                    message.push('.');
                    self.say(&message)?;
                }
                Placement::Applied { .. } => {}
                Placement::Failed { line } => {
                    writeln!(self.out, "Hunk #{number} FAILED at {line}.")?;
                }
            }
        }
        if failures == 0 {
            return Ok(Some(applied.text));
        }
        let total = hunks.len();
        let plural = if total == 1 { "" } else { "s" };
        if self.options.dry_run {
            writeln!(self.out, "{failures} out of {total} hunk{plural} FAILED")?;
        } else {
            let reject_name = format!("{target}.rej");
            writeln!(
                self.out,
                "{failures} out of {total} hunk{plural} FAILED -- saving rejects to file {reject_name}"
            )?;
            let failed: Vec<&Hunk> = hunks
                .iter()
                .zip(&applied.placements)
                .filter(|(_, placement)| matches!(placement, Placement::Failed { .. }))
                .map(|(hunk, _)| hunk)
                .collect();
            let rejects = format_rejects(target, &failed);
            if let Err(error) = write_replacing(Path::new(&reject_name), &rejects) {
                writeln!(
                    self.out,
                    "cannot write {reject_name}: {}",
                    describe_error(&error)
                )?;
            }
        }
        Ok(None)
    }

    fn say(&mut self, line: &str) -> io::Result<()> {
        if !self.options.silent {
            writeln!(self.out, "{line}")?;
        }
        Ok(())
    }

    fn say_reversed(&mut self, hunks: usize) -> io::Result<()> {
        writeln!(
            self.out,
            "Reversed (or previously applied) patch detected!  Skipping patch."
        )?;
        self.say_ignored(hunks)
    }

    fn say_ignored(&mut self, hunks: usize) -> io::Result<()> {
        let plural = if hunks == 1 { "" } else { "s" };
        writeln!(self.out, "{hunks} out of {hunks} hunk{plural} ignored")
    }

    /// Whether `name` is there. A name that cannot be looked at (the sandbox refuses it)
    /// counts as there, so that reading it reports why.
    fn exists(&self, name: &str) -> bool {
        match self.pending.get(name) {
            Some(content) => content.is_some(),
            None => match fs::metadata(name) {
                Ok(_) => true,
                Err(error) => error.kind() != io::ErrorKind::NotFound,
            },
        }
    }

    /// The current text of `name`; `None` (after saying why) when it cannot be read.
    fn read(&mut self, name: &str) -> io::Result<Option<Vec<u8>>> {
        if let Some(content) = self.pending.get(name) {
            return Ok(Some(content.clone().unwrap_or_default()));
        }
        match fs::metadata(name) {
            Ok(meta) if meta.is_dir() => {
                writeln!(
                    self.out,
                    "{name} is a directory, not a file to patch; skipping it."
                )?;
                return Ok(None);
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Some(Vec::new())),
            _ => {}
        }
        match fs::read(name) {
            Ok(text) => Ok(Some(text)),
            Err(error) => {
                writeln!(self.out, "cannot read {name}: {}", describe_error(&error))?;
                Ok(None)
            }
        }
    }

    /// Replace `name` with `text` (unless this is a dry run), keeping `name.orig` first when
    /// asked to (`-b`).
    fn write(&mut self, name: &str, text: Vec<u8>, original: Option<&[u8]>) -> io::Result<()> {
        if !self.options.dry_run {
            if let (true, Some(original)) = (self.options.backup, original) {
                write_replacing(Path::new(&format!("{name}.orig")), original)?;
            }
            write_replacing(Path::new(name), &text)?;
        }
        self.pending.insert(name.to_string(), Some(text));
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        if !self.options.dry_run {
            if self.options.backup
                && let Ok(original) = fs::read(name)
            {
                write_replacing(Path::new(&format!("{name}.orig")), &original)?;
            }
            fs::remove_file(name)?;
            // Like GNU patch, directories the deletion left empty go too.
            let mut parent = Path::new(name).parent();
            while let Some(directory) = parent.filter(|dir| !dir.as_os_str().is_empty()) {
                if fs::remove_dir(directory).is_err() {
                    break;
                }
                parent = directory.parent();
            }
        }
        self.pending.insert(name.to_string(), None);
        Ok(())
    }
}

/// Write `text` to `path` whole or not at all: into a temporary file beside it, then renamed
/// over it. Missing parent directories are created.
fn write_replacing(path: &Path, text: &[u8]) -> io::Result<()> {
    let parent = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty());
    if let Some(parent) = parent {
        fs::create_dir_all(parent)?;
    }
    let file_name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{file_name}.patch-tmp"));
    let written = fs::write(&temporary, text).and_then(|()| fs::rename(&temporary, path));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written.map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("{}: {}", path.display(), describe_error(&error)),
        )
    })
}

/// The failed hunks as a unified diff of `name`, for `name.rej`.
fn format_rejects(name: &str, hunks: &[&Hunk]) -> Vec<u8> {
    let mut text = format!("--- {name}\n+++ {name}\n").into_bytes();
    for hunk in hunks {
        text.extend_from_slice(
            format!(
                "@@ -{},{} +{},{} @@\n",
                hunk.old_start, hunk.old_len, hunk.new_start, hunk.new_len
            )
            .as_bytes(),
        );
        for (role, line) in &hunk.lines {
            text.push(match role {
                Role::Context => b' ',
                Role::Delete => b'-',
                Role::Insert => b'+',
            });
            text.extend_from_slice(line);
            if crate::lines::lacks_newline(line) {
                text.extend_from_slice(b"\n\\ No newline at end of file\n");
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> Options {
        parse_args(&args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn options_combine() {
        let parsed = options(&["-Rp1", "--dry-run", "-F", "0", "-i", "x.diff", "file"]);
        assert!(parsed.reverse && parsed.dry_run);
        assert_eq!(parsed.strip, Some(1));
        assert_eq!(parsed.fuzz, 0);
        assert_eq!(parsed.input.as_deref(), Some("x.diff"));
        assert_eq!(parsed.operands, vec!["file"]);
        assert_eq!(options(&["--strip=2"]).strip, Some(2));
        assert!(parse_args(&["-p".into(), "x".into()]).is_err());
        assert!(parse_args(&["--bogus".into()]).is_err());
    }

    #[test]
    fn components_are_stripped_like_gnu() {
        assert_eq!(strip_components("a/b/c.txt", 0), Some("a/b/c.txt"));
        assert_eq!(strip_components("a/b/c.txt", 1), Some("b/c.txt"));
        assert_eq!(strip_components("/u/howard/x.c", 1), Some("u/howard/x.c"));
        assert_eq!(strip_components("a//b", 1), Some("b"));
        assert_eq!(strip_components("x.txt", 1), None);
    }

    #[test]
    fn unsafe_names_are_refused() {
        assert!(target_name("../outside.txt", Some(0)).is_err());
        assert!(target_name("/etc/passwd", Some(0)).is_err());
        assert!(target_name("a/../../x", Some(1)).is_err());
        assert!(target_name("a/b/../x", Some(1)).is_err());
        assert!(target_name("a/", Some(1)).is_err());
        assert_eq!(target_name("/etc/passwd", Some(1)).unwrap(), "etc/passwd");
        assert_eq!(target_name("a/src/x.rs", Some(1)).unwrap(), "src/x.rs");
        assert_eq!(target_name("a/src/x.rs", None).unwrap(), "x.rs");
        assert!(target_name("a/..", None).is_err());
    }

    #[test]
    fn patches_parse_into_changes() {
        let text = b"garbage first\n--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-old\n+new\n\
--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n";
        let (changes, git) = parse_patch(text).unwrap();
        assert!(!git);
        assert_eq!(changes.len(), 2);
        assert_eq!(
            changes[0].operation,
            Operation::Modify {
                original: "a/x.txt".into(),
                modified: "b/x.txt".into()
            }
        );
        assert_eq!(changes[1].operation, Operation::Create("b/new.txt".into()));
        let plans = plan(changes, git, &Options::default()).unwrap();
        assert_eq!(plans[0].action, Action::Modify(vec!["x.txt".into()]));
        assert_eq!(plans[1].action, Action::Create("new.txt".into()));
    }

    #[test]
    fn reversing_keeps_the_old_name_first_and_swaps_create_and_delete() {
        let text = b"--- old.txt\n+++ new.txt\n@@ -1 +1 @@\n-a\n+b\n\
--- /dev/null\n+++ made.txt\n@@ -0,0 +1 @@\n+x\n";
        let (changes, git) = parse_patch(text).unwrap();
        let reverse = Options {
            reverse: true,
            strip: Some(0),
            ..Options::default()
        };
        let plans = plan(changes, git, &reverse).unwrap();
        assert_eq!(
            plans[0].action,
            Action::Modify(vec!["old.txt".into(), "new.txt".into()])
        );
        assert_eq!(plans[0].hunks[0].lines[0], (Role::Insert, b"a\n".to_vec()));
        assert_eq!(plans[1].action, Action::Delete("made.txt".into()));
    }

    #[test]
    fn malformed_patches_are_refused() {
        assert!(
            parse_patch(b"just some text\n")
                .unwrap_err()
                .contains("Only garbage")
        );
        let huge = b"--- a\n+++ a\n@@ -1,99999999 +1,99999999 @@\n x\n";
        assert!(parse_patch(huge).unwrap_err().contains("malformed patch"));
        let truncated = b"--- a\n+++ a\n@@ -1,3 +1,3 @@\n x\n-y\n";
        assert!(
            parse_patch(truncated)
                .unwrap_err()
                .contains("malformed patch")
        );
    }

    #[test]
    fn rejects_are_unified() {
        let hunk = Hunk {
            old_start: 1,
            old_len: 1,
            new_start: 1,
            new_len: 1,
            lines: vec![
                (Role::Delete, b"a\n".to_vec()),
                (Role::Insert, b"b".to_vec()),
            ],
        };
        assert_eq!(
            String::from_utf8(format_rejects("f", &[&hunk])).unwrap(),
            "--- f\n+++ f\n@@ -1,1 +1,1 @@\n-a\n+b\n\\ No newline at end of file\n"
        );
    }
}
