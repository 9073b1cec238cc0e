//! One delivery through the inbox: its parts read from the AMQP properties and headers, then
//! its ack, delayed requeue or dead-lettering.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio::task::JoinSet;

use super::RabbitInbox;
use crate::inbox::Inbox;
use crate::inbox::handler::InboxHandler;
use crate::inbox::transport::{Parts, Settle, settle};
use crate::wire::rabbitmq as wire;

impl RabbitInbox {
    /// One delivery through the inbox, then its ack, delayed requeue or dead-lettering.
    pub(super) async fn deliver<H: InboxHandler>(
        &self,
        inbox: &Inbox,
        handler: &H,
        delivery: Delivery,
        delayed: &mut JoinSet<()>,
    ) {
        let headers = delivery.properties.headers().as_ref();
        let header = |name: &str| headers.and_then(|table| text(table, name));
        let (source, position, lane, ordo_headers) = (
            header(wire::SOURCE),
            header(wire::POSITION),
            header(wire::LANE),
            header(wire::HEADERS),
        );
        let parts = Parts {
            id: delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str()),
            payload: &delivery.data,
            headers: ordo_headers.as_deref(),
            source: source.as_deref(),
            position: position.as_deref(),
            lane: lane.as_deref(),
        };
        let result = match parts.message("message_id") {
            Ok(message) => inbox.receive(&message, handler).await,
            Err(reason) => Err(inbox.refused(parts.id, reason)),
        };
        let acked = match settle(&result, &self.settings.redelivery) {
            Settle::Ack => delivery.ack(BasicAckOptions::default()).await.map(drop),
            Settle::Redeliver(delay) => {
                if let Err(error) = &result {
                    tracing::warn!(queue = self.settings.queue, %error, "RabbitMQ inbox adapter: the inbox failed; the delivery will be requeued");
                }
                let acker = delivery.acker;
                delayed.spawn(async move {
                    tokio::time::sleep(delay).await;
                    let requeue = BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    };
                    let _ = acker.nack(requeue).await;
                });
                Ok(())
            }
            Settle::Reject(reason) => {
                inbox.count_rejected();
                tracing::warn!(
                    queue = self.settings.queue,
                    dead_letters = self.dead_letter_queue(),
                    reason,
                    "RabbitMQ inbox adapter: a delivery the inbox cannot store is dead-lettered"
                );
                delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                    .map(drop)
            }
        };
        if let Err(error) = acked {
            // Unacknowledged, it is requeued when the channel closes; the inbox answers it then.
            tracing::warn!(queue = self.settings.queue, %error, "RabbitMQ inbox adapter: the ack was not sent");
        }
    }
}

/// A header's value as text: strings as they are, integers in decimal.
fn text(table: &FieldTable, name: &str) -> Option<String> {
    let value = table
        .inner()
        .iter()
        .find(|(key, _)| key.as_str() == name)
        .map(|(_, value)| value)?;
    match value {
        AMQPValue::LongString(text) => std::str::from_utf8(text.as_bytes()).ok().map(str::to_owned),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::ShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortUInt(n) => Some(n.to_string()),
        AMQPValue::Timestamp(n) => Some(n.to_string()),
        _ => None,
    }
}
