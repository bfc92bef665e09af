//! ONNX string tensors as bytes, as Triton passes them: ONNX Runtime holds each element in a
//! `std::string`, which takes any bytes but NUL, so a BYTES element that is not UTF-8 reaches
//! the model unchanged and comes back unchanged.
//!
//! `ort` only speaks Rust `str` for strings: going in, its [`Utf8Data`] trait asks for bytes
//! and hands them to `FillStringTensor` as C strings, so [`RawString`] gives it ours; coming
//! out, `try_extract_strings` refuses what is not UTF-8, so [`extract`] reads the content with
//! the two C API calls it makes, keeping the bytes. That call is the only unsafe code here.

use ort::value::{DynValue, Utf8Data};
use ort::AsPointer;
use wisp_core::{Error, Result};

/// One BYTES element for `FillStringTensor`, which copies it into a `std::string`.
#[derive(Clone, Debug)]
pub(crate) struct RawString(pub Vec<u8>);

impl Utf8Data for RawString {
    fn as_utf8_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Every element of string tensor `v` (`count` elements), as the bytes ONNX Runtime holds.
#[allow(unsafe_code)]
pub(crate) fn extract(v: &DynValue, count: usize) -> Result<Vec<Vec<u8>>> {
    let api = ort::api();
    let ptr = v.ptr();
    let mut total = 0usize;
    // SAFETY: `ptr` is a live string tensor (the caller checked its element type) owned by
    // `v`, which outlives these calls; the out-pointers are valid for one `usize`, and the
    // buffers passed to GetStringTensorContent are exactly the lengths given with them.
    unsafe {
        status((api.GetStringTensorDataLength)(ptr, &mut total))?;
        let mut content = vec![0u8; total];
        let mut offsets = vec![0usize; count + 1];
        if count > 0 {
            status((api.GetStringTensorContent)(
                ptr,
                content.as_mut_ptr().cast(),
                total,
                offsets.as_mut_ptr(),
                count,
            ))?;
        }
        offsets[count] = total;
        offsets
            .windows(2)
            .map(|w| {
                content
                    .get(w[0]..w[1])
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| Error::internal("ONNX Runtime gave string offsets out of order"))
            })
            .collect()
    }
}

/// An error for a non-null `OrtStatus`, which it releases.
#[allow(unsafe_code)]
unsafe fn status(s: ort::sys::OrtStatusPtr) -> Result<()> {
    if s.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: `s` is a status ONNX Runtime just returned to us; its message lives until the
    // status is released, which happens once, after the message is copied.
    let msg = unsafe { std::ffi::CStr::from_ptr((api.GetErrorMessage)(s.0)) }
        .to_string_lossy()
        .into_owned();
    unsafe { (api.ReleaseStatus)(s.0) };
    Err(Error::internal(format!("ONNX Runtime: {msg}")))
}

/// BYTES tensor data → the elements ONNX Runtime will hold. A NUL byte would end a C string
/// early, so an element holding one is refused, naming it.
pub(crate) fn raw_strings(data: &[u8], name: &str) -> Result<Vec<RawString>> {
    let elements = wisp_core::tensor::decode_bytes_elements(data)?;
    if let Some(i) = elements.iter().position(|b| b.contains(&0)) {
        return Err(Error::invalid(format!(
            "input '{name}': BYTES element {i} contains a NUL byte, which ONNX Runtime string tensors cannot hold"
        )));
    }
    Ok(elements
        .into_iter()
        .map(|b| RawString(b.to_vec()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::tensor::encode_bytes_elements;

    #[test]
    fn any_bytes_but_nul_become_elements() {
        let data = encode_bytes_elements([&[0xffu8, 0xfe][..], b"ok", b""]);
        let raw = raw_strings(&data, "x").unwrap();
        let got: Vec<&[u8]> = raw.iter().map(|r| r.as_utf8_bytes()).collect();
        assert_eq!(got, vec![&[0xffu8, 0xfe][..], b"ok", b""]);
        let nul = encode_bytes_elements([&b"a"[..], b"b\0c"]);
        let e = raw_strings(&nul, "x").unwrap_err();
        assert_eq!(e.kind(), wisp_core::ErrorKind::InvalidArg);
        assert!(e.message().contains("element 1 contains a NUL byte"), "{e}");
    }
}
