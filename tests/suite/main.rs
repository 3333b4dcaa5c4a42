//! Integration tests of clawcage: real components in a real engine, real files in temporary
//! directories. One binary, one module per capability.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

mod audit;
mod cache;
mod examples;
mod file_attacks;
mod file_tools;
mod misbehaving;
mod plugins;
