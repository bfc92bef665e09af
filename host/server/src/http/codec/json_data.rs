//! A tensor's JSON `data` (flat or nested) decoded straight into little-endian bytes.
//!
//! The decoder walks the JSON text once and writes each element in the tensor's datatype as it
//! meets it: no `serde_json::Value` tree (which costs 16 to 30 bytes of memory per element of
//! text), and nothing sized from the client's `shape`. It stops as soon as the data holds more
//! elements than the shape calls for, so its output never exceeds the smaller of what the shape
//! claims and what the body holds.

use std::fmt;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use wisp_core::{DataType, Error, Result};

/// How deeply `data` arrays may nest.
/// Triton's limit on JSON nesting.
const MAX_DEPTH: usize = 100;

/// Decodes `json` (the raw text of a `data` value) as `count` elements of `dt`.
pub fn decode(dt: DataType, json: &str, count: usize) -> Result<Vec<u8>> {
    // Each element takes at least two bytes of text ("1,"), so this bounds the real count.
    let likely = count.min(json.len() / 2 + 1);
    let mut w = Writer {
        dt,
        out: Vec::with_capacity(likely.saturating_mul(dt.size().unwrap_or(5))),
        n: 0,
        count,
        depth: 0,
        err: None,
    };
    let mut de = serde_json::Deserializer::from_str(json);
    let parsed = (&mut w).deserialize(&mut de).and_then(|()| de.end());
    if let Some(e) = w.err.take() {
        return Err(e);
    }
    parsed.map_err(|e| Error::invalid(format!("'data' is not valid JSON: {e}")))?;
    if w.n != count {
        return Err(Error::invalid(format!(
            "'data' has {} elements but the shape needs {count}",
            w.n
        )));
    }
    Ok(w.out)
}

struct Writer {
    dt: DataType,
    out: Vec<u8>,
    /// Elements written so far.
    n: usize,
    /// Elements the shape calls for.
    count: usize,
    depth: usize,
    /// Our own error, kept so the client gets its words rather than serde's.
    err: Option<Error>,
}

impl Writer {
    fn fail<E: serde::de::Error>(&mut self, e: Error) -> E {
        self.err = Some(e);
        E::custom("rejected")
    }

    fn next<E: serde::de::Error>(&mut self) -> std::result::Result<(), E> {
        if self.n == self.count {
            return Err(self.fail(Error::invalid(format!(
                "'data' has more elements than the shape needs ({})",
                self.count
            ))));
        }
        self.n += 1;
        Ok(())
    }

    fn bad<E: serde::de::Error>(&mut self, v: impl fmt::Display) -> E {
        let msg = format!(
            "data[{}] = {v} is not a valid {} value",
            self.n - 1,
            self.dt
        );
        self.fail(Error::invalid(msg))
    }

    fn int<E: serde::de::Error>(&mut self, v: i128) -> std::result::Result<(), E> {
        self.next()?;
        macro_rules! put {
            ($t:ty) => {
                match <$t>::try_from(v) {
                    Ok(x) => self.out.extend_from_slice(&x.to_le_bytes()),
                    Err(_) => return Err(self.bad(v)),
                }
            };
        }
        match self.dt {
            DataType::Uint8 => put!(u8),
            DataType::Uint16 => put!(u16),
            DataType::Uint32 => put!(u32),
            DataType::Uint64 => put!(u64),
            DataType::Int8 => put!(i8),
            DataType::Int16 => put!(i16),
            DataType::Int32 => put!(i32),
            DataType::Int64 => put!(i64),
            DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64 => {
                self.float_value(v as f64)
            }
            DataType::Bool | DataType::Bytes => return Err(self.bad(v)),
        }
        Ok(())
    }

    fn float_value(&mut self, x: f64) {
        match self.dt {
            DataType::Fp16 => self
                .out
                .extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            DataType::Bf16 => self
                .out
                .extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
            DataType::Fp32 => self.out.extend_from_slice(&(x as f32).to_le_bytes()),
            _ => self.out.extend_from_slice(&x.to_le_bytes()),
        }
    }
}

