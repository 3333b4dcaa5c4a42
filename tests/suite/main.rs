//! Integration tests of clawcage: real components in a real engine, real files in temporary
//! directories, real HTTP servers on loopback. One binary, one module per capability.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

mod agent_loop;
mod agent_sandbox;
mod approvals;
mod architecture;
mod audit;
mod cache;
mod cluster;
mod cluster_leases;
mod cluster_ownership;
mod cluster_records;
mod cluster_stores;
mod context_windows;
mod cron;
mod durable_turns;
mod examples;
mod exec;
mod exec_attacks;
mod file_attacks;
mod file_tools;
mod guest_units;
mod llama_server;
mod long_sessions;
mod misbehaving;
mod plugins;
mod prepared;
mod programs_archive;
mod programs_diff;
mod programs_kinds;
mod programs_text;
mod programs_walk;
mod providers;
mod python;
mod queue_modes;
mod reasoning;
mod registry_attacks;
mod sandbox_escape;
mod sessions;
mod skills;
mod store_contracts;
mod subagents;
mod truncation;
mod wasi_http;
mod web;
mod web_attacks;
mod write_approvals;
mod xargs;
