//! Compact JSON, byte for byte as `serde_json::to_vec` writes it, faster on the
//! text evidence records are made of.
//!
//! Every record is encoded once on its way into the spool, and most of its text is
//! strings that need no escaping (ids, digests, tool names). `serde_json` checks
//! each byte of a string against its escape table one at a time: ~11,800
//! instructions of every MCP call (`xtask/call_instructions.py`), a tenth of the
//! evidence path's own. This serializer checks 16 bytes at a time and copies clean
//! runs whole; numbers are written by `serde_json`'s own formatter, and everything
//! else follows `serde_json`'s serializer, so the output is the same bytes (the
//! tests compare them on records and on arbitrary values).

use serde::ser::{self, Serialize};
use serde_json::ser::{CompactFormatter, Formatter};

/// `value` as compact JSON, as `serde_json::to_vec` would write it, appended to
/// `out`.
pub(crate) fn write<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    value.serialize(&mut Json { out })
}

/// `value` as compact JSON, as `serde_json::to_vec` would write it.
#[cfg(test)]
fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::new();
    write(value, &mut out)?;
    Ok(out)
}

/// Whether `b` needs escaping in a JSON string (a control character, `"` or `\`).
#[inline]
fn needs_escape(b: u8) -> bool {
    (b < 0x20) | (b == b'"') | (b == b'\\')
}

/// Whether any of 16 bytes needs escaping: without an early exit over a fixed
/// length, so that it compiles to a few vector instructions.
#[inline]
fn dirty(chunk: &[u8; 16]) -> bool {
    chunk.iter().fold(false, |acc, &b| acc | needs_escape(b))
}

/// `s` as a JSON string: quoted, with `serde_json`'s escapes (`\"`, `\\`, `\b`,
/// `\f`, `\n`, `\r`, `\t`, other control characters as `\u00xx`; nothing else).
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // The clean prefix, 16 bytes at a time; a string of 16 bytes or more ends with
    // its last 16 checked at once (overlapping the chunks), a shorter one byte by
    // byte.
    let (chunks, tail) = bytes.as_chunks::<16>();
    let clean = 16 * chunks.iter().position(dirty).unwrap_or(chunks.len());
    let (prefix, rest) = bytes.split_at(clean);
    let rest_dirty = match bytes.last_chunk::<16>() {
        Some(last) if clean == bytes.len() - tail.len() => dirty(last),
        _ => rest.iter().copied().any(needs_escape),
    };
    if rest_dirty {
        out.extend_from_slice(prefix);
        write_escaped(out, rest);
    } else {
        out.extend_from_slice(bytes);
    }
    out.push(b'"');
}

/// `bytes` (valid UTF-8: only ASCII bytes are replaced) with every byte that needs
/// it escaped.
fn write_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(escape);
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
}

/// A write into a `Vec` failing (it cannot; `serde_json::Error::io` is not public).
#[cold]
fn io(e: std::io::Error) -> serde_json::Error {
    ser::Error::custom(e)
}

/// The serializer: appends to `out`.
struct Json<'a> {
    out: &'a mut Vec<u8>,
}

impl Json<'_> {
    /// `{"variant":`, the start of an enum variant that holds data.
    fn variant_key(&mut self, variant: &str) {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.push(b':');
    }
}

/// Numbers through `serde_json`'s own formatter (its integer and float text).
macro_rules! number {
    ($($name:ident: $ty:ty => $write:ident;)*) => {
        $(
            fn $name(self, v: $ty) -> Result<(), serde_json::Error> {
                CompactFormatter
                    .$write(self.out, v)
                    .map_err(io)
            }
        )*
    };
}

