"""Checks messages ordo's sinks sent with the reference libraries of the standards they claim:
the CloudEvents Python SDK (`cloudevents`) for HTTP, Kafka and AMQP (binary and structured),
the NATS messages through the JSON event format and the HTTP binding's header mapping (the SDK
has no NATS binding; NATS's binary mode uses the same `ce-` headers), and Standard Webhooks
signatures with the `standardwebhooks` library, for every secret of a rotation.

Reads a JSON list of cases on stdin (written by tests/relay/envelopes.rs); exits non-zero naming the
first case that fails, and prints `N passed, 0 failed` otherwise.
"""

import base64
import json
import sys

from cloudevents.core.bindings import amqp, http, kafka
from cloudevents.core.formats.json import JSONFormat
from standardwebhooks import Webhook


def check_event(case, event):
    expect = case["expect"]
    got = {
        "specversion": event.get_specversion(),
        "id": event.get_id(),
        "source": event.get_source(),
        "type": event.get_type(),
        "datacontenttype": event.get_datacontenttype(),
    }
    for name, value in got.items():
        assert value == expect[name], f"{name}: {value!r} != {expect[name]!r}"
    assert event.get_time() is not None, "time"
    assert event.get_data() == expect["data"], f"data: {event.get_data()!r}"
    key = event.get_extension("partitionkey")
    assert key == expect.get("partitionkey"), f"partitionkey: {key!r}"


def cloudevent(case, body):
    binding, headers = case["binding"], case["headers"]
    if binding == "http" or (binding == "nats" and case["mode"] == "binary"):
        return http.from_http(http.HTTPMessage(headers=headers, body=body), JSONFormat())
    if binding == "nats":
        return JSONFormat().read(None, body)
    if binding == "kafka":
        encoded = {name: value.encode() for name, value in headers.items()}
        key = case.get("key")
        message = kafka.KafkaMessage(
            headers=encoded, key=key.encode() if key else None, value=body
        )
        return kafka.from_kafka(message, JSONFormat())
    if binding == "amqp":
        message = amqp.AMQPMessage(
            properties={"content-type": case["content_type"]},
            application_properties=headers,
            application_data=body,
        )
        if case["mode"] == "binary":
            return amqp.from_binary(message, JSONFormat())
        return amqp.from_structured(message, JSONFormat())
    raise AssertionError(f"unknown binding {binding}")


def check_webhook(case, body):
    headers = case["headers"]
    for secret in case["secrets"]:
        Webhook(secret).verify(body, headers)
    try:
        Webhook(case["wrong"]).verify(body, headers)
    except Exception:
        pass
    else:
        raise AssertionError("a wrong secret verified")


def main():
    cases = json.load(sys.stdin)
    for case in cases:
        body = base64.b64decode(case["body_b64"])
        try:
            if case["binding"] == "standard-webhooks":
                check_webhook(case, body)
            else:
                check_event(case, cloudevent(case, body))
        except Exception as error:
            print(f"FAILED {case['name']}: {type(error).__name__}: {error}")
            sys.exit(1)
    print(f"{len(cases)} passed, 0 failed")


if __name__ == "__main__":
    main()
