//! The scheduler's rules, checked without a database: order per key under random completion
//! orders, keyless events, barriers, stalls that hold only their own keys, and the watermark.

use super::*;

fn keys(names: &[&str]) -> Keys {
    names.iter().copied().collect()
}

fn pending() -> Arrival {
    Arrival::Pending { attempts: 0 }
}

fn drain_ready(lanes: &mut Lanes<u64>) -> Vec<u64> {
    let mut started = Vec::new();
    while let Some((_, entry)) = lanes.take_ready() {
        started.push(entry.position);
    }
    started
}

#[test]
fn events_of_one_key_run_one_at_a_time_and_other_keys_do_not_wait() {
    let mut lanes = Lanes::new(0);
    lanes.push(1, keys(&["a"]), false, 1, pending());
    lanes.push(2, keys(&["a"]), false, 2, pending());
    lanes.push(3, keys(&["b"]), false, 3, pending());
    lanes.push(4, Keys::none(), false, 4, pending());
    assert_eq!(drain_ready(&mut lanes), [1, 3, 4]);
    assert!(lanes.complete(lanes.find(1).unwrap()));
    assert_eq!(drain_ready(&mut lanes), [2]);
    assert_eq!(lanes.watermark(), 1);
}

#[test]
fn an_event_with_two_keys_joins_their_lanes() {
    let mut lanes = Lanes::new(0);
    lanes.push(1, keys(&["a"]), false, 1, pending());
    lanes.push(2, keys(&["a", "b"]), false, 2, pending());
    // Held by 2, which waits in lane a: order holds transitively.
    lanes.push(3, keys(&["b"]), false, 3, pending());
    lanes.push(4, keys(&["c"]), false, 4, pending());
    assert_eq!(drain_ready(&mut lanes), [1, 4]);
    lanes.complete(lanes.find(1).unwrap());
    assert_eq!(drain_ready(&mut lanes), [2]);
    lanes.complete(lanes.find(2).unwrap());
    assert_eq!(drain_ready(&mut lanes), [3]);
}

#[test]
fn a_stalled_event_holds_only_its_own_keys_until_retried() {
    let mut lanes = Lanes::new(0);
    lanes.push(1, keys(&["a"]), false, 1, pending());
    lanes.push(2, keys(&["b"]), false, 2, pending());
    lanes.push(3, keys(&["a"]), false, 3, pending());
    lanes.push(4, keys(&["b"]), false, 4, pending());
    assert_eq!(drain_ready(&mut lanes), [1, 2]);
    lanes.stall(lanes.find(1).unwrap(), 3, "boom".into());
    lanes.complete(lanes.find(2).unwrap());
    assert_eq!(drain_ready(&mut lanes), [4]);
    lanes.complete(lanes.find(4).unwrap());
    assert_eq!(
        lanes.watermark(),
        0,
        "the stalled event holds the watermark"
    );
    assert_eq!(
        lanes
            .stalled()
            .map(|entry| entry.position)
            .collect::<Vec<_>>(),
        [1]
    );
    lanes.retry(lanes.find(1).unwrap());
    assert_eq!(drain_ready(&mut lanes), [1]);
    lanes.complete(lanes.find(1).unwrap());
    assert_eq!(drain_ready(&mut lanes), [3]);
    lanes.complete(lanes.find(3).unwrap());
    assert_eq!(lanes.watermark(), 4);
    assert_eq!(lanes.len(), 0);
}

#[test]
fn a_barrier_waits_for_everything_before_it_and_holds_everything_after_it() {
    let mut lanes = Lanes::new(0);
    lanes.push(1, keys(&["a"]), false, 1, pending());
    lanes.push(2, Keys::none(), true, 2, pending());
    lanes.push(3, keys(&["b"]), false, 3, pending());
    lanes.push(4, Keys::none(), false, 4, pending());
    assert_eq!(drain_ready(&mut lanes), [1]);
    lanes.complete(lanes.find(1).unwrap());
    assert_eq!(drain_ready(&mut lanes), [2]);
    lanes.complete(lanes.find(2).unwrap());
    assert_eq!(drain_ready(&mut lanes), [3, 4]);
}

