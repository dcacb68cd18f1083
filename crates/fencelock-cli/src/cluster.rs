//! `fencelock cluster status|add|remove`: the group's membership, through the
//! HTTP admin endpoint of any member (a follower hands changes to the leader).

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fencelock_server::cluster::Status;

use crate::{exit, http};

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    cmd: ClusterCmd,
    /// HTTP admin address of a member; several, comma-separated, are tried in
    /// order until one answers.
    #[arg(long, env = "FENCELOCK_ADMIN", default_value = "127.0.0.1:7071", value_delimiter = ',', global = true)]
    admin: Vec<SocketAddr>,
    /// Print the JSON status instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    tls: http::AdminTlsArgs,
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Show the members, their roles, and who leads.
    Status,
    /// Add node ID at ADDR (its gRPC host:port). Start it first with an empty
    /// data dir and `--join`; this returns once it has caught up and votes.
    Add {
        id: u64,
        addr: String,
        /// Its peer address, if it serves Raft on a port of its own
        /// (started with --peer-listen).
        #[arg(long)]
        peer_addr: Option<String>,
    },
    /// Remove node ID from the group (the leader too; another takes over).
    Remove { id: u64 },
}

pub async fn cluster(a: ClusterArgs) -> anyhow::Result<ExitCode> {
    let (method, path, body) = match &a.cmd {
        ClusterCmd::Status => return status(&a).await,
        ClusterCmd::Add { id, addr, peer_addr } => {
            let body = serde_json::json!({ "id": id, "addr": addr, "peer_addr": peer_addr });
            ("POST", "/v1/cluster/members".to_string(), body.to_string())
        }
        ClusterCmd::Remove { id } => ("DELETE", format!("/v1/cluster/members/{id}"), String::new()),
    };
    // A member that is down, or that knows no leader (a node just removed, a
    // group electing), is skipped for the next listed one.
    let text = http::call_admin(&a.admin, &a.tls, method, &path, body.as_bytes()).await?;
    let status: Status = serde_json::from_str(&text).context("unexpected answer to the membership change")?;
    Ok(show(a.json, &text, &status))
}

/// `status` wants the leader's view: only the leader knows how far each
/// member has replicated (MATCHED), so a follower's answer is kept while the
/// other listed members are asked for the leader's.
async fn status(a: &ClusterArgs) -> anyhow::Result<ExitCode> {
    let mut headers = vec![("Content-Type", "application/json".to_string())];
    headers.extend(a.tls.auth_header()?);
    let tls = a.tls.config()?;
    let (mut last, mut follower_view) = (None, None);
    for admin in &a.admin {
        match http::request_tls(tls.as_ref(), *admin, "GET", "/v1/cluster", &headers, b"").await {
            Ok((200, text)) => {
                let status: Status =
                    serde_json::from_str(&text).with_context(|| format!("unexpected answer from {admin}"))?;
                if status.state != "leader" {
                    follower_view.get_or_insert((text, status));
                    continue;
                }
                return Ok(show(a.json, &text, &status));
            }
            // A member that fails after another answered changes nothing.
            Ok(_) | Err(_) if follower_view.is_some() => continue,
            Ok((code, text)) => {
                let msg = http::error_message(&text);
                // Every member refuses the same token: no use trying the next.
                match http::auth_refusal(*admin, code, &msg) {
                    Some(refused) => return Err(refused),
                    None => bail!("{admin}: {code}: {msg}"),
                }
            }
            Err(e) => last = Some(format!("{admin}: {e:#}")),
        }
    }
    match follower_view {
        Some((text, status)) => Ok(show(a.json, &text, &status)),
        None => bail!("no member answered ({})", last.unwrap_or_else(|| "no --admin address".into())),
    }
}

/// Prints a member's answer: its JSON as it came, or the table.
fn show(json: bool, text: &str, status: &Status) -> ExitCode {
    if json {
        println!("{text}");
    } else {
        print!("{}", render(status));
    }
    ExitCode::from(exit::OK)
}

