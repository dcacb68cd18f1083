//! The small tools every fencelock binary shares, kept here so that none of
//! them reaches into another's crate for them: an HTTP/1.1 client for admin
//! ports and the fenced storage server ([`Client`], with a blocking variant
//! in [`blocking`] for the testkit), the `http(s)://host:port/path` URLs
//! they are given ([`HttpUrl`]), the one duration grammar of the command
//! lines and config files ([`parse_duration`]), and the reading of a value
//! from Prometheus text ([`prometheus::value`]).
//!
//! Where it sits: at the bottom of the workspace, beside `fencelock-core`. It
//! depends on nothing of fencelock (only tokio and rustls), so the server,
//! the client library, the fence, the CLI, the testkit, chaos and bench can
//! all use it. The client library's backend URL grammar
//! (`fencelock://`, `redis://`, …) is not here: it is the client's.

pub mod blocking;
mod client;
mod duration;
mod error;
pub mod prometheus;
mod url;
mod wire;

pub use client::Client;
pub use duration::parse_duration;
pub use error::HttpError;
/// The rustls of [`Client::tls`].
pub use tokio_rustls::rustls;
pub use url::{Endpoint, Host, HttpUrl, Scheme, UrlError};
pub use wire::{Request, Response};
