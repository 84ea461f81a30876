//! W3C trace context across the queue (cargo feature `opentelemetry`, off by
//! default; docs/TRACING.md).
//!
//! - Enqueue: inside a `tracing` span that an OpenTelemetry layer
//!   (`tracing-opentelemetry`) follows, `with_current` adds the span's
//!   `traceparent` (`00-<trace id>-<span id>-<flags>`) to the job as the extra
//!   job field [`FIELD`] (`EnqueueOptions::extra_field`). A traceparent the
//!   caller set explicitly is kept.
//! - Worker: the claim reads that field with the others (`CLAIM_FIELDS` in
//!   `prelude.lua`), and `adopt` makes it the **parent** of the delivery's
//!   `job{...}` span: every attempt is a child of the enqueuing span, in the
//!   enqueuer's trace, and the ack is logged inside the attempt's span.
//!
//! Without the feature both functions are empty inline functions: no code
//! runs (the claim reply still carries the field, empty).

use crate::enqueue_options::EnqueueOptions;

/// The job-hash field holding the W3C `traceparent` of the enqueuing span.
pub const FIELD: &str = "traceparent";

/// `opts` with the current span's `traceparent` added (when the feature is
/// on, the current span is followed by an OpenTelemetry layer, and `opts`
/// has none yet).
#[cfg(feature = "opentelemetry")]
pub(crate) fn with_current(opts: EnqueueOptions) -> EnqueueOptions {
    if opts.extra_fields.iter().any(|(n, _)| n == FIELD) {
        return opts;
    }
    match current_traceparent() {
        Some(tp) => opts.extra_field(FIELD, tp),
        None => opts,
    }
}

/// Without the feature: `opts` unchanged.
#[cfg(not(feature = "opentelemetry"))]
#[inline(always)]
pub(crate) fn with_current(opts: EnqueueOptions) -> EnqueueOptions {
    opts
}

/// Makes the job's `traceparent` (when it has a valid one) the parent of `span`.
#[cfg(feature = "opentelemetry")]
pub(crate) fn adopt(span: &tracing::Span, traceparent: Option<&str>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if let Some(cx) = traceparent.and_then(parse) {
        // Fails only without an OpenTelemetry layer: nothing to continue then.
        let _ = span.set_parent(cx);
    }
}

/// Without the feature: nothing.
#[cfg(not(feature = "opentelemetry"))]
#[inline(always)]
pub(crate) fn adopt(_span: &tracing::Span, _traceparent: Option<&str>) {}

/// The current span's W3C `traceparent`, when an OpenTelemetry layer follows it.
#[cfg(feature = "opentelemetry")]
pub fn current_traceparent() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// A W3C `traceparent` as a remote parent context; `None` when malformed
/// (a bad field never fails the job: the span just starts a new trace).
#[cfg(feature = "opentelemetry")]
pub fn parse(traceparent: &str) -> Option<opentelemetry::Context> {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let sc = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    sc.is_valid()
        .then(|| opentelemetry::Context::new().with_remote_span_context(sc))
}

#[cfg(all(test, feature = "opentelemetry"))]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn parses_w3c_traceparent() {
        let cx = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let span = cx.span();
        let sc = span.span_context();
        assert_eq!(
            format!("{:032x}", sc.trace_id()),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(format!("{:016x}", sc.span_id()), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn no_traceparent_outside_an_opentelemetry_span() {
        assert_eq!(current_traceparent(), None);
        let opts = with_current(EnqueueOptions::new());
        assert!(opts.extra_fields.is_empty());
        let kept = with_current(EnqueueOptions::new().extra_field(FIELD, "00-x"));
        assert_eq!(
            kept.extra_fields,
            vec![(FIELD.to_string(), "00-x".to_string())]
        );
    }
}