#[test]
fn finished_arrivals_move_the_watermark_and_block_nothing() {
    let mut lanes = Lanes::new(10);
    lanes.push(11, keys(&["a"]), false, 11, Arrival::Done);
    lanes.push(13, keys(&["a"]), false, 13, pending());
    lanes.push(14, keys(&["a"]), false, 14, Arrival::Done);
    assert_eq!(lanes.watermark(), 11);
    assert_eq!(drain_ready(&mut lanes), [13]);
    lanes.complete(lanes.find(13).unwrap());
    assert_eq!(lanes.watermark(), 14);
}

#[test]
fn a_failed_event_keeps_its_place_while_it_backs_off() {
    let mut lanes = Lanes::new(0);
    lanes.push(1, keys(&["a"]), false, 1, pending());
    lanes.push(2, keys(&["a"]), false, 2, pending());
    assert_eq!(drain_ready(&mut lanes), [1]);
    let now = Instant::now();
    let at = now + std::time::Duration::from_millis(5);
    lanes.back_off(lanes.find(1).unwrap(), 1, "boom".into(), at);
    lanes.wake_due(now);
    assert_eq!(drain_ready(&mut lanes), Vec::<u64>::new());
    assert_eq!(lanes.next_due(), Some(at));
    lanes.wake_due(at);
    assert_eq!(drain_ready(&mut lanes), [1]);
}

/// Random keys (0 to 3 of 5), random completion order among the running events: every
/// event starts only after every earlier event sharing a key finished, and the watermark is
/// always the end of the finished prefix.
#[test]
fn random_schedules_keep_every_keys_order() {
    for seed in 0..200 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let names = ["k0", "k1", "k2", "k3", "k4"];
        let mut lanes = Lanes::new(0);
        let mut all: Vec<(u64, Vec<&str>, bool)> = Vec::new();
        let mut finished = std::collections::BTreeSet::new();
        let mut running: Vec<Slot> = Vec::new();
        let mut position = 0;
        for _round in 0..400 {
            if all.len() < 150 && rng.bool() {
                position += rng.u64(1..3);
                let count = rng.usize(0..4);
                let chosen: Vec<&str> = (0..count)
                    .map(|_| names[rng.usize(..names.len())])
                    .collect();
                let barrier = rng.u8(..50) == 0;
                lanes.push(position, keys(&chosen), barrier, position, pending());
                all.push((position, chosen, barrier));
            }
            while let Some((slot, entry)) = lanes.take_ready() {
                let started = entry.position;
                let mine: Vec<&str> = all.iter().find(|(p, ..)| *p == started).unwrap().1.clone();
                for (earlier, theirs, fence) in all.iter().filter(|(p, ..)| *p < started) {
                    let shared = theirs.iter().any(|key| mine.contains(key));
                    if shared || *fence || entry.barrier {
                        assert!(
                            finished.contains(earlier),
                            "seed {seed}: {started} ran before {earlier}"
                        );
                    }
                }
                running.push(slot);
            }
            if !running.is_empty() && rng.bool() {
                let slot = running.swap_remove(rng.usize(..running.len()));
                finished.insert(lanes.entry(slot).unwrap().position);
                lanes.complete(slot);
                let prefix = all.iter().take_while(|(p, ..)| finished.contains(p)).last();
                assert_eq!(
                    lanes.watermark(),
                    prefix.map_or(0, |(p, ..)| *p),
                    "seed {seed}"
                );
            }
        }
    }
}

