//! `magika-features`: file bytes in, the Magika model's input features out.
//!
//! Input `CONTENT` (BYTES, one file per element) → output `FEATURES` (INT32, `[n, beg + end]`):
//! as Magika 1.0's `_extract_features_from_seekable` (features v2): read at most `block_size`
//! bytes from the start and from the end, strip ASCII whitespace (start: leading, end:
//! trailing), keep the first `beg_size` / last `end_size` bytes, pad with `padding_token` (after
//! the beginning, before the end). Parameters `beg_size`, `end_size` (1024), `block_size`
//! (4096), `padding_token` (256) default to the `standard_v3_3` model's config.

use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// The feature layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes taken from the beginning.
    pub beg_size: usize,
    /// Bytes taken from the end.
    pub end_size: usize,
    /// Bytes read from each end before stripping.
    pub block_size: usize,
    /// Value of padding positions.
    pub padding_token: i32,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            beg_size: 1024,
            end_size: 1024,
            block_size: 4096,
            padding_token: 256,
        }
    }
}

/// Python's `bytes.strip()` whitespace.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// The features of one file.
pub fn features(content: &[u8], l: &Layout) -> Vec<i32> {
    let n = content.len().min(l.block_size);
    let mut out = Vec::with_capacity(l.beg_size + l.end_size);
    let beg = &content[..n];
    let start = beg.iter().position(|&b| !is_space(b)).unwrap_or(n);
    let beg = &beg[start..];
    let beg = &beg[..beg.len().min(l.beg_size)];
    out.extend(beg.iter().map(|&b| i32::from(b)));
    out.resize(l.beg_size, l.padding_token);
    let end = &content[content.len() - n..];
    let stop = end.iter().rposition(|&b| !is_space(b)).map_or(0, |p| p + 1);
    let end = &end[..stop];
    let end = &end[end.len() - end.len().min(l.end_size)..];
    out.extend(std::iter::repeat_n(l.padding_token, l.end_size - end.len()));
    out.extend(end.iter().map(|&b| i32::from(b)));
    out
}

/// The plugin.
pub struct MagikaFeatures {
    layout: Layout,
}

impl Plugin for MagikaFeatures {
    fn init(params: &Params) -> Result<Self, Error> {
        let d = Layout::default();
        let layout = Layout {
            beg_size: params.parse_or("beg_size", d.beg_size)?,
            end_size: params.parse_or("end_size", d.end_size)?,
            block_size: params.parse_or("block_size", d.block_size)?,
            padding_token: params.parse_or("padding_token", d.padding_token)?,
        };
        if layout.beg_size >= layout.block_size || layout.end_size >= layout.block_size {
            return Err(Error::invalid(
                "parameters 'beg_size' and 'end_size' must be below 'block_size'",
            ));
        }
        Ok(MagikaFeatures { layout })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let input = request.input("CONTENT")?;
        let files = input.strings()?;
        let mut all =
            Vec::with_capacity(files.len() * (self.layout.beg_size + self.layout.end_size));
        for f in &files {
            all.extend(features(f, &self.layout));
        }
        let width = (self.layout.beg_size + self.layout.end_size) as i64;
        let mut shape = match input.shape.split_last() {
            Some((1, lead)) if !lead.is_empty() => lead.to_vec(),
            _ => input.shape.clone(),
        };
        shape.push(width);
        Ok(Response::new(vec![Tensor::from_i32(
            "FEATURES", shape, &all,
        )]))
    }
}

wisp_sdk::export_plugin!(MagikaFeatures);

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Layout = Layout {
        beg_size: 4,
        end_size: 4,
        block_size: 8,
        padding_token: 256,
    };

    #[test]
    fn strips_and_pads_like_magika() {
        // Leading whitespace goes from the beginning, trailing from the end.
        assert_eq!(
            features(b"  ab\n", &SMALL),
            vec![97, 98, 10, 256, 32, 32, 97, 98]
        );
        assert_eq!(
            features(b"ab", &SMALL),
            vec![97, 98, 256, 256, 256, 256, 97, 98]
        );
        assert_eq!(features(b"", &SMALL), vec![256; 8]);
    }

    #[test]
    fn reads_at_most_a_block_from_each_end() {
        let content: Vec<u8> = (b'a'..=b'z').collect();
        let f = features(&content, &SMALL);
        assert_eq!(f[..4], [97, 98, 99, 100]);
        assert_eq!(f[4..], [119, 120, 121, 122]);
    }

    #[test]
    fn a_batch_of_files() {
        let mut p = MagikaFeatures::init(&Params::default()).unwrap();
        let req = Request::new(vec![Tensor::from_strings(
            "CONTENT",
            vec![2, 1],
            ["x", "y"],
        )]);
        let t = p.execute(&req).unwrap().outputs.remove(0);
        assert_eq!(t.shape, vec![2, 2048]);
        assert_eq!(t.to_i32().unwrap().len(), 4096);
    }
}
