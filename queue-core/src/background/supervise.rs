//! Restarts of the worker's long-running loops after a panic: the fetchers
//! (`worker/fetcher.rs`), the promoters, the periodic-job scheduler and the
//! cross-queue relay. A panic (a bug, or code of the user's run in the
//! loop's task: a tracing layer) would otherwise end the loop for good while
//! the worker kept running, with one line on stderr to say so. Each is
//! started again after a pause that doubles (1, 2, 4, 8, 16 s) while it
//! panics soon after each start, and left stopped, logged, after 5 such
//! panics in a row ([`Restarts`]): a loop that panics at every pass must
//! not spin, and a fetcher that panics at every fetch would burn the
//! attempts of the jobs it strands.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;
use tracing::error;

use super::stop_requested;

/// Pause before a loop that panicked starts again, doubled at each panic
/// soon after a restart.
const RESTART_PAUSE: Duration = Duration::from_secs(1);
/// A loop that ran this long before it panicked starts again after the
/// first pause, and its count of quick restarts starts again.
const RESTART_QUIET: Duration = Duration::from_secs(60);
/// Panics in a row, each within [`RESTART_QUIET`] of its start, after which
/// a loop is not started again.
const QUICK_RESTARTS: u32 = 5;

/// When a loop that panicked starts again.
#[derive(Debug)]
struct Restarts {
    /// The pause before the next restart.
    pause: Duration,
    /// Panics in a row, each within [`RESTART_QUIET`] of its start.
    quick: u32,
}

impl Default for Restarts {
    fn default() -> Self {
        Restarts {
            pause: RESTART_PAUSE,
            quick: 0,
        }
    }
}

impl Restarts {
    /// The pause before starting again a loop that panicked after running
    /// `ran_for`; `None`: not again.
    fn after_panic(&mut self, ran_for: Duration) -> Option<Duration> {
        if ran_for >= RESTART_QUIET {
            *self = Restarts::default();
        }
        self.quick += 1;
        if self.quick > QUICK_RESTARTS {
            return None;
        }
        let pause = self.pause;
        self.pause = pause * 2;
        Some(pause)
    }
}

/// After a panic of loop `what` of `queue` (its message `msg`): logs it and waits out `pause`
/// (ended early by the stop). True when the loop is to start again: a
/// pause was given and no stop was requested.
async fn restart_after(
    stop: &mut watch::Receiver<bool>,
    what: &str,
    queue: &str,
    msg: &str,
    pause: Option<Duration>,
) -> bool {
    // The same tracing layer may panic on this line too: printed by the
    // panic hook already, nothing more to do with it.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| match pause {
        None => error!(queue = %queue, panic = %msg, loop_name = what,
            "worker loop panicked again soon after each restart: not restarting it until the worker is restarted"),
        Some(pause) => error!(queue = %queue, panic = %msg, loop_name = what,
            restart_in_ms = pause.as_millis() as u64, "worker loop panicked; restarting it"),
    }));
    let Some(pause) = pause else {
        return false;
    };
    if stop_requested(stop) {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(pause) => {}
        _ = stop.changed() => {}
    }
    !stop_requested(stop)
}

/// Runs the loop `start` makes (loop `what` of `queue`, given its own
/// receiver of `stop`) until it ends, starting it again after a panic
/// ([`Restarts`]).
pub(crate) async fn supervised<F, Fut>(
    what: &'static str,
    queue: String,
    mut stop: watch::Receiver<bool>,
    mut start: F,
) where
    F: FnMut(watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut restarts = Restarts::default();
    loop {
        let started = tokio::time::Instant::now();
        let Err(panic) = AssertUnwindSafe(start(stop.clone())).catch_unwind().await else {
            return;
        };
        let pause = restarts.after_panic(started.elapsed());
        let msg = crate::worker::panic_message(&*panic);
        if !restart_after(&mut stop, what, &queue, &msg, pause).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{supervised, Restarts, QUICK_RESTARTS, RESTART_QUIET};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A loop that panics soon after each start is started again after 1,
    /// 2, 4, 8, 16 s, then not again; one that ran a minute before its panic
    /// starts the count again from 1 s.
    #[test]
    fn quick_panics_back_off_then_give_up_and_a_long_run_starts_again() {
        let s = Duration::from_secs;
        let mut r = Restarts::default();
        let pauses: Vec<_> = (0..=QUICK_RESTARTS).map(|_| r.after_panic(s(0))).collect();
        assert_eq!(
            pauses,
            [
                Some(s(1)),
                Some(s(2)),
                Some(s(4)),
                Some(s(8)),
                Some(s(16)),
                None
            ]
        );
        assert_eq!(r.after_panic(RESTART_QUIET), Some(s(1)));
        assert_eq!(r.after_panic(s(0)), Some(s(2)));
    }

    /// A supervised loop that panics at every start is started 6 times (5
    /// restarts, 31 s of pauses on the paused clock), then left stopped; one
    /// that ends is not started again; the stop ends a pause at once.
    #[tokio::test(start_paused = true)]
    async fn a_supervised_loop_restarts_until_it_gives_up_or_stops() {
        let starts = Arc::new(AtomicU32::new(0));
        let (_tx, stop) = tokio::sync::watch::channel(false);
        let counted = starts.clone();
        supervised("test", "q".into(), stop, move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { panic!("always") }
        })
        .await;
        assert_eq!(starts.load(Ordering::SeqCst), 6);

        let (tx, stop) = tokio::sync::watch::channel(false);
        let counted = starts.clone();
        let run = tokio::spawn(supervised("test", "q".into(), stop, move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { panic!("always") }
        }));
        tokio::task::yield_now().await;
        tx.send_replace(true);
        run.await.unwrap();
        assert_eq!(
            starts.load(Ordering::SeqCst),
            7,
            "stopped in its first pause"
        );
    }
}
