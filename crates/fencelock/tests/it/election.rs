//! Leader election on the native server (issue 17), beyond the conformance
//! body every backend runs (`backends/suite.rs::election_where_declared`): a
//! candidate whose lease is lost while it waits is told at once (contrast
//! etcd#11007, where Campaign succeeds after the session is gone), a try
//! campaign is busy while someone leads, and an observer that starts while a
//! leader leads sees it first.

use crate::support;

use fencelock::{Error, LeaderEvent, Outcome};
use support::proxy::{Mode, Proxy};
use support::{eventually, waiters, within, Server, SECS};

/// Rule: a campaign ends with `LeaseNotFound` as soon as the server drops the
/// candidate's lease (here revoked by someone else), and leaves the queue,
/// rather than starting over on a fresh lease as a lock acquire does. Its
/// wait (an hour) and its TTL (60 s) are far longer than the test's limit, so
/// only the loss can end it.
#[tokio::test]
async fn a_campaign_fails_at_once_when_the_server_drops_its_lease() {
    let server = Server::start().await;
    let (leader_client, candidate_client) = (server.client().await, server.client().await);
    let leader = within("first campaign", leader_client.election("e").ttl(60 * SECS).campaign()).await.unwrap();
    let candidate = tokio::spawn(async move { candidate_client.election("e").ttl(60 * SECS).campaign().await });
    eventually("the candidate waits", || async { waiters(&leader_client, "e").await == 1 }).await;
    let waiting = leader_client.describe("e").await.unwrap().waiters[0].lease_id;
    leader_client.revoke_lease(waiting).await.unwrap();
    let got = within("the campaign ends", candidate).await.unwrap();
    match got {
        Err(Error::LeaseNotFound(m)) => assert!(m.contains("while campaigning for \"e\""), "{m}"),
        other => panic!("a campaign whose lease was revoked: {other:?}"),
    }
    assert_eq!(waiters(&leader_client, "e").await, 0, "nobody waits any more");
    assert!(!leader.is_lost());
    assert!(leader.resign().await.unwrap());
}

/// Rule: a campaign also ends when the candidate's own client can no longer
/// renew its lease (every answer held by a proxy): at its deadline, with
/// `LeaseNotFound`, though the server may not have expired it yet.
#[tokio::test]
async fn a_campaign_fails_when_its_client_cannot_renew_the_lease() {
    let server = Server::start().await;
    let leader_client = server.client().await;
    let leader = within("first campaign", leader_client.election("e").ttl(60 * SECS).campaign()).await.unwrap();
    let proxy = Proxy::start(server.grpc_addr).await;
    let candidate_client = fencelock::Client::connect(proxy.url()).await.unwrap();
    let candidate = tokio::spawn(async move { candidate_client.election("e").ttl(SECS).campaign().await });
    eventually("the candidate waits", || async { waiters(&leader_client, "e").await == 1 }).await;
    proxy.set_mode(Mode::Hold);
    let got = within("the campaign ends", candidate).await.unwrap();
    assert!(matches!(&got, Err(Error::LeaseNotFound(m)) if m.contains("campaigning")), "{got:?}");
    proxy.set_mode(Mode::Pass);
    assert!(leader.resign().await.unwrap());
}

/// Rules: `try_campaign` is busy while someone leads and elects when nobody
/// does; an observer that starts while a leader leads sees it first (with its
/// value and term), then its vacancy and the next leader, terms increasing.
#[tokio::test]
async fn an_observer_sees_the_current_leader_first_and_try_campaign_is_busy_while_one_leads() {
    let server = Server::start().await;
    let (a, b) = (server.client().await, server.client().await);
    let first = within("campaign", a.election("svc").value(&b"10.0.0.1:80"[..]).campaign()).await.unwrap();
    match b.election("svc").try_campaign().await.unwrap() {
        Outcome::Busy { holder_token, .. } => assert_eq!(holder_token, Some(first.term())),
        other => panic!("a try campaign while someone leads: {other:?}"),
    }
    let mut observer = b.election("svc").observe().await.unwrap();
    let seen = within("the current leader", observer.next_event()).await.unwrap().unwrap();
    let LeaderEvent::Leader(l) = seen else { panic!("{seen:?}") };
    assert_eq!((l.term, l.value.as_slice()), (first.term(), &b"10.0.0.1:80"[..]));
    let first_term = first.term();
    assert!(first.resign().await.unwrap());
    let second = match b.election("svc").try_campaign().await.unwrap() {
        Outcome::Acquired(l) => l,
        other => panic!("a try campaign with nobody leading: {other:?}"),
    };
    assert!(second.term() > first_term);
    let vacancy = within("vacancy", observer.next_event()).await.unwrap().unwrap();
    assert_eq!(vacancy, LeaderEvent::Vacant { term: first_term });
    let next = within("next leader", observer.next_event()).await.unwrap().unwrap();
    assert_eq!(next.term(), second.term());
    drop(second); // resigns in the background
    let gone = within("vacancy on drop", observer.next_event()).await.unwrap().unwrap();
    assert_eq!(gone, LeaderEvent::Vacant { term: next.term() });
}

