//! Integration tests of clawcage: real components in a real engine, real files in temporary
//! directories. One binary, one module per capability.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

mod cache;
mod exec;
mod exec_attacks;
mod file_attacks;
mod file_tools;
mod misbehaving;
