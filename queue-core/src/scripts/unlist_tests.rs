//! Script-level tests of how a finished delivery leaves the processing list
//! (`unlist_delivery` in prelude.lua, used by `ack.lua`, `fail.lua` and
//! `finish_cancel.lua`)
//! against a real redis-server: short jobs fetched while long ones run are
//! found from the head instead of by a walk past every long delivery (issue
//! #12, "cost must not grow with the work"), and the claim row's `far` flag
//! is only a hint: wherever the delivery sits, exactly its entry goes.
//!
//! The walks are counted with `INFO commandstats`, not timed.

use std::time::Duration;

use redis::AsyncCommands;

use super::ack::{Ack, AckItem, AckReply};
use super::claim::{Claim, ClaimRow, Delivery};
use super::enqueue::Enqueue;
use super::fail::{Fail, FailKind, FailReply};
use super::fetch::Fetch;
use super::finish_cancel::FinishCancel;
use crate::conn::RedisConnection;
use crate::keys::QueueKeys;

const LEASE: Duration = Duration::from_secs(60);

/// Long-running deliveries before the short ones: more than `FAR` (256) in
/// the prelude, so the short ones are claimed far from the tail, and more
/// than two `NEAR` (128) windows.
const LONG: usize = 300;

async fn setup(queue: &str) -> (queue_testkit::RedisServer, RedisConnection, QueueKeys) {
    let (server, conn) = crate::scripts::test_redis().await;
    (server, conn, QueueKeys::new(queue))
}

/// Enqueues `n` jobs `<prefix>-<i>` and claims them with one fetch: the
/// deliveries, oldest first.
async fn running(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    prefix: &str,
    n: usize,
) -> Vec<Delivery> {
    running_by(conn, keys, prefix, n, n).await
}

/// [`running`], claimed by fetches of `per_fetch` jobs.
async fn running_by(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    prefix: &str,
    n: usize,
    per_fetch: usize,
) -> Vec<Delivery> {
    for i in 0..n {
        Enqueue::test_job(keys, &format!("{prefix}-{i}").into(), 3)
            .run(conn)
            .await
            .unwrap();
    }
    let mut claimed = Vec::new();
    for call in 0..n.div_ceil(per_fetch) {
        let base = format!("tok-{prefix}-{call}");
        let rows = Fetch {
            keys,
            lease: LEASE,
            token_base: &base,
            count: per_fetch,
            first_try: false,
        }
        .run(conn)
        .await
        .unwrap();
        claimed.extend(rows.into_iter().filter_map(|r| match r {
            ClaimRow::Claimed(d) => Some(d),
            _ => None,
        }));
    }
    assert_eq!(claimed.len(), n, "all of {prefix} claimed");
    claimed
}

async fn ack(conn: &mut RedisConnection, keys: &QueueKeys, ds: &[&Delivery]) -> Vec<AckReply> {
    let items: Vec<AckItem> = ds.iter().map(|d| AckItem::of(d, None)).collect();
    Ack {
        keys,
        worker: "",
        items: &items,
        retention: Duration::from_secs(60),
        compact: false,
    }
    .run(conn)
    .await
    .unwrap()
}

/// Processing from the head (newest) to the tail (oldest).
async fn processing(conn: &mut RedisConnection, keys: &QueueKeys) -> Vec<String> {
    conn.lrange(&keys.processing, 0, -1).await.unwrap()
}

/// The ids of `ds` as processing holds them: newest first.
fn newest_first<'a>(ds: impl DoubleEndedIterator<Item = &'a Delivery>) -> Vec<String> {
    ds.rev().map(|d| d.id.as_str().to_string()).collect()
}

/// Short jobs fetched behind 300 long-running deliveries are claimed far
/// from the tail, and their acks find them near the head: one look of 128
/// entries from the tail for the batch (it misses), then one bounded look
/// from the head per delivery (the end that held the last one is looked at
/// first). Before, each ack's `LREM -1` walked past all
/// 300 (stop 43: 14 µs per ack behind 1,000 long deliveries, 1.5 ms behind
/// 100,000); no look from the head was made.
#[tokio::test]
async fn acks_behind_long_running_deliveries_find_them_from_the_head() {
    let (_s, mut c, keys) = setup("mixed").await;
    let long = running(&mut c, &keys, "long", LONG).await;
    let short = running(&mut c, &keys, "short", 8).await;
    assert!(short.iter().all(|d| d.far_from_tail), "{short:?}");
    assert!(
        !long[..256].iter().any(|d| d.far_from_tail),
        "claimed near the tail"
    );
    super::reset_command_stats(&mut c).await;
    let refs: Vec<&Delivery> = short.iter().collect();
    assert_eq!(ack(&mut c, &keys, &refs).await, [AckReply::Completed; 8]);
    assert_eq!(
        super::command_calls(&mut c, "lpos").await,
        1 + 8,
        "one look from the tail for the batch, one from the head each"
    );
    assert_eq!(
        processing(&mut c, &keys).await,
        newest_first(long.iter()),
        "the long deliveries stay, in order"
    );
}

