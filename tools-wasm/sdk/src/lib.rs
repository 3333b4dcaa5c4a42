//! The SDK for writing a clawcage tool component in Rust: it hides the
//! wit-bindgen boilerplate of the `clawcage:tool` WIT contract
//! (`basic-tool` world), so a tool crate only implements [`Tools`] and calls
//! [`export_tools!`]. Before each call it enters the operator-granted
//! workspace, parses the JSON arguments, and turns [`ToolError`] into the WIT
//! `tool-error`; [`args`] reads arguments with clear messages, [`workspace`]
//! keeps paths inside the workspace and explains refused file operations,
//! [`log`] writes into the host's tracing, and `http` (feature `http`) sends
//! requests through the host's network policy.
//!
//! ```ignore
//! use clawcage_tool_sdk::{args, json, Spec, ToolError, Tools, Value};
//!
//! struct Greeter;
//!
//! impl Tools for Greeter {
//!     fn specs() -> Vec<Spec> {
//!         vec![Spec::new(
//!             "greet",
//!             "Say hello to someone.",
//!             json!({
//!                 "type": "object",
//!                 "properties": {"who": {"type": "string", "description": "Whom to greet."}},
//!                 "required": ["who"],
//!                 "additionalProperties": false
//!             }),
//!         )]
//!     }
//!
//!     fn call(name: &str, args: Value) -> Result<String, ToolError> {
//!         match name {
//!             "greet" => Ok(format!("hello, {}", args::required_str(&args, "who")?)),
//!             _ => Err(ToolError::unknown_tool(name)),
//!         }
//!     }
//! }
//!
//! clawcage_tool_sdk::export_tools!(Greeter);
//! ```

use std::fmt;

pub use serde_json::{self, Value, json};

pub mod args;
pub mod log;
pub mod workspace;

/// The code wit-bindgen generates from `wit/` (world `basic-tool`, or
/// `web-tool` with the `http` feature).
///
/// Public only so that [`export_tools!`] can reach it from a tool crate; a
/// tool should not need anything in here.
#[doc(hidden)]
#[allow(missing_docs, unsafe_code, clippy::all)]
pub mod bindings {
    #[cfg(not(feature = "http"))]
    wit_bindgen::generate!({
        path: "../../wit",
        world: "basic-tool",
        pub_export_macro: true,
        default_bindings_module: "clawcage_tool_sdk::bindings",
    });
    #[cfg(feature = "http")]
    wit_bindgen::generate!({
        path: "../../wit",
        world: "web-tool",
        pub_export_macro: true,
        default_bindings_module: "clawcage_tool_sdk::bindings",
    });
}

#[cfg(feature = "http")]
pub mod http;

/// One tool as the model sees it: its name, what it is for, and the JSON
/// Schema (draft 2020-12) of its arguments object.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Unique name, `snake_case`, e.g. `read_file`.
    pub name: String,
    /// What the tool does and when to use it, written for a language model.
    pub description: String,
    /// JSON Schema of the arguments object. The host validates every call's
    /// arguments against it before the call reaches the component.
    pub input_schema: Value,
}

impl Spec {
    /// A spec from its three parts.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            input_schema,
        }
    }
}

/// Why a call did not succeed. The text is shown to the model verbatim, so
/// write it for the model: say what went wrong and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments do not fit the tool (bad type, bad value, missing field).
    InvalidArgs(String),
    /// The sandbox or the operator's policy refused the action.
    Denied(String),
    /// The action was allowed but did not succeed.
    Failed(String),
}

impl ToolError {
    /// The error for a tool name this component does not offer:
    /// `InvalidArgs("unknown tool: NAME")`. Return it from the fall-through
    /// arm of [`Tools::call`].
    pub fn unknown_tool(name: &str) -> Self {
        Self::InvalidArgs(format!("unknown tool: {name}"))
    }

    /// The message, whatever the kind.
    pub fn message(&self) -> &str {
        match self {
            Self::InvalidArgs(m) | Self::Denied(m) | Self::Failed(m) => m,
        }
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidArgs(m) => write!(f, "invalid arguments: {m}"),
            Self::Denied(m) => write!(f, "denied: {m}"),
            Self::Failed(m) => write!(f, "failed: {m}"),
        }
    }
}

