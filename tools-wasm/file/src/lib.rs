//! The file tools of clawcage as one WebAssembly component: `read_file`,
//! `write_file`, `edit_file` and `list_dir`. They work inside the workspace
//! the operator granted (relative paths resolve from it; anything outside is
//! refused with a clear message), stream large files instead of loading them
//! whole, and replace files atomically so no half-written file is ever left.

use std::path::PathBuf;

use clawcage_tool_sdk::workspace::{self, Mode};
use clawcage_tool_sdk::{Spec, ToolError, Tools, Value, args, json};

mod edit;
mod list;
mod read;
mod text;
mod write;

/// Where a call runs: the workspace root and its mode. Built from the
/// environment for a real call; the native tests build one over a temporary
/// directory.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// The workspace's absolute, normalised path.
    pub root: PathBuf,
    /// Whether the workspace may be written.
    pub mode: Mode,
}

impl Ctx {
    /// The context the host set up for this call.
    fn from_env() -> Result<Self, ToolError> {
        let root = workspace::root().ok_or_else(|| {
            ToolError::Denied(
                "no workspace was granted to this tool, so it can reach no files".to_string(),
            )
        })?;
        Ok(Self {
            root,
            mode: workspace::mode(),
        })
    }

    /// The absolute path `path` names inside the workspace, or a refusal.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        workspace::resolve_in(&self.root, path)
    }

    /// Refuse a write up front when the workspace is read-only.
    pub fn ensure_writable(&self, path: &str) -> Result<(), ToolError> {
        match self.mode {
            Mode::ReadWrite | Mode::AskToWrite => Ok(()),
            Mode::ReadOnly => Err(ToolError::Denied(format!(
                "the workspace is read-only for this tool: cannot write {path}"
            ))),
        }
    }

    /// Explain a failed file operation on `path`.
    pub fn io_error(
        &self,
        err: &std::io::Error,
        path: &str,
        access: workspace::Access,
    ) -> ToolError {
        workspace::io_error_with_mode(err, path, access, self.mode)
    }
}

/// Refuses what is neither a regular file nor a directory: a FIFO (named pipe), a socket or a
/// device, whose open can wait forever for another process (the host refuses such opens anyway,
/// with a bare "not supported"). `works_on` says what the tool handles, e.g. "read_file reads
/// regular files only". Stable Rust cannot tell these kinds apart inside WASI, so the message
/// names all three.
pub(crate) fn refuse_special(
    meta: &std::fs::Metadata,
    path: &str,
    works_on: &str,
) -> Result<(), ToolError> {
    if meta.is_file() || meta.is_dir() {
        return Ok(());
    }
    Err(special_file(path, works_on))
}

/// The refusal of a FIFO, socket or device at `path`.
pub(crate) fn special_file(path: &str, works_on: &str) -> ToolError {
    ToolError::Failed(format!(
        "{path} is a FIFO (named pipe), socket or device, not a regular file; {works_on}"
    ))
}

/// The component's tools.
struct FileTools;

/// The description every `path` property shares.
const PATH_HELP: &str = "A path relative to the workspace root (e.g. \"src/main.rs\"), or an absolute path inside the workspace.";