#[test]
fn a_stalled_event_let_go_frees_its_keys_but_holds_the_watermark() {
    let mut lanes = Lanes::new(0).let_stalled_go();
    lanes.push(1, keys(&["a"]), false, 1, pending());
    lanes.push(2, keys(&["a", "b"]), false, 2, pending());
    lanes.push(3, keys(&["a"]), false, 3, pending());
    assert_eq!(drain_ready(&mut lanes), [1]);
    lanes.stall(lanes.find(1).unwrap(), 3, "boom".into());
    assert_eq!(drain_ready(&mut lanes), [2], "its key goes on");
    lanes.complete(lanes.find(2).unwrap());
    assert_eq!(drain_ready(&mut lanes), [3]);
    assert_eq!(
        lanes.watermark(),
        0,
        "the stalled event holds the watermark"
    );
    // Retried while 3 runs: it rejoins key a behind 3, never beside it.
    lanes.retry(lanes.find(1).unwrap());
    assert_eq!(drain_ready(&mut lanes), Vec::<u64>::new());
    lanes.push(4, keys(&["a"]), false, 4, pending());
    lanes.complete(lanes.find(3).unwrap());
    assert_eq!(
        drain_ready(&mut lanes),
        [1],
        "ahead of the events that came after the retry"
    );
    lanes.complete(lanes.find(1).unwrap());
    assert_eq!(lanes.watermark(), 3);
    assert_eq!(drain_ready(&mut lanes), [4]);
}

#[test]
fn a_stalled_event_holds_its_keys_unless_let_go() {
    for let_go in [false, true] {
        let mut lanes = Lanes::new(0);
        if let_go {
            lanes = lanes.let_stalled_go();
        }
        lanes.push(1, keys(&["a"]), false, 1, pending());
        lanes.push(2, keys(&["a"]), false, 2, pending());
        assert_eq!(drain_ready(&mut lanes), [1]);
        lanes.stall(lanes.find(1).unwrap(), 1, "boom".into());
        let expected: &[u64] = if let_go { &[2] } else { &[] };
        assert_eq!(drain_ready(&mut lanes), expected, "let go: {let_go}");
    }
}

#[test]
fn a_stalled_arrival_let_go_holds_nothing_but_the_watermark() {
    let mut lanes = Lanes::new(0).let_stalled_go();
    let stalled = Arrival::Stalled {
        attempts: 10,
        error: "parked earlier".into(),
    };
    lanes.push(1, keys(&["a"]), false, 1, stalled);
    lanes.push(2, keys(&["a"]), false, 2, pending());
    assert_eq!(drain_ready(&mut lanes), [2]);
    lanes.complete(lanes.find(2).unwrap());
    assert_eq!(lanes.watermark(), 0);
    lanes.retry(lanes.find(1).unwrap());
    assert_eq!(drain_ready(&mut lanes), [1]);
    lanes.complete(lanes.find(1).unwrap());
    assert_eq!(lanes.watermark(), 2);
}

#[test]
fn a_barrier_does_not_wait_for_a_stalled_event_let_go() {
    let mut lanes = Lanes::new(0).let_stalled_go();
    lanes.push(1, keys(&["a"]), false, 1, pending());
    lanes.push(2, keys(&["b"]), false, 2, pending());
    lanes.push(3, Keys::none(), true, 3, pending());
    lanes.push(4, keys(&["a"]), false, 4, pending());
    assert_eq!(drain_ready(&mut lanes), [1, 2]);
    lanes.stall(lanes.find(1).unwrap(), 1, "boom".into());
    assert_eq!(drain_ready(&mut lanes), Vec::<u64>::new(), "2 still runs");
    lanes.complete(lanes.find(2).unwrap());
    assert_eq!(drain_ready(&mut lanes), [3]);
    // A barrier let go when it stalls too: everything after it runs.
    lanes.stall(lanes.find(3).unwrap(), 1, "undecodable".into());
    assert_eq!(drain_ready(&mut lanes), [4]);
}

