//! Image pre-processing and classification post-processing shared by the example plugins.
//!
//! The same functions run inside the `image-preprocess` component and natively in the
//! benchmark, which is how the wasm-vs-native ratio is measured.

use wisp_sdk::{Error, Params};

/// Tensor layout of the pre-processed image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Channels, height, width.
    Nchw,
    /// Height, width, channels.
    Nhwc,
}

/// How the image is fitted into `width` × `height`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Resize to exactly `width` × `height`.
    Stretch,
    /// Resize to `height`, keep the aspect ratio (width capped at `width`), pad the right with
    /// zeros (PP-OCR's text-direction classifier).
    PadRight,
}

/// Pre-processing settings (the plugin's `parameters`).
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Output width (`width`, default 224).
    pub width: usize,
    /// Output height (`height`, default 224).
    pub height: usize,
    /// `layout`: `NCHW` (default) or `NHWC`.
    pub layout: Layout,
    /// `resize`: `stretch` (default) or `pad_right`.
    pub fit: Fit,
    /// `channel_order`: `RGB` (default) or `BGR`.
    pub bgr: bool,
    /// `scale` applied to 0..255 pixel values first (default 1/255).
    pub scale: f32,
    /// `mean` per channel, subtracted after scaling (default ImageNet's).
    pub mean: [f32; 3],
    /// `std` per channel, divided by last (default ImageNet's).
    pub std: [f32; 3],
}

impl Default for Options {
    fn default() -> Self {
        Options {
            width: 224,
            height: 224,
            layout: Layout::Nchw,
            fit: Fit::Stretch,
            bgr: false,
            scale: 1.0 / 255.0,
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
        }
    }
}

fn triple(p: &Params, key: &str, default: [f32; 3]) -> Result<[f32; 3], Error> {
    let v = p.list_or::<f32>(key, default.to_vec())?;
    match v.len() {
        1 => Ok([v[0]; 3]),
        3 => Ok([v[0], v[1], v[2]]),
        n => Err(Error::invalid(format!(
            "parameter '{key}': expected 1 or 3 values, got {n}"
        ))),
    }
}

impl Options {
    /// Reads `width`, `height`, `layout`, `resize`, `channel_order`, `scale`, `mean`, `std`.
    pub fn from_params(p: &Params) -> Result<Self, Error> {
        let d = Options::default();
        let o = Options {
            width: p.parse_or("width", d.width)?,
            height: p.parse_or("height", d.height)?,
            layout: match p
                .get("layout")
                .unwrap_or("NCHW")
                .to_ascii_uppercase()
                .as_str()
            {
                "NCHW" => Layout::Nchw,
                "NHWC" => Layout::Nhwc,
                other => {
                    return Err(Error::invalid(format!(
                        "parameter 'layout': expected NCHW or NHWC, got '{other}'"
                    )))
                }
            },
            fit: match p.get("resize").unwrap_or("stretch") {
                "stretch" => Fit::Stretch,
                "pad_right" => Fit::PadRight,
                other => {
                    return Err(Error::invalid(format!(
                        "parameter 'resize': expected stretch or pad_right, got '{other}'"
                    )))
                }
            },
            bgr: match p
                .get("channel_order")
                .unwrap_or("RGB")
                .to_ascii_uppercase()
                .as_str()
            {
                "RGB" => false,
                "BGR" => true,
                other => {
                    return Err(Error::invalid(format!(
                        "parameter 'channel_order': expected RGB or BGR, got '{other}'"
                    )))
                }
            },
            scale: p.parse_or("scale", d.scale)?,
            mean: triple(p, "mean", d.mean)?,
            std: triple(p, "std", d.std)?,
        };
        if o.width == 0 || o.height == 0 || o.width > 8192 || o.height > 8192 {
            return Err(Error::invalid(format!(
                "parameters 'width'/'height' must be 1..=8192, got {}x{}",
                o.width, o.height
            )));
        }
        if o.std.contains(&0.0) {
            return Err(Error::invalid("parameter 'std': values must not be 0"));
        }
        Ok(o)
    }

