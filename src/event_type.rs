//! Event types: the `ordo.events.event_type` column, how a published payload's type is found,
//! and how listeners and subscriptions select types.
//!
//! The model: **one event enum per service**. A service publishes one serde enum `P`; each
//! variant is a type, and its name (as serde writes it, renames included) is stored in
//! `event_type`. A consumer selects the types it handles; rows of other types (another
//! service's events, plain-SQL rows that set another type) are skipped *before* their payload
//! is decoded, so they can never halt or dead-letter it.
//!
//! Finding the type costs no trait bound: at publish time the payload is run through a probe
//! serializer that stops at the first thing that names a type:
//! - an externally tagged enum (serde's default): the variant name
//!   (`OrderPlaced { .. }` → `"OrderPlaced"`);
//! - an object (a struct, a map, an internally or adjacently tagged enum) with a string field
//!   named `type`: its value (`#[serde(tag = "type")]` → the variant name);
//! - anything else (a plain struct, a number, ...): no type (SQL NULL).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::ser::{self, Impossible, Serializer};

mod own_types;

/// The field an object's type is read from.
const TYPE_FIELD: &str = "type";

/// The type `payload` names, if any (see the module docs for the rule).
pub(crate) fn type_of<P: Serialize + ?Sized>(payload: &P) -> Option<String> {
    match payload.serialize(Probe) {
        Err(Stop::Found(name)) => Some(name),
        _ => None,
    }
}

/// Which event types a listener or a subscription takes. Untyped events (NULL) are taken
/// unless `skip_untyped`: ordo cannot tell what they are, so they keep the consumer's policy
/// for payloads that do not decode.
#[derive(Debug, Clone, Default)]
pub(crate) struct TypeFilter {
    /// `None`: every type.
    types: Option<Arc<BTreeSet<String>>>,
    skip_untyped: bool,
    /// Whether the types were chosen ([`only`](Self::only) or [`all`](Self::all)); if not,
    /// [`or_types_of`](Self::or_types_of) selects the payload type's own.
    chosen: bool,
    /// Where a subscription counts the events this filter passes over.
    skipped: Option<metrics::Counter>,
}

impl TypeFilter {
    pub(crate) fn only<I, T>(types: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self {
            types: Some(Arc::new(types.into_iter().map(Into::into).collect())),
            skip_untyped: false,
            chosen: true,
            skipped: None,
        }
    }

    /// Only `types` from now on, keeping this filter's policy for untyped events.
    pub(crate) fn choose<I, T>(&self, types: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let mut chosen = Self::only(types);
        chosen.skip_untyped = self.skip_untyped;
        chosen
    }

    /// Every type from now on, keeping this filter's policy for untyped events.
    pub(crate) fn choose_all(&self) -> Self {
        Self {
            skip_untyped: self.skip_untyped,
            ..Self::all()
        }
    }

    /// Every type, chosen: no payload type's own selection replaces it.
    pub(crate) fn all() -> Self {
        Self {
            chosen: true,
            ..Self::default()
        }
    }

    /// This filter, or, when no types were chosen, the types `P` decodes (see
    /// [`own_types`]): every type when `P` can take any.
    pub(crate) fn or_types_of<P: serde::de::DeserializeOwned>(self) -> Self {
        if self.chosen {
            return self;
        }
        Self {
            types: own_types::types_of::<P>().map(Arc::new),
            chosen: true,
            ..self
        }
    }

    /// Counts what it passes over in `ordo_subscription_skipped_total` for `subscription`.
    pub(crate) fn counted_for(self, subscription: &str) -> Self {
        let counter = metrics::counter!(
            crate::telemetry::metrics::SUBSCRIPTION_SKIPPED,
            "subscription" => subscription.to_owned()
        );
        Self {
            skipped: Some(counter),
            ..self
        }
    }

    /// [`admits`](Self::admits), counting an event passed over.
    pub(crate) fn takes(&self, event_type: Option<&str>) -> bool {
        let admitted = self.admits(event_type);
        if let (false, Some(skipped)) = (admitted, &self.skipped) {
            skipped.increment(1);
        }
        admitted
    }

    pub(crate) fn set_skip_untyped(&mut self, skip: bool) {
        self.skip_untyped = skip;
    }

    /// Whether an event of type `event_type` is handed to the consumer.
    pub(crate) fn admits(&self, event_type: Option<&str>) -> bool {
        match (event_type, &self.types) {
            (None, _) => !self.skip_untyped,
            (Some(_), None) => true,
            (Some(name), Some(types)) => types.contains(name),
        }
    }
}

/// How the probe ends: it never serializes anything, it only looks.
#[derive(Debug)]
enum Stop {
    Found(String),
    Untyped,
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("event type probe")
    }
}

impl std::error::Error for Stop {}

impl ser::Error for Stop {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Stop::Untyped
    }
}

/// Methods that mean "no type here", for both probes.
macro_rules! untyped {
    ($($method:ident($($arg:ty),*) -> $ret:ty;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ret, Stop> { Err(Stop::Untyped) })*
    };
}

