//! The event types a payload type `P` can decode, read from its `Deserialize` impl without
//! decoding anything: what a subscription of an `Outbox<P>` selects when it is not told.
//!
//! The probe plays a deserializer that offers a type nobody has (a name with a NUL in it) in
//! the two shapes publishing stores a type for (see the parent module): an enum's variant name,
//! and an object's `type` field. A serde enum that does not know the name refuses it with
//! `unknown_variant`, and the list it expected is the list of its variants as serde names them
//! (renames and aliases included). Anything that accepts the name, or fails another way, can
//! take rows of any type: a `#[serde(other)]` catch-all, a struct, an untagged enum,
//! `serde_json::Value`.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::value::StrDeserializer;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    VariantAccess, Visitor,
};

use super::TYPE_FIELD;

/// A type no event has: stored types come from Rust identifiers, serde renames or SQL, and
/// none of the first two can hold a NUL (nor can a PostgreSQL text value).
const NOBODY: &str = "\u{0}ordo: no such event type";

/// The variants `P` decodes, or `None` when it can take a row of any type.
pub(crate) fn types_of<P: DeserializeOwned>() -> Option<BTreeSet<String>> {
    match P::deserialize(TypesProbe) {
        Err(Answer::Variants(names)) => Some(names.iter().map(|&name| name.to_owned()).collect()),
        // It took the unknown type (a catch-all) or is no tagged enum.
        Ok(_) | Err(Answer::Other) => None,
    }
}

#[derive(Debug)]
enum Answer {
    /// `unknown_variant`: the names it would have taken.
    Variants(&'static [&'static str]),
    Other,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("event type selection probe")
    }
}

impl std::error::Error for Answer {}

impl de::Error for Answer {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Answer::Other
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        Answer::Variants(expected)
    }
}

fn nobody() -> StrDeserializer<'static, Answer> {
    NOBODY.into_deserializer()
}

/// Offers `{"type": NOBODY}` to whatever asks for a map, a struct or anything, and the variant
/// `NOBODY` to an externally tagged enum.
struct TypesProbe;

impl<'de> Deserializer<'de> for TypesProbe {
    type Error = Answer;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Answer> {
        visitor.visit_map(TypeField { offered: false })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Answer> {
        visitor.visit_enum(UnknownVariant)
    }

    /// A newtype wrapper is as typed as what it wraps (publishing sees through it too).
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Answer> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// A map with one entry, `type`, whose value is [`NOBODY`].
struct TypeField {
    offered: bool,
}

impl<'de> MapAccess<'de> for TypeField {
    type Error = Answer;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Answer> {
        if std::mem::replace(&mut self.offered, true) {
            return Ok(None);
        }
        let key: StrDeserializer<'static, Answer> = TYPE_FIELD.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Answer> {
        seed.deserialize(nobody())
    }
}

/// The variant [`NOBODY`]; only a catch-all takes it, as a unit variant.
struct UnknownVariant;

impl<'de> EnumAccess<'de> for UnknownVariant {
    type Error = Answer;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Answer> {
        Ok((seed.deserialize(nobody())?, self))
    }
}

impl<'de> VariantAccess<'de> for UnknownVariant {
    type Error = Answer;

    fn unit_variant(self) -> Result<(), Answer> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _: T) -> Result<T::Value, Answer> {
        Err(Answer::Other)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Answer> {
        Err(Answer::Other)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Answer> {
        Err(Answer::Other)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde::Deserialize;

    use super::types_of;

    fn names(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|&name| name.to_owned()).collect())
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    enum External {
        Placed {
            id: u32,
        },
        #[serde(rename = "orders.Cancelled")]
        Cancelled(u32),
        #[serde(alias = "Shipped")]
        Dispatched,
    }

    #[derive(Deserialize)]
    #[serde(tag = "type")]
    #[allow(dead_code)]
    enum Internal {
        Placed { id: u32 },
        Cancelled,
    }

    #[derive(Deserialize)]
    #[serde(tag = "type", content = "data")]
    #[allow(dead_code)]
    enum Adjacent {
        Placed(u32),
        Cancelled,
    }

    #[derive(Deserialize)]
    #[serde(tag = "type")]
    #[allow(dead_code)]
    enum CatchAll {
        Placed {
            id: u32,
        },
        #[serde(other)]
        Unknown,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    enum ExternalCatchAll {
        Placed(u32),
        #[serde(other)]
        Unknown,
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    #[allow(dead_code)]
    enum Untagged {
        Number(u32),
        Text(String),
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Plain {
        id: u32,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Wrapper(External);

    #[derive(Deserialize)]
    #[serde(tag = "kind")]
    #[allow(dead_code)]
    enum OtherTag {
        Placed,
    }

    #[test]
    fn tagged_enums_name_their_variants_as_serde_does() {
        assert_eq!(
            types_of::<External>(),
            names(&["Placed", "orders.Cancelled", "Dispatched", "Shipped"])
        );
        assert_eq!(types_of::<Internal>(), names(&["Placed", "Cancelled"]));
        assert_eq!(types_of::<Adjacent>(), names(&["Placed", "Cancelled"]));
        assert_eq!(types_of::<Wrapper>(), types_of::<External>());
    }

    #[test]
    fn what_can_take_any_type_selects_none() {
        assert_eq!(types_of::<CatchAll>(), None);
        assert_eq!(types_of::<ExternalCatchAll>(), None);
        assert_eq!(types_of::<Untagged>(), None);
        assert_eq!(types_of::<Plain>(), None);
        assert_eq!(types_of::<serde_json::Value>(), None);
        assert_eq!(types_of::<String>(), None);
        // Published untyped (its tag is not `type`), so it selects nothing either.
        assert_eq!(types_of::<OtherTag>(), None);
    }
}
