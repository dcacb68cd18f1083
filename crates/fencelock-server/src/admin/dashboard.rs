//! The dashboard: a web page served by the admin port at `/`, with its script,
//! stylesheet and icon under `/ui/`, all four files of
//! `crates/fencelock-server/assets/dashboard/` embedded in the binary. Nothing
//! is loaded from another host, and the Content-Security-Policy says so to the
//! browser.
//!
//! The page reads only the HTTP API that the same port serves (the lock
//! table, leases, the group, `/metrics`, and `/v1/watch` for live updates),
//! with the token its user gives it, so it can see and do no more than that
//! token may. The files are public, as the API's shape is; the data is not.
//!
//! Where it sits: routes of the admin router ([`super`]), outside
//! [`super::ROUTES`] (they are not API operations and have no OpenAPI entry).

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../../assets/dashboard/index.html");
const SCRIPT: &str = include_str!("../../assets/dashboard/app.js");
const STYLE: &str = include_str!("../../assets/dashboard/app.css");
const ICON: &str = include_str!("../../assets/dashboard/icon.svg");

/// Only this origin, for everything; no frames around it (clickjacking of the
/// admin buttons), no plugins.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The dashboard's paths and what each serves.
pub const FILES: &[(&str, &str, &str)] = &[
    ("/", "text/html; charset=utf-8", INDEX),
    ("/ui/app.js", "text/javascript; charset=utf-8", SCRIPT),
    ("/ui/app.css", "text/css; charset=utf-8", STYLE),
    ("/ui/icon.svg", "image/svg+xml", ICON),
];

/// `router` with the dashboard's routes.
pub(super) fn routes<S: Clone + Send + Sync + 'static>(mut router: Router<S>) -> Router<S> {
    for &(path, content_type, body) in FILES {
        router = router.route(path, get(move || async move { file(content_type, body) }));
    }
    router
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // A new binary may serve a new page: the browser asks again each time.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: nothing is loaded from another host: every `src`/`href` of the
    /// page is a path of this port, and the script makes no request to an
    /// absolute URL.
    #[test]
    fn the_page_loads_nothing_from_another_host() {
        for (path, _, body) in FILES {
            for marker in ["http://", "https://", "//cdn", "src=\"//", "href=\"//"] {
                let hits: Vec<&str> =
                    body.lines().filter(|l| l.contains(marker) && !l.contains("http://www.w3.org/2000/svg")).collect();
                assert!(hits.is_empty(), "{path} refers to another host ({marker}): {hits:?}");
            }
        }
        for (attr, path) in [("src=\"", "/ui/app.js"), ("href=\"", "/ui/app.css"), ("href=\"", "/ui/icon.svg")] {
            assert!(INDEX.contains(&format!("{attr}{path}\"")), "index.html loads {path}");
        }
    }

    /// Rule: server data enters the page as text only, never as HTML (lock
    /// names and identities come from any client).
    #[test]
    fn the_script_never_writes_html() {
        for forbidden in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"] {
            assert!(!SCRIPT.contains(forbidden), "app.js uses {forbidden}");
        }
    }
}
