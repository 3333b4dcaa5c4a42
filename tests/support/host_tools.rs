//! Small host-side tools for testing the agent loop without a sandbox: each implements
//! `clawcage_core::Tool` with a real JSON Schema (so the registry validates arguments as it does
//! for components) and counts its calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clawcage_core::{BoxFuture, Tool, ToolError, ToolOutput, ToolSpec};
use serde_json::Value;

type Behaviour = dyn Fn(&Value) -> Result<ToolOutput, ToolError> + Send + Sync;

/// A tool whose result is computed by a closure.
pub struct HostTool {
    spec: ToolSpec,
    behaviour: Box<Behaviour>,
    calls: AtomicUsize,
}

impl std::fmt::Debug for HostTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTool")
            .field("name", &self.spec.name)
            .finish()
    }
}

impl HostTool {
    /// A tool `name` with `schema` that answers with `behaviour`.
    pub fn new(
        name: &str,
        description: &str,
        schema: Value,
        behaviour: impl Fn(&Value) -> Result<ToolOutput, ToolError> + Send + Sync + 'static,
    ) -> Arc<HostTool> {
        Arc::new(HostTool {
            spec: ToolSpec {
                name: name.to_string(),
                description: description.to_string(),
                input_schema: schema,
            },
            behaviour: Box::new(behaviour),
            calls: AtomicUsize::new(0),
        })
    }

    /// How often it ran.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Tool for HostTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { (self.behaviour)(args) })
    }
}
