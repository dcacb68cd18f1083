//! Bearer tokens: how the client authenticates to servers that ask for it.
//!
//! Where it sits: [`crate::ClientBuilder::token`] takes a token and
//! [`crate::backend::native::rpc`] builds every gRPC client of the crate with [`Auth`] as its
//! interceptor, so every call (unary, and the session stream's opening) carries
//! `authorization: Bearer <token>`: no call path can leave it out. The backend
//! URL form (`fencelock://h:p?token=…`) is read in [`crate::backend`].
//!
//! A token is opaque: the client never parses it. It only checks that it can
//! be sent as a header value (visible ASCII, no whitespace), and never shows
//! it: not in `Debug`, not in an error.

use std::fmt;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::Error;

/// The metadata key (and HTTP header) a token is sent in.
pub(crate) const AUTHORIZATION: &str = "authorization";

/// Checks that `token` can be sent as a bearer token: not empty, and only
/// visible ASCII (`!` to `~`: no space, tab, newline or other control
/// character, nothing beyond ASCII). Anything else is
/// [`Error::InvalidArgument`] saying why, without the token itself.
///
/// [`crate::ClientBuilder::connect`] checks its token with this; a program
/// that sends the token by other means (an HTTP header to the admin port)
/// can check it the same way.
///
/// # Examples
///
/// A token read from a file usually ends with a newline: trim it first.
///
/// ```
/// use fencelock::check_auth_token;
///
/// let from_file = "flt_0123abcd_sekritsekrit\n";
/// assert!(check_auth_token(from_file).is_err());
/// assert!(check_auth_token(from_file.trim()).is_ok());
/// ```
pub fn check_auth_token(token: &str) -> Result<(), Error> {
    if token.is_empty() {
        return Err(Error::InvalidArgument("invalid auth token: it is empty".into()));
    }
    if let Some((i, c)) = token.char_indices().find(|(_, c)| !c.is_ascii_graphic()) {
        let what = match c {
            ' ' => "a space".to_string(),
            '\n' | '\r' => "a line break".to_string(),
            c if c.is_whitespace() => "whitespace".to_string(),
            c if c.is_control() => "a control character".to_string(),
            _ => "a character that is not ASCII".to_string(),
        };
        return Err(Error::InvalidArgument(format!(
            "invalid auth token: it holds {what} at byte {i} (a token is visible ASCII without whitespace)"
        )));
    }
    Ok(())
}

/// The interceptor of every gRPC client: adds the bearer token, if any.
#[derive(Clone, Default)]
pub(crate) struct Auth {
    header: Option<MetadataValue<Ascii>>,
}

impl Auth {
    /// With `token` (checked by [`check_auth_token`]), or none.
    pub(crate) fn new(token: Option<&str>) -> Result<Auth, Error> {
        let Some(token) = token else { return Ok(Auth::default()) };
        check_auth_token(token)?;
        let mut header = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Error::InvalidArgument("invalid auth token: not a valid header value".into()))?;
        // Never indexed by HPACK, never cached.
        header.set_sensitive(true);
        Ok(Auth { header: Some(header) })
    }
}

impl Auth {
    /// The `authorization` value every call carries (`Bearer <token>`), or
    /// nothing: what a framed session's hello carries.
    pub(crate) fn header_bytes(&self) -> &[u8] {
        self.header.as_ref().map_or(&[], |h| h.as_bytes())
    }
}