/// The far flag is a hint: a far delivery found at the tail (the long ones
/// ended first), one beyond both looks (newer deliveries in front of it,
/// longer ones behind), and a batch mixing the two are each removed, and
/// only their entries: every other delivery stays, in order.
#[tokio::test]
async fn a_far_delivery_leaves_processing_wherever_it_sits() {
    let (_s, mut c, keys) = setup("far").await;
    let long = running(&mut c, &keys, "long", LONG).await;
    let short = running(&mut c, &keys, "short", 4).await;
    let newer = running(&mut c, &keys, "newer", 200).await;
    assert!(short.iter().all(|d| d.far_from_tail));

    // Beyond both looks: 300 behind, 200 in front.
    assert_eq!(
        ack(&mut c, &keys, &[&short[0]]).await,
        [AckReply::Completed]
    );
    let mut left = newest_first(newer.iter());
    left.extend(newest_first(short[1..].iter()));
    left.extend(newest_first(long.iter()));
    assert_eq!(processing(&mut c, &keys).await, left);

    // The long ones end: the short ones are at the tail now. One batch
    // whose first delivery is near the head (newer[199], far) and whose
    // others are at the tail.
    let refs: Vec<&Delivery> = long.iter().collect();
    assert!(ack(&mut c, &keys, &refs)
        .await
        .iter()
        .all(|r| *r == AckReply::Completed));
    let batch = [&newer[199], &short[1], &short[2]];
    assert!(batch.iter().all(|d| d.far_from_tail));
    assert_eq!(ack(&mut c, &keys, &batch).await, [AckReply::Completed; 3]);
    let mut left = newest_first(newer[..199].iter());
    left.push(short[3].id.as_str().to_string());
    assert_eq!(processing(&mut c, &keys).await, left);

    // A far delivery that fails (retried later) leaves processing the same
    // way: short[3] is at the tail.
    let reply = Fail {
        keys: &keys,
        id: &short[3].id,
        token: &short[3].token,
        kind: FailKind::Retry,
        message: "planned",
        delay: Duration::from_secs(60),
        far_from_tail: short[3].far_from_tail,
    }
    .run(&mut c)
    .await
    .unwrap();
    assert!(matches!(reply, FailReply::Retry { .. }), "{reply:?}");
    assert_eq!(
        processing(&mut c, &keys).await,
        newest_first(newer[..199].iter())
    );
}

/// A short job that fails behind long-running deliveries is found from the
/// head too (`fail.lua`); before, its `LREM -1` walked past them.
#[tokio::test]
async fn a_failure_behind_long_running_deliveries_finds_it_from_the_head() {
    let (_s, mut c, keys) = setup("mixed-fail").await;
    let long = running(&mut c, &keys, "long", LONG).await;
    let short = running(&mut c, &keys, "short", 3).await;
    super::reset_command_stats(&mut c).await;
    for (d, kind) in [
        (&short[0], FailKind::Retry),
        (&short[1], FailKind::Permanent),
    ] {
        let reply = Fail {
            keys: &keys,
            id: &d.id,
            token: &d.token,
            kind,
            message: "planned",
            delay: Duration::from_secs(60),
            far_from_tail: d.far_from_tail,
        }
        .run(&mut c)
        .await
        .unwrap();
        assert!(
            matches!(reply, FailReply::Retry { .. } | FailReply::Dead { .. }),
            "{reply:?}"
        );
    }
    assert_eq!(
        super::command_calls(&mut c, "lpos").await,
        2 * 2,
        "tail, then head, each"
    );
    let mut left = vec![short[2].id.as_str().to_string()];
    left.extend(newest_first(long.iter()));
    assert_eq!(processing(&mut c, &keys).await, left);
}

/// A job taken by `BLMOVE` behind long-running deliveries is claimed far
/// from the tail too (`claim.lua`), and its ack finds it from the head.
#[tokio::test]
async fn a_blocking_fetch_behind_long_running_deliveries_is_claimed_far() {
    let (_s, mut c, keys) = setup("mixed-blmove").await;
    let long = running(&mut c, &keys, "long", LONG).await;
    Enqueue::test_job(&keys, &"trickle".into(), 3)
        .run(&mut c)
        .await
        .unwrap();
    let moved: String = redis::cmd("LMOVE")
        .arg(&keys.main)
        .arg(&keys.processing)
        .arg("RIGHT")
        .arg("LEFT")
        .query_async(&mut c)
        .await
        .unwrap();
    let row = Claim {
        keys: &keys,
        id: moved.as_bytes(),
        lease: LEASE,
        token: "tok-trickle",
    }
    .run(&mut c)
    .await
    .unwrap();
    let ClaimRow::Claimed(d) = row else {
        panic!("{row:?}")
    };
    assert!(d.far_from_tail);
    super::reset_command_stats(&mut c).await;
    assert_eq!(ack(&mut c, &keys, &[&d]).await, [AckReply::Completed]);
    assert_eq!(super::command_calls(&mut c, "lpos").await, 2);
    assert_eq!(processing(&mut c, &keys).await, newest_first(long.iter()));
}

