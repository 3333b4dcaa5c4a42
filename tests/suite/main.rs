//! Integration tests of clawcage: real components in a real engine, real files in temporary
//! directories, real HTTP servers on loopback. One binary, one module per capability.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

mod cache;
mod file_attacks;
mod file_tools;
mod misbehaving;
mod wasi_http;
mod web;
mod web_attacks;
