//! Crash points for fault tests (cargo feature `failpoints`): the fault tests
//! kill workers at chosen points and check every job ends exactly once
//! (docs/DESIGN.md, "Tests").
//!
//! With the feature on, `QUEUE_FAILPOINT=name[:probability][,name...]` makes
//! the process abort at once (no destructors, no acks, like SIGKILL) when it
//! reaches a named point:
//!
//! | point | where |
//! |---|---|
//! | `after_blmove` | the blocking fetch got an id, before the claim script |
//! | `after_claim` | a job is claimed, before its handler starts |
//! | `before_ack` | the handler succeeded, before the ack script |
//! | `before_fail` | the handler failed, before the retry/dead-letter script |
//! | `relay_after_apply` | the cross-queue relay applied notices to their batches, before removing them (workflow/relay.rs) |
//!
//! Without the feature every point compiles to nothing.

#[cfg(feature = "failpoints")]
pub(crate) fn hit(point: &str) {
    use std::sync::OnceLock;
    static POINTS: OnceLock<Vec<(String, f64)>> = OnceLock::new();
    let points = POINTS.get_or_init(|| {
        std::env::var("QUEUE_FAILPOINT")
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| match s.split_once(':') {
                Some((name, p)) => (name.to_string(), p.parse().unwrap_or(1.0)),
                None => (s.to_string(), 1.0),
            })
            .collect()
    });
    for (name, probability) in points {
        if name == point && rand::random::<f64>() < *probability {
            eprintln!("failpoint `{point}` hit: aborting the process");
            std::process::abort();
        }
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_point: &str) {}
