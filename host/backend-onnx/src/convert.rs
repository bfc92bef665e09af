//! Little-endian bytes ↔ typed element vectors, shared by both engines (tract uses only the
//! string conversions, so a build without ONNX Runtime leaves the rest unused).
#![cfg_attr(not(feature = "onnxruntime"), allow(dead_code))]

use wisp_core::tensor::{decode_bytes_elements, encode_bytes_elements};
use wisp_core::Result;

/// Element types with a fixed little-endian encoding.
pub(crate) trait Le: Sized + Copy {
    const SIZE: usize;
    fn read(b: &[u8]) -> Self;
    fn write(self, out: &mut Vec<u8>);
}

macro_rules! le {
    ($($t:ty),*) => {$(
        impl Le for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunk has the element size"))
            }
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
le!(
    u8,
    u16,
    u32,
    u64,
    i8,
    i16,
    i32,
    i64,
    f32,
    f64,
    half::f16,
    half::bf16
);

impl Le for bool {
    const SIZE: usize = 1;
    fn read(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn write(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

/// Decodes `data` (a whole number of elements, checked by `Tensor::new`) into a vector.
pub(crate) fn from_le<T: Le>(data: &[u8]) -> Vec<T> {
    data.chunks_exact(T::SIZE).map(T::read).collect()
}

/// Encodes elements as little-endian bytes.
pub(crate) fn to_le<T: Le>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    for &x in v {
        x.write(&mut out);
    }
    out
}

/// BYTES tensor data → strings, for tract, which holds string tensors as UTF-8 `String`s
/// (ONNX Runtime takes any bytes: see `ort_strings`).
pub(crate) fn to_strings(data: &[u8], name: &str) -> Result<Vec<String>> {
    decode_bytes_elements(data)?
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            String::from_utf8(b.to_vec()).map_err(|_| {
                wisp_core::Error::invalid(format!(
                    "input '{name}': BYTES element {i} is not UTF-8, which tract's string tensors require (ONNX Runtime takes any bytes)"
                ))
            })
        })
        .collect()
}

/// Strings → BYTES tensor data.
pub(crate) fn from_strings(v: &[String]) -> Vec<u8> {
    encode_bytes_elements(v.iter().map(|s| s.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_that_are_not_utf8_are_invalid_arguments() {
        let ok = encode_bytes_elements([&b"a"[..], b"b c"]);
        assert_eq!(to_strings(&ok, "x").unwrap(), vec!["a", "b c"]);
        let bad = encode_bytes_elements([&[0xffu8, 0xfe][..]]);
        let e = to_strings(&bad, "x").unwrap_err();
        assert_eq!(e.kind(), wisp_core::ErrorKind::InvalidArg);
        assert!(e.message().contains("element 0 is not UTF-8"), "{e}");
    }

    #[test]
    fn round_trips() {
        let v = vec![1.5f32, -2.0, 0.0];
        assert_eq!(from_le::<f32>(&to_le(&v)), v);
        let b = vec![true, false, true];
        assert_eq!(from_le::<bool>(&to_le(&b)), b);
        let h = vec![half::f16::from_f32(0.5)];
        assert_eq!(from_le::<half::f16>(&to_le(&h)), h);
        let s = vec!["a".to_string(), "héllo".to_string()];
        assert_eq!(to_strings(&from_strings(&s), "x").unwrap(), s);
        assert!(to_strings(&encode_bytes_elements([[0xffu8]]), "x").is_err());
    }
}
