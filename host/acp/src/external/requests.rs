//! What an external agent asks of clawcage while it runs, answered under the child's grants:
//! its streamed text (scrubbed, then shown), `fs/read_text_file` (the exact text beneath the
//! workspace), `fs/write_text_file` through the `write_file` tool, `terminal/*` through the
//! sandboxed `exec` tool, and `session/request_permission` by the configured policy or the
//! person at the parent's front end.

use super::*;

fn refusal(message: impl Into<String>) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_params().data(json!({"message": message.into()}))
}

impl RunState {
    /// Shows the agent's streamed `text` at the front end, scrubbed.
    fn show(&self, text: &str) {
        self.scrubber.push(text, |clean| (self.output)(clean));
    }

    /// Shows what the scrubber still holds back: the stream has ended.
    pub(super) fn show_held(&self) {
        self.scrubber.finish(false, |clean| (self.output)(clean));
    }

    /// A `session/update` from the agent: its text is kept and streamed, tool calls are named.
    pub(super) fn update(&self, params: &Value) {
        let update = &params["update"];
        match update["sessionUpdate"].as_str() {
            Some("agent_message_chunk") => {
                if let Some(text) = update["content"]["text"].as_str() {
                    lock(&self.text).push_str(text);
                    self.show(text);
                }
            }
            Some("tool_call") => {
                let title = update["title"].as_str().unwrap_or("a tool");
                (self.output)(&format!("[tool call: {title}]"));
            }
            _ => {}
        }
    }

    /// Serves one request of the agent.
    pub(super) async fn serve(
        &self,
        method: &str,
        params: Value,
    ) -> Result<Value, agent_client_protocol::Error> {
        match method {
            "fs/read_text_file" => self.read_text_file(&params),
            "fs/write_text_file" => {
                let args = json!({"path": params["path"], "content": params["content"]});
                self.call("write_file", &args).await?;
                Ok(json!({}))
            }
            "terminal/create" if self.agent.terminal => self.create_terminal(&params),
            "terminal/output" => {
                let (output, exit) = self.terminal_result(&params, false).await?;
                Ok(terminal_output(&output, exit))
            }
            "terminal/wait_for_exit" => {
                let (_, exit) = self.terminal_result(&params, true).await?;
                Ok(json!({"exitCode": exit, "signal": Value::Null}))
            }
            "terminal/kill" => {
                if let Some(terminal) = lock(&self.terminals).get(terminal_id(&params)?) {
                    terminal.task.abort();
                }
                Ok(json!({}))
            }
            "terminal/release" => {
                if let Some(terminal) = lock(&self.terminals).remove(terminal_id(&params)?) {
                    terminal.task.abort();
                }
                Ok(json!({}))
            }
            "session/request_permission" => Ok(self.permission(&params).await),
            _ => Err(
                agent_client_protocol::Error::method_not_found().data(json!({
                    "message": format!("clawcage does not serve `{method}` to external agents")
                })),
            ),
        }
    }

    /// `fs/read_text_file`: the file's exact text, which the agent may write back whole. The
    /// `read_file` tool's answer is written for a model (cut at a bound, with a note, invalid
    /// UTF-8 replaced), so the text is read on the host beneath the workspace instead, only
    /// when the child's grants include `read_file`, and recorded in the audit log as that
    /// method; a file too large for one answer is refused whole, never cut.
    fn read_text_file(&self, params: &Value) -> Result<Value, agent_client_protocol::Error> {
        let path = params["path"]
            .as_str()
            .ok_or_else(|| refusal("fs/read_text_file needs `path`"))?;
        if self.tools.registry().get("read_file").is_none() {
            return Err(refusal(
                "refused by clawcage's sandbox: this agent's grants do not include reading files",
            ));
        }
        let lines = LineRange {
            first_line: params["line"].as_u64().unwrap_or(1),
            limit: params["limit"].as_u64(),
        };
        let output = self
            .tools
            .record_host_call(&self.session, "fs/read_text_file", params, || {
                self.workspace
                    .read_text(path, lines, READ_TEXT_LIMIT)
                    .map(ToolOutput::text)
                    .map_err(|error| match error {
                        WorkspaceTextError::Outside { .. } => ToolError::Denied(error.to_string()),
                        WorkspaceTextError::Invalid(_) => ToolError::InvalidArgs(error.to_string()),
                        _ => ToolError::Failed(error.to_string()),
                    })
            })
            .map_err(|error| refusal(format!("refused by clawcage's sandbox: {error}")))?;
        Ok(json!({"content": output.text}))
    }

