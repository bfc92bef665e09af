//! Reading a request body: bounded, decompressed as it is charged to the in-flight budget, and a binary body's JSON header found.

use super::*;

/// Reads the body within `app.body_timeout`, bounded by `app.max_input_size`; a compressed body
/// is decoded on the blocking pool. The body is charged to the in-flight budget as it arrives
/// and as it inflates, before the memory is spent: the returned charge covers what it holds
/// (a gzip bomb stops at the budget, with 503, not after it has inflated).
pub(crate) async fn read_body(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Charge), Error> {
    let secs = app.body_timeout.as_secs();
    let mut charge = Charge::new(app.service.budget());
    let raw = tokio::time::timeout(
        app.body_timeout,
        read_raw(headers, body, app.max_input_size, &mut charge),
    )
    .await
    .map_err(|_| {
        tracing::info!(secs, "request body not received in time");
        Error::invalid(format!(
            "the request body was not received within {secs} s (--http-body-timeout-secs)"
        ))
    })??;
    match raw {
        Raw::Plain(b) => Ok((b, charge)),
        Raw::Compressed(b, kind) => {
            let limit = app.max_input_size;
            tokio::task::spawn_blocking(move || {
                let out = decompress(&b, kind, limit, &mut charge)?;
                Ok((out, charge))
            })
            .await
            .map_err(|_| Error::internal("decompression panicked"))?
        }
    }
}

/// A body as read from the wire.
pub(super) enum Raw {
    Plain(Bytes),
    Compressed(Bytes, Compression),
}

#[derive(Clone, Copy)]
pub(super) enum Compression {
    Gzip,
    Deflate,
}

/// Inflates `raw` up to `limit` bytes, charging `charge` for the compressed and inflated bytes
/// together as the output grows, a chunk at a time.
pub(super) fn decompress(
    raw: &[u8],
    kind: Compression,
    limit: usize,
    charge: &mut Charge,
) -> Result<Bytes, Error> {
    const CHUNK: usize = 64 * 1024;
    let mut decoder: Box<dyn Read + '_> = match kind {
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(raw)),
        Compression::Deflate => Box::new(flate2::read::ZlibDecoder::new(raw)),
    };
    let too_big = || {
        Error::too_large(format!(
            "request body exceeds the maximum of {limit} bytes (--http-max-input-size)"
        ))
    };
    let mut out: Vec<u8> = Vec::new();
    loop {
        if out.len() > limit {
            return Err(too_big());
        }
        let at = out.len();
        reserve_charged(&mut out, CHUNK, limit + CHUNK + 1, raw.len(), charge)?;
        out.resize(at + CHUNK, 0);
        let n = match decoder.read(&mut out[at..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => {
                return Err(Error::invalid(format!(
                    "cannot decompress request body: {e}"
                )))
            }
        };
        out.truncate(at + n);
        if n == 0 {
            break;
        }
    }
    if out.len() > limit {
        return Err(too_big());
    }
    Ok(out.into())
}

/// Makes room in `buf` for `extra` more bytes, charging `charge` for the new capacity (plus
/// `held` bytes kept elsewhere) before it is allocated: grown by doubling, as `Vec` would,
/// but never past `most` unless `extra` needs it.
pub(super) fn reserve_charged(
    buf: &mut Vec<u8>,
    extra: usize,
    most: usize,
    held: usize,
    charge: &mut Charge,
) -> Result<(), Error> {
    let need = buf.len() + extra;
    if buf.capacity() >= need {
        return Ok(());
    }
    let cap = (buf.capacity() * 2).min(most).max(need);
    charge.grow_to((held + cap) as u64)?;
    buf.reserve_exact(cap - buf.len());
    Ok(())
}

/// Reads the raw body, bounded by `limit`, charging `charge` for each frame as it arrives.
pub(super) async fn read_raw(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    charge: &mut Charge,
) -> Result<Raw, Error> {
    use http_body_util::BodyExt;
    let too_big = || {
        Error::too_large(format!(
            "request body exceeds the maximum of {limit} bytes (--http-max-input-size)"
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_big());
    }
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut rest: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::invalid(format!("cannot read request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let held = first.as_ref().map_or(0, Bytes::len) + rest.len();
        if held + data.len() > limit {
            return Err(too_big());
        }
        charge.grow_to((held + data.len()) as u64)?;
        match &first {
            // One frame is kept as it came (no copy), as most bodies are one frame.
            None => first = Some(data),
            Some(f) => {
                // The declared length is room reserved at once, so it is charged first too.
                let first_len = if rest.is_empty() { f.len() } else { 0 };
                let extra = first_len + data.len();
                let want = declared.unwrap_or(0).max(rest.len() + extra) - rest.len();
                reserve_charged(&mut rest, want, limit, f.len(), charge)?;
                if first_len > 0 {
                    rest.extend_from_slice(f);
                }
                rest.extend_from_slice(&data);
            }
        }
    }
    let raw = match (first, rest.is_empty()) {
        (Some(f), true) => f,
        (None, _) => Bytes::new(),
        (Some(_), false) => Bytes::from(rest),
    };
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("") | Some("identity") => Ok(Raw::Plain(raw)),
        Some("gzip") => Ok(Raw::Compressed(raw, Compression::Gzip)),
        Some("deflate") => Ok(Raw::Compressed(raw, Compression::Deflate)),
        Some(other) => Err(Error::unsupported(format!(
            "unsupported Content-Encoding '{other}' (use gzip or deflate)"
        ))),
    }
}

/// Requests whose JSON part is up to this size are decoded on the async worker; larger ones on
/// the blocking pool, so that a few large requests cannot stall health checks. Binary tensor
/// data is sliced, not decoded, so it does not count.
pub(crate) const INLINE_DECODE_BYTES: usize = 64 * 1024;

/// What a body may cost in memory while its request runs, in bytes, charged against the
/// in-flight budget: the body itself, plus for its JSON part the tensors decoded from it (at
/// most 4 bytes per byte of text: FP64 from `1,`); binary data is sliced without copies.
/// The values of its outline are charged as decoding counts them ([`super::codec::decode`]).
pub(super) fn decode_cost(body_len: usize, header_len: Option<usize>) -> u64 {
    let json = header_len.map_or(body_len, |n| n.min(body_len));
    (json as u64) * 5 + (body_len - json) as u64
}