impl<'de> DeserializeSeed<'de> for &mut Writer {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &mut Writer {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} values, flat or in nested arrays", self.dt)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(self.fail(Error::invalid(
                "JSON nesting depth exceeds maximum allowed limit (100) in 'data'",
            )));
        }
        self.depth += 1;
        while seq.next_element_seed(&mut *self)?.is_some() {}
        self.depth -= 1;
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> std::result::Result<(), E> {
        self.next()?;
        if self.dt != DataType::Bool {
            return Err(self.bad(v));
        }
        self.out.push(v as u8);
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<(), E> {
        self.int(v.into())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<(), E> {
        self.int(v.into())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<(), E> {
        self.next()?;
        match self.dt {
            DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64 => {
                self.float_value(v);
                Ok(())
            }
            _ => Err(self.bad(v)),
        }
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<(), E> {
        self.next()?;
        if self.dt != DataType::Bytes {
            return Err(self.bad(format_args!("{v:?}")));
        }
        let len = u32::try_from(v.len()).map_err(|_| self.bad("a string over 4 GiB"))?;
        self.out.extend_from_slice(&len.to_le_bytes());
        self.out.extend_from_slice(v.as_bytes());
        Ok(())
    }

    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<(), E> {
        self.next()?;
        Err(self.bad("null"))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> std::result::Result<(), A::Error> {
        self.next()?;
        Err(self.bad("an object"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(dt: DataType, json: &str, count: usize) -> Vec<u8> {
        decode(dt, json, count).unwrap()
    }

    fn err(dt: DataType, json: &str, count: usize) -> String {
        decode(dt, json, count).unwrap_err().message().to_string()
    }

    #[test]
    fn every_datatype_flat_and_nested() {
        assert_eq!(
            ok(DataType::Fp32, "[[1, 2.5]]", 2),
            [1f32.to_le_bytes(), 2.5f32.to_le_bytes()].concat()
        );
        assert_eq!(
            ok(DataType::Int64, "[-9223372036854775808]", 1),
            i64::MIN.to_le_bytes()
        );
        assert_eq!(
            ok(DataType::Uint64, "[18446744073709551615]", 1),
            u64::MAX.to_le_bytes()
        );
        assert_eq!(ok(DataType::Uint8, "[0, 255]", 2), vec![0, 255]);
        assert_eq!(ok(DataType::Int8, "[-128]", 1), vec![0x80]);
        assert_eq!(ok(DataType::Bool, "[true, false]", 2), vec![1, 0]);
        assert_eq!(ok(DataType::Fp64, "[1e300]", 1), 1e300f64.to_le_bytes());
        assert_eq!(ok(DataType::Fp16, "[1]", 1), half::f16::ONE.to_le_bytes());
        assert_eq!(
            ok(DataType::Bytes, r#"["ab", ""]"#, 2),
            vec![2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]
        );
        assert_eq!(ok(DataType::Int32, "7", 1), 7i32.to_le_bytes());
    }

    #[test]
    fn bad_values_and_counts_name_the_element() {
        assert!(err(DataType::Uint8, "[1, 256]", 2).contains("data[1] = 256 is not a valid UINT8"));
        assert!(err(DataType::Int32, "[1.5]", 1).contains("data[0] = 1.5"));
        assert!(err(DataType::Fp32, r#"["a", 2]"#, 2).contains("data[0]"));
        assert!(err(DataType::Bool, "[1]", 1).contains("BOOL"));
        assert!(err(DataType::Fp32, "[null]", 1).contains("null"));
        assert!(err(DataType::Fp32, "[{}]", 1).contains("object"));
        assert!(err(DataType::Fp32, "[1, 2]", 3).contains("has 2 elements but the shape needs 3"));
        assert!(err(DataType::Fp32, "[1, 2, 3]", 2).contains("more elements than the shape"));
        // Triton's limit: 100 levels decode, 101 do not.
        let nested = |n| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert!(decode(DataType::Fp32, &nested(100), 1).is_ok());
        assert!(err(DataType::Fp32, &nested(101), 1)
            .contains("JSON nesting depth exceeds maximum allowed limit (100)"));
    }

    /// A shape claiming 2^40 elements with one element of data: nothing is sized from the
    /// claim (this once aborted the process).
    #[test]
    fn a_lying_count_allocates_nothing_from_the_claim() {
        let e = err(DataType::Fp64, "[1]", 1 << 40);
        assert!(e.contains("has 1 elements"), "{e}");
    }
}