impl Interceptor for Auth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert(AUTHORIZATION, h.clone());
        }
        Ok(req)
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token.
        f.debug_struct("Auth").field("token", &self.header.as_ref().map(|_| "***")).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "flt_0123abcd_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

    /// Rule: a token is non-empty visible ASCII without whitespace; anything
    /// else is a clear InvalidArgument (never a panic) that does not echo it.
    #[test]
    fn an_invalid_token_is_a_clear_error() {
        assert_eq!(check_auth_token(TOKEN), Ok(()));
        for (bad, why) in [
            ("", "empty"),
            ("flt_1 secret", "a space"),
            ("flt_1secret\n", "a line break"),
            ("flt_1\r\nX-Evil: secret", "a line break"),
            ("flt_1\tsecret", "whitespace"),
            ("flt_1\u{7f}secret", "a control character"),
            ("flt_1ésecret", "not ASCII"),
        ] {
            let err = check_auth_token(bad).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err:?}");
            assert!(msg.starts_with("invalid argument: invalid auth token:") && msg.contains(why), "{bad:?}: {msg}");
            assert!(!msg.contains("secret"), "the token is not echoed: {msg}");
            assert!(Auth::new(Some(bad)).is_err(), "{bad:?}");
        }
    }

    /// Rule: every request through the interceptor carries
    /// `authorization: Bearer <token>`, marked sensitive; without a token, none.
    #[test]
    fn the_interceptor_adds_the_bearer_header() {
        let mut auth = Auth::new(Some(TOKEN)).unwrap();
        let req = auth.call(Request::new(())).unwrap();
        let got = req.metadata().get(AUTHORIZATION).unwrap();
        assert_eq!(got.to_str().unwrap(), format!("Bearer {TOKEN}"));
        assert!(got.is_sensitive());
        let req = Auth::new(None).unwrap().call(Request::new(())).unwrap();
        assert!(req.metadata().get(AUTHORIZATION).is_none());
    }

    /// Rule: the token never appears in Debug output.
    #[test]
    fn debug_hides_the_token() {
        let debug = format!("{:?}", Auth::new(Some(TOKEN)).unwrap());
        assert!(!debug.contains(TOKEN) && !debug.contains("Bearer") && debug.contains("***"), "{debug}");
    }

    /// A gRPC server of the `Lock` service that records the `authorization`
    /// of every call and refuses it (UNAUTHENTICATED), as a server with
    /// authentication does to a bad token.
    /// Each call's path and `authorization`.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

    #[derive(Clone, Default)]
    struct Refuser {
        seen: Seen,
    }

    impl tonic::server::NamedService for Refuser {
        const NAME: &'static str = "fencelock.v1.Lock";
    }

    impl tonic::codegen::Service<tonic::codegen::http::Request<tonic::body::Body>> for Refuser {
        type Response = tonic::codegen::http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
            let auth = req.headers().get(AUTHORIZATION).map(|v| v.to_str().unwrap().to_string());
            self.seen.lock().unwrap().push((req.uri().path().to_string(), auth));
            std::future::ready(Ok(Status::unauthenticated("unknown token").into_http()))
        }
    }

    /// Rule: every call path carries the token (a unary call, a call of the
    /// lease layer, and the opening of a session stream), and a refusal is
    /// `Error::Unauthenticated` after exactly one attempt (never retried).
    #[tokio::test]
    async fn every_call_carries_the_token_and_a_refusal_is_not_retried() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Refuser::default();
        let seen = server.seen.clone();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(server).serve_with_incoming(incoming));

        let client = crate::Client::builder(format!("http://{addr}")).token(TOKEN).connect().await.unwrap();
        let refused = Error::Unauthenticated("unknown token".into());
        assert_eq!(client.check("a", 1).await, Err(refused.clone()));
        assert_eq!(client.revoke_lease(7).await, Err(refused.clone()));
        assert_eq!(client.session().await.err(), Some(refused));
        let seen = seen.lock().unwrap().clone();
        let paths: Vec<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            ["/fencelock.v1.Lock/Check", "/fencelock.v1.Lock/RevokeLease", "/fencelock.v1.Lock/Session"],
            "one attempt each"
        );
        let bearer = format!("Bearer {TOKEN}");
        assert!(seen.iter().all(|(_, auth)| auth.as_deref() == Some(bearer.as_str())), "{seen:?}");
    }
}
