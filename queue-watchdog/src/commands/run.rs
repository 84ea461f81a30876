//! `run`: the reclaim loop (queue-core's `Watchdog`), optionally exporting
//! Prometheus metrics (the queue series come from `queue_gauges`).

use std::process::ExitCode;
use std::time::Duration;

use queue_core::{Backoff, Watchdog, WatchdogConfig};

use crate::cli::RunArgs;
use crate::error::{CliError, Result};

pub async fn run(url: &str, args: RunArgs) -> Result<ExitCode> {
    // Before the connect and the first pass: a SIGTERM from then on stops
    // the loop (see `termination`). Not with --once, which a signal ends.
    let stop = (!args.once).then(super::termination);
    // Checked as a worker's backoff is (queue-core's Backoff::validate),
    // before the metrics listener and the connect: a base above the max or
    // a max beyond 30 days ran, parking returned jobs for up to decades.
    let backoff = Backoff {
        base: Duration::from_millis(args.backoff_base_ms),
        max: Duration::from_millis(args.backoff_max_ms),
    };
    if let Err(e) = backoff.validate() {
        return Err(CliError::Other(format!(
            "--backoff-base-ms {} / --backoff-max-ms {}: {e}",
            args.backoff_base_ms, args.backoff_max_ms
        )));
    }
    if let Some(addr) = args.metrics_listen {
        crate::metrics_export::serve(addr)?;
        tracing::info!(%addr, "serving Prometheus metrics at http://{addr}/metrics");
    }
    let config = WatchdogConfig {
        interval: Duration::from_millis(args.interval_ms),
        orphan_grace: Duration::from_millis(args.orphan_grace_ms),
        batch: args.batch,
        backoff,
        // With --metrics-listen the sampler below publishes the gauges (from
        // one health read per queue and interval); the passes need not.
        publish_gauges: false,
        dead_max_len: args.dead_max_len,
        dead_retention: Duration::from_secs(args.dead_retention_hours.saturating_mul(3600)),
        ..WatchdogConfig::default()
    };
    let watchdog = Watchdog::connect(url, &args.queues, config).await?;
    if args.metrics_listen.is_some() && !args.once {
        let admin = queue_core::admin::Admin::connect(url).await?;
        crate::queue_gauges::spawn(
            admin,
            args.queues.clone(),
            Duration::from_millis(args.interval_ms.max(100)),
        );
    }
    if args.once {
        let r = watchdog.run_once().await?;
        println!(
            "reclaimed={} dead_lettered={} adopted={} promoted={} trimmed={} dropped={} failed_queue_passes={}",
            r.reclaimed,
            r.dead_lettered,
            r.adopted,
            r.promoted,
            r.trimmed,
            r.dropped,
            r.failed_queue_passes
        );
        if r.failed_queue_passes > 0 {
            return Ok(ExitCode::FAILURE);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(stop) = stop {
        watchdog.run_until(stop).await;
    }
    Ok(ExitCode::SUCCESS)
}