impl std::error::Error for ToolError {}

/// What a tool component implements: the tools it offers and how to run one.
///
/// Both are associated functions: every call runs in a fresh instance, so a
/// component keeps no state between calls.
pub trait Tools {
    /// The tools this component offers. The host asks once, when it loads
    /// the component.
    fn specs() -> Vec<Spec>;

    /// Run tool `name` with `args`, the arguments object (already validated
    /// by the host against the tool's schema). A name the component does not
    /// offer must return [`ToolError::unknown_tool`].
    ///
    /// When the host granted a workspace, the current directory is already
    /// the workspace (unless [`Tools::enters_workspace`] says otherwise);
    /// resolve paths with [`workspace::resolve`] all the same, so a path
    /// outside it gets a clear message.
    fn call(name: &str, args: Value) -> Result<String, ToolError>;

    /// Whether the SDK makes the workspace the current directory before each
    /// call (the default), so that relative paths resolve inside it. A
    /// component that resolves every path with [`workspace::resolve`]
    /// (absolute paths) may answer `false` and spare every call the `chdir`,
    /// which wasi-libc checks with a `stat` of the workspace: two host calls.
    fn enters_workspace() -> bool {
        true
    }
}

/// Export a type implementing [`Tools`] as this component's
/// `clawcage:tool/tool@0.1.0` interface. Call it once, at the crate's top
/// level: `clawcage_tool_sdk::export_tools!(MyTools);`
#[macro_export]
macro_rules! export_tools {
    ($tools:ty) => {
        const _: () = {
            struct __ClawcageToolsExport;

            impl $crate::bindings::exports::clawcage::tool::tool::Guest for __ClawcageToolsExport {
                fn specs()
                -> ::std::vec::Vec<$crate::bindings::exports::clawcage::tool::tool::ToolSpec>
                {
                    $crate::__private::specs::<$tools>()
                }

                fn call(
                    name: ::std::string::String,
                    args: ::std::string::String,
                ) -> ::std::result::Result<
                    ::std::string::String,
                    $crate::bindings::exports::clawcage::tool::tool::ToolError,
                > {
                    $crate::__private::call::<$tools>(&name, &args)
                }
            }

    $crate::bindings::export!(__ClawcageToolsExport with_types_in $crate::bindings);
        };
    };
}

/// Glue used by [`export_tools!`]; not part of the API.
#[doc(hidden)]
pub mod __private {
    use super::{ToolError, Tools, workspace};
    use crate::bindings::exports::clawcage::tool::tool as wit;

    /// The specs of `T` in WIT form.
    pub fn specs<T: Tools>() -> Vec<wit::ToolSpec> {
        T::specs()
            .into_iter()
            .map(|s| wit::ToolSpec {
                name: s.name,
                description: s.description,
                input_schema: s.input_schema.to_string(),
            })
            .collect()
    }

    /// Enter the workspace, parse the arguments, run the call.
    pub fn call<T: Tools>(name: &str, args: &str) -> Result<String, wit::ToolError> {
        dispatch::<T>(name, args).map_err(|e| match e {
            ToolError::InvalidArgs(m) => wit::ToolError::InvalidArgs(m),
            ToolError::Denied(m) => wit::ToolError::Denied(m),
            ToolError::Failed(m) => wit::ToolError::Failed(m),
        })
    }

    fn dispatch<T: Tools>(name: &str, args: &str) -> Result<String, ToolError> {
        let args = crate::args::parse(args)?;
        if T::enters_workspace() {
            workspace::enter()?;
        }
        T::call(name, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_tool_message() {
        assert_eq!(
            ToolError::unknown_tool("frobnicate"),
            ToolError::InvalidArgs("unknown tool: frobnicate".to_string())
        );
    }

    #[test]
    fn parse_args_accepts_objects_only() {
        assert_eq!(crate::args::parse("").ok(), Some(json!({})));
        assert_eq!(crate::args::parse(r#"{"a":1}"#).ok(), Some(json!({"a": 1})));
        assert!(matches!(
            crate::args::parse("[1]"),
            Err(ToolError::InvalidArgs(_))
        ));
        assert!(matches!(
            crate::args::parse("{nope"),
            Err(ToolError::InvalidArgs(_))
        ));
    }
}