    /// The output shape of one image: `[3, h, w]` or `[h, w, 3]`.
    pub fn shape(&self) -> [i64; 3] {
        let (h, w) = (self.height as i64, self.width as i64);
        match self.layout {
            Layout::Nchw => [3, h, w],
            Layout::Nhwc => [h, w, 3],
        }
    }
}

/// An 8-bit RGB image.
#[derive(Debug, Clone)]
pub struct Rgb {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `width * height * 3` bytes, row-major.
    pub pixels: Vec<u8>,
}

/// Largest decoded image accepted (pixels), so a hostile header cannot ask for gigabytes.
pub const MAX_PIXELS: u64 = 40_000_000;

/// Decodes PNG or JPEG bytes.
pub fn decode(bytes: &[u8]) -> Result<Rgb, Error> {
    let reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| Error::invalid(format!("cannot read image: {e}")))?;
    let Some(format) = reader.format() else {
        return Err(Error::invalid(
            "not a PNG or JPEG image (unrecognized header)",
        ));
    };
    let mut reader = reader;
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_PIXELS * 4);
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| Error::invalid(format!("cannot decode {format:?} image: {e}")))?;
    let rgb = img.into_rgb8();
    Ok(Rgb {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        pixels: rgb.into_raw(),
    })
}

/// Bilinear resize with half-pixel centres (as OpenCV's `INTER_LINEAR`).
pub fn resize(src: &Rgb, width: usize, height: usize) -> Rgb {
    let sx = src.width as f32 / width as f32;
    let sy = src.height as f32 / height as f32;
    // Per output column: left source column and weight (shared by every row).
    let cols: Vec<(usize, usize, f32)> = (0..width)
        .map(|x| {
            let fx = ((x as f32 + 0.5) * sx - 0.5).max(0.0);
            let x0 = (fx as usize).min(src.width - 1);
            let x1 = (x0 + 1).min(src.width - 1);
            (x0 * 3, x1 * 3, fx - x0 as f32)
        })
        .collect();
    let mut out = vec![0u8; width * height * 3];
    let stride = src.width * 3;
    for y in 0..height {
        let fy = ((y as f32 + 0.5) * sy - 0.5).max(0.0);
        let y0 = (fy as usize).min(src.height - 1);
        let y1 = (y0 + 1).min(src.height - 1);
        let wy = fy - y0 as f32;
        let r0 = &src.pixels[y0 * stride..(y0 + 1) * stride];
        let r1 = &src.pixels[y1 * stride..(y1 + 1) * stride];
        let dst = &mut out[y * width * 3..(y + 1) * width * 3];
        for (x, &(a, b, wx)) in cols.iter().enumerate() {
            for c in 0..3 {
                let top = r0[a + c] as f32 * (1.0 - wx) + r0[b + c] as f32 * wx;
                let bottom = r1[a + c] as f32 * (1.0 - wx) + r1[b + c] as f32 * wx;
                // Non-negative, so +0.5 then truncation rounds half away from zero as
                // `round` does, without a libm call per sample (wasm has no such instruction).
                dst[x * 3 + c] = (top * (1.0 - wy) + bottom * wy + 0.5) as u8;
            }
        }
    }
    Rgb {
        width,
        height,
        pixels: out,
    }
}

/// Decodes, fits, scales and normalizes one image into `3 * height * width` floats.
pub fn preprocess(bytes: &[u8], o: &Options) -> Result<Vec<f32>, Error> {
    let mut out = vec![0f32; 3 * o.width * o.height];
    preprocess_into(bytes, o, &mut out)?;
    Ok(out)
}

