//! The `cron` tool of clawcage: one tool that adds, lists and removes scheduled messages through
//! the host's `scheduler` import (`wit/scheduler.wit`). The component only checks the shape of
//! the arguments and formats the answers; the host parses the schedule, computes every firing,
//! keeps the jobs across restarts and delivers each firing to the session's lane. The component
//! sees no files, no network and no other job's secrets — there are none to see.

use clawcage_tool_sdk::{Spec, ToolError, Value, args, json};

#[doc(hidden)]
#[allow(missing_docs, unsafe_code, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "cron-tool",
    });
}

use bindings::clawcage::tool::scheduler as wit;
use bindings::exports::clawcage::tool::tool as export;

/// The host's `scheduler` import, behind a trait so the tool can be tested natively.
pub trait Scheduler {
    /// Schedule a job.
    fn add(&mut self, request: &wit::JobRequest) -> Result<wit::JobInfo, String>;
    /// Every job, soonest first.
    fn list(&mut self) -> Vec<wit::JobInfo>;
    /// Remove a job by id.
    fn remove(&mut self, id: &str) -> Result<wit::JobInfo, String>;
}

/// The real import.
struct HostScheduler;

impl Scheduler for HostScheduler {
    fn add(&mut self, request: &wit::JobRequest) -> Result<wit::JobInfo, String> {
        wit::add(request)
    }

    fn list(&mut self) -> Vec<wit::JobInfo> {
        wit::list()
    }

    fn remove(&mut self, id: &str) -> Result<wit::JobInfo, String> {
        wit::remove(id)
    }
}

/// The tool's name, description and argument schema.
pub fn spec() -> Spec {
    Spec::new(
        "cron",
        "Schedule a message to be delivered back to this conversation later, once or repeatedly; \
         list or remove scheduled jobs. Each firing arrives as a new message \
         \"[cron job NAME] MESSAGE\", so write the message as an instruction to yourself \
         (e.g. \"Check the build status and summarize failures\"). \
         action \"add\" needs `message` and exactly one of `every_seconds` (at least 1) or `cron`: \
         a cron expression of 5 fields \"minute hour day-of-month month day-of-week\" or 6 fields \
         with seconds first. Fields allow lists (1,15), ranges (MON-FRI), steps (*/15), names \
         (JAN-DEC, SUN-SAT), L (last day of month, or 5#L: last Friday), W (15W: weekday nearest \
         the 15th) and # (1#2: second Monday). `timezone` is an IANA name such as \"Europe/Berlin\" \
         (default UTC). Examples: {\"action\":\"add\",\"cron\":\"0 9 * * MON-FRI\",\"timezone\":\
         \"America/New_York\",\"message\":\"Post the stand-up reminder\",\"name\":\"standup\"}; \
         {\"action\":\"add\",\"every_seconds\":3600,\"message\":\"Check the queue length\"}; \
         {\"action\":\"list\"}; {\"action\":\"remove\",\"id\":\"job-3\"}. \
         A job fires until removed; firings missed while the host was down are delivered once at \
         its next start.",
        json!({
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "enum": ["add", "list", "remove"],
                    "description": "What to do."
                },
                "message": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 4000,
                    "description": "add: the text delivered at each firing."
                },
                "every_seconds": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 31_536_000,
                    "description": "add: fire every this many seconds (1 to one year)."
                },
                "cron": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 200,
                    "description": "add: a cron expression, e.g. \"0 9 * * MON-FRI\" or \"*/30 * * * * *\"."
                },
                "timezone": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 64,
                    "description": "add: the IANA time zone of `cron`, e.g. \"Europe/Berlin\" (default UTC)."
                },
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 100,
                    "description": "add: a short name for listings."
                },
                "id": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 100,
                    "description": "remove: the job id `list` or `add` showed."
                }
            },
            "required": ["action"],
            "additionalProperties": false
        }),
    )
}

/// Fields each action accepts besides `action`.
fn allowed_fields(action: &str) -> &'static [&'static str] {
    match action {
        "add" => &["message", "every_seconds", "cron", "timezone", "name"],
        "remove" => &["id"],
        _ => &[],
    }
}

