//! Trace context across the outbox: the publisher's span becomes the parent of the
//! subscriber's handler span, through the `traceparent` stored in the event's headers.
#![cfg(feature = "opentelemetry")]

mod common;

use std::time::Duration;

use common::{Note, TestDb};
use opentelemetry::trace::TracerProvider;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use ordo::{Delivery, HandlerError, JobConfig, Outbox, OutboxConfig, TRACEPARENT};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

struct Handles;

impl ordo::Subscriber<Note> for Handles {
    async fn handle(
        &self,
        _tx: &mut sqlx::PgConnection,
        _event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        tracing::info_span!("projection.write").in_scope(|| {});
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publishers_span_is_the_parent_of_the_subscribers_handler_span() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("ordo-test"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
        .expect("the only subscriber of this binary");

    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    async {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer: 1, n: 1 }).expect("publish");
        tx.commit().await.expect("commit");
    }
    .instrument(tracing::info_span!("http.request"))
    .await;

    let stored: serde_json::Value =
        sqlx::query_scalar("SELECT headers FROM ordo.events WHERE sequence = 1")
            .fetch_one(&db.pool)
            .await
            .expect("headers");
    let traceparent = stored[TRACEPARENT]
        .as_str()
        .expect("a traceparent header")
        .to_owned();
    assert_eq!(
        traceparent.len(),
        55,
        "00-<32 hex>-<16 hex>-<2 hex>: {traceparent}"
    );

    let handle = outbox
        .subscribe(JobConfig::new("traced"), Handles)
        .await
        .expect("subscribe");
    let (_, done) = handle
        .wait_for(Duration::from_secs(10), |s| s.position.get() >= 1)
        .await;
    assert!(done);
    handle.shutdown().await;
    provider.force_flush().expect("flush");

    let spans = exporter.get_finished_spans().expect("spans");
    let request = spans
        .iter()
        .find(|s| s.name == "http.request")
        .expect("the publisher's span");
    let handler = spans
        .iter()
        .find(|s| s.name == "ordo.handle")
        .expect("the handler's span");
    assert_eq!(
        handler.span_context.trace_id(),
        request.span_context.trace_id(),
        "one trace"
    );
    assert_eq!(
        handler.parent_span_id,
        request.span_context.span_id(),
        "the publisher's span is the parent"
    );
    assert!(traceparent.contains(&request.span_context.span_id().to_string()));
    let inner = spans
        .iter()
        .find(|s| s.name == "projection.write")
        .expect("the handler's own span");
    assert_eq!(inner.parent_span_id, handler.span_context.span_id());
}
