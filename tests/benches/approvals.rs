//! What approvals add to an exec call, measured in one run: the same command line (`wc -l` of a
//! 1,000-line file, then `echo`, a builtin) through the exec tool without an approvals gate, and
//! with a gate whose allowlist covers it (asking nobody): the difference is the planner's fresh
//! instance, the plan's parse, the policy check before the call and the check of each program
//! the call starts. Calls alternate between the two registries so that a noisy machine weighs
//! on both alike. Prints medians, p99 and the ratio to the ungated call.
//!
//! Run: `cargo bench --workspace --bench approvals`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::sync::Arc;
use std::time::Instant;

use clawcage_agent::ToolRegistry;
use clawcage_agent::approvals::{ApprovalBroker, ApprovalSettings};
use clawcage_core::approval::{AllowEntry, ExecMode};
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ExecGrant, FsMode, Limits};
use clawcage_tests::bench::{report, report_against};
use serde_json::json;

const CALLS: usize = 200;

async fn call(registry: &ToolRegistry, command: &str) {
    let output = registry
        .execute_value("exec", &json!({ "command": command }))
        .await
        .unwrap_or_else(|error| panic!("`{command}` failed: {error}"));
    assert!(output.text.ends_with("[exit status: 0]"), "{}", output.text);
}

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let workspace = tempfile::tempdir().unwrap();
        let text: String = (0..1000).map(|line| format!("line {line}\n")).collect();
        std::fs::write(workspace.path().join("lines.txt"), text).unwrap();
        let programs = clawcage_tests::programs().await;
        let grants = clawcage_tests::grants(workspace.path(), FsMode::ReadWrite, Limits::default());
        let plain = clawcage_tests::registry_of(
            &[("exec", bundled::EXEC)],
            grants.clone().with_exec(ExecGrant::new(programs.clone())),
        )
        .await;
        let mut settings = ApprovalSettings::default();
        settings.exec.mode = ExecMode::Allowlist;
        settings.exec.allow = vec![AllowEntry::parse("wc *").unwrap()];
        let broker = ApprovalBroker::new(settings, None, None);
        let gated = clawcage_tests::registry_of(
            &[("exec", bundled::EXEC)],
            grants.with_exec(ExecGrant::new(programs).with_approvals(Arc::new(broker))),
        )
        .await;
        for command in ["wc -l lines.txt", "echo hi"] {
            // Warm both (components loaded, caches filled).
            for _ in 0..10 {
                call(&plain, command).await;
                call(&gated, command).await;
            }
            let mut without = Vec::with_capacity(CALLS);
            let mut with = Vec::with_capacity(CALLS);
            for _ in 0..CALLS {
                let started = Instant::now();
                call(&plain, command).await;
                without.push(started.elapsed());
                let started = Instant::now();
                call(&gated, command).await;
                with.push(started.elapsed());
            }
            let baseline = report(&format!("exec `{command}` without approvals"), without);
            report_against(
                &format!("exec `{command}` with an allowlist gate"),
                with,
                Some(baseline),
            );
        }
    });
}
