#!/usr/bin/env bash
# One stuck key, from outside, with the CLI alone: `ordo relay run` to a webhook keyed by
# `payload:/k`; the first event (key "stuck") is answered 400 and parked; then EVENTS events
# on KEYS other keys, one in every STUCK_EVERY of the stuck key, are written by plain SQL in
# transactions of 1,000, with a sequencer (`ordo fold`) running beside. Prints, as the relay goes: delivered, the stuck key's backlog, the
# relay's resident memory (RSS); runs `ordo retention --apply --keep 0s` meanwhile; then heals
# the endpoint, requeues the key, and checks every event was delivered once, in order per key.
#
#   benches/stuck_key/run.sh            (DATABASE_URL names a server; a scratch database is made)
#   EVENTS=100000 KEYS=1000 STUCK_EVERY=100 benches/stuck_key/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
EVENTS=${EVENTS:-100000}
KEYS=${KEYS:-1000}
STUCK_EVERY=${STUCK_EVERY:-100}
PORT=${PORT:-18555}
SERVER=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
DB="ordo_stuck_key_$$"
WORK=$(mktemp -d)
URL="${SERVER%/*}/$DB"
psql "$SERVER" -qc "CREATE DATABASE $DB"
# Partitions of 10,000 sequences, so that retention has whole partitions to drop meanwhile.
psql "$SERVER" -qc "ALTER DATABASE $DB SET ordo.partition_size = '10000'"
cleanup() {
    kill "${RELAY:-}" "${RECEIVER:-}" "${FOLD:-}" 2>/dev/null || true
    wait 2>/dev/null || true
    psql "$SERVER" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
    rm -rf "$WORK"
}
trap cleanup EXIT
cargo build --release --quiet --features cli,http --bin ordo
ORDO=target/release/ordo
DATABASE_URL=$URL $ORDO migrate >/dev/null
# A sequencer, as a deployment runs one: retention drops only what the commit lane has logged.
DATABASE_URL=$URL $ORDO fold --progress 0 2>"$WORK/fold.log" &
FOLD=$!
python3 benches/stuck_key/receiver.py --port "$PORT" --log "$WORK/delivered" --heal "$WORK/healed" &
RECEIVER=$!
sleep 0.5
psql "$URL" -qc "INSERT INTO ordo.events (payload) VALUES ('{\"k\": \"stuck\", \"n\": 0}')"
ORDO_WEBHOOK_SECRET=stuck-key-bench-secret-0123456789 DATABASE_URL=$URL $ORDO relay run hooks --sink webhook \
    --url "http://127.0.0.1:$PORT/events" --key-from payload:/k --lane insert \
    --max-attempts 1 --progress 0 2>"$WORK/relay.log" &
RELAY=$!
rss() { awk '/VmRSS/ {print $2}' "/proc/$RELAY/status"; }
delivered() { wc -l < "$WORK/delivered"; }
backlog() { psql "$URL" -tAc "SELECT count(*) FROM ordo.key_backlogs"; }
until [ "$(backlog)" = 1 ]; do
    if ! kill -0 "$RELAY" 2>/dev/null; then echo "the relay exited"; cat "$WORK/relay.log"; exit 1; fi
    sleep 0.2
done
echo "parked: the stuck key's first event is in its backlog; RSS $(rss) KiB"
start=$(date +%s.%N)
# Transactions of 1,000 sequences that end at multiples of 1,000 (the first event took
# sequence 1), so none straddles a partition boundary and retention may drop whole partitions.
written=0
size=999
while [ "$written" -lt "$EVENTS" ]; do
    upto=$((written + size > EVENTS ? EVENTS : written + size))
    psql "$URL" -qc "INSERT INTO ordo.events (payload)
        SELECT jsonb_build_object('k', CASE WHEN g % $STUCK_EVERY = 0 THEN 'stuck' ELSE 'k' || (g % $KEYS) END, 'n', g)
        FROM generate_series($written + 1, $upto) AS g"
    written=$upto
    size=1000
done
stuck_total=$((EVENTS / STUCK_EVERY))
healthy=$((EVENTS - stuck_total))
echo "written: $EVENTS events ($healthy on $KEYS keys, $stuck_total more of the stuck key)"
retained=0
mark=10000
while [ "$(delivered)" -lt "$healthy" ]; do
    if ! kill -0 "$RELAY" 2>/dev/null; then echo "the relay exited"; cat "$WORK/relay.log"; exit 1; fi
    if [ "$(delivered)" -ge "$mark" ]; then
        echo "delivered $(delivered), backlog $(backlog), RSS $(rss) KiB"
        mark=$((mark * 10))
    fi
    if [ "$retained" = 0 ] && [ "$(delivered)" -ge $((healthy / 2)) ]; then
        DATABASE_URL=$URL $ORDO retention --apply --keep 0s >"$WORK/retention" && retained=1
        echo "retention --apply --keep 0s ran at $(delivered) delivered: events left $(psql "$URL" -tAc 'SELECT count(*) FROM ordo.events'), backlog $(backlog)"
        sed -n '1,6p' "$WORK/retention"
    fi
    sleep 0.2
done
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
echo "delivered $(delivered) healthy events in ${elapsed}s, backlog $(backlog), RSS $(rss) KiB"
touch "$WORK/healed"
DATABASE_URL=$URL $ORDO subscriptions retry-keys hooks stuck >/dev/null 2>&1
until [ "$(delivered)" -ge "$EVENTS" ] && [ "$(backlog)" = 0 ]; do sleep 0.2; done
echo "requeued: delivered $(delivered), backlog $(backlog), RSS $(rss) KiB"
python3 - "$WORK/delivered" "$EVENTS" <<'PY'
import sys
ids, last, total = set(), {}, int(sys.argv[2])
for line in open(sys.argv[1]):
    event_id, key, n = line.split()
    assert event_id not in ids, f"delivered twice: {line}"
    ids.add(event_id)
    assert last.get(key, -1) < int(n), f"key {key} out of order at {n}"
    last[key] = int(n)
assert len(ids) == total + 1, f"{len(ids)} delivered, {total + 1} written"
print(f"checked: {len(ids)} events, each once, in order per key")
PY
