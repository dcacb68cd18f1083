//! The group line's data, from a member's HTTP admin port (`--admin`), with
//! the TLS files and the token of `--server` as `fencelock cluster status`
//! sends them: `GET /v1/cluster` (the leader's answer preferred: only it
//! knows how far each member has replicated), else, where that is refused
//! (it needs `admin`) or absent, `GET /healthz` (the node's own view).

use std::net::SocketAddr;
use std::time::Duration;

use fencelock_server::cluster::Status;
use serde::Deserialize;

use super::state::Group;
use crate::http::{self, AdminTlsArgs};
use crate::ServerArg;

/// How long one admin request may take before the member counts as down:
/// the line is refreshed every few seconds, so a hung port must not hold it.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// The members' admin addresses, and how to talk to them.
#[derive(Debug, Clone)]
pub struct Admin {
    addrs: Vec<SocketAddr>,
    tls: AdminTlsArgs,
}

/// `GET /healthz`'s answer (200 or 503, the same fields).
#[derive(Debug, Deserialize)]
struct Health {
    node_id: u64,
    leader: Option<u64>,
    term: u64,
    last_applied: Option<u64>,
}

/// One member's answer to `GET /v1/cluster`.
enum Asked {
    Status(Status),
    /// Refused (401, 403) or absent (404): the reason, for the line.
    NotShown(String),
    Failed(String),
}

impl Admin {
    /// `None` without an address. The TLS files and the token are
    /// `--server`'s (`--tls-ca`, `--tls-cert`, `--tls-key`, `--auth-token`).
    pub fn new(addrs: Vec<SocketAddr>, server: &ServerArg) -> Option<Admin> {
        let tls = AdminTlsArgs {
            tls_ca: server.tls_ca.clone(),
            tls_cert: server.tls_cert.clone(),
            tls_key: server.tls_key.clone(),
            auth_token: server.auth_token.clone(),
        };
        (!addrs.is_empty()).then_some(Admin { addrs, tls })
    }

    /// The group as the members say it: the first leader's status, else the
    /// first follower's, else the first `/healthz` of a member that would
    /// not show its status, else why none answered.
    pub async fn fetch(&self) -> Group {
        let mut headers = vec![("Accept", "application/json".to_string())];
        let tls = match (self.tls.auth_header(), self.tls.config()) {
            (Ok(auth), Ok(tls)) => {
                headers.extend(auth);
                tls
            }
            (Err(e), _) | (_, Err(e)) => return Group::Failed(format!("{e:#}")),
        };
        let (mut follower, mut health, mut last) = (None, None, None);
        for &addr in &self.addrs {
            match self.ask(tls.as_ref(), addr, "/v1/cluster", &headers).await.map(|(c, b)| cluster(c, &b)) {
                Ok(Asked::Status(s)) if s.state == "leader" => return Group::Cluster(s),
                Ok(Asked::Status(s)) => _ = follower.get_or_insert(s),
                Ok(Asked::NotShown(why)) if health.is_none() => {
                    match self.ask(tls.as_ref(), addr, "/healthz", &headers).await {
                        Ok((code, body)) => match healthz(addr, code, &body, why) {
                            Ok(g) => health = Some(g),
                            Err(e) => last = Some(e),
                        },
                        Err(e) => last = Some(e),
                    }
                }
                Ok(Asked::NotShown(_)) => {}
                Ok(Asked::Failed(e)) => last = Some(format!("{addr}: {e}")),
                Err(e) => last = Some(e),
            }
        }
        match (follower, health) {
            (Some(s), _) => Group::Cluster(s),
            (None, Some(g)) => g,
            (None, None) => Group::Failed(last.unwrap_or_else(|| "no --admin address".into())),
        }
    }

    /// One GET: (status, body), or the reason it failed, naming `addr`.
    async fn ask(
        &self,
        tls: Option<&std::sync::Arc<tokio_rustls::rustls::ClientConfig>>,
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, String)],
    ) -> Result<(u16, String), String> {
        match tokio::time::timeout(ASK_TIMEOUT, http::request_tls(tls, addr, "GET", path, headers, b"")).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(format!("{addr}: {e:#}")),
            Err(_) => Err(format!("{addr}: no answer within {}s", ASK_TIMEOUT.as_secs())),
        }
    }
}

