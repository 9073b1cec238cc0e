//! The broker adapters' one run loop: receive a message, take it through the inbox, settle it
//! with the broker; reconnect when the broker fails; stop cleanly on shutdown. What differs
//! between brokers (connecting, reading a message's parts, acknowledging) is a [`Transport`].

use std::future::Future;
use std::time::Duration;

use super::Inbox;
use super::handler::InboxHandler;
use super::transport::{Parts, Redelivery, Settle, settle};
use crate::error::Result;

/// How long the adapter waits before setting its consumer up again after it failed.
const RESUME_AFTER: Duration = Duration::from_secs(1);

/// How long a stopping adapter waits for each message the broker sent before the stop.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// One broker, as an adapter's run loop sees it.
pub(crate) trait Transport {
    /// The broker's name in logs: `NATS`, `RabbitMQ`.
    const BROKER: &'static str;
    /// The header or property that carries a message's id, for the refusal of one without.
    const ID_HEADER: &'static str;

    /// What the adapter holds while it runs: the connection and what it consumes through.
    type Session;
    /// One message as the broker hands it over.
    type Message;

    /// What the logs name the adapter by: the durable consumer, the queue.
    fn consumer(&self) -> &str;

    /// When messages the inbox did not settle are delivered again.
    fn redelivery(&self) -> &Redelivery;

    /// What a message the inbox cannot store becomes, for the log: `terminated`,
    /// `dead-lettered to billing.dlq`.
    fn rejected(&self) -> String;

    /// Connects and sets the consumer up. A failure here ends the run: the start is where a
    /// wrong URL or a missing stream or queue is reported.
    fn start(&self) -> impl Future<Output = Result<Self::Session>>;

    /// Sets the consumer up again after it failed; on an error the loop waits and tries again.
    fn resume(&self, session: &mut Self::Session) -> impl Future<Output = Result<()>>;

    /// The next message; `None` when the broker ended the consumer, an error when it failed.
    fn next(
        &self,
        session: &mut Self::Session,
    ) -> impl Future<Output = Option<std::result::Result<Self::Message, String>>>;

    /// Hands `message`'s parts to `read`.
    fn parts<R>(message: &Self::Message, read: impl FnOnce(Parts<'_>) -> R) -> R;

    /// Tells the broker what the inbox answered.
    fn settle(
        &self,
        session: &mut Self::Session,
        message: Self::Message,
        settle: Settle,
    ) -> impl Future<Output = std::result::Result<(), String>>;

    /// Asks the broker to send no more. `true` when it then yields what it sent before, and
    /// ends: the loop settles those before [`close`](Self::close).
    fn cancel(&self, session: &mut Self::Session) -> impl Future<Output = bool>;

    /// Sends what is still to send and closes.
    fn close(&self, session: Self::Session) -> impl Future<Output = ()>;
}

/// Receives messages through `transport` into `inbox`, handled by `handler`, one at a time,
/// until `shutdown` completes. A lost connection or a failed consumer is logged and set up
/// again; only the start's failure is returned.
pub(crate) async fn run<T: Transport, H: InboxHandler>(
    transport: &T,
    inbox: &Inbox,
    handler: &H,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    // A pool this inbox cannot run on is refused here, once, not redelivered for ever.
    inbox.statements(inbox.locks_rows()).await?;
    let mut session = transport.start().await?;
    tracing::info!(
        consumer = inbox.config().consumer(),
        from = transport.consumer(),
        "inbox adapter consuming from {}",
        T::BROKER
    );
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        loop {
            let next = tokio::select! {
                () = &mut shutdown => return stop(transport, session, inbox, handler).await,
                next = transport.next(&mut session) => next,
            };
            match next {
                Some(Ok(message)) => {
                    deliver(transport, &mut session, inbox, handler, message).await
                }
                Some(Err(error)) => {
                    tracing::warn!(from = transport.consumer(), %error, "{} inbox adapter: receiving failed; setting the consumer up again", T::BROKER);
                    break;
                }
                None => {
                    tracing::warn!(
                        from = transport.consumer(),
                        "{} inbox adapter: the broker ended the consumer; setting it up again",
                        T::BROKER
                    );
                    break;
                }
            }
        }
        loop {
            tokio::select! {
                () = &mut shutdown => return stop(transport, session, inbox, handler).await,
                () = tokio::time::sleep(RESUME_AFTER) => {}
            }
            match transport.resume(&mut session).await {
                Ok(()) => break,
                Err(error) => {
                    tracing::warn!(from = transport.consumer(), %error, "{} inbox adapter: cannot set the consumer up; trying again", T::BROKER);
                }
            }
        }
    }
}

/// One message through the inbox, then what the broker is told.
async fn deliver<T: Transport, H: InboxHandler>(
    transport: &T,
    session: &mut T::Session,
    inbox: &Inbox,
    handler: &H,
    message: T::Message,
) {
    let read = T::parts(&message, |parts| {
        parts
            .message(T::ID_HEADER)
            .map_err(|reason| inbox.refused(parts.id, reason))
    });
    let result = match read {
        Ok(inbox_message) => inbox.receive(&inbox_message, handler).await,
        Err(refused) => Err(refused),
    };
    let settle = settle(&result, transport.redelivery());
    match (&settle, &result) {
        (Settle::Redeliver(_), Err(error)) => {
            tracing::warn!(from = transport.consumer(), %error, "{} inbox adapter: the inbox failed; the message will be delivered again", T::BROKER);
        }
        (Settle::Reject(reason), _) => {
            inbox.count_rejected();
            tracing::warn!(
                from = transport.consumer(),
                reason,
                "{} inbox adapter: a message the inbox cannot store is {}",
                T::BROKER,
                transport.rejected()
            );
        }
        _ => {}
    }
    if let Err(error) = transport.settle(session, message, settle).await {
        // Unacknowledged, the broker delivers it again, and the inbox answers it from its record.
        tracing::warn!(from = transport.consumer(), %error, "{} inbox adapter: the ack was not sent", T::BROKER);
    }
}

/// A clean stop: no more messages; the ones the broker sent before the stop are settled, so
/// that a stop leaves nothing to redeliver; then the acks are sent and the connection closed.
async fn stop<T: Transport, H: InboxHandler>(
    transport: &T,
    mut session: T::Session,
    inbox: &Inbox,
    handler: &H,
) -> Result<()> {
    if transport.cancel(&mut session).await {
        while let Ok(Some(Ok(message))) =
            tokio::time::timeout(DRAIN_PATIENCE, transport.next(&mut session)).await
        {
            deliver(transport, &mut session, inbox, handler, message).await;
        }
    }
    transport.close(session).await;
    Ok(())
}
