//! The audit log: one JSON line per tool call — when, which session, which tool from where, a
//! SHA-256 digest of the arguments (never the arguments themselves), the grants the tool ran
//! with, the verdict and the duration — appended to a file and flushed line by line.
//! [`AuditedRegistry`] wraps a [`ToolRegistry`] so that every front end (the CLI's `call`, the
//! MCP server, the agent loop) records its calls the same way, including calls refused before
//! any tool ran (unknown tool, arguments that fail the schema) and calls abandoned midway, and
//! scrubs every result — output text and error message — of the secret values the host holds
//! ([`AuditedRegistry::with_redactor`]) before the caller, and so the model, sees it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clawcage_core::redact::Redactor;
use clawcage_core::{ToolError, ToolOutput};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::registry::ToolRegistry;

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When the call started, RFC 3339 in UTC with milliseconds.
    pub time: String,
    /// The session the call belongs to (an MCP session, a CLI invocation, an agent session).
    pub session: String,
    /// The tool's name as requested.
    pub tool: String,
    /// Where the tool comes from (`bundled:file`, `plugin:NAME@VERSION`); absent for an unknown
    /// tool.
    pub origin: Option<String>,
    /// Lowercase hex SHA-256 of the arguments as compact JSON with sorted keys (of the raw text
    /// when it was not JSON).
    pub args_sha256: String,
    /// The effective grants the tool ran with; absent for an unknown tool.
    pub grants: Option<String>,
    /// `ok`, `invalid_args`, `denied`, `failed`, or `cancelled` when the caller gave up first.
    pub verdict: String,
    /// Wall-clock time of the call in milliseconds.
    pub duration_ms: f64,
}