/// Runs one call of the `cron` tool against `scheduler`.
pub fn call(
    name: &str,
    arguments: Value,
    scheduler: &mut dyn Scheduler,
) -> Result<String, ToolError> {
    if name != "cron" {
        return Err(ToolError::unknown_tool(name));
    }
    let action = args::required_str(&arguments, "action")?;
    if !matches!(action, "add" | "list" | "remove") {
        return Err(ToolError::InvalidArgs(format!(
            "unknown action '{action}': use \"add\", \"list\" or \"remove\""
        )));
    }
    if let Some(object) = arguments.as_object() {
        let allowed = allowed_fields(action);
        if let Some(extra) = object
            .keys()
            .find(|key| key.as_str() != "action" && !allowed.contains(&key.as_str()))
        {
            return Err(ToolError::InvalidArgs(format!(
                "argument '{extra}' does not apply to action \"{action}\"{}",
                if allowed.is_empty() {
                    String::new()
                } else {
                    format!(" (it takes: {})", allowed.join(", "))
                }
            )));
        }
    }
    match action {
        "add" => add(&arguments, scheduler),
        "remove" => {
            let id = args::required_str(&arguments, "id")?;
            let job = scheduler.remove(id).map_err(ToolError::InvalidArgs)?;
            Ok(format!("Removed job {} ({}).", job.id, job.name))
        }
        _ => Ok(list(&scheduler.list())),
    }
}

fn add(arguments: &Value, scheduler: &mut dyn Scheduler) -> Result<String, ToolError> {
    let message = args::required_str(arguments, "message")?;
    let every_seconds = args::optional_u64(arguments, "every_seconds")?;
    let cron = args::optional_str(arguments, "cron")?;
    let timezone = args::optional_str(arguments, "timezone")?;
    match (every_seconds, cron) {
        (Some(_), Some(_)) => {
            return Err(ToolError::InvalidArgs(
                "give either 'every_seconds' or 'cron', not both".to_string(),
            ));
        }
        (None, None) => {
            return Err(ToolError::InvalidArgs(
                "action \"add\" needs 'every_seconds' (a number of seconds) or 'cron' (an expression such as \"0 9 * * MON-FRI\")".to_string(),
            ));
        }
        (Some(_), None) if timezone.is_some() => {
            return Err(ToolError::InvalidArgs(
                "'timezone' applies only to 'cron' expressions; 'every_seconds' counts from now"
                    .to_string(),
            ));
        }
        _ => {}
    }
    let request = wit::JobRequest {
        every_seconds,
        cron: cron.map(str::to_string),
        timezone: timezone.map(str::to_string),
        message: message.to_string(),
        name: args::optional_str(arguments, "name")?.map(str::to_string),
        session: None,
    };
    let job = scheduler.add(&request).map_err(ToolError::InvalidArgs)?;
    Ok(format!(
        "Scheduled job {} ({}): {}; next firing {}.",
        job.id,
        job.name,
        describe_schedule(&job),
        job.next_fire.as_deref().unwrap_or("never")
    ))
}

fn describe_schedule(job: &wit::JobInfo) -> String {
    if job.schedule.starts_with("cron ") {
        format!("{} ({})", job.schedule, job.timezone)
    } else {
        job.schedule.clone()
    }
}

fn list(jobs: &[wit::JobInfo]) -> String {
    if jobs.is_empty() {
        return "No scheduled jobs.".to_string();
    }
    let mut text = format!(
        "{} scheduled job{}:",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" }
    );
    for job in jobs {
        text.push_str(&format!(
            "\n- {} ({}): {}; next {}; session {}; message: {}",
            job.id,
            job.name,
            describe_schedule(job),
            job.next_fire.as_deref().unwrap_or("never"),
            job.session,
            job.message
        ));
    }
    text
}

struct CronTool;

impl export::Guest for CronTool {
    fn specs() -> Vec<export::ToolSpec> {
        let spec = spec();
        vec![export::ToolSpec {
            name: spec.name,
            description: spec.description,
            input_schema: spec.input_schema.to_string(),
        }]
    }

