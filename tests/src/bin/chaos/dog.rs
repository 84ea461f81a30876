//! The in-process watchdog the `inbox` and `flow` workloads run beside
//! their worker processes: fast passes, short backoff, stopped on request.

use std::time::Duration;

use queue_core::{ReclaimReport, Watchdog, WatchdogConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running watchdog loop on some queues.
pub struct Dog {
    stop: oneshot::Sender<()>,
    task: JoinHandle<ReclaimReport>,
}

impl Dog {
    /// Connects and starts the loop on `queues`.
    pub async fn start(url: &str, queues: &[&str]) -> Result<Dog, String> {
        let config = WatchdogConfig {
            interval: Duration::from_millis(100),
            orphan_grace: Duration::from_millis(500),
            backoff: queue_core::Backoff {
                base: Duration::from_millis(20),
                max: Duration::from_millis(200),
            },
            ..WatchdogConfig::default()
        };
        let watchdog = Watchdog::connect(url, queues, config)
            .await
            .map_err(|e| e.to_string())?;
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            watchdog
                .run_until(async {
                    let _ = rx.await;
                })
                .await
        });
        Ok(Dog { stop, task })
    }

    /// Stops the loop and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}