/// An append-only JSONL file of [`AuditRecord`]s.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens (creating it and its directory if needed) the log at `path` for appending. On Unix a
    /// new file is readable by its owner only.
    pub fn open(path: impl Into<PathBuf>) -> io::Result<AuditLog> {
        let path = path.into();
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)?;
        }
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let file = options.open(&path)?;
        Ok(AuditLog {
            path,
            file: Mutex::new(file),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record as one line, written with a single `write` on a file opened for
    /// appending, so lines from concurrent writers never interleave.
    pub fn append(&self, record: &AuditRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut file = self
            .file
            .lock()
            .map_err(|_| io::Error::other("the audit log's lock was poisoned"))?;
        file.write_all(&line)?;
        file.flush()
    }
}

/// A [`ToolRegistry`] whose every call is recorded in an [`AuditLog`] (when one is configured)
/// and whose every result is scrubbed by its [`Redactor`] (when one is given).
#[derive(Debug, Clone)]
pub struct AuditedRegistry {
    registry: ToolRegistry,
    log: Option<Arc<AuditLog>>,
    redactor: Redactor,
}

impl AuditedRegistry {
    /// Wraps `registry`; with `log` `None` calls are passed through unrecorded. Results are not
    /// scrubbed until [`with_redactor`](Self::with_redactor) gives the values to scrub.
    pub fn new(registry: ToolRegistry, log: Option<Arc<AuditLog>>) -> Self {
        Self {
            registry,
            log,
            redactor: Redactor::default(),
        }
    }

    /// This registry with every tool output and every error message scrubbed by `redactor`:
    /// each occurrence of a secret value the host holds (API keys, the network policy's secret
    /// headers) becomes `[redacted: LABEL]` before the result is returned. The audit record
    /// never holds results; its tool and session names are scrubbed too.
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// What scrubs results.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// The registry underneath.
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// The audit log, if any.
    pub fn log(&self) -> Option<&Arc<AuditLog>> {
        self.log.as_ref()
    }

    /// Runs tool `name` with arguments as JSON text, as [`ToolRegistry::execute`], records the
    /// call and returns the result scrubbed.
    pub async fn execute(
        &self,
        session: &str,
        name: &str,
        json_args: &str,
    ) -> Result<ToolOutput, ToolError> {
        // Parsed once here: the registry gets the value, and only text that is not JSON goes
        // to it as text, for its error.
        let Ok(args) = serde_json::from_str::<Value>(json_args) else {
            let pending = self.pending(session, name, hex_sha256(json_args.as_bytes()));
            let result = self.registry.execute(name, json_args).await;
            pending.finish(&result);
            return self.redactor.redact_result(result);
        };
        self.execute_value(session, name, &args).await
    }

    /// Runs tool `name` with parsed arguments, as [`ToolRegistry::execute_value`], records the
    /// call and returns the result scrubbed.
    pub async fn execute_value(
        &self,
        session: &str,
        name: &str,
        args: &Value,
    ) -> Result<ToolOutput, ToolError> {
        let pending = self.pending(session, name, args_digest(args));
        let result = self.registry.execute_value(name, args).await;
        pending.finish(&result);
        self.redactor.redact_result(result)
    }

    /// Records as a call of `name` what the host itself does for a client in place of a tool
    /// (an external agent's exact file read), and returns its result scrubbed. A result that a
    /// scrub would change is refused instead, since scrubbed text handed back as a file's
    /// content would be written back changed.
    pub fn record_host_call(
        &self,
        session: &str,
        name: &str,
        args: &Value,
        run: impl FnOnce() -> Result<ToolOutput, ToolError>,
    ) -> Result<ToolOutput, ToolError> {
        let pending = self.pending(session, name, args_digest(args));
        let result = run().and_then(|output| {
            if self.redactor.contains(output.text.as_bytes()) {
                Err(ToolError::Denied(
                    "the text holds a credential of clawcage's, which is not handed out"
                        .to_string(),
                ))
            } else {
                Ok(output)
            }
        });
        pending.finish(&result);
        match result {
            // Checked above: nothing to scrub.
            Ok(output) => Ok(output),
            Err(error) => self.redactor.redact_result(Err(error)),
        }
    }

    fn pending(&self, session: &str, name: &str, args_sha256: String) -> Pending {
        let tool = self.registry.get(name);
        Pending {
            log: self.log.clone(),
            started: Instant::now(),
            record: Some(AuditRecord {
                time: rfc3339_utc(SystemTime::now()),
                // Names come from the caller; the log never holds a secret either.
                session: self.redactor.redact(session),
                tool: self.redactor.redact(name),
                origin: tool.map(|tool| tool.origin()),
                args_sha256,
                grants: tool.map(|tool| tool.grants_summary()),
                verdict: String::new(),
                duration_ms: 0.0,
            }),
        }
    }
}

/// A call under way. Finishing it writes its record; dropping it unfinished (the caller's future
/// was dropped, e.g. an MCP client cancelled) writes it with the verdict `cancelled`.
struct Pending {
    log: Option<Arc<AuditLog>>,
    started: Instant,
    record: Option<AuditRecord>,
}

impl Pending {
    fn finish(mut self, result: &Result<ToolOutput, ToolError>) {
        let verdict = match result {
            Ok(_) => "ok",
            Err(error) => error.kind(),
        };
        self.write(verdict);
    }

    fn write(&mut self, verdict: &str) {
        let (Some(log), Some(mut record)) = (self.log.as_ref(), self.record.take()) else {
            return;
        };
        record.verdict = verdict.to_string();
        record.duration_ms = (self.started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        if let Err(error) = log.append(&record) {
            tracing::error!(
                path = %log.path().display(),
                "could not write the audit log: {error}; this call is not recorded"
            );
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.write("cancelled");
    }
}

/// Lowercase hex SHA-256 of `args` serialized as compact JSON with object keys sorted, so the
/// same arguments have the same digest however a client spaced or ordered them.
pub fn args_digest(args: &Value) -> String {
    hex_sha256(sorted_keys(args).to_string().as_bytes())
}

fn sorted_keys(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key.clone(), sorted_keys(value)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A new session id: `PREFIX-` and 16 hex digits, unique within the process and unlikely to repeat
/// across processes.
pub fn new_session_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    let mut hasher = Sha256::new();
    hasher.update(nanos.to_le_bytes());
    hasher.update(std::process::id().to_le_bytes());
    hasher.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let digest = hex::encode(hasher.finalize());
    format!("{prefix}-{}", &digest[..16])
}

/// `time` as RFC 3339 in UTC with milliseconds, e.g. `2026-11-05T09:30:00.250Z`.
fn rfc3339_utc(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap_day = UNIX_EPOCH + Duration::from_millis(951_782_400_123);
        assert_eq!(rfc3339_utc(leap_day), "2000-02-29T00:00:00.123Z");
        let later = UNIX_EPOCH + Duration::from_secs(1_794_000_000);
        assert_eq!(rfc3339_utc(later), "2026-11-06T21:20:00.000Z");
    }

    #[test]
    fn the_digest_ignores_spacing_and_key_order() {
        let a: Value = serde_json::from_str(r#"{"b": [1, {"y": 2, "x": 1}], "a": "s"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"s","b":[1,{"x":1,"y":2}]}"#).unwrap();
        assert_eq!(args_digest(&a), args_digest(&b));
        assert_eq!(
            args_digest(&b),
            hex_sha256(br#"{"a":"s","b":[1,{"x":1,"y":2}]}"#)
        );
    }

    const ANTHROPIC_KEY: &str = "sk-ant-api03-0123456789abcdef";
    const SEARCH_KEY: &str = "brave-key-fedcba9876";

    /// Answers with its `text` argument, or fails with it when `fail` is set.
    #[derive(Debug)]
    struct Echo(clawcage_core::ToolSpec);

    impl clawcage_core::Tool for Echo {
        fn spec(&self) -> &clawcage_core::ToolSpec {
            &self.0
        }

        fn call<'a>(
            &'a self,
            args: &'a Value,
        ) -> clawcage_core::BoxFuture<'a, Result<ToolOutput, ToolError>> {
            Box::pin(async move {
                let text = args["text"].as_str().unwrap_or_default().to_string();
                if args["fail"].as_bool() == Some(true) {
                    Err(ToolError::Failed(text))
                } else {
                    Ok(ToolOutput::text(text))
                }
            })
        }
    }

    fn echo_registry() -> ToolRegistry {
        let mut registry = ToolRegistry::new();
        registry
            .register(Arc::new(Echo(clawcage_core::ToolSpec {
                name: "echo".to_string(),
                description: "Echo.".to_string(),
                input_schema: serde_json::json!({"type": "object"}),
            })))
            .unwrap();
        registry
    }

    #[tokio::test]
    async fn results_are_scrubbed_of_the_hosts_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(AuditLog::open(dir.path().join("audit.jsonl")).unwrap());
        let audited =
            AuditedRegistry::new(echo_registry(), Some(log)).with_redactor(Redactor::new([
                ("ANTHROPIC_API_KEY", ANTHROPIC_KEY),
                ("BRAVE_API_KEY", SEARCH_KEY),
            ]));
        assert_eq!(
            audited.redactor().labels(),
            ["ANTHROPIC_API_KEY", "BRAVE_API_KEY"]
        );
        let echoed = format!("key {ANTHROPIC_KEY} and {SEARCH_KEY}");
        let output = audited
            .execute_value("s", "echo", &serde_json::json!({"text": echoed}))
            .await
            .unwrap();
        assert_eq!(
            output.text,
            "key [redacted: ANTHROPIC_API_KEY] and [redacted: BRAVE_API_KEY]"
        );
        let args = serde_json::json!({"text": format!("oops {SEARCH_KEY}"), "fail": true});
        let error = audited
            .execute("s", "echo", &args.to_string())
            .await
            .unwrap_err();
        assert_eq!(
            error,
            ToolError::Failed("oops [redacted: BRAVE_API_KEY]".into())
        );
        // A refusal before any tool ran is scrubbed too.
        let error = audited
            .execute("s", &format!("no_such_{SEARCH_KEY}"), "{}")
            .await
            .unwrap_err();
        assert!(!error.message().contains(SEARCH_KEY), "{error}");
        assert!(
            error.message().contains("[redacted: BRAVE_API_KEY]"),
            "{error}"
        );
        // The verdicts are recorded as they were.
        let lines = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
        let verdicts: Vec<String> = lines
            .lines()
            .map(|line| serde_json::from_str::<AuditRecord>(line).unwrap().verdict)
            .collect();
        assert_eq!(verdicts, ["ok", "failed", "invalid_args"]);
        assert!(!lines.contains(SEARCH_KEY) && !lines.contains(ANTHROPIC_KEY));
    }

    #[tokio::test]
    async fn without_a_redactor_results_pass_unchanged() {
        let audited = AuditedRegistry::new(echo_registry(), None);
        assert!(audited.redactor().is_empty());
        let output = audited
            .execute_value("s", "echo", &serde_json::json!({"text": SEARCH_KEY}))
            .await
            .unwrap();
        assert_eq!(output.text, SEARCH_KEY);
    }

    #[test]
    fn session_ids_differ() {
        let a = new_session_id("mcp");
        let b = new_session_id("mcp");
        assert_ne!(a, b);
        assert!(a.starts_with("mcp-") && a.len() == 20, "{a}");
    }
}
