//! `GET /v1/watch?prefix=P&from=R` on the admin port: a watch as server-sent
//! events, for browsers (`EventSource`) and curl.
//!
//! Each event is `event: <kind>`, `id: <revision>` (`INDEX.SEQ`) and `data:`
//! one JSON object (`revision`, `index`, `seq`, `kind`, `lock`, `lease_id`,
//! `token`, `identity`, `reason`, `value_base64`, `mode`). A reconnecting `EventSource` sends the last
//! id as `Last-Event-ID`, and the watch resumes right after it (it wins over
//! `from`); `from` is inclusive, as in the `Watch` RPC. A revision the node no
//! longer holds answers 410 with `{"error": "compacted: …", "oldest": "I.S"}`
//! before the stream starts, or ends the stream with an `event: error` whose
//! data says the same. A caller no longer allowed to read the prefix (its
//! token removed from the auth file, its rules changed) gets an `event:
//! error` with the refusal, and the stream ends.

use std::convert::Infallible;

use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio_stream::StreamExt as _;

use super::serve::{start, Caller, Ended, Selector, Source};
use super::{Event, Rev, WatchError};

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
        Err(WatchError::Compacted(c)) => {
            let body = json!({ "error": c.to_string(), "oldest": c.oldest.to_string() });
            return (StatusCode::GONE, axum::Json(body)).into_response();
        }
        Err(e @ WatchError::TooManyWatchers) => {
            return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({ "error": e.to_string() }))).into_response();
        }
    };
    let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(|item| {
        Ok::<_, Infallible>(match item {
            Ok(e) => sse_event(&e),
            Err(Ended::Compacted(c)) => SseEvent::default()
                .event("error")
                .data(json!({ "error": c.to_string(), "oldest": c.oldest.to_string() }).to_string()),
            Err(Ended::Refused(r)) => {
                SseEvent::default().event("error").data(json!({ "error": r.to_string() }).to_string())
            }
        })
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

fn sse_event(e: &Event) -> SseEvent {
    let data = json!({
        "revision": e.rev.to_string(),
        "index": e.rev.index,
        "seq": e.rev.seq,
        "kind": e.kind.as_str(),
        "lock": e.lock,
        "lease_id": e.lease,
        "token": e.token,
        "identity": e.identity,
        "reason": e.reason,
        "value_base64": fencelock_core::b64::encode(&e.value),
        "mode": if e.shared { "shared" } else { "exclusive" },
    });
    SseEvent::default().id(e.rev.to_string()).event(e.kind.as_str()).data(data.to_string())
}