impl<'a, 'b> ser::Serializer for &'b mut Json<'a> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Compound<'a, 'b>;
    type SerializeTuple = Compound<'a, 'b>;
    type SerializeTupleStruct = Compound<'a, 'b>;
    type SerializeTupleVariant = Compound<'a, 'b>;
    type SerializeMap = Compound<'a, 'b>;
    type SerializeStruct = Compound<'a, 'b>;
    type SerializeStructVariant = Compound<'a, 'b>;

    fn serialize_bool(self, v: bool) -> Result<(), serde_json::Error> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    number! {
        serialize_i8: i8 => write_i8;
        serialize_i16: i16 => write_i16;
        serialize_i32: i32 => write_i32;
        serialize_i64: i64 => write_i64;
        serialize_i128: i128 => write_i128;
        serialize_u8: u8 => write_u8;
        serialize_u16: u16 => write_u16;
        serialize_u32: u32 => write_u32;
        serialize_u64: u64 => write_u64;
        serialize_u128: u128 => write_u128;
    }

    fn serialize_f32(self, v: f32) -> Result<(), serde_json::Error> {
        if v.is_finite() {
            CompactFormatter.write_f32(self.out, v).map_err(io)
        } else {
            self.serialize_unit()
        }
    }

    fn serialize_f64(self, v: f64) -> Result<(), serde_json::Error> {
        if v.is_finite() {
            CompactFormatter.write_f64(self.out, v).map_err(io)
        } else {
            self.serialize_unit()
        }
    }

    fn serialize_char(self, v: char) -> Result<(), serde_json::Error> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), serde_json::Error> {
        write_str(self.out, v);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), serde_json::Error> {
        use ser::SerializeSeq;
        let mut seq = self.serialize_seq(Some(v.len()))?;
        for b in v {
            seq.serialize_element(b)?;
        }
        seq.end()
    }

    fn serialize_none(self) -> Result<(), serde_json::Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), serde_json::Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), serde_json::Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), serde_json::Error> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        self.variant_key(variant);
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a, 'b>, serde_json::Error> {
        self.out.push(b'[');
        Ok(Compound::open(self, b"]"))
    }

    fn serialize_tuple(self, _len: usize) -> Result<Compound<'a, 'b>, serde_json::Error> {
        self.serialize_seq(None)
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'b>, serde_json::Error> {
        self.serialize_seq(None)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'b>, serde_json::Error> {
        self.variant_key(variant);
        self.out.push(b'[');
        Ok(Compound::open(self, b"]}"))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a, 'b>, serde_json::Error> {
        self.out.push(b'{');
        Ok(Compound::open(self, b"}"))
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'b>, serde_json::Error> {
        self.serialize_map(None)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'b>, serde_json::Error> {
        self.variant_key(variant);
        self.out.push(b'{');
        Ok(Compound::open(self, b"}}"))
    }
}

/// An array or object being written: whether an element was written yet (for
/// the commas) and what closes it.
struct Compound<'a, 'b> {
    ser: &'b mut Json<'a>,
    first: bool,
    close: &'static [u8],
}

impl<'a, 'b> Compound<'a, 'b> {
    /// Opened (its opening bracket written). `serde_json` closes an array or
    /// object it knows to be empty at once; the bytes are the same.
    fn open(ser: &'b mut Json<'a>, close: &'static [u8]) -> Self {
        Self {
            ser,
            first: true,
            close,
        }
    }

    fn comma(&mut self) {
        if !std::mem::replace(&mut self.first, false) {
            self.ser.out.push(b',');
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), serde_json::Error> {
        self.comma();
        value.serialize(&mut *self.ser)
    }

    fn field<T: Serialize + ?Sized>(
        &mut self,
        key: &str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        self.comma();
        write_str(self.ser.out, key);
        self.ser.out.push(b':');
        value.serialize(&mut *self.ser)
    }

    fn close(self) -> Result<(), serde_json::Error> {
        self.ser.out.extend_from_slice(self.close);
        Ok(())
    }
}

/// The array-like compounds: each element after a comma.
macro_rules! elements {
    ($($trait:ident::$method:ident;)*) => {
        $(
            impl ser::$trait for Compound<'_, '_> {
                type Ok = ();
                type Error = serde_json::Error;

                fn $method<T: Serialize + ?Sized>(
                    &mut self,
                    value: &T,
                ) -> Result<(), serde_json::Error> {
                    self.element(value)
                }

                fn end(self) -> Result<(), serde_json::Error> {
                    self.close()
                }
            }
        )*
    };
}

elements! {
    SerializeSeq::serialize_element;
    SerializeTuple::serialize_element;
    SerializeTupleStruct::serialize_field;
    SerializeTupleVariant::serialize_field;
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), serde_json::Error> {
        self.comma();
        key.serialize(MapKey(&mut *self.ser.out))
    }

