//! Building and reading tensors without `unsafe`: typed constructors, typed copies out, and
//! helpers for BYTES (length-prefixed) elements.

use crate::{Datatype, Error, Tensor};

impl Datatype {
    /// Bytes per element (`None` for variable-length `bytes`).
    pub fn size(self) -> Option<usize> {
        Some(match self {
            Datatype::Bool | Datatype::Uint8 | Datatype::Int8 => 1,
            Datatype::Uint16 | Datatype::Int16 | Datatype::Fp16 | Datatype::Bf16 => 2,
            Datatype::Uint32 | Datatype::Int32 | Datatype::Fp32 => 4,
            Datatype::Uint64 | Datatype::Int64 | Datatype::Fp64 => 8,
            Datatype::Bytes => return None,
        })
    }

    /// The KServe name (`"FP32"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Datatype::Bool => "BOOL",
            Datatype::Uint8 => "UINT8",
            Datatype::Uint16 => "UINT16",
            Datatype::Uint32 => "UINT32",
            Datatype::Uint64 => "UINT64",
            Datatype::Int8 => "INT8",
            Datatype::Int16 => "INT16",
            Datatype::Int32 => "INT32",
            Datatype::Int64 => "INT64",
            Datatype::Fp16 => "FP16",
            Datatype::Fp32 => "FP32",
            Datatype::Fp64 => "FP64",
            Datatype::Bf16 => "BF16",
            Datatype::Bytes => "BYTES",
        }
    }
}

macro_rules! numeric {
    ($($from:ident, $to:ident, $t:ty, $dt:ident;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("A `", stringify!($dt), "` tensor from `", stringify!($t), "` values in row-major order.")]
                pub fn $from(name: impl Into<String>, shape: Vec<i64>, values: &[$t]) -> Tensor {
                    const N: usize = std::mem::size_of::<$t>();
                    // Fixed-size chunks of a zeroed buffer: compiles to a plain copy on
                    // little-endian targets (wasm included), unlike a push per element.
                    let mut data = vec![0u8; values.len() * N];
                    for (d, v) in data.chunks_exact_mut(N).zip(values) {
                        d.copy_from_slice(&v.to_le_bytes());
                    }
                    Tensor { name: name.into(), datatype: Datatype::$dt, shape, data }
                }

                #[doc = concat!("The elements as `", stringify!($t), "` (the tensor must be `", stringify!($dt), "`).")]
                pub fn $to(&self) -> Result<Vec<$t>, Error> {
                    self.expect(Datatype::$dt)?;
                    const N: usize = std::mem::size_of::<$t>();
                    Ok(self
                        .data
                        .chunks_exact(N)
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of N bytes")))
                        .collect())
                }
            )*
        }
    };
}

numeric! {
    from_f32, to_f32, f32, Fp32;
    from_f64, to_f64, f64, Fp64;
    from_i8, to_i8, i8, Int8;
    from_i16, to_i16, i16, Int16;
    from_i32, to_i32, i32, Int32;
    from_i64, to_i64, i64, Int64;
    from_u16, to_u16, u16, Uint16;
    from_u32, to_u32, u32, Uint32;
    from_u64, to_u64, u64, Uint64;
}

impl Tensor {
    /// A tensor from raw little-endian `data` (checked against `shape` and `datatype`).
    pub fn new(
        name: impl Into<String>,
        datatype: Datatype,
        shape: Vec<i64>,
        data: Vec<u8>,
    ) -> Result<Tensor, Error> {
        let t = Tensor {
            name: name.into(),
            datatype,
            shape,
            data,
        };
        t.check()?;
        Ok(t)
    }

    /// A `UINT8` tensor.
    pub fn from_u8(name: impl Into<String>, shape: Vec<i64>, values: &[u8]) -> Tensor {
        Tensor {
            name: name.into(),
            datatype: Datatype::Uint8,
            shape,
            data: values.to_vec(),
        }
    }

    /// A `BOOL` tensor.
    pub fn from_bool(name: impl Into<String>, shape: Vec<i64>, values: &[bool]) -> Tensor {
        Tensor {
            name: name.into(),
            datatype: Datatype::Bool,
            shape,
            data: values.iter().map(|&b| b as u8).collect(),
        }
    }

