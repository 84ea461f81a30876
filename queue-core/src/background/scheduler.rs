//! Periodic jobs: each worker that registers a job with a cron schedule
//! enqueues it at each due time, under the id `cron:<job>:<unix seconds>` with
//! a once-marker, so a firing runs once however many workers try.
//!
//! Schedules are evaluated in UTC (on the Redis clock, `TIME`).
//!
//! Every firing since the last one this scheduler handled is enqueued, in
//! order, within the catch-up window (a schedule faster than the 500 ms tick,
//! or a stalled tick, skips nothing). Firings missed for longer than the
//! window (every worker down, Redis unreachable) are coalesced into one: the
//! latest of them is enqueued late, with a warning, unless a firing within
//! the window is due anyway.
//!
//! The last firing handled is kept in Redis too, per job, in the queue's
//! cron hash (`cron_mark.lua`). Start-up is the first tick that read the
//! Redis clock and those records: a job with a record of its schedule goes
//! on from it (what no scheduler enqueued while every worker was down is
//! caught up as above); one without (first start, a changed schedule) has
//! only its latest due firing within the window enqueued. Each later tick
//! enqueues every firing after the last one, even while the enqueues fail
//! (Redis refusing or unreachable: the firings wait until an enqueue
//! succeeds).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::keys::QueueKeys;
use crate::queue::{EnqueueOptions, EnqueueOutcome, Queue};
use crate::registry::{CronFiring, Registration};
use crate::scripts::cron_mark::{self, CronMark, Marked};

/// A missed firing is still enqueued if a scheduler sees it within this long.
pub(crate) const CATCH_UP: Duration = Duration::from_secs(60);
/// A late firing's log line counts the firings it stands for up to this many.
const SKIPPED_COUNTED: usize = 10_000;

/// [`CATCH_UP`] on the schedules' clock.
fn window() -> chrono::Duration {
    chrono::Duration::seconds(CATCH_UP.as_secs() as i64)
}
/// How long a firing's id is refused after it was enqueued, at least
/// ([`once_ttl`]: until its job's next firing has passed the window).
const ONCE_FOR: Duration = Duration::from_secs(600);

pub(crate) struct Periodic {
    reg: Registration,
    /// The expression as written: the cron hash's records are kept per
    /// schedule (a record of another one is not read).
    expr: &'static str,
    schedule: cron::Schedule,
    firing: CronFiring,
    keys: QueueKeys,
}

/// Parses the cron schedules of the registrations that have one.
pub(crate) fn parse(regs: &[Registration]) -> Result<Vec<Periodic>> {
    regs.iter()
        .filter_map(|reg| reg.cron.map(|c| (reg, c)))
        .map(|(reg, (expr, firing))| {
            let schedule = cron::Schedule::from_str(expr).map_err(|e| {
                QueueError::Config(format!(
                    "job type `{}` on queue `{}`: invalid cron expression {expr:?} (6 fields, with seconds): {e}",
                    reg.name, reg.queue
                ))
            })?;
            // It parses, but no date at all matches it (the 30th of
            // February): the job would never run. A schedule whose dates
            // are all past (`"0 0 9 * * * 2026"` in 2027) is only warned of:
            // refused, every restart after its last date would fail the
            // whole worker, whatever else it runs.
            if schedule.after(&DateTime::<Utc>::UNIX_EPOCH).next().is_none() {
                return Err(QueueError::Config(format!(
                    "job type `{}` on queue `{}`: cron expression {expr:?} never fires \
                     (no date matches it: a day the month does not have?)",
                    reg.name, reg.queue
                )));
            }
            if schedule.upcoming(Utc).next().is_none() {
                warn!(job_type = reg.name, queue = reg.queue, cron = expr,
                    "periodic job's schedule has no date after now: it will not fire again");
            }
            let firing = firing().map_err(|e| {
                QueueError::Config(format!(
                    "periodic job type `{}` on queue `{}`: {e}",
                    reg.name, reg.queue
                ))
            })?;
            Ok(Periodic {
                reg: reg.clone(),
                expr,
                schedule,
                firing,
                keys: QueueKeys::new(reg.queue),
            })
        })
        .collect()
}