macro_rules! untyped_scalars {
    () => {
        untyped! {
            serialize_bool(bool) -> ();
            serialize_i8(i8) -> ();
            serialize_i16(i16) -> ();
            serialize_i32(i32) -> ();
            serialize_i64(i64) -> ();
            serialize_u8(u8) -> ();
            serialize_u16(u16) -> ();
            serialize_u32(u32) -> ();
            serialize_u64(u64) -> ();
            serialize_f32(f32) -> ();
            serialize_f64(f64) -> ();
            serialize_char(char) -> ();
            serialize_bytes(&[u8]) -> ();
            serialize_none() -> ();
            serialize_unit() -> ();
            serialize_unit_struct(&'static str) -> ();
            serialize_seq(Option<usize>) -> Impossible<(), Stop>;
            serialize_tuple(usize) -> Impossible<(), Stop>;
            serialize_tuple_struct(&'static str, usize) -> Impossible<(), Stop>;
        }
        fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), Stop> {
            Err(Stop::Untyped)
        }
    };
}

/// Methods that mean "this variant's name is the type", for both probes.
macro_rules! variant_names {
    ($($method:ident($($arg:ty),*) -> $ret:ty;)*) => {
        $(fn $method(
            self,
            _: &'static str,
            _: u32,
            variant: &'static str,
            $(_: $arg),*
        ) -> Result<$ret, Stop> {
            Err(Stop::Found(variant.to_owned()))
        })*
    };
}

/// A newtype wrapper (`struct Event(Inner)`) is as typed as what it wraps, for both probes.
macro_rules! transparent_newtypes {
    () => {
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            value: &T,
        ) -> Result<(), Stop> {
            value.serialize(self)
        }
    };
}

/// The top-level probe: a variant name, or an object's `type` field.
struct Probe;

impl Serializer for Probe {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Impossible<(), Stop>;
    type SerializeTuple = Impossible<(), Stop>;
    type SerializeTupleStruct = Impossible<(), Stop>;
    type SerializeTupleVariant = Impossible<(), Stop>;
    type SerializeMap = ObjectProbe;
    type SerializeStruct = ObjectProbe;
    type SerializeStructVariant = Impossible<(), Stop>;

    untyped_scalars!();
    untyped! { serialize_str(&str) -> (); }
    variant_names! {
        serialize_unit_variant() -> ();
        serialize_tuple_variant(usize) -> Self::SerializeTupleVariant;
        serialize_struct_variant(usize) -> Self::SerializeStructVariant;
    }
    transparent_newtypes!();

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: &T,
    ) -> Result<(), Stop> {
        Err(Stop::Found(variant.to_owned()))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<ObjectProbe, Stop> {
        Ok(ObjectProbe { at_type: false })
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<ObjectProbe, Stop> {
        Ok(ObjectProbe { at_type: false })
    }
}

/// Looks through an object's fields for `type`; other fields' values are never serialized.
struct ObjectProbe {
    /// The last key was `type`.
    at_type: bool,
}

impl ObjectProbe {
    fn type_value<T: Serialize + ?Sized>(value: &T) -> Result<(), Stop> {
        match value.serialize(StrProbe) {
            Err(stop) => Err(stop),
            Ok(()) => Err(Stop::Untyped),
        }
    }
}

impl ser::SerializeStruct for ObjectProbe {
    type Ok = ();
    type Error = Stop;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        if key == TYPE_FIELD {
            return Self::type_value(value);
        }
        Ok(())
    }

    fn end(self) -> Result<(), Stop> {
        Err(Stop::Untyped)
    }
}

impl ser::SerializeMap for ObjectProbe {
    type Ok = ();
    type Error = Stop;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Stop> {
        self.at_type =
            matches!(key.serialize(StrProbe), Err(Stop::Found(name)) if name == TYPE_FIELD);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        if self.at_type {
            return Self::type_value(value);
        }
        Ok(())
    }

    fn end(self) -> Result<(), Stop> {
        Err(Stop::Untyped)
    }
}

/// A string, or a unit variant (how an adjacently tagged enum writes its tag).
struct StrProbe;

impl Serializer for StrProbe {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Impossible<(), Stop>;
    type SerializeTuple = Impossible<(), Stop>;
    type SerializeTupleStruct = Impossible<(), Stop>;
    type SerializeTupleVariant = Impossible<(), Stop>;
    type SerializeMap = Impossible<(), Stop>;
    type SerializeStruct = Impossible<(), Stop>;
    type SerializeStructVariant = Impossible<(), Stop>;

    untyped_scalars!();
    untyped! {
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Impossible<(), Stop>;
        serialize_map(Option<usize>) -> Impossible<(), Stop>;
        serialize_struct(&'static str, usize) -> Impossible<(), Stop>;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Impossible<(), Stop>;
    }

    variant_names! { serialize_unit_variant() -> (); }
    transparent_newtypes!();

    fn serialize_str(self, value: &str) -> Result<(), Stop> {
        Err(Stop::Found(value.to_owned()))
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Stop> {
        Err(Stop::Untyped)
    }
}

#[cfg(test)]
mod tests {
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
}
