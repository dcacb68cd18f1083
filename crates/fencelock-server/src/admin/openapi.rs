//! `GET /v1/openapi.json` (`openapi`): the HTTP API's OpenAPI 3.1 document,
//! the file `crates/fencelock-server/openapi.json` of the repository,
//! embedded in the binary. A test (`tests/it/http_openapi.rs`) checks that
//! every route the router serves is in it and every operation in it is
//! served, and validates answers against its schemas.
//!
//! Where it sits: a route of the admin router ([`super`]); public, as the
//! API's shape is no secret.

use axum::http::header;
use axum::response::IntoResponse;

/// The document, as written in the repository.
pub const DOCUMENT: &str = include_str!("../../openapi.json");

pub(super) async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}