/// [`preprocess`] into `out`, which must hold `3 * height * width` floats (all are written).
pub fn preprocess_into(bytes: &[u8], o: &Options, out: &mut [f32]) -> Result<(), Error> {
    let (w, h) = (o.width, o.height);
    if out.len() != 3 * h * w {
        return Err(Error::internal(format!(
            "preprocess buffer holds {} floats, expected {}",
            out.len(),
            3 * h * w
        )));
    }
    let img = decode(bytes)?;
    if img.width == 0 || img.height == 0 {
        return Err(Error::invalid("image has no pixels"));
    }
    let resized_w = match o.fit {
        Fit::Stretch => w,
        Fit::PadRight => {
            let ratio = img.width as f64 / img.height as f64;
            ((h as f64 * ratio).ceil() as usize).clamp(1, w)
        }
    };
    let resized;
    let small = if (img.width, img.height) == (resized_w, h) {
        &img
    } else {
        resized = resize(&img, resized_w, h);
        &resized
    };
    // Per channel: value = (pixel * scale - mean) / std, as one multiply-add; padding is 0.
    let mul: [f32; 3] = std::array::from_fn(|c| o.scale / o.std[c]);
    let add: [f32; 3] = std::array::from_fn(|c| -o.mean[c] / o.std[c]);
    let src_channel = |c: usize| if o.bgr { 2 - c } else { c };
    match o.layout {
        Layout::Nchw => {
            // One plane at a time, one row at a time: straight loops the compiler vectorizes.
            for (c, plane) in out.chunks_exact_mut(h * w).enumerate() {
                let (sc, m, a) = (src_channel(c), mul[c], add[c]);
                for (y, row) in plane.chunks_exact_mut(w).enumerate() {
                    let src = &small.pixels[y * resized_w * 3..(y + 1) * resized_w * 3];
                    let (used, pad) = row.split_at_mut(resized_w);
                    for (d, p) in used.iter_mut().zip(src.chunks_exact(3)) {
                        *d = p[sc] as f32 * m + a;
                    }
                    pad.fill(0.0);
                }
            }
        }
        Layout::Nhwc => {
            for (y, row) in out.chunks_exact_mut(w * 3).enumerate() {
                let src = &small.pixels[y * resized_w * 3..(y + 1) * resized_w * 3];
                let (used, pad) = row.split_at_mut(resized_w * 3);
                for (d, p) in used.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
                    for c in 0..3 {
                        d[c] = p[src_channel(c)] as f32 * mul[c] + add[c];
                    }
                }
                pad.fill(0.0);
            }
        }
    }
    Ok(())
}

/// Encodes an RGB image as PNG (for tests, examples and benchmarks).
pub fn encode_png(width: u32, height: u32, f: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| image::Rgb(f(x, y)));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("encoding to memory cannot fail");
    out.into_inner()
}

/// Encodes an RGB image as JPEG at `quality` (for tests, examples and benchmarks).
pub fn encode_jpeg(
    width: u32,
    height: u32,
    quality: u8,
    f: impl Fn(u32, u32) -> [u8; 3],
) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| image::Rgb(f(x, y)));
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
        .encode_image(&img)
        .expect("encoding to memory cannot fail");
    out
}

/// Pre-processes every encoded image of a BYTES tensor into one buffer of `n × 3 × h × w`
/// floats; an error names the image by index.
pub fn preprocess_all(images: &[&[u8]], o: &Options) -> Result<Vec<f32>, Error> {
    let per_image = 3 * o.width * o.height;
    let mut pixels = vec![0f32; images.len() * per_image];
    for (i, (bytes, out)) in images
        .iter()
        .zip(pixels.chunks_exact_mut(per_image))
        .enumerate()
    {
        preprocess_into(bytes, o, out)
            .map_err(|e| Error::new(e.code, format!("image {i}: {}", e.message)))?;
    }
    Ok(pixels)
}

/// Post-processing settings shared by the classification plugins.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Classify {
    /// Classes kept per row, best first.
    pub top_k: usize,
    /// Apply a softmax to each row first.
    pub softmax: bool,
    /// Class names by index.
    pub labels: Vec<String>,
}

