//! The tool registry: the set of tools one agent may call. It owns the schema check that runs
//! before any tool does, renders tool definitions in each provider's format, and narrows itself
//! with [`ToolRegistry::exclude`]: a tool missing from a registry is never instantiated through
//! it, so exclusion removes a capability rather than hiding a name.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use clawcage_core::{Tool, ToolError, ToolOutput, ToolSpec};
use serde_json::{Value, json};

/// Why a tool could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two tools with one name.
    #[error("a tool named `{0}` is already registered; tool names must be unique")]
    DuplicateName(String),
    /// The tool's input schema is not a valid JSON Schema.
    #[error("tool `{name}` has an invalid input schema: {reason}")]
    InvalidSchema {
        /// The tool's name.
        name: String,
        /// What the schema compiler said.
        reason: String,
    },
}

/// A tool with its argument validator, compiled when first needed (or at registration, for
/// [`ToolRegistry::register_checked`]).
#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    validator: Arc<OnceLock<Result<jsonschema::Validator, String>>>,
}

impl Entry {
    fn new(tool: Arc<dyn Tool>) -> Self {
        Self {
            tool,
            validator: Arc::new(OnceLock::new()),
        }
    }

    /// The compiled validator, or what the schema compiler said of the tool's schema.
    fn validator(&self) -> Result<&jsonschema::Validator, RegistryError> {
        self.validator
            .get_or_init(|| {
                jsonschema::validator_for(&self.tool.spec().input_schema)
                    .map_err(|error| error.to_string())
            })
            .as_ref()
            .map_err(|reason| RegistryError::InvalidSchema {
                name: self.tool.spec().name.clone(),
                reason: reason.clone(),
            })
    }
}