/// A batch led by a delivery found at the tail (a long job that ended, its
/// older deliveries gone) still finds the short ones after it from the
/// head: the end that held the last one is only looked at first. Found by
/// review: the first version took the rest of such a batch from the tail at
/// once, a walk past every long delivery.
#[tokio::test]
async fn a_batch_led_by_a_delivery_at_the_tail_finds_the_others_from_the_head() {
    let (_s, mut c, keys) = setup("led-by-tail").await;
    let old = running(&mut c, &keys, "old", LONG).await;
    let ended = running(&mut c, &keys, "ended", 3).await;
    let long = running(&mut c, &keys, "long", LONG).await;
    let short = running(&mut c, &keys, "short", 8).await;
    let refs: Vec<&Delivery> = old.iter().collect();
    assert!(ack(&mut c, &keys, &refs)
        .await
        .iter()
        .all(|r| *r == AckReply::Completed));
    assert!(ended[0].far_from_tail);
    super::reset_command_stats(&mut c).await;
    let mut batch = vec![&ended[0]];
    batch.extend(short.iter());
    assert_eq!(ack(&mut c, &keys, &batch).await, [AckReply::Completed; 9]);
    assert_eq!(
        super::command_calls(&mut c, "lpos").await,
        1 + 2 + 7,
        "ended[0] at the tail; short[0] missed there, found at the head; the rest from the head"
    );
    let mut left = newest_first(long.iter());
    left.extend(newest_first(ended[1..].iter()));
    assert_eq!(processing(&mut c, &keys).await, left);
}

/// A worker whose slots long-running jobs hold fetches one job at a time:
/// such a delivery is claimed far from the tail too, and its ack finds it
/// from the head. Found by review: the first version gave a fetch of one or
/// two jobs no distance (it cost an `LLEN`), so those acks walked the list.
#[tokio::test]
async fn a_one_job_fetch_behind_long_running_deliveries_is_claimed_far() {
    let (_s, mut c, keys) = setup("one-by-one").await;
    let long = running(&mut c, &keys, "long", LONG).await;
    let short = running_by(&mut c, &keys, "short", 2, 1).await;
    assert!(short.iter().all(|d| d.far_from_tail), "{short:?}");
    let pair = running_by(&mut c, &keys, "pair", 2, 2).await;
    assert!(pair.iter().all(|d| d.far_from_tail), "{pair:?}");
    super::reset_command_stats(&mut c).await;
    let refs: Vec<&Delivery> = short.iter().chain(pair.iter()).collect();
    assert_eq!(ack(&mut c, &keys, &refs).await, [AckReply::Completed; 4]);
    assert_eq!(super::command_calls(&mut c, "lpos").await, 2 + 3);
    assert_eq!(processing(&mut c, &keys).await, newest_first(long.iter()));
}

/// More short deliveries in flight than one look holds (200 in front of the
/// acked one, 1,000 long behind it): the looks grow (128, then 512) instead
/// of falling back to the walk past the 1,000. Found by review: the first version looked
/// 128 entries from each end only.
#[tokio::test]
async fn a_delivery_deeper_than_one_look_is_found_by_a_larger_one() {
    let (_s, mut c, keys) = setup("deeper").await;
    let long = running(&mut c, &keys, "long", 1000).await;
    let short = running(&mut c, &keys, "short", 1).await;
    let newer = running(&mut c, &keys, "newer", 200).await;
    super::reset_command_stats(&mut c).await;
    assert_eq!(
        ack(&mut c, &keys, &[&short[0]]).await,
        [AckReply::Completed]
    );
    assert_eq!(
        super::command_calls(&mut c, "lpos").await,
        2 + 2,
        "128 from each end, then 512 from the tail (1,000 long: not there) and the head"
    );
    let mut left = newest_first(newer.iter());
    left.extend(newest_first(long.iter()));
    assert_eq!(processing(&mut c, &keys).await, left);
}

/// A far delivery an operator cancelled ends (`finish_cancel.lua`) found
/// from the head too; before, its `LREM -1` walked past the long ones.
#[tokio::test]
async fn a_cancelled_delivery_behind_long_running_ones_is_found_from_the_head() {
    let (_s, mut c, keys) = setup("mixed-cancel").await;
    let long = running(&mut c, &keys, "long", LONG).await;
    let short = running(&mut c, &keys, "short", 3).await;
    let d = &short[0];
    let _: () = c
        .hset(keys.job(d.id.as_str()), "cancel_requested", "1")
        .await
        .unwrap();
    super::reset_command_stats(&mut c).await;
    let ended = FinishCancel {
        keys: &keys,
        id: &d.id,
        token: &d.token,
        retention: Duration::from_secs(60),
        message: "cancelled",
        far_from_tail: d.far_from_tail,
    }
    .run(&mut c)
    .await
    .unwrap();
    assert!(ended);
    assert_eq!(
        super::command_calls(&mut c, "lpos").await,
        2,
        "tail, then head"
    );
    let mut left = newest_first(short[1..].iter());
    left.extend(newest_first(long.iter()));
    assert_eq!(processing(&mut c, &keys).await, left);
}