impl Classify {
    /// Reads `top_k` (default 1, at least 1), `softmax` (default false) and `labels`
    /// (comma-separated).
    pub fn from_params(p: &Params) -> Result<Self, Error> {
        let top_k = p.parse_or("top_k", 1usize)?;
        if top_k == 0 {
            return Err(Error::invalid("parameter 'top_k' must be at least 1"));
        }
        Ok(Classify {
            top_k,
            softmax: p.parse_or("softmax", false)?,
            labels: p
                .get("labels")
                .map(|l| l.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default(),
        })
    }

    /// `score:index:label` strings, `min(top_k, classes)` per row of `classes` scores.
    pub fn rows(&self, scores: &[f32], classes: usize) -> Vec<String> {
        let k = self.top_k.min(classes);
        let mut out = Vec::with_capacity(scores.len() / classes.max(1) * k);
        for row in scores.chunks(classes.max(1)) {
            let mut row = row.to_vec();
            if self.softmax {
                softmax(&mut row);
            }
            for (i, s) in top_k(&row, k) {
                out.push(class_string(s, i, self.labels.get(i).map(String::as_str)));
            }
        }
        out
    }
}

/// Softmax in place (numerically stable).
pub fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    if sum > 0.0 {
        for x in v.iter_mut() {
            *x /= sum;
        }
    }
}

/// The `k` highest scores as (index, score), best first (ties: lower index first).
pub fn top_k(scores: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.into_iter().take(k).map(|i| (i, scores[i])).collect()
}