impl Tools for FileTools {
    fn specs() -> Vec<Spec> {
        vec![
            Spec::new(
                "read_file",
                format!(
                    "Read a text file in the workspace. Returns the file's lines exactly as they are \
                     (no line numbers added), starting at line `offset` (default 1), at most `limit` \
                     lines (default {}) and at most {} characters. When the output is cut, its last \
                     line is a note in square brackets saying which lines were shown, how many lines \
                     the file has, and the offset to pass to continue reading. Binary files are \
                     refused. For a directory use list_dir.",
                    read::DEFAULT_LIMIT,
                    read::MAX_CHARS
                ),
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": format!("The file to read. {PATH_HELP}")},
                        "offset": {
                            "type": "integer",
                            "minimum": 1,
                            "default": 1,
                            "description": "Number of the first line to return, counting from 1. Default 1. To continue after a cut, use the offset the note names."
                        },
                        "limit": {
                            "type": "integer",
                            "minimum": 1,
                            "default": read::DEFAULT_LIMIT,
                            "description": format!("Maximum number of lines to return. Default {}.", read::DEFAULT_LIMIT)
                        }
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            ),
            Spec::new(
                "write_file",
                "Create a file in the workspace, or replace an existing file, with the given content. \
                 Missing parent directories are created. The write is atomic: the file ends up either \
                 fully written or unchanged. It overwrites without asking; to change part of an \
                 existing file, prefer edit_file.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": format!("The file to write. {PATH_HELP}")},
                        "content": {"type": "string", "description": "The complete content of the file, written exactly as given (UTF-8)."}
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }),
            ),
            Spec::new(
                "edit_file",
                "Replace one exact piece of text in an existing file in the workspace. `old_text` must \
                 occur in the file exactly once, character for character, whitespace and indentation \
                 included (copy it from read_file output). If it occurs nowhere, the call fails; if it \
                 occurs several times, nothing is changed and you must add surrounding lines to \
                 old_text until it is unique. An empty new_text deletes old_text. To create a file or \
                 replace all of it, use write_file.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": format!("The file to edit. {PATH_HELP}")},
                        "old_text": {
                            "type": "string",
                            "minLength": 1,
                            "description": "The exact text to replace; must occur exactly once in the file. Include enough surrounding lines to make it unique."
                        },
                        "new_text": {"type": "string", "description": "The text to put in its place (may be empty to delete old_text)."}
                    },
                    "required": ["path", "old_text", "new_text"],
                    "additionalProperties": false
                }),
            ),
            Spec::new(
                "list_dir",
                format!(
                    "List the entries of a directory in the workspace (not recursive), sorted by name, \
                     one per line, each marked [folder] or [file]; a symbolic link is marked by what it \
                     points to, or [link] when its target cannot be reached, and anything else is \
                     marked [other]. Shows at most {} entries and then states the total.",
                    list::MAX_ENTRIES
                ),
                json!({
                    "type": "object",
                    "properties": {
                        "path": {
                            "type": "string",
                            "default": ".",
                            "description": "The directory to list: a path relative to the workspace root (e.g. \"src\"), or an absolute path inside the workspace. Default \".\", the workspace root."
                        }
                    },
                    "additionalProperties": false
                }),
            ),
        ]
    }

    fn call(name: &str, args: Value) -> Result<String, ToolError> {
        if !matches!(name, "read_file" | "write_file" | "edit_file" | "list_dir") {
            return Err(ToolError::unknown_tool(name));
        }
        let ctx = Ctx::from_env()?;
        run(&ctx, name, &args)
    }

    /// Every path is resolved to an absolute one with `Ctx::resolve`: no call needs the
    /// workspace as its current directory.
    fn enters_workspace() -> bool {
        false
    }
}

/// Run one tool in `ctx`.
fn run(ctx: &Ctx, name: &str, args: &Value) -> Result<String, ToolError> {
    match name {
        "read_file" => {
            let path = args::required_str(args, "path")?;
            let offset = args::optional_u64(args, "offset")?.unwrap_or(1);
            let limit = args::optional_u64(args, "limit")?.unwrap_or(read::DEFAULT_LIMIT);
            read::read_file(ctx, path, offset, limit)
        }
        "write_file" => {
            let path = args::required_str(args, "path")?;
            let content = args::required_str(args, "content")?;
            write::write_file(ctx, path, content)
        }
        "edit_file" => {
            let path = args::required_str(args, "path")?;
            let old_text = args::required_str(args, "old_text")?;
            let new_text = args::required_str(args, "new_text")?;
            edit::edit_file(ctx, path, old_text, new_text)
        }
        "list_dir" => {
            let path = args::optional_str(args, "path")?.unwrap_or(".");
            list::list_dir(ctx, path)
        }
        _ => Err(ToolError::unknown_tool(name)),
    }
}

