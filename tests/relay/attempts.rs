//! What holds a relay, and an event's attempt history: a parked event that holds its key is
//! reported as the relay's held head (its key, position, since when, its error), and
//! `ordo relay attempts` / `ordo::admin::relay_attempts` answer "was this event sent, when,
//! and why not" with each failed attempt's time, error, host and pid, by position or event id.
#![cfg(all(feature = "cli", feature = "http"))]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::TestDb;
use common::http_responder::{Reply, Responder};
use common::keyed::{Parcel, publish};
use common::relays::{config, keys, parcels, relayed};
use common::subscribers::PATIENCE;
use ordo::relay::http::WebhookSink;
use ordo::relay::{RelayEvent, RelayEventState};
use ordo::{Outbox, OutboxConfig};

const SECRET: &[u8] = b"an attempts secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_head_is_reported_and_its_attempts_say_when_and_why() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    // Parcel 1 (position 2, key k1) is refused while `refusing`; everything else is taken.
    let refusing = Arc::new(AtomicBool::new(true));
    let refuse = Arc::clone(&refusing);
    let responder = Responder::with_rule(move |request| {
        let parcel: Parcel = serde_json::from_slice(&request.body).ok()?;
        (parcel.id == 1 && refuse.load(Ordering::SeqCst))
            .then(|| Reply::status(400).with_header("content-type", "text/plain"))
    })
    .await;
    let sink = WebhookSink::builder(responder.url("/hook"), SECRET)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("hist"), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 20)).await;

    // The relay's status names the parked event that holds its key (in the key's backlog, it
    // no longer holds the relay's position).
    let (status, held) = relay
        .wait_for(PATIENCE, |status| !status.stalled.is_empty())
        .await;
    assert!(held, "no parked head reported: {status:?}");
    let head = &status.stalled[0];
    assert!(!head.holds_watermark, "{head:?}");
    assert_eq!((head.key.as_str(), head.position.get()), ("k1", 2));
    assert!(head.since.is_some(), "{head:?}");
    assert!(head.error.contains("400"), "{head:?}");
    // So do the database's readers (`ordo subscriptions`, `ordo relay parked`), once the
    // relay stored what it delivered before it.
    let stored = common::eventually(PATIENCE, || async {
        let stored = ordo::admin::list_stalled_keys(&db.pool, "hist")
            .await
            .expect("stalled keys");
        stored
            .iter()
            .any(|key| key.position.get() == 2 && !key.holds_watermark && key.since.is_some())
    })
    .await;
    assert!(
        stored,
        "the stored parked head is not reported as holding the relay"
    );

    // The library answer: parked, one attempt, by this process.
    let found = ordo::admin::relay_attempts(&db.pool, "hist", RelayEvent::Position(2))
        .await
        .expect("attempts");
    assert_eq!(found.state, RelayEventState::Parked);
    assert_eq!(found.attempts.len(), 1, "{found:?}");
    let attempt = &found.attempts[0];
    assert_eq!(attempt.attempt, 1);
    assert!(
        attempt.parked && attempt.error.contains("400"),
        "{attempt:?}"
    );
    assert_eq!(attempt.pid, std::process::id());
    assert!(!attempt.host.is_empty());
    let id = found.event_id.expect("the event's id");

    // The operator's answer, by position and by id.
    let (ok, out, err) = db.ordo(&["relay", "attempts", "hist", "2"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("parked") && out.contains(&id.to_string()),
        "{out}"
    );
    assert!(out.contains(&std::process::id().to_string()), "{out}");
    let (ok, out, err) = db.ordo(&["relay", "attempts", "hist", &id.to_string(), "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(json["state"], "parked");
    assert_eq!(json["attempts"][0]["pid"], std::process::id());
    let (ok, _, err) = db.ordo(&["relay", "attempts", "hist", "not-an-event"]);
    assert!(
        !ok && err.contains("neither a position nor an event id"),
        "{err}"
    );

    // Requeued and delivered: the history stays, the state says delivered.
    refusing.store(false, Ordering::SeqCst);
    ordo::admin::retry_stalled_keys(&db.pool, "hist", Some("k1"))
        .await
        .expect("requeue");
    relayed(&relay, &db.pool, 20).await;
    relay.shutdown().await;
    let found = ordo::admin::relay_attempts(&db.pool, "hist", RelayEvent::Id(id))
        .await
        .expect("attempts");
    assert_eq!(found.state, RelayEventState::Delivered);
    assert_eq!(found.attempts.len(), 1, "{found:?}");
    let (ok, out, _) = db.ordo(&["relay", "attempts", "hist", "3"]);
    assert!(
        ok && out.contains("delivered") && out.contains("no failed attempt"),
        "{out}"
    );
}

/// `ordo relay run` whose only obstacle is a parked head: it says so once (then every minute),
/// and never "nothing delivered ... although events wait", which is for a stall of no known
/// cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_relay_logs_a_parked_head_once_not_nothing_delivered_every_period() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let responder = Responder::with_rule(|request| {
        let parcel: Parcel = serde_json::from_slice(&request.body).ok()?;
        (parcel.id == 1).then(|| Reply::status(400))
    })
    .await;
    publish(&outbox, parcels(0, 20)).await;
    let url = responder.url("/hook");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args([
            "relay",
            "run",
            "held",
            "--sink",
            "webhook",
            "--key-from",
            "payload:/keys/0",
            "--batch-size",
            "20",
            "--per-event-budget",
            "25ms",
            "--batch-deadline",
            "600ms",
            "--lease",
            "3s",
            "--backoff-initial",
            "5ms",
            "--backoff-max",
            "50ms",
            "--progress",
            "1s",
        ])
        .env("DATABASE_URL", &db.url)
        .env("ORDO_RELAY_URL", &url)
        .env("ORDO_WEBHOOK_SECRET", "an attempts test secret")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ordo relay run");
    let stderr = child.stderr.take().expect("stderr");
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut log: Vec<String> = Vec::new();
    let until = std::time::Instant::now() + PATIENCE;
    while !log
        .iter()
        .any(|line: &String| line.contains("a parked event holds"))
    {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match seen.recv_timeout(left) {
            Ok(line) => log.push(plain(&line)),
            Err(_) => break,
        }
    }
    // Four progress periods more (1 s, the shortest `--progress`): the head is not logged
    // again, nor is "nothing delivered".
    std::thread::sleep(std::time::Duration::from_secs(4));
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    log.extend(seen.try_iter().map(|line| plain(&line)));
    let held: Vec<&String> = log
        .iter()
        .filter(|line| line.contains("a parked event holds"))
        .collect();
    assert_eq!(held.len(), 1, "{log:#?}");
    assert!(
        held[0].contains("k1") && held[0].contains("position=2") && held[0].contains("400"),
        "{}",
        held[0]
    );
    assert!(
        !log.iter().any(|line| line.contains("nothing delivered")),
        "{log:#?}"
    );
}

/// `line` without its terminal colours (`ESC [ ... m`).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