    fn call(name: String, arguments: String) -> Result<String, export::ToolError> {
        let parsed = args::parse(&arguments);
        let result = parsed.and_then(|arguments| call(&name, arguments, &mut HostScheduler));
        result.map_err(|error| match error {
            ToolError::InvalidArgs(message) => export::ToolError::InvalidArgs(message),
            ToolError::Denied(message) => export::ToolError::Denied(message),
            ToolError::Failed(message) => export::ToolError::Failed(message),
        })
    }
}

// Only a WebAssembly build exports the tool (a native test build cannot link the export names).
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod exported {
    use super::CronTool;
    crate::bindings::export!(CronTool with_types_in crate::bindings);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Records requests and answers with a fixed job.
    #[derive(Default)]
    struct Recorder {
        added: Vec<wit::JobRequest>,
        removed: Vec<String>,
    }

    fn job(id: &str) -> wit::JobInfo {
        wit::JobInfo {
            id: id.to_string(),
            name: "standup".to_string(),
            schedule: "cron 0 9 * * MON-FRI".to_string(),
            timezone: "Europe/Berlin".to_string(),
            message: "Post the reminder".to_string(),
            session: "main".to_string(),
            next_fire: Some("2026-11-30T08:00:00Z".to_string()),
        }
    }

    impl Scheduler for Recorder {
        fn add(&mut self, request: &wit::JobRequest) -> Result<wit::JobInfo, String> {
            self.added.push(request.clone());
            Ok(job("job-1"))
        }

        fn list(&mut self) -> Vec<wit::JobInfo> {
            vec![job("job-1"), job("job-2")]
        }

        fn remove(&mut self, id: &str) -> Result<wit::JobInfo, String> {
            self.removed.push(id.to_string());
            Err(format!("there is no job `{id}`"))
        }
    }

    #[test]
    fn add_passes_the_request_and_formats_the_job() {
        let mut scheduler = Recorder::default();
        let text = call(
            "cron",
            json!({"action": "add", "cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin",
                   "message": "Post the reminder", "name": "standup"}),
            &mut scheduler,
        )
        .unwrap();
        assert_eq!(
            text,
            "Scheduled job job-1 (standup): cron 0 9 * * MON-FRI (Europe/Berlin); next firing 2026-11-30T08:00:00Z."
        );
        let request = &scheduler.added[0];
        assert_eq!(request.cron.as_deref(), Some("0 9 * * MON-FRI"));
        assert_eq!(request.every_seconds, None);
        assert_eq!(request.session, None);
    }

    #[test]
    fn arguments_of_the_wrong_shape_never_reach_the_host() {
        let mut scheduler = Recorder::default();
        for (args, expected) in [
            (
                json!({"action": "add", "message": "m"}),
                "needs 'every_seconds'",
            ),
            (
                json!({"action": "add", "message": "m", "cron": "* * * * *", "every_seconds": 5}),
                "not both",
            ),
            (
                json!({"action": "add", "message": "m", "every_seconds": 5, "timezone": "UTC"}),
                "'timezone' applies only",
            ),
            (json!({"action": "list", "id": "job-1"}), "does not apply"),
            (json!({"action": "remove"}), "'id'"),
            (json!({"action": "stop"}), "unknown action"),
            (json!({}), "'action'"),
        ] {
            let error = call("cron", args.clone(), &mut scheduler).unwrap_err();
            match error {
                ToolError::InvalidArgs(message) => {
                    assert!(message.contains(expected), "{args}: {message}")
                }
                other => panic!("{args}: {other:?}"),
            }
        }
        assert!(scheduler.added.is_empty() && scheduler.removed.is_empty());
    }

    #[test]
    fn list_and_remove_report_in_text() {
        let mut scheduler = Recorder::default();
        let listed = call("cron", json!({"action": "list"}), &mut scheduler).unwrap();
        assert!(
            listed.starts_with("2 scheduled jobs:\n- job-1 (standup)"),
            "{listed}"
        );
        let error = call(
            "cron",
            json!({"action": "remove", "id": "job-9"}),
            &mut scheduler,
        )
        .unwrap_err();
        assert!(matches!(error, ToolError::InvalidArgs(message) if message.contains("job-9")));
    }
}
