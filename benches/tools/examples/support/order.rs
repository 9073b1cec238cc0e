//! The payload the publish benchmarks write: a serde struct of about 100 bytes of JSON, the
//! same in `benches/publish.rs` and `examples/single_writer.rs` so their figures compare.
#![allow(dead_code)]

use serde::{Deserialize, Serialize};

/// The first order's id: [`payload`]`(n)` is order `FIRST_ORDER + n`.
pub const FIRST_ORDER: u64 = 1_000_000;

/// About 100 bytes of JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: u64,
    pub customer_id: u64,
    pub sku: String,
    pub quantity: u32,
    pub total_cents: u64,
    pub currency: String,
}

impl OrderPlaced {
    /// The `n` this order was made from by [`payload`].
    pub fn number(&self) -> u64 {
        self.order_id.saturating_sub(FIRST_ORDER)
    }
}

/// The `n`th order.
pub fn payload(n: u64) -> OrderPlaced {
    OrderPlaced {
        order_id: FIRST_ORDER + n,
        customer_id: 500_000 + n % 997,
        sku: format!("SKU-{:05}-BLUE-XL", n % 10_000),
        quantity: 1 + (n % 5) as u32,
        total_cents: 1_299 + n % 10_000,
        currency: "EUR".to_owned(),
    }
}