/// Triton's classification string: `score:index:label` (`score:index` without a label).
pub fn class_string(score: f32, index: usize, label: Option<&str>) -> String {
    match label {
        Some(l) => format!("{score:.6}:{index}:{l}"),
        None => format!("{score:.6}:{index}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::encode_png as png;

    #[test]
    fn decodes_jpeg_too() {
        let bytes = encode_jpeg(16, 16, 95, |_, _| [200, 100, 50]);
        let img = decode(&bytes).unwrap();
        assert_eq!((img.width, img.height), (16, 16));
        let p = &img.pixels[..3];
        assert!(
            (p[0] as i32 - 200).abs() < 6 && (p[1] as i32 - 100).abs() < 6,
            "{p:?}"
        );
    }

    #[test]
    fn decodes_and_normalizes_a_solid_image() {
        let bytes = png(10, 6, |_, _| [255, 0, 51]);
        let o = Options {
            width: 4,
            height: 2,
            mean: [0.5; 3],
            std: [0.5; 3],
            ..Options::default()
        };
        let v = preprocess(&bytes, &o).unwrap();
        assert_eq!(v.len(), 3 * 2 * 4);
        // NCHW: channel planes of 8 values.
        assert!(v[..8].iter().all(|&x| (x - 1.0).abs() < 1e-6));
        assert!(v[8..16].iter().all(|&x| (x + 1.0).abs() < 1e-6));
        assert!(v[16..]
            .iter()
            .all(|&x| (x - (0.2 / 0.5 - 1.0)).abs() < 1e-5));
    }

    #[test]
    fn bgr_and_nhwc_reorder_channels() {
        let bytes = png(2, 2, |_, _| [10, 20, 30]);
        let o = Options {
            width: 1,
            height: 1,
            layout: Layout::Nhwc,
            bgr: true,
            scale: 1.0,
            mean: [0.0; 3],
            std: [1.0; 3],
            ..Options::default()
        };
        assert_eq!(preprocess(&bytes, &o).unwrap(), vec![30.0, 20.0, 10.0]);
    }

    #[test]
    fn pad_right_keeps_the_aspect_ratio() {
        // 4 wide, 2 high → height 2 gives width 4 of 8; the rest is zero padding.
        let bytes = png(4, 2, |_, _| [255, 255, 255]);
        let o = Options {
            width: 8,
            height: 2,
            fit: Fit::PadRight,
            scale: 1.0 / 255.0,
            mean: [0.0; 3],
            std: [1.0; 3],
            ..Options::default()
        };
        let v = preprocess(&bytes, &o).unwrap();
        let row: Vec<f32> = v[..8].to_vec();
        assert_eq!(row, vec![1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn resize_to_the_same_size_is_the_identity() {
        let src = Rgb {
            width: 5,
            height: 3,
            pixels: (0..45).map(|i| (i * 37 % 256) as u8).collect(),
        };
        assert_eq!(resize(&src, 5, 3).pixels, src.pixels);
    }

    #[test]
    fn nhwc_holds_the_same_values_as_nchw_and_both_pad_with_zero() {
        let bytes = png(6, 3, |x, y| [(x * 40) as u8, (y * 80) as u8, 7]);
        let nchw = Options {
            width: 5,
            height: 2,
            fit: Fit::PadRight,
            bgr: true,
            ..Options::default()
        };
        let nhwc = Options {
            layout: Layout::Nhwc,
            ..nchw.clone()
        };
        let (a, b) = (
            preprocess(&bytes, &nchw).unwrap(),
            preprocess(&bytes, &nhwc).unwrap(),
        );
        for c in 0..3 {
            for y in 0..2 {
                for x in 0..5 {
                    assert_eq!(
                        a[(c * 2 + y) * 5 + x],
                        b[(y * 5 + x) * 3 + c],
                        "c{c} y{y} x{x}"
                    );
                }
            }
        }
        // 6×3 at height 2 is 4 wide: column 4 is padding.
        assert!((0..6).all(|i| a[i * 5 + 4] == 0.0));
        assert!(a.iter().any(|&v| v != 0.0));
    }

    #[test]
    fn a_batch_lands_image_by_image_and_errors_name_the_image() {
        let o = Options {
            width: 2,
            height: 2,
            ..Options::default()
        };
        let (red, blue) = (png(3, 3, |_, _| [255, 0, 0]), png(3, 3, |_, _| [0, 0, 255]));
        let all = preprocess_all(&[&red, &blue], &o).unwrap();
        assert_eq!(all[..12], preprocess(&red, &o).unwrap()[..]);
        assert_eq!(all[12..], preprocess(&blue, &o).unwrap()[..]);
        let e = preprocess_all(&[&red, b"nope"], &o).unwrap_err();
        assert!(e.message.starts_with("image 1: "), "{}", e.message);
    }

    #[test]
    fn resize_interpolates_between_pixels() {
        let src = Rgb {
            width: 2,
            height: 1,
            pixels: vec![0, 0, 0, 200, 200, 200],
        };
        let out = resize(&src, 4, 1);
        assert_eq!(
            out.pixels.chunks(3).map(|p| p[0]).collect::<Vec<_>>(),
            vec![0, 50, 150, 200]
        );
    }

    #[test]
    fn rejects_what_is_not_an_image() {
        let e = preprocess(b"hello", &Options::default()).unwrap_err();
        assert!(e.message.contains("not a PNG or JPEG"), "{}", e.message);
        let mut truncated = png(8, 8, |x, _| [x as u8; 3]);
        truncated.truncate(40);
        assert!(preprocess(&truncated, &Options::default()).is_err());
    }

    #[test]
    fn options_name_bad_parameters() {
        let e = Options::from_params(&Params::from_pairs(&[("layout", "CHW")])).unwrap_err();
        assert!(e.message.contains("'layout'"));
        let e = Options::from_params(&Params::from_pairs(&[("mean", "1,2")])).unwrap_err();
        assert!(e.message.contains("'mean'"));
        let o = Options::from_params(&Params::from_pairs(&[("mean", "0.5"), ("width", "192")]))
            .unwrap();
        assert_eq!((o.mean, o.width), ([0.5; 3], 192));
    }

    #[test]
    fn softmax_and_top_k() {
        let mut v = vec![1.0, 3.0, 2.0];
        softmax(&mut v);
        assert!((v.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let top = top_k(&v, 2);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(class_string(0.5, 1, Some("180")), "0.500000:1:180");
    }
}
