//! Operator paths of batches whose members are on other queues than the
//! batch (docs/WORKFLOWS.md, "Relay" and "Operating batches"), against a
//! real redis-server, each step driven by hand (no worker, no watchdog, no
//! timing): a replay of such a member is relayed by the replay call itself,
//! and `batches show` reads such members' state on their own queue.

use std::time::Duration;

use redis::Value;

use crate::admin::{Admin, BatchMember, OUTCOME_ELSEWHERE};
use crate::conn::RedisConnection;
use crate::keys::QueueKeys;
use crate::scripts::ack::{Ack, AckItem, AckReply};
use crate::scripts::claim::{ClaimRow, Delivery};
use crate::scripts::fail::{Fail, FailKind, FailReply};
use crate::scripts::fetch::Fetch;
use crate::{Batch, Flow, JobSpec, Queue};

const ORDERS: &str = "orders";
const EMAILS: &str = "emails";

/// A private redis-server, a queue client and a raw connection to it.
struct Fx {
    _server: queue_testkit::RedisServer,
    queue: Queue,
    conn: RedisConnection,
}

impl Fx {
    async fn start() -> Fx {
        let server = queue_testkit::RedisServer::start().unwrap();
        let queue = Queue::connect(&server.url()).await.unwrap();
        let conn = queue.connection();
        Fx {
            _server: server,
            queue,
            conn,
        }
    }

    /// Claims up to `count` jobs of `queue`, each expected to be claimed.
    async fn fetch(&mut self, queue: &str, count: usize) -> Vec<Delivery> {
        let keys = QueueKeys::new(queue);
        let base = uuid::Uuid::new_v4().to_string();
        Fetch {
            keys: &keys,
            lease: Duration::from_secs(60),
            token_base: &base,
            count,
            first_try: true,
        }
        .run(&mut self.conn)
        .await
        .unwrap()
        .into_iter()
        .map(|r| match r {
            ClaimRow::Claimed(d) => d,
            other => panic!("expected a claimed row, got {other:?}"),
        })
        .collect()
    }

    /// Fails delivery `d` of `queue` for good (dead-lettered).
    async fn fail_for_good(&mut self, queue: &str, d: &Delivery) {
        let keys = QueueKeys::new(queue);
        let reply = Fail {
            keys: &keys,
            id: &d.id,
            token: &d.token,
            kind: FailKind::Permanent,
            message: "smtp down",
            delay: Duration::ZERO,
            far_from_tail: false,
        }
        .run(&mut self.conn)
        .await
        .unwrap();
        assert!(matches!(reply, FailReply::Dead { .. }), "{reply:?}");
    }

    async fn ack(&mut self, queue: &str, ds: &[Delivery]) {
        let keys = QueueKeys::new(queue);
        let items: Vec<AckItem> = ds.iter().map(|d| AckItem::of(d, None)).collect();
        let replies = Ack {
            keys: &keys,
            worker: "",
            items: &items,
            retention: Duration::from_secs(60),
            compact: false,
        }
        .run(&mut self.conn)
        .await
        .unwrap();
        assert!(
            replies.iter().all(|r| *r == AckReply::Completed),
            "{replies:?}"
        );
    }

    async fn cmd(&mut self, args: &[&str]) -> Value {
        crate::scripts::raw_cmd(&mut self.conn, args).await
    }

    async fn text(&mut self, args: &[&str]) -> Option<String> {
        crate::scripts::raw_text(&mut self.conn, args).await
    }

    async fn int(&mut self, args: &[&str]) -> i64 {
        crate::scripts::raw_int(&mut self.conn, args).await
    }
}