    /// One sandboxed tool call; its error is the request's error.
    async fn call(&self, tool: &str, args: &Value) -> Result<String, agent_client_protocol::Error> {
        match self.tools.execute_value(&self.session, tool, args).await {
            Ok(output) => Ok(output.text),
            Err(error) => Err(refusal(format!("refused by clawcage's sandbox: {error}"))),
        }
    }

    fn create_terminal(&self, params: &Value) -> Result<Value, agent_client_protocol::Error> {
        let command = params["command"]
            .as_str()
            .ok_or_else(|| refusal("terminal/create needs `command`"))?;
        let mut line = shell_quote(command);
        for arg in params["args"].as_array().into_iter().flatten() {
            line.push(' ');
            line.push_str(&shell_quote(arg.as_str().unwrap_or_default()));
        }
        if let Some(cwd) = params["cwd"].as_str() {
            line = format!("cd {} && {line}", shell_quote(cwd));
        }
        let id = format!(
            "term-{}",
            self.next_terminal.fetch_add(1, Ordering::Relaxed)
        );
        let (sender, receiver) = watch::channel(None);
        let tools = self.tools.clone();
        let session = self.session.clone();
        let task = tokio::spawn(async move {
            let result = tools
                .execute_value(&session, "exec", &json!({"command": line}))
                .await;
            let (text, exit) = match result {
                Ok(output) => {
                    let text = output.text;
                    let exit = exit_status(&text);
                    (text, exit)
                }
                Err(error) => (format!("refused by clawcage's sandbox: {error}"), Some(1)),
            };
            let _ = sender.send(Some((text, exit)));
        });
        lock(&self.terminals).insert(
            id.clone(),
            TerminalState {
                result: receiver,
                task: task.abort_handle(),
            },
        );
        Ok(json!({"terminalId": id}))
    }

    async fn terminal_result(
        &self,
        params: &Value,
        wait: bool,
    ) -> Result<(String, Option<i64>), agent_client_protocol::Error> {
        let mut receiver = lock(&self.terminals)
            .get(terminal_id(params)?)
            .map(|terminal| terminal.result.clone())
            .ok_or_else(|| refusal("unknown terminalId"))?;
        if wait {
            let _ = receiver.wait_for(Option::is_some).await;
        }
        let value = receiver.borrow().clone();
        Ok(match value {
            Some((text, exit)) => (text, exit),
            None => (String::new(), None),
        })
    }

    /// The answer to a permission request under the agent's policy.
    async fn permission(&self, params: &Value) -> Value {
        let kind = params["toolCall"]["kind"].as_str().unwrap_or("other");
        let title = params["toolCall"]["title"].as_str().unwrap_or(kind);
        if self.agent.permission_mode == PermissionMode::Ask
            && let Some(ask) = &self.ask
        {
            let chosen = ask(&self.parent_session, params.clone()).await;
            // Only an option the agent offered counts.
            let offered = chosen.filter(|id| {
                params["options"].as_array().is_some_and(|options| {
                    options
                        .iter()
                        .any(|option| option["optionId"].as_str() == Some(id))
                })
            });
            (self.output)(&format!(
                "[permission for {title}: {} by the operator]",
                offered.as_deref().unwrap_or("nothing chosen")
            ));
            return match offered {
                Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
                None => json!({"outcome": {"outcome": "cancelled"}}),
            };
        }
        if self.agent.permission_mode == PermissionMode::Ask {
            // Nobody can be asked from this front end: rejected, and said in the log.
            tracing::warn!(
                agent = %self.agent.name,
                "a permission request was rejected: no operator can be asked from this front end; use clawcage acp, or set permission_mode"
            );
        }
        let (allow, outcome) = policy_answer(self.agent.permission_mode, kind, params);
        (self.output)(&format!(
            "[permission {} for {title}: {}]",
            if allow { "granted once" } else { "rejected" },
            self.agent.permission_mode.as_str()
        ));
        outcome
    }
}