/// The tools one agent may call, by name.
///
/// Cloning is cheap (tools and validators are shared). [`exclude`](Self::exclude) returns a
/// narrower registry and leaves `self` untouched.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a tool whose schema ships with clawcage (a bundled or host tool, whose schemas the
    /// tests check). The schema is compiled when the tool is first called: a one-call command
    /// compiles only the schema of the tool it calls.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.spec().name.clone();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::DuplicateName(name));
        }
        self.tools.insert(name, Entry::new(tool));
        Ok(())
    }

    /// Add a tool whose schema comes from elsewhere (a plugin): it is compiled now, so a broken
    /// schema refuses the tool at load rather than at its first call.
    pub fn register_checked(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let entry = Entry::new(tool);
        entry.validator()?;
        let name = entry.tool.spec().name.clone();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::DuplicateName(name));
        }
        self.tools.insert(name, entry);
        Ok(())
    }

    /// Compiles every registered tool's schema and returns what is wrong with any of them.
    pub fn check_schemas(&self) -> Vec<RegistryError> {
        self.tools
            .values()
            .filter_map(|entry| entry.validator().err())
            .collect()
    }

    /// A new registry without the named tools. Names that are not registered are ignored, so a
    /// default exclusion list can be applied to any registry.
    pub fn exclude(&self, names: &[&str]) -> ToolRegistry {
        let tools = self
            .tools
            .iter()
            .filter(|(name, _)| !names.contains(&name.as_str()))
            .map(|(name, entry)| (name.clone(), entry.clone()))
            .collect();
        ToolRegistry { tools }
    }

    /// The registered tool names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.tools.keys().map(String::as_str).collect()
    }

    /// Whether a tool of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// The tool of that name, if registered.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|entry| &entry.tool)
    }

    /// The registered tools, sorted by name.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values().map(|entry| &entry.tool)
    }

    /// The specs of the registered tools, sorted by name.
    pub fn specs(&self) -> Vec<&ToolSpec> {
        self.tools.values().map(|entry| entry.tool.spec()).collect()
    }

    /// Tool definitions in the Anthropic Messages API format
    /// (`{"name", "description", "input_schema"}`).
    pub fn anthropic_definitions(&self) -> Vec<Value> {
        self.specs()
            .into_iter()
            .map(|spec| {
                json!({
                    "name": spec.name,
                    "description": spec.description,
                    "input_schema": spec.input_schema,
                })
            })
            .collect()
    }

    /// Tool definitions in the OpenAI chat-completions format
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`).
    pub fn openai_definitions(&self) -> Vec<Value> {
        self.specs()
            .into_iter()
            .map(|spec| {
                json!({
                    "type": "function",
                    "function": {
                        "name": spec.name,
                        "description": spec.description,
                        "parameters": spec.input_schema,
                    }
                })
            })
            .collect()
    }

    /// Run tool `name` with arguments given as JSON text, as a model sends them.
    pub async fn execute(&self, name: &str, json_args: &str) -> Result<ToolOutput, ToolError> {
        let entry = self.entry(name)?;
        let args: Value = serde_json::from_str(json_args).map_err(|error| {
            ToolError::InvalidArgs(format!(
                "the arguments for `{name}` are not valid JSON ({error}); send one JSON object"
            ))
        })?;
        Self::validate_and_call(name, entry, &args).await
    }

    /// Run tool `name` with arguments already parsed.
    pub async fn execute_value(&self, name: &str, args: &Value) -> Result<ToolOutput, ToolError> {
        let entry = self.entry(name)?;
        Self::validate_and_call(name, entry, args).await
    }

    fn entry(&self, name: &str) -> Result<&Entry, ToolError> {
        self.tools.get(name).ok_or_else(|| {
            let names = self.names();
            let suggestion = closest_name(name, &names)
                .map(|close| format!(" (did you mean `{close}`?)"))
                .unwrap_or_default();
            ToolError::InvalidArgs(format!(
                "unknown tool `{name}`{suggestion}; the available tools are: {}",
                names.join(", ")
            ))
        })
    }

    async fn validate_and_call(
        name: &str,
        entry: &Entry,
        args: &Value,
    ) -> Result<ToolOutput, ToolError> {
        let validator = entry
            .validator()
            .map_err(|error| ToolError::Failed(error.to_string()))?;
        let problems: Vec<String> = validator
            .iter_errors(args)
            .map(|error| describe_schema_error(&error))
            .collect();
        if !problems.is_empty() {
            return Err(ToolError::InvalidArgs(format!(
                "the arguments for `{name}` do not match its schema: {}",
                problems.join("; ")
            )));
        }
        entry.tool.call(args).await
    }
}

/// One schema violation as a sentence that names the field.
fn describe_schema_error(error: &jsonschema::ValidationError<'_>) -> String {
    let pointer = error.instance_path().as_str();
    let field = pointer.trim_start_matches('/').replace('/', ".");
    if field.is_empty() {
        error.to_string()
    } else {
        format!("field `{field}`: {error}")
    }
}

/// The tool name closest to a mistyped `name` (`read-file`, `readfile`, `Read_File`), when one is
/// close enough to be what was meant.
fn closest_name<'a>(name: &str, names: &[&'a str]) -> Option<&'a str> {
    let wanted = name.to_lowercase().replace('-', "_");
    names
        .iter()
        .map(|candidate| (strsim::damerau_levenshtein(&wanted, candidate), *candidate))
        .filter(|(distance, candidate)| *distance <= 2.max(candidate.len() / 4))
        .min()
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawcage_core::BoxFuture;

    #[derive(Debug)]
    struct Echo(ToolSpec);

    impl Tool for Echo {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
            Box::pin(async move { Ok(ToolOutput::text(args["text"].to_string())) })
        }
    }

    fn echo(name: &str) -> Arc<dyn Tool> {
        Arc::new(Echo(ToolSpec {
            name: name.into(),
            description: "echo".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["text"],
                "additionalProperties": false
            }),
        }))
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        // The echo tool never awaits anything, so one poll completes it.
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("the test tool should complete in one poll"),
        }
    }

    #[test]
    fn duplicate_names_and_bad_schemas_are_refused() {
        let mut registry = ToolRegistry::new();
        registry.register(echo("a")).unwrap();
        assert!(matches!(
            registry.register(echo("a")),
            Err(RegistryError::DuplicateName(_))
        ));
        let broken = || {
            Arc::new(Echo(ToolSpec {
                name: "broken".into(),
                description: String::new(),
                input_schema: json!({"type": "no-such-type"}),
            }))
        };
        assert!(matches!(
            registry.register_checked(broken()),
            Err(RegistryError::InvalidSchema { .. })
        ));
        assert!(!registry.contains("broken"));
        assert!(matches!(
            registry.register_checked(echo("a")),
            Err(RegistryError::DuplicateName(_))
        ));

        // Registered unchecked, a broken schema is the call's error, never a call without a
        // check, and the schema check names it.
        registry.register(broken()).unwrap();
        let error = block_on(registry.execute("broken", r#"{"text":"x"}"#)).unwrap_err();
        assert!(matches!(error, ToolError::Failed(_)), "{error:?}");
        assert!(error.message().contains("invalid input schema"), "{error}");
        let problems = registry.check_schemas();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].to_string().contains("`broken`"));
    }

    #[test]
    fn a_schema_compiled_at_the_first_call_still_refuses_bad_arguments() {
        let mut registry = ToolRegistry::new();
        registry.register(echo("a")).unwrap();
        let error = block_on(registry.execute("a", r#"{"text": 3}"#)).unwrap_err();
        assert!(matches!(error, ToolError::InvalidArgs(_)), "{error:?}");
        assert!(error.message().contains("field `text`"), "{error}");
        // The narrowed registry shares the compiled validator.
        let narrowed = registry.exclude(&[]);
        let error = block_on(narrowed.execute("a", r#"{}"#)).unwrap_err();
        assert!(matches!(error, ToolError::InvalidArgs(_)), "{error:?}");
        assert!(registry.check_schemas().is_empty());
    }

    #[test]
    fn a_mistyped_tool_name_gets_the_closest_one_suggested() {
        let mut registry = ToolRegistry::new();
        for name in ["read_file", "write_file", "exec", "web_fetch"] {
            registry.register(echo(name)).unwrap();
        }
        for typed in ["read-file", "readfile", "Read_File", "raed_file"] {
            let error = block_on(registry.execute(typed, r#"{"text":"x"}"#)).unwrap_err();
            assert!(
                error.message().contains("(did you mean `read_file`?)"),
                "{typed}: {error}"
            );
        }
        let error = block_on(registry.execute("exce", r#"{"text":"x"}"#)).unwrap_err();
        assert!(error.message().contains("did you mean `exec`"), "{error}");
        for unrelated in ["spawn", "delete_everything", ""] {
            let error = block_on(registry.execute(unrelated, "{}")).unwrap_err();
            assert!(
                !error.message().contains("did you mean"),
                "{unrelated}: {error}"
            );
            assert!(
                error.message().contains("the available tools are"),
                "{error}"
            );
        }
    }

    #[test]
    fn exclude_returns_a_narrower_registry_and_keeps_the_original() {
        let mut registry = ToolRegistry::new();
        for name in ["read_file", "write_file", "edit_file"] {
            registry.register(echo(name)).unwrap();
        }
        let narrow = registry.exclude(&["edit_file", "not_there"]);
        assert_eq!(narrow.names(), vec!["read_file", "write_file"]);
        assert_eq!(
            registry.names(),
            vec!["edit_file", "read_file", "write_file"]
        );
        let error = block_on(narrow.execute("edit_file", r#"{"text":"x"}"#)).unwrap_err();
        assert!(
            error.message().contains("unknown tool `edit_file`"),
            "{error}"
        );
    }

    #[test]
    fn arguments_are_checked_before_the_tool_runs() {
        let mut registry = ToolRegistry::new();
        registry.register(echo("echo")).unwrap();
        let ok = block_on(registry.execute("echo", r#"{"text":"hi"}"#)).unwrap();
        assert_eq!(ok.text, "\"hi\"");

        let cases = [
            (r#"{"text": 5}"#, "field `text`"),
            (r#"{}"#, "\"text\" is a required property"),
            (r#"{"text":"x","n":"five"}"#, "field `n`"),
            (r#"{"text":"x","extra":1}"#, "extra"),
            (r#"[1,2]"#, "is not of type \"object\""),
            (r#"{"text": "#, "not valid JSON"),
        ];
        for (args, expected) in cases {
            let error = block_on(registry.execute("echo", args)).unwrap_err();
            assert_eq!(error.kind(), "invalid_args", "{args}");
            assert!(error.message().contains(expected), "{args}: {error}");
        }
    }

    #[test]
    fn definitions_follow_each_provider_format() {
        let mut registry = ToolRegistry::new();
        registry.register(echo("echo")).unwrap();
        let anthropic = registry.anthropic_definitions();
        assert_eq!(anthropic[0]["name"], "echo");
        assert_eq!(anthropic[0]["input_schema"]["required"], json!(["text"]));
        let openai = registry.openai_definitions();
        assert_eq!(openai[0]["type"], "function");
        assert_eq!(openai[0]["function"]["name"], "echo");
        assert_eq!(openai[0]["function"]["parameters"]["type"], json!("object"));
    }
}