    fn serialize_value<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        self.ser.out.push(b':');
        value.serialize(&mut *self.ser)
    }

    fn end(self) -> Result<(), serde_json::Error> {
        self.close()
    }
}

/// The object-like compounds: each field after a comma.
macro_rules! fields {
    ($($trait:ident;)*) => {
        $(
            impl ser::$trait for Compound<'_, '_> {
                type Ok = ();
                type Error = serde_json::Error;

                fn serialize_field<T: Serialize + ?Sized>(
                    &mut self,
                    key: &'static str,
                    value: &T,
                ) -> Result<(), serde_json::Error> {
                    self.field(key, value)
                }

                fn end(self) -> Result<(), serde_json::Error> {
                    self.close()
                }
            }
        )*
    };
}

fields! {
    SerializeStruct;
    SerializeStructVariant;
}

/// An object's key: a string, or what `serde_json` quotes as one (integers,
/// booleans, characters, finite floats, unit variants); anything else is refused
/// as `serde_json` refuses it.
struct MapKey<'a>(&'a mut Vec<u8>);

impl MapKey<'_> {
    /// `text` quoted (it needs no escaping: digits, signs, `true`/`false`).
    fn quoted(self, text: &[u8]) -> Result<(), serde_json::Error> {
        self.0.push(b'"');
        self.0.extend_from_slice(text);
        self.0.push(b'"');
        Ok(())
    }

    /// `write` (a number) quoted.
    fn quoted_number(
        self,
        write: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>,
    ) -> Result<(), serde_json::Error> {
        self.0.push(b'"');
        write(self.0).map_err(io)?;
        self.0.push(b'"');
        Ok(())
    }
}

fn key_must_be_a_string() -> serde_json::Error {
    ser::Error::custom("key must be a string")
}

/// Integer keys, quoted.
macro_rules! number_key {
    ($($name:ident: $ty:ty => $write:ident;)*) => {
        $(
            fn $name(self, v: $ty) -> Result<(), serde_json::Error> {
                self.quoted_number(|out| CompactFormatter.$write(out, v))
            }
        )*
    };
}

