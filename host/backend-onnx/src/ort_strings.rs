//! ONNX string tensors as bytes, as Triton passes them: ONNX Runtime holds each element in a
//! `std::string`, which takes any bytes, so a BYTES element that is not UTF-8, or that holds a
//! NUL byte, reaches the model unchanged and comes back unchanged.
//!
//! `ort` only speaks Rust `str` for strings: going in, its [`Utf8Data`] trait asks for bytes
//! and hands them to `FillStringTensor` as C strings, so [`RawString`] gives it ours, and an
//! element holding a NUL (which would end a C string early) is written afterwards with its
//! length through `GetResizedStringTensorElementBuffer`; coming out, `try_extract_strings`
//! refuses what is not UTF-8, so [`extract`] reads the content with the two C API calls it
//! makes, keeping the bytes. Those calls are the only unsafe code here.

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

/// A BYTES input on its way into an ONNX Runtime string tensor: the elements `FillStringTensor`
/// can take as C strings, with those holding a NUL left empty there and written afterwards by
/// [`StringInput::write_nul_elements`].
pub(crate) struct StringInput<'a> {
    /// One element per tensor element; empty where `with_nul` has the real bytes.
    pub raw: Vec<RawString>,
    with_nul: Vec<(usize, &'a [u8])>,
}

/// BYTES tensor data → the elements ONNX Runtime will hold.
pub(crate) fn raw_strings(data: &[u8]) -> Result<StringInput<'_>> {
    let elements = wisp_core::tensor::decode_bytes_elements(data)?;
    let mut with_nul = Vec::new();
    let raw = elements
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            if b.contains(&0) {
                with_nul.push((i, b));
                RawString(Vec::new())
            } else {
                RawString(b.to_vec())
            }
        })
        .collect();
    Ok(StringInput { raw, with_nul })
}

impl StringInput<'_> {
    /// Writes the elements holding a NUL into `v`, the string tensor made from [`Self::raw`],
    /// each with its length, so none is cut at its first NUL.
    #[allow(unsafe_code)]
    pub(crate) fn write_nul_elements(&self, v: &mut DynValue) -> Result<()> {
        if self.with_nul.is_empty() {
            return Ok(());
        }
        let api = ort::api();
        let count = self.raw.len();
        for &(index, bytes) in &self.with_nul {
            if index >= count {
                return Err(Error::internal("string element index out of range"));
            }
            let mut buffer: *mut std::ffi::c_char = std::ptr::null_mut();
            // SAFETY: `v` is a live string tensor of `count` elements that we own mutably and
            // `index < count`; ONNX Runtime resizes that element's `std::string` to
            // `bytes.len()` and returns its buffer, valid for that many bytes until the tensor
            // changes again, which it does not before the copy ends.
            unsafe {
                status((api.GetResizedStringTensorElementBuffer)(
                    v.ptr_mut(),
                    index,
                    bytes.len(),
                    &mut buffer,
                ))?;
                if buffer.is_null() {
                    return Err(Error::internal(
                        "ONNX Runtime gave no buffer for a string element",
                    ));
                }
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), bytes.len());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::tensor::encode_bytes_elements;

    #[test]
    fn elements_with_a_nul_wait_to_be_written_with_their_length() {
        let data = encode_bytes_elements([&[0xffu8, 0xfe][..], b"ok", b"", b"b\0c\0\0"]);
        let input = raw_strings(&data).unwrap();
        let got: Vec<&[u8]> = input.raw.iter().map(|r| r.as_utf8_bytes()).collect();
        assert_eq!(got, vec![&[0xffu8, 0xfe][..], b"ok", b"", b""]);
        assert_eq!(input.with_nul, vec![(3, &b"b\0c\0\0"[..])]);
    }
}
