//! The routing settings of [`RelayConfig`]: its destination and header templates, the payload's
//! form and the envelope.

use std::sync::Arc;

use super::{PayloadForm, Template};
use crate::relay::{Format, RelayConfig};

impl RelayConfig {
    /// Where each event goes, from a [`Template`] over the event: the NATS subject, the Kafka
    /// topic, the RabbitMQ routing key (on the sink's exchange) or the path after the webhook's
    /// URL, used by each built-in sink's default routing instead of its own (`{prefix}.{type}`,
    /// the sink's topic, the event type, the URL itself). Default: none (the sink's own).
    ///
    /// A template that does not parse refuses the relay's start (`Error::InvalidConfig`,
    /// setting `destination`, pointing at the mistake); a field one event lacks, or a
    /// destination its broker cannot take (a space in a subject, a character a topic name
    /// cannot hold), parks that event and no other. A sink given a routing function of its
    /// own (`NatsSinkBuilder::subject`, ...) uses that instead.
    ///
    /// ```
    /// use ordo::relay::RelayConfig;
    ///
    /// // Debezium's outbox router: the topic from the aggregate type.
    /// let config = RelayConfig::new("outbox").destination("outbox.event.{payload:/aggregate_type}");
    /// ```
    pub fn destination(mut self, template: impl AsRef<str>) -> Self {
        self.routing.destination = Some(Template::parse(template.as_ref()).map(Arc::new));
        self
    }

    /// Sends a header `name` with every message, its value from a [`Template`] over the event
    /// (`.header("tenant", "{payload:/tenant_id}")`). Names are 1 to 64 of `A-Z a-z 0-9 - _ .`,
    /// none twice, none the sinks write themselves (`Ordo-*`, `ce-*`, `webhook-*`,
    /// `Content-Type`, `traceparent`): refused at start-up otherwise. A value with a control
    /// character or over [`MAX_HEADER_VALUE`](super::MAX_HEADER_VALUE) bytes, or a field the
    /// event lacks (without a `|default`), parks that event.
    ///
    /// ```
    /// let config = ordo::relay::RelayConfig::new("orders-out")
    ///     .header("tenant", "{payload:/tenant_id}")
    ///     .header("region", "{header:region|eu}");
    /// ```
    pub fn header(mut self, name: impl Into<String>, template: impl AsRef<str>) -> Self {
        let parsed = Template::parse(template.as_ref()).map(Arc::new);
        self.routing.headers.push((name.into(), parsed));
        self
    }

    /// How each payload is sent: as stored (the default) or expanded from a JSON string that
    /// holds a document ([`PayloadForm`]).
    pub fn payload(mut self, form: PayloadForm) -> Self {
        self.routing.payload = form;
        self
    }

    /// The envelope of the relay's messages: ordo's own headers (the default) or CloudEvents
    /// in binary or structured content mode ([`Format`]). Each built-in sink learns it when
    /// the relay starts ([`SinkTiming::format`](crate::relay::SinkTiming::format)).
    ///
    /// ```
    /// use ordo::relay::{Format, RelayConfig};
    ///
    /// let config = RelayConfig::new("orders-out").format(Format::CloudEventsBinary);
    /// ```
    pub fn format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }
}
