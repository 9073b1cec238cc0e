//! The unit tests of the type probe: what names a type and what is untyped.

use std::collections::BTreeMap;

use serde::Serialize;

use super::type_of;

#[derive(Serialize)]
enum External {
    Placed {
        id: u32,
    },
    Wrapped(u32),
    Pair(u32, u32),
    Cancelled,
    #[serde(rename = "order.shipped")]
    Shipped {
        id: u32,
    },
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum Internal {
    Placed { id: u32 },
    Inner(Plain),
}

#[derive(Serialize)]
#[serde(tag = "type", content = "data")]
enum Adjacent {
    Placed { id: u32 },
}

#[derive(Serialize)]
struct Plain {
    id: u32,
}

#[derive(Serialize)]
struct Newtype(External);

#[test]
fn a_variant_or_a_type_field_names_the_type() {
    assert_eq!(
        type_of(&External::Placed { id: 1 }).as_deref(),
        Some("Placed")
    );
    assert_eq!(type_of(&External::Wrapped(1)).as_deref(), Some("Wrapped"));
    assert_eq!(type_of(&External::Pair(1, 2)).as_deref(), Some("Pair"));
    assert_eq!(type_of(&External::Cancelled).as_deref(), Some("Cancelled"));
    assert_eq!(
        type_of(&External::Shipped { id: 1 }).as_deref(),
        Some("order.shipped")
    );
    assert_eq!(
        type_of(&Newtype(External::Cancelled)).as_deref(),
        Some("Cancelled")
    );
    assert_eq!(
        type_of(&Internal::Placed { id: 1 }).as_deref(),
        Some("Placed")
    );
    assert_eq!(
        type_of(&Internal::Inner(Plain { id: 1 })).as_deref(),
        Some("Inner")
    );
    assert_eq!(
        type_of(&Adjacent::Placed { id: 1 }).as_deref(),
        Some("Placed")
    );
    let value = serde_json::json!({"a": 1, "type": "FromJson", "z": 2});
    assert_eq!(type_of(&value).as_deref(), Some("FromJson"));
    let map: BTreeMap<&str, &str> = [("type", "FromMap")].into_iter().collect();
    assert_eq!(type_of(&map).as_deref(), Some("FromMap"));
}

#[test]
fn anything_else_is_untyped() {
    assert_eq!(type_of(&Plain { id: 1 }), None);
    assert_eq!(type_of(&serde_json::json!({"k": 1})), None);
    assert_eq!(type_of(&serde_json::json!({"type": 1})), None);
    assert_eq!(type_of(&serde_json::json!("Placed")), None);
    assert_eq!(type_of(&7u32), None);
    assert_eq!(type_of(&Some(External::Cancelled)), None);
}