impl ser::Serializer for MapKey<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = ser::Impossible<(), serde_json::Error>;
    type SerializeTuple = ser::Impossible<(), serde_json::Error>;
    type SerializeTupleStruct = ser::Impossible<(), serde_json::Error>;
    type SerializeTupleVariant = ser::Impossible<(), serde_json::Error>;
    type SerializeMap = ser::Impossible<(), serde_json::Error>;
    type SerializeStruct = ser::Impossible<(), serde_json::Error>;
    type SerializeStructVariant = ser::Impossible<(), serde_json::Error>;

    fn serialize_str(self, v: &str) -> Result<(), serde_json::Error> {
        write_str(self.0, v);
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), serde_json::Error> {
        write_str(self.0, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }

    fn serialize_bool(self, v: bool) -> Result<(), serde_json::Error> {
        self.quoted(if v { b"true" } else { b"false" })
    }

    number_key! {
        serialize_i8: i8 => write_i8;
        serialize_i16: i16 => write_i16;
        serialize_i32: i32 => write_i32;
        serialize_i64: i64 => write_i64;
        serialize_i128: i128 => write_i128;
        serialize_u8: u8 => write_u8;
        serialize_u16: u16 => write_u16;
        serialize_u32: u32 => write_u32;
        serialize_u64: u64 => write_u64;
        serialize_u128: u128 => write_u128;
    }

    fn serialize_f32(self, v: f32) -> Result<(), serde_json::Error> {
        if !v.is_finite() {
            return Err(ser::Error::custom("float key must be finite"));
        }
        self.quoted_number(|out| CompactFormatter.write_f32(out, v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), serde_json::Error> {
        if !v.is_finite() {
            return Err(ser::Error::custom("float key must be finite"));
        }
        self.quoted_number(|out| CompactFormatter.write_f64(out, v))
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), serde_json::Error> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_bytes(self, _v: &[u8]) -> Result<(), serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_none(self) -> Result<(), serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_unit(self) -> Result<(), serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, serde_json::Error> {
        Err(key_must_be_a_string())
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, serde_json::Error> {
        Err(key_must_be_a_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::{Value, json};

    use super::*;

    fn same<T: Serialize + ?Sized>(value: &T) {
        assert_eq!(
            String::from_utf8(to_vec(value).unwrap()).unwrap(),
            serde_json::to_string(value).unwrap()
        );
    }

    #[test]
    fn records_of_every_kind_are_the_bytes_serde_json_writes() {
        for record in crate::quick_head::tests::records() {
            same(&record);
            let encoded = crate::EncodedRecord::encode(&record).unwrap();
            assert_eq!(encoded.as_str(), serde_json::to_string(&record).unwrap());
        }
    }

    /// Every single character that needs escaping, at every position around the
    /// 16-byte chunks, and text that needs none.
    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let specials: Vec<char> = (0u8..0x20)
            .map(char::from)
            .chain(['"', '\\', '/', '\u{7f}', 'é', '€', '😀'])
            .collect();
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 64, 100] {
            let clean = "a".repeat(len);
            same(&clean);
            for &c in &specials {
                for at in [0, len / 2, len] {
                    let mut s = clean.clone();
                    s.insert(at.min(s.len()), c);
                    same(&s);
                    same(&json!({ s.clone(): s }));
                }
            }
        }
        same(&'"');
        same(&'é');
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        let v = json!({
            "null": null, "t": true, "f": false,
            "ints": [0, 1, -1, i64::MIN, i64::MAX, u64::MAX],
            "floats": [0.0, -0.0, 1.5, 1e300, -2.5e-8, 0.1],
            "empty": {}, "none": [], "nested": [{"a": [[], {}]}, "x\ny"],
            "text": "sha256:0daa0fe8d8bc6cd4ef38206fa0ac1cef9eb8ce69abe7a77b01d0711880980228",
        });
        same(&v);
        // Not through Value: floats as f32, non-finite floats, bytes, chars, units,
        // options, tuples and enums of every shape, keys that are not strings.
        #[derive(serde::Serialize)]
        enum E {
            Unit,
            New(u8),
            Tuple(u8, &'static str),
            Struct { a: Option<u8>, b: () },
        }
        #[derive(serde::Serialize)]
        struct Unit;
        #[derive(serde::Serialize)]
        struct Wrap(i16);
        #[derive(serde::Serialize)]
        #[serde(tag = "event", rename_all = "snake_case")]
        enum Tagged {
            Begin { id: String, n: u32 },
            Empty {},
        }
        #[derive(serde::Serialize)]
        struct Flat {
            a: u8,
            #[serde(flatten)]
            rest: std::collections::BTreeMap<String, Value>,
        }
        same(&(1.5f32, f64::NAN, f64::INFINITY, f32::NEG_INFINITY));
        same(&(Unit, Wrap(-3), (), Some(2u8), None::<u8>, 'q'));
        same(&serde_bytes_like(&[0, 1, 255]));
        same(&[
            E::Unit,
            E::New(7),
            E::Tuple(1, "a\"b"),
            E::Struct { a: None, b: () },
        ]);
        same(&[
            Tagged::Begin {
                id: "x".into(),
                n: 3,
            },
            Tagged::Empty {},
        ]);
        let rest = [("z".to_owned(), json!(1)), ("b\u{1}".to_owned(), json!([]))];
        same(&Flat {
            a: 1,
            rest: rest.into_iter().collect(),
        });
        let keys: std::collections::BTreeMap<i64, &str> = [(-1, "a"), (20, "b")].into();
        same(&keys);
        let keys: std::collections::BTreeMap<bool, u8> = [(true, 1)].into();
        same(&keys);
        let keys: std::collections::BTreeMap<char, u8> = [('"', 1)].into();
        same(&keys);
        let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(to_vec(&bad).is_err());
        assert!(serde_json::to_vec(&bad).is_err());
    }

    /// `v` serialized as bytes (`serialize_bytes`), as a byte-buffer type would.
    fn serde_bytes_like(v: &[u8]) -> impl Serialize + '_ {
        struct Bytes<'a>(&'a [u8]);
        impl Serialize for Bytes<'_> {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        Bytes(v)
    }
}
