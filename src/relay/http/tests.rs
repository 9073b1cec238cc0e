//! The unit tests of the webhook sink: how a batch is grouped by key.

use super::post::by_key;
use crate::relay::Message;

#[test]
fn keys_keep_batch_order() {
    let batch: Vec<Message> = ["a", "b", "a", "c", "b"]
        .iter()
        .map(|key| Message::new(&b"{}"[..]).with_key(Some(key)))
        .collect();
    assert_eq!(by_key(&batch), vec![vec![0, 2], vec![1, 4], vec![3]]);
}

#[test]
fn messages_without_a_key_are_each_their_own_group() {
    let batch: Vec<Message> = [None, Some("a"), None, Some("a")]
        .iter()
        .map(|key| Message::new(&b"{}"[..]).with_key(*key))
        .collect();
    assert_eq!(by_key(&batch), vec![vec![0], vec![1, 3], vec![2]]);
}

#[test]
fn a_url_route_keeps_no_credentials_or_query_and_tells_queries_apart() {
    use super::route_of_url;
    assert_eq!(
        route_of_url("https://user:secret@hooks.example/in/7"),
        "https://hooks.example/in/7"
    );
    let a = route_of_url("https://hooks.example/in?token=abc");
    let b = route_of_url("https://hooks.example/in?token=abd");
    assert!(
        a.starts_with("https://hooks.example/in?") && !a.contains("abc"),
        "{a}"
    );
    assert_ne!(a, b);
    assert_eq!(
        route_of_url("https://hooks.example/in#x"),
        "https://hooks.example/in"
    );
}
