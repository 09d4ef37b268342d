//! split-profile on the admin listener: the routes as pure handlers, with the free pre-check
//! allowance ([`service`]). The check itself (criteria, shares, the signed report) is the
//! `tokensaver-split-profile` crate, re-exported here.

pub use tokensaver_split_profile::*;

pub mod service;

pub use service::SplitProfileService;
