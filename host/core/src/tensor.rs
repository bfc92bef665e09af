//! Tensors as they travel through Wisp: name, datatype, shape and little-endian bytes.
//!
//! Data is [`Bytes`], so slicing a request body into tensors, and a batch back into per-request
//! outputs, never copies. BYTES tensors hold Triton's serialized form: each element is a 4-byte
//! little-endian length followed by that many bytes.

use bytes::Bytes;

use crate::datatype::DataType;
use crate::error::{Error, Result};

/// A named tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Tensor name (a model input or output).
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Full shape, including any batch dimension. Every dim is ≥ 0.
    pub shape: Vec<i64>,
    /// Row-major little-endian data (BYTES: length-prefixed elements).
    pub data: Bytes,
}

impl Tensor {
    /// A tensor after checking that `data` holds exactly the elements `shape` calls for.
    pub fn new(
        name: impl Into<String>,
        datatype: DataType,
        shape: Vec<i64>,
        data: Bytes,
    ) -> Result<Self> {
        let name = name.into();
        let count = element_count(&shape).map_err(|e| e.context(format!("tensor '{name}'")))?;
        match datatype.size() {
            Some(_) => {
                let expected = byte_size(&name, datatype, count)?;
                if data.len() != expected {
                    return Err(Error::invalid(format!(
                        "tensor '{name}': expected {expected} bytes for {datatype} shape {shape:?}, got {}",
                        data.len()
                    )));
                }
            }
            None => {
                let got = bytes_element_count(&data)
                    .map_err(|e| e.context(format!("tensor '{name}'")))?;
                // Triton's two messages: too few counted at the end, too many at the first extra
                if got < count {
                    return Err(Error::invalid(format!(
                        "expected {count} string elements for inference input '{name}', got {got} (shape {shape:?})"
                    )));
                }
                if got > count {
                    return Err(Error::invalid(format!(
                        "unexpected number of string elements {} for inference input '{name}', expecting {count} (shape {shape:?})",
                        count + 1
                    )));
                }
            }
        }
        Ok(Tensor {
            name,
            datatype,
            shape,
            data,
        })
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        self.shape.iter().map(|&d| d.max(0) as usize).product()
    }

    /// A tensor of plain elements (`f32`, `i64`, …), stored little-endian.
    pub fn from_values<T: Element>(
        name: impl Into<String>,
        shape: Vec<i64>,
        values: &[T],
    ) -> Result<Self> {
        let mut data = Vec::with_capacity(values.len().saturating_mul(T::SIZE));
        for v in values {
            v.write_le(&mut data);
        }
        Tensor::new(name, T::DATATYPE, shape, data.into())
    }

    /// A BYTES tensor of the given strings.
    pub fn from_strings<B: AsRef<[u8]>>(
        name: impl Into<String>,
        shape: Vec<i64>,
        items: impl IntoIterator<Item = B>,
    ) -> Result<Self> {
        Tensor::new(
            name,
            DataType::Bytes,
            shape,
            encode_bytes_elements(items).into(),
        )
    }

    /// The elements as `T`, which must be this tensor's datatype.
    pub fn values<T: Element>(&self) -> Result<Vec<T>> {
        if self.datatype != T::DATATYPE {
            return Err(Error::invalid(format!(
                "tensor '{}' is {}, not {}",
                self.name,
                self.datatype,
                T::DATATYPE
            )));
        }
        Ok(self.data.chunks_exact(T::SIZE).map(T::read_le).collect())
    }

