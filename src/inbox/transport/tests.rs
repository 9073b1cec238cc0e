use super::*;

#[test]
fn a_refusal_quotes_a_hostile_header_cut_and_on_one_line() {
    let huge = format!("commit\nFORGED LINE {}", "x".repeat(10_000));
    let parts = |lane, position| Parts {
        id: Some("m-1"),
        payload: b"{}",
        lane,
        position,
        ..Parts::default()
    };
    for reason in [
        parts(Some(&huge), None).message("Nats-Msg-Id"),
        parts(None, Some(&huge)).message("Nats-Msg-Id"),
    ]
    .map(|refused| refused.err().unwrap_or_default())
    {
        assert!(reason.contains("commit\\nFORGED LINE"), "{reason}");
        assert!(reason.contains("(10019 bytes in all)"), "{reason}");
        assert!(!reason.contains('\n'), "{reason}");
        assert!(reason.len() < 200, "{} bytes", reason.len());
    }
    let json = format!("\"{huge}\"");
    let headers = Parts {
        headers: Some(&json),
        ..parts(None, None)
    };
    let reason = headers.message("Nats-Msg-Id").err().unwrap_or_default();
    assert!(
        reason.starts_with("the Ordo-Headers header is not a JSON object"),
        "{reason}"
    );
    assert!(!reason.contains('\n') && reason.len() < 400, "{reason}");
}

#[test]
fn settled_receipts_are_acknowledged_and_others_redelivered() {
    let delays = Redelivery::default()
        .busy(Duration::from_millis(10))
        .gap(Duration::from_millis(20))
        .retry_backoff(Duration::from_millis(100), Duration::from_millis(350));
    assert_eq!(settle(&Ok(Receipt::Handled), &delays), Settle::Ack);
    assert_eq!(settle(&Ok(Receipt::Duplicate), &delays), Settle::Ack);
    let failed = Receipt::Failed {
        attempts: 3,
        error: "no".into(),
    };
    assert_eq!(settle(&Ok(failed), &delays), Settle::Ack);
    let ms = Duration::from_millis;
    assert_eq!(
        settle(&Ok(Receipt::Busy), &delays),
        Settle::Redeliver(ms(10))
    );
    assert_eq!(
        settle(&Ok(Receipt::Gap { expected: 4 }), &delays),
        Settle::Redeliver(ms(20))
    );
    let retry = |attempts| Receipt::Retry {
        attempts,
        error: "no".into(),
    };
    assert_eq!(settle(&Ok(retry(1)), &delays), Settle::Redeliver(ms(100)));
    assert_eq!(settle(&Ok(retry(2)), &delays), Settle::Redeliver(ms(200)));
    assert_eq!(settle(&Ok(retry(9)), &delays), Settle::Redeliver(ms(350)));
    let refused = Error::InvalidInboxMessage {
        consumer: "c".into(),
        id: "m".into(),
        reason: "bad".into(),
    };
    assert_eq!(settle(&Err(refused), &delays), Settle::Reject("bad".into()));
    assert_eq!(
        settle(&Err(Error::Shutdown), &delays),
        Settle::Redeliver(ms(10))
    );
}

#[test]
fn ordo_headers_map_to_an_inbox_message() {
    let parts = Parts {
        id: Some("e-1"),
        payload: br#"{"n":1}"#,
        headers: Some(r#"{"traceparent":"00-abc"}"#),
        source: Some("orders-db"),
        position: Some("42"),
        lane: Some("commit"),
        history: Some("1796647812188840"),
        history_start: Some("40"),
        route: Some("orders.placed"),
        previous: Some("39"),
    };
    let message = parts.message("Nats-Msg-Id").expect("a message");
    assert_eq!(
        message.history,
        Some(crate::ServerHistory {
            id: 1_796_647_812_188_840,
            first_position: 40
        })
    );
    assert_eq!(message.route.as_deref(), Some("orders.placed"));
    assert_eq!(message.previous, Some(39));
    assert_eq!(message.id, "e-1");
    assert_eq!(message.payload, r#"{"n":1}"#);
    assert_eq!(message.source.as_deref(), Some("orders-db"));
    assert_eq!(message.position, Some(42));
    assert!(message.headers.contains_key("traceparent"));

    let insert_lane = Parts {
        lane: Some("insert"),
        ..parts
    };
    let message = insert_lane.message("Nats-Msg-Id").expect("a message");
    assert_eq!(message.position, None, "insert-lane positions have gaps");
}

#[test]
fn what_cannot_be_stored_says_why() {
    let no_id = Parts {
        payload: b"{}",
        ..Parts::default()
    };
    let why = no_id.message("message_id").expect_err("no id");
    assert!(why.contains("message_id"), "{why}");
    let binary = Parts {
        id: Some("m"),
        payload: &[0xff, 0xfe],
        ..Parts::default()
    };
    assert!(binary.message("x").is_err());
    let bad_position = Parts {
        id: Some("m"),
        payload: b"{}",
        source: Some("s"),
        position: Some("minus one"),
        ..Parts::default()
    };
    assert!(bad_position.message("x").is_err());
    let bad_headers = Parts {
        id: Some("m"),
        payload: b"{}",
        headers: Some("[1,2]"),
        ..Parts::default()
    };
    assert!(bad_headers.message("x").is_err());
    let half_a_history = Parts {
        id: Some("m"),
        payload: b"{}",
        source: Some("s"),
        position: Some("5"),
        history: Some("2"),
        ..Parts::default()
    };
    let why = half_a_history.message("x").expect_err("no start");
    assert!(why.contains("Ordo-History-Start"), "{why}");
    let hostile = "2\nFORGED".repeat(50);
    let bad_history = Parts {
        history_start: Some("1"),
        history: Some(&hostile),
        ..half_a_history
    };
    let why = bad_history.message("x").expect_err("not a number");
    assert!(!why.contains('\n') && why.len() < 200, "{why}");
}