/// The firings to enqueue at `now`, oldest first: every firing after `last`
/// (the latest one already handled) up to `now` within the catch-up window
/// (at most one per second of it, cron's finest step). When none is due
/// within the window but firings after `last` fell before it (missed for
/// longer than the window), the latest of those: missed firings are
/// coalesced into one run. With no `last` (start-up without a record), only
/// the latest due firing within the window.
fn due_since(
    schedule: &cron::Schedule,
    last: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let window_start = now - window();
    let due = schedule.after(&last.map_or(window_start, |l| l.max(window_start)));
    let due = due.take_while(|t| *t <= now);
    let Some(last) = last else {
        return due.last().into_iter().collect();
    };
    let due: Vec<_> = due.take(CATCH_UP.as_secs() as usize + 1).collect();
    if !due.is_empty() || last >= window_start {
        return due;
    }
    latest_until(schedule, window_start)
        .filter(|missed| *missed > last)
        .into_iter()
        .collect()
}

/// The latest firing of `schedule` at or before `t` (found backwards: a
/// record months old costs no walk over every firing since).
fn latest_until(schedule: &cron::Schedule, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule
        .after(&(t + chrono::Duration::seconds(1)))
        .next_back()
        .filter(|at| *at <= t)
}

/// How many firings of `schedule` fell strictly between `last` and `at`
/// (the ones a late firing at `at` stands for), counted up to `cap`.
fn missed_between(
    schedule: &cron::Schedule,
    last: DateTime<Utc>,
    at: DateTime<Utc>,
    cap: usize,
) -> usize {
    schedule
        .after(&last)
        .take_while(|t| *t < at)
        .take(cap)
        .count()
}

/// Where a job's firings start at start-up (the first tick that read the
/// Redis clock): just before the latest due firing within the catch-up
/// window, so it is the first one due; `now` when none is.
fn start_point(schedule: &cron::Schedule, now: DateTime<Utc>) -> DateTime<Utc> {
    due_since(schedule, None, now)
        .last()
        .map_or(now, |latest| *latest - chrono::Duration::seconds(1))
}

/// The firings due on a tick at `now` after `last` (the latest firing
/// handled). A `last` later than `now` means the Redis clock stepped back (an
/// NTP step, a failover to a server whose clock is behind): the schedule
/// restarts from `now` as at start-up, instead of waiting until the clock
/// catches up with `last` and skipping every firing until then. A firing
/// handled before the step is not enqueued twice: its id is refused while
/// its once-marker lives.
fn due_on_tick(
    schedule: &cron::Schedule,
    last: &mut DateTime<Utc>,
    now: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    if *last > now {
        *last = start_point(schedule, now);
    }
    due_since(schedule, Some(*last), now)
}

async fn redis_now(conn: &mut RedisConnection) -> redis::RedisResult<DateTime<Utc>> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(DateTime::from_timestamp(secs, (micros * 1000) as u32).unwrap_or_default())
}

/// One periodic job's progress in this scheduler.
#[derive(Default)]
struct Progress {
    /// The latest firing handled (at start-up: its record in the cron hash,
    /// or the second before the first due one). `None` until the job's
    /// record was read: only that read (after a read of the Redis clock) is
    /// its start-up. Each job starts on its own, so a record that cannot be
    /// read (its queue's node down) holds up no other job.
    last: Option<DateTime<Utc>>,
    /// The latest firing handled but not yet recorded in the cron hash: a
    /// mark that failed is tried again on the next tick (a record left
    /// behind would make a restart enqueue that firing again).
    unmarked: Option<DateTime<Utc>>,
}

