//! `GET /v1/watch?prefix=P&from=R` on the admin port: a watch as server-sent
//! events, for browsers (`EventSource`) and curl.
//!
//! Each event is `event: <kind>`, `id: <revision>` (`INDEX.SEQ`) and `data:`
//! one JSON object (`revision`, `index`, `seq`, `kind`, `lock`, `lease_id`,
//! `token` (decimal strings), `identity`, `reason`, `value_base64`, `mode`,
//! `highest_token` (a decimal string, "0" but for `write_refused`),
//! `resource`). A reconnecting `EventSource` sends the last
//! id as `Last-Event-ID`, and the watch resumes right after it (it wins over
//! `from`); `from` is inclusive, as in the `Watch` RPC. A revision the node no
//! longer holds answers 410 with `{"error": {"code": "compacted", "message",
//! "oldest": "I.S"}}` before the stream starts, or ends the stream with an
//! `event: error` whose data says the same (the HTTP port's one error shape,
//! [`crate::http_error::ApiError`]). A caller no longer allowed to read the prefix (its
//! token removed from the auth file, its rules changed) gets an `event:
//! error` with the refusal, and the stream ends.

use std::convert::Infallible;

use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use fencelock_core::ErrorCode;
use serde_json::json;
use tokio_stream::StreamExt as _;

use super::serve::{start, Caller, Ended, Selector, Source};
use super::{Event, Rev, WatchError};
use crate::http_error::ApiError;

/// Where a watch starts: after `Last-Event-ID` if sent, else at `from`.
pub fn start_rev(headers: &HeaderMap, from: Option<&str>) -> Result<Option<Rev>, String> {
    if let Some(last) = headers.get("last-event-id") {
        let last = last.to_str().map_err(|_| "Last-Event-ID is not text".to_string())?;
        return last.parse::<Rev>().map(|r| Some(r.next()));
    }
    from.filter(|f| !f.is_empty()).map(str::parse::<Rev>).transpose()
}

/// The SSE response of a watch of `prefix` from `from`, for `caller` (already
/// allowed to read the prefix).
pub fn respond(source: &Source, caller: Caller, prefix: String, from: Option<Rev>) -> Response {
    let rx = match start(&source.hub, caller, Selector::Prefix(prefix), from, source.stop.clone()) {
        Ok((_, rx)) => rx,
        Err(WatchError::Compacted(c)) => return compacted(&c).into_response(),
        Err(e @ WatchError::TooManyWatchers) => {
            return ApiError::new(ErrorCode::LimitReached, e.to_string()).into_response()
        }
    };
    let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(|item| {
        Ok::<_, Infallible>(match item {
            Ok(e) => sse_event(&e),
            Err(Ended::Compacted(c)) => SseEvent::default().event("error").data(compacted(&c).body().to_string()),
            Err(Ended::Refused(r)) => SseEvent::default().event("error").data(ApiError::from(r).body().to_string()),
        })
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

/// A resume from a revision no longer held, naming the oldest that is.
fn compacted(c: &super::Compacted) -> ApiError {
    ApiError::new(ErrorCode::Compacted, c.to_string()).with("oldest", c.oldest.to_string())
}

fn sse_event(e: &Event) -> SseEvent {
    let data = json!({
        "revision": e.rev.to_string(),
        "index": e.rev.index,
        "seq": e.rev.seq,
        "kind": e.kind.as_str(),
        "lock": e.lock,
        // Decimal strings, as every id and token of the HTTP API (see
        // `admin::body::Id`): tokens are far above 2^53.
        "lease_id": e.lease.to_string(),
        "token": e.token.to_string(),
        "identity": e.identity,
        "reason": e.reason,
        "value_base64": fencelock_core::b64::encode(&e.value),
        "mode": if e.shared { "shared" } else { "exclusive" },
        // A fence's report (`write_refused`): its highest token and what it
        // protects; "0" and "" for the other kinds.
        "highest_token": e.highest.to_string(),
        "resource": e.resource,
    });
    SseEvent::default().id(e.rev.to_string()).event(e.kind.as_str()).data(data.to_string())
}