/// Random keys, random stalls and retries with stalled events let go: two events sharing a
/// key never run at once, an event runs only after every earlier event of its keys finished
/// or stalled, and the watermark is the end of the finished prefix (a stalled event holds it).
#[test]
fn random_schedules_with_stalls_let_go_keep_the_rules() {
    for seed in 0..200 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let names = ["k0", "k1", "k2", "k3"];
        let mut lanes = Lanes::new(0).let_stalled_go();
        let mut all: Vec<(u64, Vec<&str>)> = Vec::new();
        let mut finished = std::collections::BTreeSet::new();
        let mut ever_stalled = std::collections::BTreeSet::new();
        let mut stalled: Vec<Slot> = Vec::new();
        let mut running: Vec<Slot> = Vec::new();
        let mut position = 0;
        for _round in 0..400 {
            if all.len() < 120 && rng.bool() {
                position += 1;
                let count = rng.usize(1..3);
                let chosen: Vec<&str> = (0..count)
                    .map(|_| names[rng.usize(..names.len())])
                    .collect();
                lanes.push(position, keys(&chosen), false, position, pending());
                all.push((position, chosen));
            }
            while let Some((slot, entry)) = lanes.take_ready() {
                let started = entry.position;
                let mine = all.iter().find(|(p, _)| *p == started).unwrap().1.clone();
                for (earlier, theirs) in all.iter().filter(|(p, _)| *p < started) {
                    if theirs.iter().any(|key| mine.contains(key)) {
                        assert!(
                            finished.contains(earlier) || ever_stalled.contains(earlier),
                            "seed {seed}: {started} ran before {earlier}"
                        );
                    }
                }
                for other in &running {
                    let theirs = &all
                        .iter()
                        .find(|(p, _)| *p == lanes.entry(*other).unwrap().position)
                        .unwrap()
                        .1;
                    assert!(
                        !theirs.iter().any(|key| mine.contains(key)),
                        "seed {seed}: {started} runs beside an event of its key"
                    );
                }
                running.push(slot);
            }
            match rng.u8(..10) {
                0..5 if !running.is_empty() => {
                    let slot = running.swap_remove(rng.usize(..running.len()));
                    finished.insert(lanes.entry(slot).unwrap().position);
                    lanes.complete(slot);
                }
                5 if !running.is_empty() => {
                    let slot = running.swap_remove(rng.usize(..running.len()));
                    ever_stalled.insert(lanes.entry(slot).unwrap().position);
                    lanes.stall(slot, 1, "boom".into());
                    stalled.push(slot);
                }
                6 if !stalled.is_empty() => {
                    let slot = stalled.swap_remove(rng.usize(..stalled.len()));
                    lanes.retry(slot);
                }
                _ => {}
            }
            let prefix = all.iter().take_while(|(p, _)| finished.contains(p)).last();
            assert_eq!(
                lanes.watermark(),
                prefix.map_or(0, |(p, _)| *p),
                "seed {seed}"
            );
        }
    }
}

#[test]
fn held_bytes_count_unfinished_events_only() {
    let mut lanes = Lanes::new(0);
    lanes.push_weighed(1, keys(&["a"]), false, 1, pending(), 100);
    lanes.push_weighed(2, keys(&["b"]), false, 2, pending(), 50);
    lanes.push_weighed(3, keys(&["c"]), false, 3, Arrival::Done, 1_000);
    assert_eq!(
        lanes.held_bytes(),
        150,
        "an event done on arrival weighs nothing"
    );
    assert_eq!(drain_ready(&mut lanes), [1, 2]);
    // Event 2 is done while event 1 holds the watermark: its bytes are free at once.
    assert!(!lanes.complete(lanes.find(2).unwrap()));
    assert_eq!((lanes.held_bytes(), lanes.watermark()), (100, 0));
    assert!(lanes.complete(lanes.find(1).unwrap()));
    assert_eq!((lanes.held_bytes(), lanes.watermark()), (0, 3));
}