/// Rules (proclaim): the leader's new value reaches `leader` and every
/// observer as the same term with the new value, in order, each once, and
/// the next leader's grant carries its own campaign value and identity; a
/// leadership whose term has ended cannot proclaim (`LeaseNotFound`, nothing
/// changes), nor can the old guard of a lock set a value under a newer
/// holder.
#[tokio::test]
async fn proclaim_keeps_the_term_and_observers_see_each_value_once() {
    let server = Server::start().await;
    let (a, b, c) = (server.client().await, server.client().await, server.client().await);
    let mut observer = c.election("svc").observe().await.unwrap();
    let mut first =
        within("campaign", a.election("svc").value(&b"v1"[..]).identity("node-a").campaign()).await.unwrap();
    let term = first.term();
    within("proclaim", first.proclaim(&b"v2"[..])).await.unwrap();
    within("proclaim", first.proclaim(&b"v3"[..])).await.unwrap();
    assert_eq!(first.value(), b"v3");
    let shown = c.election("svc").leader().await.unwrap().expect("a leader");
    assert_eq!((shown.term, shown.value.as_slice(), shown.identity.as_deref()), (term, &b"v3"[..], Some("node-a")));
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = within("observed change", observer.next_event()).await.unwrap().unwrap();
        let LeaderEvent::Leader(l) = ev else { panic!("only leaders so far: {ev:?}") };
        seen.push((l.term, l.value, l.identity));
    }
    let node_a = Some("node-a".to_string());
    assert_eq!(
        seen,
        vec![
            (term, b"v1".to_vec(), node_a.clone()),
            (term, b"v2".to_vec(), node_a.clone()),
            (term, b"v3".to_vec(), node_a)
        ]
    );
    // Hand over to b; a's leadership is gone and b leads with its own value.
    let second = tokio::spawn(async move { b.election("svc").value(&b"b1"[..]).identity("node-b").campaign().await });
    let a_lease = first.guard().lease_id();
    assert!(first.resign().await.unwrap());
    let second = within("second leader", second).await.unwrap().unwrap();
    assert!(second.term() > term);
    assert_eq!(within("vacancy", observer.next_event()).await.unwrap().unwrap(), LeaderEvent::Vacant { term });
    let next = within("next leader", observer.next_event()).await.unwrap().unwrap();
    let LeaderEvent::Leader(l) = next else { panic!("{next:?}") };
    assert_eq!((l.term, l.value.as_slice(), l.identity.as_deref()), (second.term(), &b"b1"[..], Some("node-b")));
    // A set-value under the ended term changes nothing.
    assert!(!a.set_value_raw("svc", a_lease, term, b"late".to_vec()).await.unwrap());
    let shown = c.election("svc").leader().await.unwrap().expect("a leader");
    assert_eq!(shown.value, b"b1".to_vec());
    // A leadership whose lease was revoked cannot proclaim.
    let mut second = second;
    c.revoke_lease(second.guard().lease_id()).await.unwrap();
    eventually("the leader learns of the revoke", || async { second.is_lost() }).await;
    let got = second.proclaim(&b"b2"[..]).await;
    assert!(matches!(&got, Err(Error::LeaseNotFound(m)) if m.contains("has ended")), "{got:?}");
}

/// Rule: a native observer misses no term, however short (its watch goes on
/// from the revision of its first read, docs/guide/election.md): three terms
/// that each begin and end without waiting for the observer all show, each
/// leader and then its vacancy, in term order. (The conformance body waits
/// for the observer before each resignation, because a polling observer may
/// skip such a term.)
#[tokio::test]
async fn an_observer_misses_no_term_however_short() {
    let server = Server::start().await;
    let client = server.client().await;
    let mut observer = within("observe", client.election("short").observe()).await.unwrap();
    let mut terms = Vec::new();
    for i in 0..3 {
        let election = client.election("short").ttl(60 * SECS).value(format!("v{i}").into_bytes());
        let leadership = within("campaign", election.campaign()).await.unwrap();
        terms.push(leadership.term());
        assert!(within("resign", leadership.resign()).await.unwrap());
    }
    for (i, term) in terms.into_iter().enumerate() {
        match within("a leader", observer.next_event()).await {
            Some(Ok(LeaderEvent::Leader(l))) => assert_eq!((l.term, l.value), (term, format!("v{i}").into_bytes())),
            other => panic!("leader of term {term} expected: {other:?}"),
        }
        let vacancy = within("its vacancy", observer.next_event()).await.unwrap().unwrap();
        assert_eq!(vacancy, LeaderEvent::Vacant { term });
    }
}