    /// The elements as `f64` whatever their numeric datatype (classification, and the gate's
    /// comparisons), `None` for BYTES.
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        let d = &self.data;
        macro_rules! conv {
            ($t:ty, $n:expr) => {
                d.chunks_exact($n)
                    .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk")) as f64)
                    .collect()
            };
        }
        Some(match self.datatype {
            DataType::Bool | DataType::Uint8 => d.iter().map(|&b| b as f64).collect(),
            DataType::Int8 => d.iter().map(|&b| b as i8 as f64).collect(),
            DataType::Uint16 => conv!(u16, 2),
            DataType::Int16 => conv!(i16, 2),
            DataType::Uint32 => conv!(u32, 4),
            DataType::Int32 => conv!(i32, 4),
            DataType::Uint64 => conv!(u64, 8),
            DataType::Int64 => conv!(i64, 8),
            DataType::Fp32 => conv!(f32, 4),
            DataType::Fp64 => conv!(f64, 8),
            DataType::Fp16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DataType::Bf16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DataType::Bytes => return None,
        })
    }

    /// The elements of a BYTES tensor.
    pub fn strings(&self) -> Result<Vec<&[u8]>> {
        if self.datatype != DataType::Bytes {
            return Err(Error::invalid(format!(
                "tensor '{}' is {}, not BYTES",
                self.name, self.datatype
            )));
        }
        decode_bytes_elements(&self.data)
    }
}

/// A fixed-size element type a [`Tensor`] can be built from ([`Tensor::from_values`]) and read
/// as ([`Tensor::values`]).
pub trait Element: Copy {
    /// The tensor datatype of this element type.
    const DATATYPE: DataType;
    /// Bytes per element.
    const SIZE: usize;
    /// Appends the little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads one element from exactly [`Self::SIZE`] little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($($t:ty => $dt:ident),* $(,)?) => {$(
        impl Element for $t {
            const DATATYPE: DataType = DataType::$dt;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("SIZE bytes"))
            }
        }
    )*};
}

element!(u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64, i8 => Int8, i16 => Int16,
    i32 => Int32, i64 => Int64, f32 => Fp32, f64 => Fp64);

impl Element for bool {
    const DATATYPE: DataType = DataType::Bool;
    const SIZE: usize = 1;
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

/// Number of elements of `shape`, rejecting negative dims and overflow.
pub fn element_count(shape: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for &d in shape {
        if d < 0 {
            return Err(Error::invalid(format!(
                "shape {shape:?} has a negative dimension"
            )));
        }
        // Triton counts elements in an int64_t; so does this, whatever usize is
        n = n
            .checked_mul(d as usize)
            .filter(|&n| i64::try_from(n).is_ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "shape {shape:?} causes total element count to exceed maximum size of {}",
                    i64::MAX
                ))
            })?;
    }
    Ok(n)
}

/// Bytes of `count` elements of fixed-size `datatype` for input `name`, refused in Triton's
/// words when they exceed what an `int64_t` holds (0 for BYTES, whose size the data decides).
pub fn byte_size(name: &str, datatype: DataType, count: usize) -> Result<usize> {
    let size = datatype.size().unwrap_or(0);
    count
        .checked_mul(size)
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| {
            Error::invalid(format!(
                "byte size overflow for input '{name}': element count ({count}) * data type size ({size}) exceeds maximum allowed size ({})",
                i64::MAX
            ))
        })
}

/// Names `model` in [`Tensor::new`]'s BYTES element-count error for `input`, as Triton words it
/// ("expected N string elements for inference input 'X' for model 'M', got K"); any other
/// error is returned unchanged. Front ends call it where they know the model.
pub fn naming_model(e: Error, input: &str, model: &str) -> Error {
    let needle = format!("for inference input '{input}',");
    if e.kind() != crate::ErrorKind::InvalidArg || !e.message().contains(&needle) {
        return e;
    }
    Error::invalid(e.message().replacen(
        &needle,
        &format!("for inference input '{input}' for model '{model}',"),
        1,
    ))
}

/// Serializes byte strings in Triton's BYTES form.
pub fn encode_bytes_elements<I, B>(items: I) -> Vec<u8>
where
    I: IntoIterator<Item = B>,
    B: AsRef<[u8]>,
{
    let mut out = Vec::new();
    for item in items {
        let item = item.as_ref();
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    out
}

/// Splits serialized BYTES data into its elements, checking the framing.
pub fn decode_bytes_elements(data: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err(Error::invalid(
                "BYTES data is truncated: an element length needs 4 bytes",
            ));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if rest.len() - 4 < len {
            return Err(Error::invalid(format!(
                "BYTES data is truncated: element of {len} bytes but only {} remain",
                rest.len() - 4
            )));
        }
        out.push(&rest[4..4 + len]);
        rest = &rest[4 + len..];
    }
    Ok(out)
}