    /// A `BYTES` tensor: each element is stored as a 4-byte little-endian length and the bytes.
    pub fn from_strings<I, B>(name: impl Into<String>, shape: Vec<i64>, elements: I) -> Tensor
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        let mut data = Vec::new();
        for e in elements {
            let e = e.as_ref();
            data.extend_from_slice(&(e.len() as u32).to_le_bytes());
            data.extend_from_slice(e);
        }
        Tensor {
            name: name.into(),
            datatype: Datatype::Bytes,
            shape,
            data,
        }
    }

    /// The elements of a `UINT8` tensor.
    pub fn to_u8(&self) -> Result<&[u8], Error> {
        self.expect(Datatype::Uint8)?;
        Ok(&self.data)
    }

    /// The elements of a `BOOL` tensor.
    pub fn to_bool(&self) -> Result<Vec<bool>, Error> {
        self.expect(Datatype::Bool)?;
        Ok(self.data.iter().map(|&b| b != 0).collect())
    }

    /// The elements of a `BYTES` tensor (borrowed, no copy).
    pub fn strings(&self) -> Result<Vec<&[u8]>, Error> {
        if self.datatype != Datatype::Bytes {
            return Err(self.wrong_type(Datatype::Bytes));
        }
        let mut out = Vec::new();
        let mut rest = &self.data[..];
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err(Error::invalid(format!(
                    "tensor '{}': truncated BYTES element length",
                    self.name
                )));
            }
            let n = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            rest = &rest[4..];
            if rest.len() < n {
                return Err(Error::invalid(format!(
                    "tensor '{}': BYTES element of {n} bytes runs past the data",
                    self.name
                )));
            }
            out.push(&rest[..n]);
            rest = &rest[n..];
        }
        Ok(out)
    }

    /// Joins tensors of one name and datatype along the batch (first) dimension — the first
    /// step of a batch-level model call: concatenate, one call, then [`Tensor::split_rows`].
    pub fn concat_rows(parts: &[&Tensor]) -> Result<Tensor, Error> {
        let first = parts
            .first()
            .ok_or_else(|| Error::invalid("concat_rows: no tensors"))?;
        let mut rows = 0i64;
        let mut data = Vec::with_capacity(parts.iter().map(|t| t.data.len()).sum());
        for t in parts {
            if t.datatype != first.datatype
                || t.shape.is_empty()
                || t.shape[1..] != first.shape[1..]
            {
                return Err(Error::invalid(format!(
                    "concat_rows: tensor '{}' is {} {:?}, the first is {} {:?}",
                    t.name,
                    t.datatype.as_str(),
                    t.shape,
                    first.datatype.as_str(),
                    first.shape
                )));
            }
            rows += t.shape[0];
            data.extend_from_slice(&t.data);
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        Ok(Tensor {
            name: first.name.clone(),
            datatype: first.datatype,
            shape,
            data,
        })
    }

    /// Splits a tensor along its batch (first) dimension into parts of `rows` rows each (which
    /// must add up to its first dimension).
    pub fn split_rows(&self, rows: &[usize]) -> Result<Vec<Tensor>, Error> {
        let total = self.shape.first().copied().unwrap_or(0).max(0) as usize;
        if rows.iter().sum::<usize>() != total {
            return Err(Error::invalid(format!(
                "split_rows: tensor '{}' has {total} rows, not {}",
                self.name,
                rows.iter().sum::<usize>()
            )));
        }
        let per_row: usize = self.shape[1..].iter().map(|&d| d.max(0) as usize).product();
        let elements: Option<Vec<&[u8]>> = match self.datatype.size() {
            Some(_) => None,
            None => Some(self.strings()?),
        };
        let mut out = Vec::with_capacity(rows.len());
        let (mut byte, mut element) = (0usize, 0usize);
        for &n in rows {
            let len = match (self.datatype.size(), &elements) {
                (Some(size), _) => n * per_row * size,
                (None, Some(e)) => e[element..element + n * per_row]
                    .iter()
                    .map(|x| 4 + x.len())
                    .sum(),
                (None, None) => unreachable!("BYTES elements were read above"),
            };
            let mut shape = self.shape.clone();
            shape[0] = n as i64;
            out.push(Tensor {
                name: self.name.clone(),
                datatype: self.datatype,
                shape,
                data: self.data[byte..byte + len].to_vec(),
            });
            byte += len;
            element += n * per_row;
        }
        Ok(out)
    }

    /// Number of elements the shape calls for.
    pub fn element_count(&self) -> usize {
        self.shape.iter().map(|&d| d.max(0) as usize).product()
    }

    /// Checks that the data holds exactly the elements the shape calls for.
    pub fn check(&self) -> Result<(), Error> {
        let count = self.element_count();
        let ok = match self.datatype.size() {
            Some(size) => self.data.len() == count * size,
            None => self.strings()?.len() == count,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "tensor '{}': {} bytes of data do not fit {} shape {:?}",
                self.name,
                self.data.len(),
                self.datatype.as_str(),
                self.shape
            )))
        }
    }

    fn expect(&self, want: Datatype) -> Result<(), Error> {
        if self.datatype != want {
            return Err(self.wrong_type(want));
        }
        match want.size() {
            Some(size) if self.data.len() % size != 0 => Err(Error::invalid(format!(
                "tensor '{}': {} bytes is not a whole number of {} elements",
                self.name,
                self.data.len(),
                want.as_str()
            ))),
            _ => Ok(()),
        }
    }

    fn wrong_type(&self, want: Datatype) -> Error {
        Error::invalid(format!(
            "tensor '{}' is {}, expected {}",
            self.name,
            self.datatype.as_str(),
            want.as_str()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_round_trips() {
        let t = Tensor::from_f32("x", vec![3], &[1.0, -2.5, 3.25]);
        assert_eq!(t.data.len(), 12);
        assert_eq!(t.to_f32().unwrap(), vec![1.0, -2.5, 3.25]);
        assert!(t.check().is_ok());
        let e = t.to_i64().unwrap_err();
        assert!(
            e.message.contains("'x' is FP32, expected INT64"),
            "{}",
            e.message
        );
        let i = Tensor::from_i64("i", vec![2], &[-1, 1 << 40]);
        assert_eq!(i.to_i64().unwrap(), vec![-1, 1 << 40]);
    }

    #[test]
    fn rows_concatenate_and_split_back() {
        let a = Tensor::from_f32("x", vec![1, 2], &[1.0, 2.0]);
        let b = Tensor::from_f32("x", vec![2, 2], &[3.0, 4.0, 5.0, 6.0]);
        let all = Tensor::concat_rows(&[&a, &b]).unwrap();
        assert_eq!(all.shape, vec![3, 2]);
        let back = all.split_rows(&[1, 2]).unwrap();
        let same = |x: &Tensor, y: &Tensor| x.shape == y.shape && x.data == y.data;
        assert!(same(&back[0], &a) && same(&back[1], &b));
        let s1 = Tensor::from_strings("s", vec![1, 2], ["ab", ""]);
        let s2 = Tensor::from_strings("s", vec![1, 2], ["c", "dé"]);
        let joined = Tensor::concat_rows(&[&s1, &s2]).unwrap();
        assert!(joined.check().is_ok());
        let parts = joined.split_rows(&[1, 1]).unwrap();
        assert!(same(&parts[1], &s2));
        assert!(all.split_rows(&[1]).is_err());
        let c = Tensor::from_f32("x", vec![1, 3], &[0.0; 3]);
        assert!(Tensor::concat_rows(&[&a, &c]).is_err());
    }

    #[test]
    fn bytes_elements() {
        let t = Tensor::from_strings("s", vec![2], ["ab", ""]);
        assert_eq!(t.data, vec![2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        assert_eq!(t.strings().unwrap(), vec![&b"ab"[..], &b""[..]]);
        let bad = Tensor::new("b", Datatype::Bytes, vec![1], vec![9, 0, 0, 0, 1]).unwrap_err();
        assert!(bad.message.contains("runs past"), "{}", bad.message);
        let short = Tensor::new("f", Datatype::Fp32, vec![2], vec![0; 4]).unwrap_err();
        assert!(short.message.contains("do not fit"), "{}", short.message);
    }
}
