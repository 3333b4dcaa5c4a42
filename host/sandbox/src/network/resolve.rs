//! Name resolution as a replaceable part: the policy resolves every name itself, exactly once per
//! hop, checks the answer and then connects to the addresses it checked. [`SystemResolver`] asks
//! the operating system; tests inject their own [`NameResolver`] to map names such as
//! `allowed.test` to local addresses or to answer differently on a second lookup.

use std::fmt;
use std::io;
use std::net::IpAddr;

use clawcage_core::BoxFuture;

/// Turns a host name into addresses.
pub trait NameResolver: Send + Sync + fmt::Debug {
    /// The addresses of `name` (no port, no brackets). An empty list means "not found".
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The operating system's resolver (`getaddrinfo` through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl NameResolver for SystemResolver {
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let mut addresses: Vec<IpAddr> = tokio::net::lookup_host((name, 0))
                .await?
                .map(|address| address.ip())
                .collect();
            addresses.dedup();
            Ok(addresses)
        })
    }
}