/// What `mode` answers a permission request of `kind` without asking anyone: whether it allows,
/// and the outcome (an option the agent offered of the kind chosen, else cancelled).
/// `approve-reads` allows reading kinds once; everything else is rejected.
fn policy_answer(mode: PermissionMode, kind: &str, params: &Value) -> (bool, Value) {
    let allow = match mode {
        PermissionMode::DenyAll | PermissionMode::Ask => false,
        PermissionMode::ApproveReads => matches!(kind, "read" | "search" | "fetch" | "think"),
    };
    let wanted: &[&str] = if allow {
        &["allow_once"]
    } else {
        &["reject_once", "reject_always"]
    };
    let chosen = params["options"].as_array().and_then(|options| {
        wanted.iter().find_map(|kind| {
            options
                .iter()
                .find(|option| option["kind"].as_str() == Some(kind))
                .and_then(|option| option["optionId"].as_str())
        })
    });
    let outcome = match chosen {
        Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
        None => json!({"outcome": {"outcome": "cancelled"}}),
    };
    (allow, outcome)
}

fn terminal_id(params: &Value) -> Result<&str, agent_client_protocol::Error> {
    params["terminalId"]
        .as_str()
        .ok_or_else(|| refusal("the request needs `terminalId`"))
}

fn terminal_output(output: &str, exit: Option<i64>) -> Value {
    let (cut, truncated) = match output.char_indices().nth(TERMINAL_OUTPUT_LIMIT) {
        Some((end, _)) => (&output[..end], true),
        None => (output, false),
    };
    let mut value = json!({"output": cut, "truncated": truncated});
    if let Some(code) = exit {
        value["exitStatus"] = json!({"exitCode": code, "signal": Value::Null});
    }
    value
}

/// The `[exit status: N]` the exec tool ends its output with.
fn exit_status(output: &str) -> Option<i64> {
    let start = output.rfind("[exit status: ")?;
    let rest = &output[start + "[exit status: ".len()..];
    rest.split(']').next()?.trim().parse().ok()
}

/// `word` in single quotes for the sandbox's shell.
fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {

    #[test]
    fn permission_modes_answer_without_asking_and_only_reads_pass_approve_reads() {
        let request = |kind: &str| {
            json!({
                "toolCall": {"kind": kind, "title": "t"},
                "options": [
                    {"optionId": "yes", "kind": "allow_once"},
                    {"optionId": "always", "kind": "allow_always"},
                    {"optionId": "no", "kind": "reject_once"},
                ],
            })
        };
        let chosen = |mode, kind: &str| {
            let (allow, outcome) = policy_answer(mode, kind, &request(kind));
            (allow, outcome["outcome"]["optionId"].clone())
        };
        assert_eq!(
            chosen(PermissionMode::ApproveReads, "read"),
            (true, json!("yes"))
        );
        assert_eq!(
            chosen(PermissionMode::ApproveReads, "search"),
            (true, json!("yes"))
        );
        for kind in ["edit", "delete", "move", "execute", "other"] {
            assert_eq!(
                chosen(PermissionMode::ApproveReads, kind),
                (false, json!("no")),
                "{kind}"
            );
        }
        assert_eq!(
            chosen(PermissionMode::DenyAll, "read"),
            (false, json!("no"))
        );
        assert_eq!(chosen(PermissionMode::Ask, "read"), (false, json!("no")));
        // Never "allow always", and with no option of the kind wanted: cancelled, not allowed.
        let only_allow = json!({"options": [{"optionId": "yes", "kind": "allow_once"}]});
        let (_, outcome) = policy_answer(PermissionMode::DenyAll, "edit", &only_allow);
        assert_eq!(outcome, json!({"outcome": {"outcome": "cancelled"}}));
    }

    use super::*;

    #[test]
    fn exit_status_and_quoting() {
        assert_eq!(exit_status("hi\n[exit status: 3]"), Some(3));
        assert_eq!(exit_status("no status"), None);
        assert_eq!(shell_quote("a b'c"), "'a b'\\''c'");
        assert_eq!(shell_quote("ls"), "ls");
    }
}