/// The status as a short table.
fn render(s: &Status) -> String {
    let mut out = format!(
        "node {} is {} (term {}); leader: {}; last log {}, applied {}\n",
        s.node_id,
        s.state,
        s.term,
        s.leader.map(|l| format!("node {l}")).unwrap_or_else(|| "none".into()),
        s.last_log_index.map(|i| i.to_string()).unwrap_or_else(|| "-".into()),
        s.last_applied.map(|i| i.to_string()).unwrap_or_else(|| "-".into()),
    );
    out.push_str(&format!("{:<6}{:<24}{:<10}{}\n", "ID", "ADDRESS", "ROLE", "MATCHED"));
    for m in &s.members {
        let role = match (m.voter, Some(m.id) == s.leader) {
            (true, true) => "leader",
            (true, false) => "voter",
            (false, _) => "learner",
        };
        let matched = m.matched.map(|i| i.to_string()).unwrap_or_else(|| "-".into());
        let addr = match &m.peer_addr {
            Some(p) => format!("{} (peers {p})", m.addr),
            None => m.addr.clone(),
        };
        out.push_str(&format!("{:<6}{:<24}{:<10}{}\n", m.id, addr, role, matched));
    }
    if s.state != "leader" {
        let leader = match (s.leader, &s.leader_addr) {
            (Some(id), Some(addr)) => format!("node {id}, gRPC {addr}"),
            (Some(id), None) => format!("node {id}"),
            _ => "none now".into(),
        };
        out.push_str(&format!(
            "MATCHED is known to the leader only ({leader}): add its admin address to --admin to see it\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_server::cluster::Member;

    #[test]
    fn status_renders_roles_and_the_leader() {
        let s = Status {
            node_id: 2,
            state: "follower".into(),
            leader: Some(1),
            leader_addr: Some("127.0.0.1:7070".into()),
            term: 3,
            last_log_index: Some(12),
            last_applied: Some(12),
            members: vec![
                Member { id: 1, addr: "127.0.0.1:7070".into(), peer_addr: None, voter: true, matched: None },
                Member { id: 2, addr: "127.0.0.1:7170".into(), peer_addr: None, voter: true, matched: None },
                Member { id: 4, addr: "127.0.0.1:7470".into(), peer_addr: None, voter: false, matched: None },
            ],
        };
        let t = render(&s);
        assert!(t.starts_with("node 2 is follower (term 3); leader: node 1; last log 12, applied 12\n"), "{t}");
        assert!(t.contains("1     127.0.0.1:7070          leader"), "{t}");
        assert!(t.contains("2     127.0.0.1:7170          voter"), "{t}");
        assert!(t.contains("4     127.0.0.1:7470          learner"), "{t}");
        assert!(t.ends_with("MATCHED is known to the leader only (node 1, gRPC 127.0.0.1:7070): add its admin address to --admin to see it\n"), "{t}");
    }

    /// Issue 16: the leader's view shows each member's matched index, and no note.
    #[test]
    fn the_leaders_view_shows_matched_indexes() {
        let member =
            |id, matched| Member { id, addr: format!("127.0.0.1:{id}070"), peer_addr: None, voter: true, matched };
        let s = Status {
            node_id: 1,
            state: "leader".into(),
            leader: Some(1),
            leader_addr: Some("127.0.0.1:1070".into()),
            term: 3,
            last_log_index: Some(12),
            last_applied: Some(12),
            members: vec![member(1, Some(12)), member(2, Some(11)), member(3, None)],
        };
        let t = render(&s);
        assert!(t.contains("1     127.0.0.1:1070          leader    12\n"), "{t}");
        assert!(t.contains("2     127.0.0.1:2070          voter     11\n"), "{t}");
        assert!(t.contains("3     127.0.0.1:3070          voter     -\n"), "{t}");
        assert!(!t.contains("known to the leader only"), "{t}");
    }
}