clawcage_tool_sdk::export_tools!(FileTools);

/// Helpers for the native tests: a scratch workspace in the system's temp
/// directory.
#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A scratch workspace, removed on drop.
    pub struct Scratch {
        pub ctx: Ctx,
    }

    impl Scratch {
        pub fn new(mode: Mode) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "clawcage-file-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let root = dir.canonicalize().unwrap();
            Self {
                ctx: Ctx { root, mode },
            }
        }

        pub fn path(&self, rel: &str) -> PathBuf {
            self.ctx.root.join(rel)
        }

        pub fn write(&self, rel: &str, content: &[u8]) {
            let p = self.path(rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(p, content).unwrap();
        }

        pub fn read(&self, rel: &str) -> Vec<u8> {
            std::fs::read(self.path(rel)).unwrap()
        }

        /// Makes a FIFO (named pipe) at `rel`.
        #[cfg(unix)]
        pub fn fifo(&self, rel: &str) {
            let status = std::process::Command::new("mkfifo")
                .arg(self.path(rel))
                .status()
                .unwrap();
            assert!(status.success(), "mkfifo failed");
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.ctx.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_tool_is_invalid_args() {
        assert_eq!(
            FileTools::call("nope", json!({})),
            Err(ToolError::InvalidArgs("unknown tool: nope".to_string()))
        );
    }

    /// Every tool answers a FIFO with a message at once; none opens it (which would wait for a
    /// writer forever: the test would hang).
    #[cfg(unix)]
    #[test]
    fn special_files_are_refused_by_every_tool() {
        let ws = testutil::Scratch::new(Mode::ReadWrite);
        ws.fifo("pipe");
        std::os::unix::fs::symlink("pipe", ws.path("link")).unwrap();
        for path in ["pipe", "link"] {
            let calls = [
                (
                    "read_file",
                    json!({"path": path}),
                    "read_file reads regular files only",
                ),
                (
                    "write_file",
                    json!({"path": path, "content": "x"}),
                    "write_file writes regular files only",
                ),
                (
                    "edit_file",
                    json!({"path": path, "old_text": "a", "new_text": "b"}),
                    "edit_file edits regular files only",
                ),
                (
                    "list_dir",
                    json!({"path": path}),
                    "list_dir lists directories",
                ),
            ];
            for (tool, args, works_on) in calls {
                let Err(ToolError::Failed(message)) = run(&ws.ctx, tool, &args) else {
                    panic!("{tool} {path}: not refused");
                };
                assert_eq!(
                    message,
                    format!(
                        "{path} is a FIFO (named pipe), socket or device, not {}; {works_on}",
                        if tool == "list_dir" {
                            "a directory"
                        } else {
                            "a regular file"
                        }
                    )
                );
            }
        }
        use std::os::unix::fs::FileTypeExt as _;
        let kind = std::fs::metadata(ws.path("pipe")).unwrap().file_type();
        assert!(kind.is_fifo(), "write_file must not replace the FIFO");
    }

    #[test]
    fn specs_are_well_formed() {
        let specs = FileTools::specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["read_file", "write_file", "edit_file", "list_dir"]);
        for spec in &specs {
            let schema = &spec.input_schema;
            assert_eq!(schema["type"], "object", "{}", spec.name);
            assert_eq!(schema["additionalProperties"], false, "{}", spec.name);
            let props = schema["properties"].as_object().unwrap();
            for (prop, def) in props {
                assert!(
                    def["description"].as_str().is_some_and(|d| !d.is_empty()),
                    "{}.{prop} has no description",
                    spec.name
                );
            }
            if let Some(required) = schema["required"].as_array() {
                for r in required {
                    assert!(props.contains_key(r.as_str().unwrap()));
                }
            }
        }
    }
}
