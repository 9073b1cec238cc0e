//! Opening the connection: connecting, declaring the queue with its dead letters and its
//! bindings (when asked), and starting to consume.

use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::{DEAD_LETTER_EXCHANGE, Open, RabbitInbox};
use crate::error::Result;

impl RabbitInbox {
    /// Connects, declares (when asked) and starts consuming.
    pub(super) async fn open(&self) -> Result<Open> {
        let settings = &self.settings;
        let connecting = Connection::connect(&settings.uri, ConnectionProperties::default());
        let connection = tokio::time::timeout(settings.connect_timeout, connecting)
            .await
            .map_err(|_| {
                self.broker(format!(
                    "no connection within {:?}",
                    settings.connect_timeout
                ))
            })?
            .map_err(|error| self.broker(format!("cannot connect: {error}")))?;
        let setup = async {
            let channel = connection.create_channel().await?;
            if settings.declare {
                self.declare(&channel).await?;
            } else {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                channel
                    .queue_declare(
                        settings.queue.as_str().into(),
                        passive,
                        FieldTable::default(),
                    )
                    .await?;
            }
            channel
                .basic_qos(settings.prefetch, BasicQosOptions::default())
                .await?;
            let consumer = channel
                .basic_consume(
                    settings.queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((channel, consumer))
        };
        match setup.await {
            Ok((channel, consumer)) => Ok(Open {
                connection,
                channel,
                consumer,
            }),
            Err(error) => {
                let _ = connection.close(200, "setup failed".into()).await;
                Err(self.broker(format!(
                    "setting up queue {:?}: {error}{}",
                    settings.queue,
                    if settings.declare {
                        " (a queue that exists with other arguments cannot be declared again: delete it, or turn declare off and dead-letter with a policy)"
                    } else {
                        " (with declare off, the queue must exist)"
                    }
                )))
            }
        }
    }

    /// The dead-letter exchange and queue, the queue, its bindings.
    async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let queue = self.settings.queue.as_str();
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .exchange_declare(
                DEAD_LETTER_EXCHANGE.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let dead_letters = self.dead_letter_queue();
        channel
            .queue_declare(dead_letters.as_str().into(), durable, FieldTable::default())
            .await?;
        channel
            .queue_bind(
                dead_letters.as_str().into(),
                DEAD_LETTER_EXCHANGE.into(),
                queue.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(DEAD_LETTER_EXCHANGE.into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(queue.into()),
        );
        channel
            .queue_declare(queue.into(), durable, arguments)
            .await?;
        for (exchange, routing_key) in &self.settings.bindings {
            channel
                .queue_bind(
                    queue.into(),
                    exchange.as_str().into(),
                    routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }
}