/// The reviewer's repro (t3), without pausing any queue: flow `close` on
/// `orders`, child `X` on `emails` and child `Y` on `orders`. X fails for
/// good (relayed: the batch counts it dead), the operator replays X, and
/// then Y finishes on the batch's own queue before anything else relays
/// `emails`. The replay call relayed its own notice, so the batch waits for
/// X; X re-runs and succeeds, and the parent is created (not dead-lettered)
/// with X's result `ok`. Before, `replay_dead` left the notice for the next
/// relay run: Y's ack fired the batch with X still dead and the parent was
/// dead-lettered ("flow: 1 child(ren) failed, first X").
#[tokio::test]
async fn a_cross_queue_child_replayed_before_its_flow_fires_no_longer_fails_the_parent() {
    let mut fx = Fx::start().await;
    let job = |queue: &str, id: &str| JobSpec::raw(queue, "t", 1, 1, vec![0xc0]).id(id);
    Flow::new(job(ORDERS, "close"))
        .child(job(EMAILS, "X"))
        .child(job(ORDERS, "Y"))
        .enqueue(&fx.queue)
        .await
        .unwrap();
    let bkey = QueueKeys::new(ORDERS).batch("close");
    let x = fx.fetch(EMAILS, 1).await;
    fx.fail_for_good(EMAILS, &x[0]).await;
    assert_eq!(fx.queue.relay(EMAILS).await.unwrap().applied, 1);
    assert_eq!(
        fx.text(&["HGET", &bkey, "dead"]).await.as_deref(),
        Some("1")
    );

    assert!(fx.queue.replay_dead(EMAILS, "X", true).await.unwrap());
    // Applied by the replay call: nothing left to relay, X uncounted.
    let relay = QueueKeys::new(EMAILS).relay();
    assert_eq!(fx.int(&["LLEN", &relay]).await, 0, "the notice is relayed");
    assert_eq!(
        fx.text(&["HGET", &bkey, "dead"]).await.as_deref(),
        Some("0")
    );

    // The sibling on the batch's own queue finishes first.
    let y = fx.fetch(ORDERS, 1).await;
    assert_eq!(y[0].id.as_str(), "Y");
    fx.ack(ORDERS, &y).await;
    assert_eq!(
        fx.text(&["HGET", &bkey, "state"]).await.as_deref(),
        Some("sealed"),
        "the flow waits for the replayed child"
    );
    let parent = QueueKeys::new(ORDERS).job("close");
    assert_eq!(fx.int(&["EXISTS", &parent]).await, 0, "no parent yet");

    // X runs again and succeeds; its notice is relayed.
    let again = fx.fetch(EMAILS, 1).await;
    assert_eq!(again[0].id.as_str(), "X");
    fx.ack(EMAILS, &again).await;
    assert_eq!(fx.queue.relay(EMAILS).await.unwrap().applied, 1);
    assert_eq!(
        fx.text(&["HGET", &bkey, "state"]).await.as_deref(),
        Some("fired")
    );
    assert_eq!(
        fx.text(&["HGET", &parent, "state"]).await.as_deref(),
        Some("queued"),
        "the parent is created, not dead-lettered: {:?}",
        fx.text(&["HGET", &parent, "dead_reason"]).await
    );
    let result = fx
        .text(&["HGET", &format!("{bkey}:results"), "X"])
        .await
        .unwrap();
    assert!(result.starts_with("ok:"), "{result}");
    // X's queue was recorded in the batch hash, and expires with it.
    assert_eq!(
        fx.text(&["HGET", &bkey, "where:X"]).await.as_deref(),
        Some(EMAILS)
    );
    assert_eq!(
        fx.text(&["HGET", &bkey, "where:Y"]).await,
        None,
        "home queue"
    );
    assert!(fx.int(&["PTTL", &bkey]).await > 0, "expires with the batch");
}

/// `batches show` of a batch on `orders` whose members are on `emails`:
/// `m1` queued, `m2` running, `m3` dead-lettered with its notice not yet
/// relayed, and `home` queued on `orders`; an unrelated job `m2` waits on
/// `orders`. Each member is shown with its real state on its own queue,
/// naming that queue (never the unrelated job). Before, every member on
/// `emails` was looked up on `orders`: `m1` and `m3` showed as "not
/// enqueued" and `m2` as the unrelated job's `queued`. A batch opened by an
/// older version (no `:where`) shows a member it cannot find on its queue as
/// possibly elsewhere, never a confident wrong state.
#[tokio::test]
async fn batch_detail_reads_members_on_other_queues_on_their_own_queue() {
    let mut fx = Fx::start().await;
    let job = |queue: &str, id: &str| JobSpec::raw(queue, "t", 1, 1, vec![0xc0]).id(id);
    let unrelated = crate::EnqueueOptions::default().id("m2");
    fx.queue
        .enqueue_raw(ORDERS, "other", 1, 1, unrelated, b"\xc0")
        .await
        .unwrap();
    Batch::new(&fx.queue)
        .id("b1")
        .home(ORDERS)
        .add(job(EMAILS, "m2"))
        .add(job(EMAILS, "m3"))
        .add(job(EMAILS, "m1"))
        .add(job(ORDERS, "home"))
        .enqueue()
        .await
        .unwrap();
    let taken = fx.fetch(EMAILS, 2).await;
    let ids: Vec<&str> = taken.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["m2", "m3"]);
    fx.fail_for_good(EMAILS, &taken[1]).await;
    assert_eq!(
        fx.int(&["LLEN", &QueueKeys::new(EMAILS).relay()]).await,
        1,
        "m3's notice waits"
    );

    let admin = Admin::new(fx.queue.clone());
    let shown = |d: &crate::admin::BatchDetail| -> Vec<(String, bool, String, Option<String>)> {
        d.members
            .iter()
            .map(|m: &BatchMember| (m.id.clone(), m.counted, m.outcome.clone(), m.queue.clone()))
            .collect()
    };
    let row = |id: &str, outcome: &str, queue: Option<&str>| {
        (
            id.to_string(),
            false,
            outcome.to_string(),
            queue.map(str::to_string),
        )
    };
    let detail = admin.batch_detail(ORDERS, "b1").await.unwrap().unwrap();
    assert_eq!(
        shown(&detail),
        [
            row("home", "queued", None),
            row("m1", "queued", Some(EMAILS)),
            row("m2", "active", Some(EMAILS)),
            row("m3", "dead", Some(EMAILS)),
        ]
    );

    // The same batch as an older version left it: no `where:<id>`, no marker.
    let bkey = QueueKeys::new(ORDERS).batch("b1");
    for m in ["m1", "m2", "m3"] {
        fx.cmd(&["HDEL", &bkey, &format!("where:{m}")]).await;
    }
    fx.cmd(&["HDEL", &bkey, "where"]).await;
    let detail = admin.batch_detail(ORDERS, "b1").await.unwrap().unwrap();
    assert_eq!(
        shown(&detail),
        [
            row("home", "queued", None),
            row("m1", OUTCOME_ELSEWHERE, None),
            row("m2", OUTCOME_ELSEWHERE, None),
            row("m3", OUTCOME_ELSEWHERE, None),
        ]
    );
}
