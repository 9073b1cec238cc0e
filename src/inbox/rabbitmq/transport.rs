//! The RabbitMQ side of the adapters' run loop: one delivery's parts read from the AMQP
//! properties and headers, its ack, delayed requeue or dead-lettering, and the connection's
//! making, remaking and clean closing.

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio::task::JoinSet;

use super::{Open, RabbitInbox};
use crate::error::Result;
use crate::inbox::adapter::Transport;
use crate::inbox::transport::{Parts, Redelivery, Settle};
use crate::wire::rabbitmq as wire;

/// The open connection (none after it failed, until it is made again) and the deliveries
/// waiting out their redelivery delay before their nack.
pub(crate) struct Session {
    open: Option<Open>,
    delayed: JoinSet<()>,
}

impl Transport for RabbitInbox {
    const BROKER: &'static str = "RabbitMQ";
    const ID_HEADER: &'static str = "message_id";
    type Session = Session;
    type Message = Delivery;

    fn consumer(&self) -> &str {
        &self.settings.queue
    }

    fn redelivery(&self) -> &Redelivery {
        &self.settings.redelivery
    }

    fn rejected(&self) -> String {
        format!("dead-lettered to {}", self.dead_letter_queue())
    }

    async fn start(&self) -> Result<Session> {
        Ok(Session {
            open: Some(self.open().await?),
            delayed: JoinSet::new(),
        })
    }

    /// A new connection. The deliveries of the lost one are requeued by the broker; their
    /// nacks are void.
    async fn resume(&self, session: &mut Session) -> Result<()> {
        session.delayed.abort_all();
        session.open = None;
        session.open = Some(self.open().await?);
        Ok(())
    }

    async fn next(&self, session: &mut Session) -> Option<std::result::Result<Delivery, String>> {
        while session.delayed.try_join_next().is_some() {}
        let open = session.open.as_mut()?;
        let next = open.consumer.next().await?;
        Some(next.map_err(|error| error.to_string()))
    }

    fn parts<R>(delivery: &Delivery, read: impl FnOnce(Parts<'_>) -> R) -> R {
        let headers = delivery.properties.headers().as_ref();
        let header = |name: &str| headers.and_then(|table| text(table, name));
        let (source, position, lane, ordo_headers) = (
            header(wire::SOURCE),
            header(wire::POSITION),
            header(wire::LANE),
            header(wire::HEADERS),
        );
        let (history, history_start) = (header(wire::HISTORY), header(wire::HISTORY_START));
        let (route, previous) = (header(wire::ROUTE), header(wire::PREVIOUS));
        read(Parts {
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
            history: history.as_deref(),
            history_start: history_start.as_deref(),
            route: route.as_deref(),
            previous: previous.as_deref(),
        })
    }

    async fn settle(
        &self,
        session: &mut Session,
        delivery: Delivery,
        settle: Settle,
    ) -> std::result::Result<(), String> {
        let acked = match settle {
            Settle::Ack => delivery.ack(BasicAckOptions::default()).await.map(drop),
            Settle::Redeliver(delay) => {
                // A nack with requeue once the delay is over; the delivery holds its prefetch
                // slot until then.
                let acker = delivery.acker;
                session.delayed.spawn(async move {
                    tokio::time::sleep(delay).await;
                    let requeue = BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    };
                    let _ = acker.nack(requeue).await;
                });
                Ok(())
            }
            Settle::Reject(_) => delivery
                .reject(BasicRejectOptions { requeue: false })
                .await
                .map(drop),
        };
        acked.map_err(|error| error.to_string())
    }

    /// After the cancel, the consumer yields what the broker sent before it, then ends. Those
    /// waiting out a redelivery delay go back to the queue as the channel closes.
    async fn cancel(&self, session: &mut Session) -> bool {
        session.delayed.abort_all();
        let Some(open) = session.open.as_ref() else {
            return false;
        };
        open.channel
            .basic_cancel(open.consumer.tag(), BasicCancelOptions::default())
            .await
            .is_ok()
    }

    /// The channel and the connection closed, after the acks.
    async fn close(&self, mut session: Session) {
        session.delayed.abort_all();
        if let Some(open) = session.open {
            let _ = open
                .channel
                .close(200, "inbox adapter stopping".into())
                .await;
            let _ = open
                .connection
                .close(200, "inbox adapter stopping".into())
                .await;
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
