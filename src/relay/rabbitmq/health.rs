//! The sink's probe ([`Sink::probe`](crate::relay::Sink::probe)), and whose fault a channel
//! the broker closed is.

use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::{ErrorKind, ExchangeKind};

use super::{RabbitSink, SendError};

/// How the broker's closing of a channel weighs on one unconfirmed message of it.
pub(super) enum Closed {
    /// The message's destination cannot take it (a missing exchange, refused permissions):
    /// the sink's fault.
    Unavailable(SendError),
    /// Another message closed the channel, or no one can tell which: the message has no
    /// outcome (released without an attempt, its next batch halved until, alone, a message
    /// that closes the channel by itself is blamed).
    Unknown,
}

impl RabbitSink {
    /// A channel opened on the connection the last batch used (a new connection when there is
    /// none) and, with the default route, the exchange checked (a passive declare): answered
    /// within the confirm timeout, the broker takes this sink's messages.
    pub(super) async fn health(&mut self) -> Result<(), SendError> {
        let bound = self.confirm_timeout;
        let exchange = self.exchange.clone();
        let connection = match &self.connection {
            Some(open) if open.connection.status().connected() => &open.connection,
            _ => {
                self.connection = None;
                self.channel().await?;
                match &self.connection {
                    Some(open) => &open.connection,
                    None => return Err(SendError::transient("no RabbitMQ connection")),
                }
            }
        };
        let asked = async {
            let channel = connection
                .create_channel()
                .await
                .map_err(|error| format!("opening a channel: {error}"))?;
            if let Some(exchange) = exchange.filter(|name| !name.is_empty()) {
                let passive = ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                };
                // A missing exchange closes this channel, not the sink's.
                channel
                    .exchange_declare(
                        exchange.as_str().into(),
                        ExchangeKind::Topic,
                        passive,
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|error| {
                        format!(
                            "checking exchange {}: {error}",
                            crate::relay::quoted(&exchange)
                        )
                    })?;
            }
            let _ = channel.close(200, "probed".into()).await;
            Ok::<(), String>(())
        };
        match tokio::time::timeout(bound, asked).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(SendError::transient(why)),
            Err(_) => Err(SendError::transient(format!(
                "the broker did not answer within the confirm timeout ({bound:?})"
            ))),
        }
    }
}

/// What a channel closed by the broker with `error` means for an unconfirmed message
/// published to `exchange`: a `NOT_FOUND` naming that exchange, or an `ACCESS_REFUSED`, is the
/// destination's; anything else (a `PRECONDITION_FAILED` for an oversized message, a
/// `NOT_FOUND` naming another exchange) is unknown for this message.
pub(super) fn closed(error: &lapin::Error, exchange: &str) -> Closed {
    let ErrorKind::ProtocolError(amqp) = error.kind() else {
        return Closed::Unknown;
    };
    let text = amqp.get_message().as_str();
    let unavailable = |why: String| {
        Closed::Unavailable(SendError::Unavailable {
            message: why,
            retry_after: super::UNAVAILABLE_PAUSE.mul_f64(0.5 + fastrand::f64()),
        })
    };
    match amqp.get_id() {
        // "NOT_FOUND - no exchange 'orders' in vhost '/'"
        404 if missing_exchange(text) == Some(exchange) => unavailable(format!(
            "the exchange {} does not exist: the broker closed the channel: {error}",
            crate::relay::quoted(exchange)
        )),
        403 => unavailable(format!("the broker refused this client: {error}")),
        _ => Closed::Unknown,
    }
}

/// The exchange a `NOT_FOUND` close names, from RabbitMQ's text.
fn missing_exchange(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once("no exchange '")?;
    let (name, _) = rest.split_once("' in vhost")?;
    Some(name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_not_found_close_names_its_exchange() {
        let text = "NOT_FOUND - no exchange 'orders' in vhost '/'";
        assert_eq!(super::missing_exchange(text), Some("orders"));
        assert_eq!(super::missing_exchange("NOT_FOUND - no queue 'q'"), None);
    }
}