/// A member's answer to `GET /v1/cluster`.
fn cluster(code: u16, body: &str) -> Asked {
    match code {
        200 => match serde_json::from_str(body) {
            Ok(s) => Asked::Status(s),
            Err(e) => Asked::Failed(format!("unexpected /v1/cluster answer: {e}")),
        },
        401 | 403 => Asked::NotShown(format!("/v1/cluster: {}", refusal(code, body))),
        404 => Asked::NotShown("no /v1/cluster".into()),
        _ => Asked::Failed(format!("/v1/cluster: {code}: {}", http::error_message(body))),
    }
}

/// A member's answer to `GET /healthz` as the group line, `why` saying why
/// `/v1/cluster` was not used.
fn healthz(addr: SocketAddr, code: u16, body: &str, why: String) -> Result<Group, String> {
    if matches!(code, 401 | 403) {
        return Err(format!("{addr}: {why}; /healthz: {}", refusal(code, body)));
    }
    match serde_json::from_str::<Health>(body) {
        Ok(h) => {
            Ok(Group::Health { node_id: h.node_id, leader: h.leader, term: h.term, last_applied: h.last_applied, why })
        }
        Err(_) => Err(format!("{addr}: {why}; /healthz: {code}: {}", http::error_message(body))),
    }
}

/// `permission denied` / `not authenticated`, as the library words them.
fn refusal(code: u16, body: &str) -> String {
    match fencelock::Error::from_http_refusal(code, &http::error_message(body)) {
        Some(fencelock::Error::PermissionDenied(_)) => "permission denied".into(),
        Some(fencelock::Error::Unauthenticated(_)) => "not authenticated".into(),
        _ => format!("{code}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDR: &str = "127.0.0.1:7071";

    /// Rule: `/v1/cluster` gives the status on 200; a refusal or its absence
    /// sends the line to `/healthz`, with the reason; anything else is an
    /// error of that member.
    #[test]
    fn cluster_answers() {
        let body = r#"{"node_id":1,"state":"leader","leader":1,"leader_addr":"127.0.0.1:7070","term":2,
            "last_log_index":9,"last_applied":9,"members":[{"id":1,"addr":"127.0.0.1:7070","voter":true,"matched":9}]}"#;
        assert!(matches!(cluster(200, body), Asked::Status(s) if s.term == 2 && s.members.len() == 1));
        let denied = r#"{"error":{"code":"permission_denied","message":"needs admin"}}"#;
        assert!(matches!(cluster(403, denied), Asked::NotShown(w) if w == "/v1/cluster: permission denied"));
        assert!(matches!(cluster(401, "{}"), Asked::NotShown(w) if w == "/v1/cluster: not authenticated"));
        assert!(matches!(cluster(404, ""), Asked::NotShown(w) if w == "no /v1/cluster"));
        assert!(matches!(cluster(500, r#"{"error":"boom"}"#), Asked::Failed(e) if e == "/v1/cluster: 500: boom"));
    }

    /// Rule: `/healthz` is read on 200 and on 503 (a node that does not
    /// serve still says what it knows); a refusal of it says both refusals.
    #[test]
    fn health_answers() {
        let addr: SocketAddr = ADDR.parse().unwrap();
        let body = r#"{"status":"unavailable","node_id":2,"leader":1,"term":4,"last_applied":30}"#;
        let g = healthz(addr, 503, body, "no /v1/cluster".into()).unwrap();
        assert_eq!(
            g,
            Group::Health {
                node_id: 2,
                leader: Some(1),
                term: 4,
                last_applied: Some(30),
                why: "no /v1/cluster".into()
            }
        );
        let e = healthz(addr, 403, "{}", "/v1/cluster: permission denied".into()).unwrap_err();
        assert_eq!(e, "127.0.0.1:7071: /v1/cluster: permission denied; /healthz: permission denied");
    }
}
