//! clawcage over the Agent Client Protocol (ACP v1: newline-delimited JSON-RPC over stdio), on
//! the official Rust SDK. Both sides live here: `clawcage acp` serves clawcage as an agent to
//! editors (`server`), and `spawn` with `runtime: "acp"` drives an external ACP agent as a
//! sub-agent (`external`, which the runtime attaches in every front end through
//! `Options::external_agents`), serving its file and terminal requests through the sandboxed
//! tools.
//! It is a front end like the gateway: it gets runtimes, agents and tools from
//! `clawcage-runtime` and renders their events (`updates`); the workspace grant whose exact-text
//! reads serve an external agent's file requests comes from the runtime too, so it never depends
//! on the sandbox crate. Its own crate because only it needs the ACP SDK. See `docs/acp.md`.

pub mod external;
pub mod lines;
pub mod server;
pub mod updates;

pub use external::{external_agents, external_runtime};
pub use server::run;
