//! The nemesis of the 3-node group's scenarios (backend `fencelock3`): L1
//! leader kills, L2 leader isolation, L3 one node cut off (the leader or a
//! follower: a minority of one, a majority of two). How the group is wired
//! so that a node can be cut off is in [`crate::cluster`].

use std::time::Duration;

use anyhow::bail;
use fencelock_testkit::proxy::Mode;
use serde_json::json;

use crate::cluster::{Cluster, NODES};
use crate::ctx::{evidence, fault, pause_between_faults, Ctx};
use crate::targets::Target;

fn cluster(ctx: &mut Ctx) -> anyhow::Result<&mut Cluster> {
    match &mut ctx.target {
        Target::Cluster(c) => Ok(c),
        _ => bail!("{} needs the fencelock3 backend", ctx.spec.scenario),
    }
}

/// L1: every 1–3 s the leader is SIGKILLed; once another node leads (the
/// time it took is the evidence), it is started again on its data.
pub async fn l1_leader_kills(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 1000, 3000).await;
        let c = cluster(ctx)?;
        let Some(i) = c.leader().await else { continue };
        let id = c.nodes[i].id;
        let pid = c.nodes[i].server.kill();
        fault(ctx, "start", &format!("node{id}"), json!({ "leader": id, "pid": pid }));
        evidence(ctx, "leader-killed", 1, &format!("node{id}"), json!({ "pid": pid }));
        let c = cluster(ctx)?;
        let elected = c.wait_leader(Some(id), Duration::from_secs(10)).await;
        let restarted = c.nodes[i].server.start().await;
        if let Some((new, took)) = elected {
            let new_id = cluster(ctx)?.nodes[new].id;
            evidence(ctx, "new-leader", 1, &format!("node{new_id}"), json!({ "ms": took.as_millis() as u64 }));
        }
        restarted?;
        fault(ctx, "end", &format!("node{id}"), serde_json::Value::Null);
    }
    Ok(())
}

/// L2: the leader is cut off from both peers (its links held) for 1–3 s
/// beyond the election of a new leader, then healed; the held bytes flow on.
pub async fn l2_leader_isolation(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 1000, 3000).await;
        let c = cluster(ctx)?;
        let Some(i) = c.leader().await else { continue };
        let id = c.nodes[i].id;
        isolate(ctx, id, "leader").await?;
    }
    Ok(())
}

/// L3: one node, drawn at random (the leader or a follower), is cut off from
/// the other two for 1–3 s beyond any election it causes, then healed.
pub async fn l3_partitions(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 1000, 3000).await;
        let id = ctx.rng.u64(1..=NODES);
        let c = cluster(ctx)?;
        let role = match c.leader().await.map(|i| c.nodes[i].id) {
            Some(l) if l == id => "leader",
            _ => "follower",
        };
        isolate(ctx, id, role).await?;
    }
    Ok(())
}

async fn isolate(ctx: &mut Ctx, id: u64, role: &str) -> anyhow::Result<()> {
    let keep = Duration::from_millis(ctx.rng.u64(1000..=3000));
    let target = format!("node{id}");
    cluster(ctx)?.set_links(id, Mode::Hold);
    fault(ctx, "start", &target, json!({ "isolated": id, "role": role, "ms": keep.as_millis() as u64 }));
    evidence(ctx, "isolated", 1, &target, json!({ "role": role }));
    if role == "leader" {
        if let Some((new, took)) = cluster(ctx)?.wait_leader(Some(id), Duration::from_secs(10)).await {
            let new_id = cluster(ctx)?.nodes[new].id;
            evidence(ctx, "new-leader", 1, &format!("node{new_id}"), json!({ "ms": took.as_millis() as u64 }));
        }
    }
    tokio::time::sleep(keep).await;
    cluster(ctx)?.set_links(id, Mode::Pass);
    fault(ctx, "end", &target, serde_json::Value::Null);
    Ok(())
}
