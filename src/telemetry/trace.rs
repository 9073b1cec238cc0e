//! Trace context across the outbox: with the `opentelemetry` feature, a publisher's current
//! OpenTelemetry context is written into the event's headers as a W3C `traceparent`, and a
//! subscription's handler span takes it as its parent, so a trace runs from the request that
//! published through every subscriber that handled the event, across processes.
//!
//! Without the feature (or without an OpenTelemetry layer on the publisher's `tracing`
//! subscriber) nothing is written, and handler spans are roots.

use crate::envelope::Headers;

/// The header that carries the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// Adds the current span's context as `traceparent`, unless the publisher set one.
#[cfg(feature = "opentelemetry")]
pub(crate) fn inject(headers: &mut Headers) {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    if headers.contains_key(TRACEPARENT) {
        return;
    }
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    if !span_context.is_valid() {
        return;
    }
    let value = format!(
        "00-{}-{}-{:02x}",
        span_context.trace_id(),
        span_context.span_id(),
        span_context.trace_flags().to_u8()
    );
    headers.insert(TRACEPARENT.to_owned(), serde_json::Value::String(value));
}

#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn inject(_headers: &mut Headers) {}

/// Makes the `traceparent` in `headers` (if valid) the parent of `span`.
#[cfg(feature = "opentelemetry")]
pub(crate) fn adopt(span: &tracing::Span, headers: &Headers) {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let Some(value) = headers.get(TRACEPARENT).and_then(|v| v.as_str()) else {
        return;
    };
    let mut parts = value.split('-');
    let (Some("00"), Some(trace), Some(span_id), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return;
    };
    let (Ok(trace), Ok(span_id), Ok(flags)) = (
        TraceId::from_hex(trace),
        SpanId::from_hex(span_id),
        u8::from_str_radix(flags, 16),
    ) else {
        return;
    };
    let remote = SpanContext::new(
        trace,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    if remote.is_valid() {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}

#[cfg(not(feature = "opentelemetry"))]
pub(crate) fn adopt(_span: &tracing::Span, _headers: &Headers) {}
