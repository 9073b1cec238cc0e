//! The probe serializer that finds a payload's type: it stops at the first variant name or
//! object `type` field, and never serializes anything else.

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible, Serializer};

use super::TYPE_FIELD;

/// How the probe ends: it never serializes anything, it only looks.
#[derive(Debug)]
pub(super) enum Stop {
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
pub(super) struct Probe;

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
pub(super) struct ObjectProbe {
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
pub(super) struct StrProbe;

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
