//! Tensor datatypes: the KServe v2 names (`FP32`), the config names (`TYPE_FP32`) and sizes.

use crate::error::{Error, Result};

/// A tensor element type, as the KServe v2 protocol names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// One byte, 0 or 1.
    Bool,
    /// Unsigned 8-bit integer.
    Uint8,
    /// Unsigned 16-bit integer.
    Uint16,
    /// Unsigned 32-bit integer.
    Uint32,
    /// Unsigned 64-bit integer.
    Uint64,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// IEEE half precision.
    Fp16,
    /// IEEE single precision.
    Fp32,
    /// IEEE double precision.
    Fp64,
    /// bfloat16.
    Bf16,
    /// Variable-length byte strings, each serialized as a 4-byte LE length then the bytes.
    Bytes,
}

const ALL: [DataType; 14] = [
    DataType::Bool,
    DataType::Uint8,
    DataType::Uint16,
    DataType::Uint32,
    DataType::Uint64,
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::Fp16,
    DataType::Fp32,
    DataType::Fp64,
    DataType::Bf16,
    DataType::Bytes,
];

impl DataType {
    /// The protocol name (`"FP32"`).
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bf16 => "BF16",
            DataType::Bytes => "BYTES",
        }
    }

    /// The model-config name (`"TYPE_FP32"`; BYTES is `TYPE_STRING`).
    pub fn config_name(self) -> &'static str {
        match self {
            DataType::Bool => "TYPE_BOOL",
            DataType::Uint8 => "TYPE_UINT8",
            DataType::Uint16 => "TYPE_UINT16",
            DataType::Uint32 => "TYPE_UINT32",
            DataType::Uint64 => "TYPE_UINT64",
            DataType::Int8 => "TYPE_INT8",
            DataType::Int16 => "TYPE_INT16",
            DataType::Int32 => "TYPE_INT32",
            DataType::Int64 => "TYPE_INT64",
            DataType::Fp16 => "TYPE_FP16",
            DataType::Fp32 => "TYPE_FP32",
            DataType::Fp64 => "TYPE_FP64",
            DataType::Bf16 => "TYPE_BF16",
            DataType::Bytes => "TYPE_STRING",
        }
    }

    /// Parses a protocol name (`"FP32"`).
    pub fn parse(name: &str) -> Result<Self> {
        ALL.into_iter().find(|d| d.as_str() == name).ok_or_else(|| {
            Error::invalid(format!(
                "unknown datatype '{name}', expected one of BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BF16, BYTES"
            ))
        })
    }

    /// Parses a model-config name (`"TYPE_FP32"`); `None` for `TYPE_INVALID` or unknown names.
    pub fn from_config_name(name: &str) -> Option<Self> {
        ALL.into_iter().find(|d| d.config_name() == name)
    }

    /// Bytes per element, `None` for BYTES (variable length).
    pub fn size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in ALL {
            assert_eq!(DataType::parse(d.as_str()).unwrap(), d);
            assert_eq!(DataType::from_config_name(d.config_name()), Some(d));
        }
        assert_eq!(
            DataType::from_config_name("TYPE_STRING"),
            Some(DataType::Bytes)
        );
        assert!(DataType::parse("FLOAT").is_err());
        assert_eq!(DataType::from_config_name("TYPE_INVALID"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(DataType::Bool.size(), Some(1));
        assert_eq!(DataType::Fp16.size(), Some(2));
        assert_eq!(DataType::Int64.size(), Some(8));
        assert_eq!(DataType::Bytes.size(), None);
    }
}
