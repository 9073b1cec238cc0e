//! The unit tests of the NATS sink: what NATS cannot carry is refused before it is sent.

use super::headers::{check_subject, headers};
use crate::relay::Message;
use crate::relay::format::Framing;

#[test]
fn what_nats_cannot_carry_is_refused_before_it_is_sent() {
    assert!(check_subject("orders.placed").is_ok());
    let long = format!("orders.{}", "x".repeat(4_000));
    assert!(check_subject(&long).is_err_and(|error| error.is_permanent()));
    let message = Message::new(&b"{}"[..]).with_key(Some("customer\n42"));
    assert!(headers(&message, false, &Framing::default()).is_err_and(|error| error.is_permanent()));
    let fine = Message::new(&b"{}"[..]).with_key(Some("customer-42"));
    assert!(headers(&fine, true, &Framing::default()).is_ok());
}
