//! A tracing layer of a user's that panics, for the scenarios of a worker
//! whose loops run the user's tracing code (a fetcher opening job spans, a
//! scheduler logging firings): at every job span, at the first INFO event
//! of one module, or at every event of one module with a given message.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// See the module doc.
#[derive(Default)]
pub struct PanickingLayer {
    every_job_span: bool,
    first_info_event_of: Option<&'static str>,
    every_event: Option<(&'static str, &'static str)>,
    seen: AtomicBool,
}

impl PanickingLayer {
    /// Panics whenever a job's span (`job`) opens.
    pub fn at_every_job_span() -> Self {
        PanickingLayer {
            every_job_span: true,
            ..Self::default()
        }
    }

    /// Panics at the first INFO event whose target is `target` (a module
    /// path: `queue_core::worker::fetcher`).
    pub fn at_first_info_event_of(target: &'static str) -> Self {
        PanickingLayer {
            first_info_event_of: Some(target),
            ..Self::default()
        }
    }

    /// Panics at every event (any level) whose target is `target` and
    /// whose message is `message` (`queue_core::worker::runner`, "started").
    pub fn at_every_event(target: &'static str, message: &'static str) -> Self {
        PanickingLayer {
            every_event: Some((target, message)),
            ..Self::default()
        }
    }

    /// Installs the layer as this thread's subscriber until the guard
    /// drops (a `#[tokio::test]` runtime has one thread: the worker's tasks
    /// run on it).
    pub fn install(self) -> DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self))
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanickingLayer {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: Context<'_, S>,
    ) {
        if self.every_job_span && attrs.metadata().name() == "job" {
            panic!("a tracing layer that panics at job spans");
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let m = event.metadata();
        if let Some((target, message)) = self.every_event {
            let mut seen = Message(String::new());
            event.record(&mut seen);
            if m.target() == target && seen.0 == message {
                panic!("a tracing layer that panics at {target}'s {message:?}");
            }
        }
        if Some(m.target()) == self.first_info_event_of
            && *m.level() == tracing::Level::INFO
            && !self.seen.swap(true, Ordering::SeqCst)
        {
            panic!(
                "a tracing layer that panics at {}'s first event",
                m.target()
            );
        }
    }
}

/// An event's message, as written.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}
