//! `image-preprocess`: PNG/JPEG bytes in, a normalized FP32 image tensor out.
//!
//! Input `IMAGE` (BYTES, one encoded image per element) → output `PIXELS` (FP32,
//! `[n, 3, height, width]` or `[n, height, width, 3]`, where `n` is the number of images).
//! Parameters: see [`plugin_imaging::Options::from_params`], plus `input`/`output` to rename
//! the tensors.

use plugin_imaging::Options;
use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// The plugin: its options and tensor names.
pub struct ImagePreprocess {
    options: Options,
    input: String,
    output: String,
}

impl Plugin for ImagePreprocess {
    fn init(params: &Params) -> Result<Self, Error> {
        Ok(ImagePreprocess {
            options: Options::from_params(params)?,
            input: params.get("input").unwrap_or("IMAGE").to_string(),
            output: params.get("output").unwrap_or("PIXELS").to_string(),
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let input = request.input(&self.input)?;
        let images = input.strings()?;
        let pixels = plugin_imaging::preprocess_all(&images, &self.options)?;
        let mut shape = match input.shape.split_last() {
            Some((1, lead)) if !lead.is_empty() => lead.to_vec(),
            _ => input.shape.clone(),
        };
        shape.extend_from_slice(&self.options.shape());
        Ok(Response::new(vec![Tensor::from_f32(
            self.output.clone(),
            shape,
            &pixels,
        )]))
    }
}

wisp_sdk::export_plugin!(ImagePreprocess);

#[cfg(test)]
mod tests {
    use super::*;

    fn png() -> Vec<u8> {
        plugin_imaging::encode_png(1, 1, |_, _| [255, 0, 0])
    }

    fn plugin(pairs: &[(&str, &str)]) -> ImagePreprocess {
        ImagePreprocess::init(&Params::from_pairs(pairs)).unwrap()
    }

    #[test]
    fn batch_of_images_gives_a_batch_of_tensors() {
        let mut p = plugin(&[("width", "4"), ("height", "2"), ("mean", "0"), ("std", "1")]);
        let req = Request::new(vec![Tensor::from_strings(
            "IMAGE",
            vec![2, 1],
            [png(), png()],
        )]);
        let out = p.execute(&req).unwrap();
        let t = out.output("PIXELS").unwrap();
        assert_eq!(t.shape, vec![2, 3, 2, 4]);
        let v = t.to_f32().unwrap();
        assert_eq!(v.len(), 2 * 3 * 8);
        assert!(
            v[..8].iter().all(|&x| (x - 1.0).abs() < 1e-6),
            "red plane {:?}",
            &v[..8]
        );
        assert!(v[8..16].iter().all(|&x| x.abs() < 1e-6));
    }

    #[test]
    fn names_the_bad_image() {
        let mut p = plugin(&[]);
        let req = Request::new(vec![Tensor::from_strings(
            "IMAGE",
            vec![2],
            [png(), b"junk".to_vec()],
        )]);
        let e = p.execute(&req).unwrap_err();
        assert!(e.message.starts_with("image 1:"), "{}", e.message);
        let e = p.execute(&Request::new(vec![])).unwrap_err();
        assert!(e.message.contains("'IMAGE'"));
    }

    #[test]
    fn bad_parameters_fail_init() {
        assert!(ImagePreprocess::init(&Params::from_pairs(&[("width", "0")])).is_err());
    }
}