fn bytes_element_count(data: &[u8]) -> Result<usize> {
    decode_bytes_elements(data).map(|v| v.len())
}

/// Byte offsets of each element boundary in `t` (len = elements + 1), for slicing by element.
fn element_offsets(t: &Tensor) -> Result<Vec<usize>> {
    let n = t.element_count();
    match t.datatype.size() {
        Some(size) => Ok((0..=n).map(|i| i * size).collect()),
        None => {
            let mut offsets = Vec::with_capacity(n + 1);
            let mut pos = 0;
            offsets.push(0);
            for e in decode_bytes_elements(&t.data)? {
                pos += 4 + e.len();
                offsets.push(pos);
            }
            Ok(offsets)
        }
    }
}

/// Concatenates tensors along dimension 0 (they must agree on name, type and other dims).
pub fn concat_batch(parts: &[&Tensor]) -> Result<Tensor> {
    let first = parts
        .first()
        .ok_or_else(|| Error::internal("concat of no tensors"))?;
    if parts.len() == 1 {
        return Ok((*first).clone());
    }
    let mut batch = 0i64;
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
    for p in parts {
        if p.datatype != first.datatype
            || p.shape.len() != first.shape.len()
            || p.shape.get(1..) != first.shape.get(1..)
            || p.shape.is_empty()
        {
            return Err(Error::invalid(format!(
                "input '{}': cannot batch shape {:?} {} with shape {:?} {}",
                first.name, first.shape, first.datatype, p.shape, p.datatype
            )));
        }
        batch += p.shape[0];
        data.extend_from_slice(&p.data);
    }
    let mut shape = first.shape.clone();
    shape[0] = batch;
    Ok(Tensor {
        name: first.name.clone(),
        datatype: first.datatype,
        shape,
        data: data.into(),
    })
}

