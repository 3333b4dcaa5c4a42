//! Outbound HTTP for components granted network access: the operator's [`NetworkPolicy`]
//! (allow-list, secrets, limits), the checks it makes before any connection (`policy`, `address`),
//! the client that sends under it (`client`), and the two ways a component reaches it: the
//! `clawcage:tool/http` import (`import`) and standard `wasi:http` (`wasi_http`), both through the
//! same checks and the same client.

mod address;
mod client;
mod error;
pub(crate) mod import;
mod policy;
mod resolve;
mod secrets;
pub(crate) mod wasi_http;

pub use address::{SpecialRange, canonical, special_range};
pub use client::{MAX_REDIRECTS, NetworkLimits, NetworkPolicy, OutboundRequest, OutboundResponse};
pub use error::{NetworkError, NetworkErrorFamily, NetworkErrorKind};
pub use policy::{
    AllowEntry, AllowEntryError, AllowList, check_addresses, check_target, is_loopback_url,
    parse_url,
};
pub use resolve::{NameResolver, SystemResolver};
pub use secrets::{Secret, SecretError, SecretValue};