/// Fires due periodic jobs until `stop`.
pub(crate) async fn run(
    conn: RedisConnection,
    jobs: Arc<Vec<Periodic>>,
    mut stop: watch::Receiver<bool>,
) {
    if jobs.is_empty() {
        return;
    }
    let queue = Queue::from_connection(conn.clone());
    let mut conn = conn;
    let mut progress: Vec<Progress> = jobs.iter().map(|_| Progress::default()).collect();
    // The last Redis clock read and when it was made (this host's monotonic
    // clock): a Redis clock that ran far ahead of it stepped forward.
    let mut clock: Option<(DateTime<Utc>, tokio::time::Instant)> = None;
    loop {
        if super::stop_requested(&stop) {
            return;
        }
        match redis_now(&mut conn).await {
            Ok(now) => {
                let read_at = tokio::time::Instant::now();
                if let Some((before, then)) = clock {
                    if stepped_forward(before, now, read_at - then) {
                        warn!(from = %before, to = %now, "the Redis clock stepped forward: periodic jobs start again from the new time, as at start-up (no late firing for the step)");
                        for (job, p) in jobs.iter().zip(progress.iter_mut()) {
                            if p.last.is_some() {
                                p.last = Some(start_point(&job.schedule, now));
                            }
                        }
                    }
                }
                clock = Some((now, read_at));
                for (job, p) in jobs.iter().zip(progress.iter_mut()) {
                    tick(&queue, &mut conn, job, p, now).await;
                }
            }
            Err(e) => warn!(error = %e, "scheduler cannot read the Redis clock; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Whether the Redis clock, read at `before` and now at `now`, moved on by
/// more than `elapsed` (this host's monotonic time between the two reads)
/// plus the catch-up window: a step forward (a failover to a server whose
/// clock is ahead, an NTP step), not time that passed. Firings "missed" in
/// such a step are not due; coalescing them would run a firing of the
/// future early (and its real one would then find it done).
fn stepped_forward(before: DateTime<Utc>, now: DateTime<Utc>, elapsed: Duration) -> bool {
    let slack = chrono::Duration::from_std(elapsed + CATCH_UP).unwrap_or(chrono::Duration::MAX);
    now - before > slack
}

/// One tick of one job: its start-up when it has not started (its record
/// read), then its due firings, then a mark of the last one handled.
async fn tick(
    queue: &Queue,
    conn: &mut RedisConnection,
    job: &Periodic,
    p: &mut Progress,
    now: DateTime<Utc>,
) {
    if p.last.is_none() {
        match start_point_of(conn, job, now).await {
            Ok(point) => p.last = Some(point),
            Err(e) => {
                warn!(queue = job.reg.queue, job_type = job.reg.name, error = %e,
                    "scheduler cannot read the job's cron record; retrying");
                return;
            }
        }
    }
    if let Some(last) = p.last.as_mut() {
        if let Some(at) = fire_due(queue, job, last, now).await {
            p.unmarked = Some(at);
        }
    }
    if let Some(at) = p.unmarked {
        let mark = CronMark {
            keys: &job.keys,
            job_type: job.reg.name,
            schedule: job.expr,
            firing: at.timestamp(),
        };
        match mark.run(conn).await {
            Ok(_) => p.unmarked = None,
            Err(e) => warn!(queue = job.reg.queue, job_type = job.reg.name, error = %e,
                "periodic firing enqueued but not recorded in the cron hash; retrying"),
        }
    }
}

/// Where `job`'s firings go on from at its start-up (`now`): its record in
/// the cron hash, when it is of the same schedule and not after `now` (a
/// clock stepped back); otherwise just before its latest due firing within
/// the window ([`start_point`]). A cron hash of another type (corrupt data)
/// reads as no record; any other error is returned (retried next tick).
async fn start_point_of(
    conn: &mut RedisConnection,
    job: &Periodic,
    now: DateTime<Utc>,
) -> redis::RedisResult<DateTime<Utc>> {
    let (queue, job_type) = (job.reg.queue, job.reg.name);
    let marked = match cron_mark::last_marked(conn, &job.keys, job_type, job.expr).await {
        Ok(marked) => marked,
        Err(e) if e.code() == Some("WRONGTYPE") => {
            warn!(queue, job_type, key = %job.keys.cron(), error = %e,
                "the cron hash is not a hash: its record of this job is not read (only the latest due firing is enqueued at start-up)");
            Marked::Nothing
        }
        Err(e) => return Err(e),
    };
    let record = match marked {
        Marked::Firing(secs) => match DateTime::from_timestamp(secs, 0) {
            Some(l) if l <= now => Some(l),
            _ => {
                warn!(queue, job_type, record = secs, now = %now,
                    "cron record ahead of the Redis clock: not read (only the latest due firing is enqueued at start-up)");
                None
            }
        },
        Marked::Stale(value) => {
            debug!(queue, job_type, record = %value, "cron record of another schedule: not read");
            None
        }
        Marked::Nothing => None,
    };
    Ok(record.unwrap_or_else(|| start_point(&job.schedule, now)))
}

/// Enqueues `job`'s firings due at `now` after `last`, oldest first, moving
/// `last` on with each one handled and stopping at the first enqueue that
/// fails (retried on the next tick). Returns the last firing handled, if
/// any, for the cron hash.
async fn fire_due(
    queue: &Queue,
    job: &Periodic,
    last: &mut DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let mut handled = None;
    for at in due_on_tick(&job.schedule, last, now) {
        if !fire(queue, job, *last, at, now).await {
            break;
        }
        *last = at;
        handled = Some(at);
    }
    handled
}

/// How long the once-marker of the firing at `at` must refuse its id: until
/// no scheduler can find it due again, even one that starts from a record
/// left behind it (a mark lost in a crash or a failover), which finds it due
/// as long as it is the latest firing before the catch-up window, so until
/// the next firing plus the window. At least [`ONCE_FOR`]; a schedule with
/// no later firing, and a next firing further than a year, keep it a year
/// and a window.
fn once_ttl(schedule: &cron::Schedule, at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    const YEAR: Duration = Duration::from_secs(366 * 24 * 3600);
    let until_next = schedule
        .after(&at)
        .next()
        .and_then(|next| (next - now).to_std().ok())
        .map_or(YEAR, |d| d.min(YEAR));
    (until_next + CATCH_UP + Duration::from_secs(60)).max(ONCE_FOR)
}

/// Enqueues the firing of `job` at `at` (the one after `last`); whether it
/// was handled (enqueued now, or already by another worker). A firing older
/// than the catch-up window stands for every firing missed since `last`: it
/// is logged as late, with how many it stands for.
async fn fire(
    queue: &Queue,
    job: &Periodic,
    last: DateTime<Utc>,
    at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> bool {
    let id = format!("cron:{}:{}", job.reg.name, at.timestamp());
    let once = once_ttl(&job.schedule, at, now);
    let mut opts = EnqueueOptions::new().id(id.as_str()).once_for(once);
    if let Some(key) = &job.firing.rate_key {
        opts = opts.rate_key(key.as_str());
    }
    let reg = &job.reg;
    let enqueued = queue
        .enqueue_raw(
            reg.queue,
            reg.name,
            reg.version,
            reg.max_attempts,
            opts,
            &job.firing.payload,
        )
        .await;
    match enqueued {
        Ok(e) if e.outcome == EnqueueOutcome::Created => {
            if now - at > window() {
                let skipped = missed_between(&job.schedule, last, at, SKIPPED_COUNTED);
                warn!(queue = reg.queue, job_id = %id, job_type = reg.name, firing = %at,
                    last_handled = %last, skipped = skipped, skipped_capped = skipped == SKIPPED_COUNTED,
                    "periodic job fired late: no scheduler enqueued its firings for longer than the catch-up window; the latest missed one runs now, the earlier ones are skipped");
            } else {
                info!(queue = reg.queue, job_id = %id, job_type = reg.name, "periodic job fired");
            }
            true
        }
        Ok(_) => {
            debug!(queue = reg.queue, job_id = %id, "periodic firing already enqueued by another worker");
            true
        }
        Err(e) => {
            warn!(queue = reg.queue, job_id = %id, error = %e, "periodic job not enqueued; retrying");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn times(v: Vec<DateTime<Utc>>) -> Vec<String> {
        v.iter().map(|t| t.format("%H:%M:%S").to_string()).collect()
    }

    /// Args whose `Default` does not serialize.
    #[derive(Default, serde::Deserialize)]
    struct Unserializable;

    impl serde::Serialize for Unserializable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }

    struct Broken;

    impl crate::Job for Broken {
        type Args = Unserializable;
        const NAME: &'static str = "broken";
        const QUEUE: &'static str = "cron";
        fn run(
            _: crate::JobContext,
            _: Unserializable,
        ) -> crate::BoxFuture<'static, std::result::Result<(), crate::JobError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// A periodic job whose default args do not serialize is refused when
    /// the worker is built. Before, each firing was enqueued with an empty
    /// payload, which no handler could decode.
    #[test]
    fn default_args_that_do_not_serialize_are_refused_at_build() {
        let regs = [Registration::periodic::<Broken>("* * * * * *")];
        let err = parse(&regs).err().expect("refused");
        assert!(
            matches!(&err, QueueError::Config(m) if m.contains("`broken`") && m.contains("do not serialize")),
            "{err}"
        );
    }

    /// A schedule that parses but matches no date at all (a hand-written
    /// `Registration::periodic`, which the attribute's compile-time check
    /// does not see) is refused when the worker is built. Before, the
    /// worker built and the job never ran, without a word. One whose dates
    /// are all past builds (a warning): refusing it would fail every
    /// restart of the whole worker after the schedule's last date.
    #[test]
    fn a_schedule_that_never_fires_is_refused_at_build() {
        for never in ["0 0 0 30 2 *", "0 0 0 31 4 *"] {
            let regs = [Registration::periodic::<Broken>(never)];
            let err = parse(&regs).err().expect("refused");
            assert!(
                matches!(&err, QueueError::Config(m) if m.contains("`broken`") && m.contains("never fires") && m.contains(never)),
                "{never}: {err}"
            );
        }
        let past = [Registration::periodic::<Broken>("0 0 0 1 1 * 2020")];
        assert!(
            matches!(parse(&past), Err(QueueError::Config(m)) if m.contains("do not serialize")),
            "a schedule whose dates are past is not refused for it"
        );
    }

    #[test]
    fn at_start_up_only_the_latest_firing_within_the_window_is_due() {
        let s = cron::Schedule::from_str("0 */5 * * * *").unwrap();
        let now = at("2026-01-01T10:05:30Z");
        assert_eq!(times(due_since(&s, None, now)), ["10:05:00"]);
        let later = at("2026-01-01T10:07:00Z");
        assert!(
            due_since(&s, None, later).is_empty(),
            "older than the catch-up window"
        );
    }

    /// The start point makes the start-up firing the first one due, and
    /// every later firing due on later ticks (while its enqueue keeps
    /// failing, the start point stays where it is).
    #[test]
    fn after_start_up_every_firing_since_the_start_point_is_due() {
        let s = cron::Schedule::from_str("*/10 * * * * *").unwrap();
        let start = at("2026-01-01T10:00:05Z");
        let from = start_point(&s, start);
        assert_eq!(times(due_since(&s, Some(from), start)), ["10:00:00"]);
        let later = at("2026-01-01T10:00:45Z");
        assert_eq!(
            times(due_since(&s, Some(from), later)),
            ["10:00:00", "10:00:10", "10:00:20", "10:00:30", "10:00:40"]
        );
        // Nothing due at start-up: the firings after start-up are.
        let s = cron::Schedule::from_str("0 0 * * * *").unwrap();
        let from = start_point(&s, at("2026-01-01T10:30:00Z"));
        assert!(due_since(&s, Some(from), at("2026-01-01T10:30:00Z")).is_empty());
        assert_eq!(
            times(due_since(&s, Some(from), at("2026-01-01T11:00:30Z"))),
            ["11:00:00"]
        );
    }

    /// A Redis clock that steps back half an hour after a firing was
    /// handled: the next tick fires what is due at the new time. Before, the
    /// scheduler waited until the clock caught up with its last firing and
    /// skipped every firing of that half hour.
    #[test]
    fn a_clock_stepped_back_fires_what_is_due_at_its_new_time() {
        let s = cron::Schedule::from_str("0 * * * * *").unwrap();
        let mut last = at("2026-01-01T10:30:00Z");
        assert_eq!(
            times(due_on_tick(&s, &mut last, at("2026-01-01T10:00:30Z"))),
            ["10:00:00"]
        );
        // Later ticks go on from there, one firing a minute.
        last = at("2026-01-01T10:00:00Z");
        assert_eq!(
            times(due_on_tick(&s, &mut last, at("2026-01-01T10:01:10Z"))),
            ["10:01:00"]
        );
        // A clock that did not step back: as before.
        let mut last = at("2026-01-01T10:30:00Z");
        assert!(due_on_tick(&s, &mut last, at("2026-01-01T10:30:40Z")).is_empty());
        assert_eq!(last, at("2026-01-01T10:30:00Z"));
    }

    /// Firings missed for longer than the window (every worker down for 3 h
    /// across an hourly job, or Redis unreachable) are coalesced into the
    /// latest one. Before, every one of them was skipped without a word.
    #[test]
    fn firings_missed_beyond_the_window_are_coalesced_into_the_latest() {
        let s = cron::Schedule::from_str("0 0 * * * *").unwrap();
        let last = at("2026-01-01T07:00:00Z");
        let now = at("2026-01-01T10:20:00Z");
        assert_eq!(times(due_since(&s, Some(last), now)), ["10:00:00"]);
        assert_eq!(
            missed_between(&s, last, at("2026-01-01T10:00:00Z"), 100),
            2,
            "08:00 and 09:00"
        );
        // A firing within the window stands for the missed ones.
        let now = at("2026-01-01T10:00:30Z");
        assert_eq!(times(due_since(&s, Some(last), now)), ["10:00:00"]);
        // A firing exactly at the window's start is not lost between the two.
        let now = at("2026-01-01T10:01:00Z");
        assert_eq!(times(due_since(&s, Some(last), now)), ["10:00:00"]);
        // Nothing missed since the last one handled: nothing due.
        let last = at("2026-01-01T10:00:00Z");
        assert!(due_since(&s, Some(last), at("2026-01-01T10:20:00Z")).is_empty());
        // A record months old: the latest firing, found without a walk.
        let daily = cron::Schedule::from_str("0 0 2 * * *").unwrap();
        let due = due_since(
            &daily,
            Some(at("2025-10-01T02:00:00Z")),
            at("2026-01-01T09:00:00Z"),
        );
        assert_eq!(due, [at("2026-01-01T02:00:00Z")]);
        // Without a last firing (start-up, no record): as before, only
        // within the window.
        assert!(due_since(&daily, None, at("2026-01-01T09:00:00Z")).is_empty());
    }

    /// A firing's once-marker lives until its job's next firing has left the
    /// catch-up window: a scheduler starting from a record left behind it
    /// (a mark lost in a crash) finds it due until then, and its id must be
    /// refused. Before, 10 minutes for every schedule (stop 48 review: a
    /// weekly job ran twice after a restart two days later).
    #[test]
    fn a_firings_once_marker_outlives_the_time_it_can_be_found_due() {
        let weekly = cron::Schedule::from_str("0 0 3 * * Mon").unwrap();
        let at = at("2026-01-05T03:00:00Z");
        let ttl = once_ttl(&weekly, at, at + chrono::Duration::seconds(1));
        assert_eq!(ttl, Duration::from_secs(7 * 24 * 3600 - 1 + 60 + 60));
        // Fired late (found due 2 days after): still until the next one.
        let late = at + chrono::Duration::days(2);
        assert_eq!(
            once_ttl(&weekly, at, late),
            Duration::from_secs(5 * 24 * 3600 + 120)
        );
        // A fast schedule keeps the 10 minutes.
        let every_sec = cron::Schedule::from_str("* * * * * *").unwrap();
        assert_eq!(once_ttl(&every_sec, at, at), ONCE_FOR);
        // No later firing: a year and the window.
        let once = cron::Schedule::from_str("0 0 3 5 1 * 2026").unwrap();
        assert_eq!(
            once_ttl(&once, at, at),
            Duration::from_secs(366 * 24 * 3600 + 120)
        );
    }

    /// A Redis clock that ran ahead of this host's monotonic clock by more
    /// than the window stepped forward; time that passed while reads failed
    /// (both clocks moved) did not.
    #[test]
    fn a_redis_clock_far_ahead_of_the_monotonic_one_stepped_forward() {
        let before = at("2026-01-01T10:00:00Z");
        let tick = Duration::from_millis(500);
        assert!(!stepped_forward(
            before,
            at("2026-01-01T10:00:00.500Z"),
            tick
        ));
        assert!(!stepped_forward(before, at("2026-01-01T10:01:00Z"), tick));
        assert!(stepped_forward(before, at("2026-01-02T10:00:00Z"), tick));
        let outage = Duration::from_secs(600);
        assert!(!stepped_forward(before, at("2026-01-01T10:10:30Z"), outage));
    }

    /// A schedule faster than the tick (or a tick that stalled) used to fire
    /// only the latest firing of each tick, skipping the others.
    #[test]
    fn every_firing_since_the_last_one_is_due_within_the_window() {
        let s = cron::Schedule::from_str("* * * * * *").unwrap();
        let last = at("2026-01-01T10:00:00Z");
        let now = at("2026-01-01T10:00:03.200Z");
        assert_eq!(
            times(due_since(&s, Some(last), now)),
            ["10:00:01", "10:00:02", "10:00:03"]
        );
        assert!(due_since(&s, Some(at("2026-01-01T10:00:03Z")), now).is_empty());
        // After a long stall, only the window is caught up.
        let stalled = due_since(&s, Some(at("2026-01-01T09:00:00Z")), now);
        assert_eq!(stalled.len(), 60);
        assert_eq!(times(stalled)[0], "09:59:04");
    }
}