/// Splits `t` along dimension 0 into pieces of `sizes` rows each (zero-copy).
pub fn split_batch(t: &Tensor, sizes: &[usize]) -> Result<Vec<Tensor>> {
    let rows = *t
        .shape
        .first()
        .ok_or_else(|| Error::internal(format!("output '{}' has no batch dimension", t.name)))?
        as usize;
    if sizes.iter().sum::<usize>() != rows {
        return Err(Error::internal(format!(
            "output '{}' has {rows} batch rows but the batch holds {}",
            t.name,
            sizes.iter().sum::<usize>()
        )));
    }
    let per_row = t.element_count().checked_div(rows).unwrap_or(0);
    let offsets = element_offsets(t)?;
    let mut out = Vec::with_capacity(sizes.len());
    let mut row = 0;
    for &s in sizes {
        let (a, b) = (offsets[row * per_row], offsets[(row + s) * per_row]);
        let mut shape = t.shape.clone();
        shape[0] = s as i64;
        out.push(Tensor {
            name: t.name.clone(),
            datatype: t.datatype,
            shape,
            data: t.data.slice(a..b),
        });
        row += s;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(name: &str, shape: Vec<i64>, v: &[f32]) -> Tensor {
        let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Tensor::new(name, DataType::Fp32, shape, data.into()).unwrap()
    }

    #[test]
    fn typed_values_round_trip_and_check_their_type() {
        let t = Tensor::from_values("x", vec![2, 2], &[1.5f32, -2.0, 0.0, 7.25]).unwrap();
        assert_eq!(t.datatype, DataType::Fp32);
        assert_eq!(t.values::<f32>().unwrap(), vec![1.5, -2.0, 0.0, 7.25]);
        let e = t.values::<i64>().unwrap_err();
        assert!(e.message().contains("is FP32, not INT64"), "{e}");
        let b = Tensor::from_values("b", vec![3], &[true, false, true]).unwrap();
        assert_eq!(b.data.as_ref(), &[1, 0, 1]);
        assert_eq!(b.values::<bool>().unwrap(), vec![true, false, true]);
        assert!(Tensor::from_values("short", vec![3], &[1i64, 2]).is_err());
        let s = Tensor::from_strings("s", vec![2], ["hi", ""]).unwrap();
        assert_eq!(s.strings().unwrap(), vec![&b"hi"[..], b""]);
        assert!(t.strings().is_err());
    }

    #[test]
    fn the_string_count_error_names_the_model() {
        // Triton words too few and too many differently (its QA checks both)
        let data = encode_bytes_elements(["a"]);
        let e = Tensor::new("text", DataType::Bytes, vec![1, 2], data.into()).unwrap_err();
        let e = naming_model(e, "text", "strings");
        assert!(
            e.message().starts_with(
                "expected 2 string elements for inference input 'text' for model 'strings', got 1"
            ),
            "{e}"
        );
        let data = encode_bytes_elements(["a", "b", "c", "d"]);
        let e = Tensor::new("text", DataType::Bytes, vec![1, 2], data.into()).unwrap_err();
        let e = naming_model(e, "text", "strings");
        assert!(
            e.message().starts_with(
                "unexpected number of string elements 3 for inference input 'text' for model 'strings', expecting 2"
            ),
            "{e}"
        );
        let other = Error::invalid("something else for inference input 'text', really");
        assert_eq!(
            naming_model(other.clone(), "x", "m").message(),
            other.message()
        );
    }

    #[test]
    fn new_checks_byte_size() {
        assert!(Tensor::new("x", DataType::Fp32, vec![2, 2], vec![0; 16].into()).is_ok());
        let e = Tensor::new("x", DataType::Fp32, vec![2, 2], vec![0; 15].into()).unwrap_err();
        assert!(e.message().contains("expected 16 bytes"), "{e}");
        let e = Tensor::new("x", DataType::Fp32, vec![-1, 2], vec![].into()).unwrap_err();
        assert!(e.message().contains("negative"), "{e}");
        let e = Tensor::new("x", DataType::Int8, vec![i64::MAX, 4], vec![].into()).unwrap_err();
        assert!(
            e.message().contains(
                "causes total element count to exceed maximum size of 9223372036854775807"
            ),
            "{e}"
        );
        // fits an int64_t as a count, not as bytes: Triton's second overflow message
        let e =
            Tensor::new("x", DataType::Fp32, vec![4, (1 << 60) + 2], vec![].into()).unwrap_err();
        assert!(
            e.message().starts_with(
                "byte size overflow for input 'x': element count (4611686018427387912) * data type size (4)"
            ),
            "{e}"
        );
    }

    #[test]
    fn bytes_round_trip_and_truncation() {
        let enc = encode_bytes_elements(["ab", "", "xyz"]);
        assert_eq!(
            decode_bytes_elements(&enc).unwrap(),
            vec![&b"ab"[..], b"", b"xyz"]
        );
        assert!(Tensor::new("s", DataType::Bytes, vec![3], enc.clone().into()).is_ok());
        assert!(Tensor::new("s", DataType::Bytes, vec![2], enc.clone().into()).is_err());
        let e = decode_bytes_elements(&enc[..enc.len() - 1]).unwrap_err();
        assert!(e.message().contains("truncated"));
        assert!(decode_bytes_elements(&[1, 0]).is_err());
    }

    #[test]
    fn concat_and_split() {
        let a = f32s("x", vec![1, 2], &[1.0, 2.0]);
        let b = f32s("x", vec![2, 2], &[3.0, 4.0, 5.0, 6.0]);
        let c = concat_batch(&[&a, &b]).unwrap();
        assert_eq!(c.shape, vec![3, 2]);
        let parts = split_batch(&c, &[1, 2]).unwrap();
        assert_eq!(parts[0], a);
        assert_eq!(parts[1], b);
        assert!(split_batch(&c, &[1, 1]).is_err());
        let bad = f32s("x", vec![1, 1], &[1.0]);
        assert!(concat_batch(&[&a, &bad]).is_err());
    }

    #[test]
    fn split_bytes_tensor() {
        let t = Tensor::new(
            "s",
            DataType::Bytes,
            vec![3, 1],
            encode_bytes_elements(["a", "bb", "ccc"]).into(),
        )
        .unwrap();
        let parts = split_batch(&t, &[2, 1]).unwrap();
        assert_eq!(
            decode_bytes_elements(&parts[1].data).unwrap(),
            vec![&b"ccc"[..]]
        );
        assert_eq!(parts[0].shape, vec![2, 1]);
    }
}
