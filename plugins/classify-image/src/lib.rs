//! `classify-image`: a whole image classifier in one plugin (Triton's "BLS" style).
//!
//! Decodes and normalizes the image (as `image-preprocess`), runs a model the server serves
//! through `wasi:nn`, and turns its scores into `score:index:label` strings (as
//! `classify-postprocess`). Input `IMAGE` (BYTES) → output `CLASSES` (BYTES, `[n, top_k]`).
//!
//! Parameters: `model` (required: `name` or `name:version`), `model_input` (default `x`),
//! `model_output` (default: the model's first output), the pre-processing parameters of
//! `plugin_imaging::Options`, and `top_k`, `softmax`, `labels` as in `classify-postprocess`.
//! The model is resolved on first use, so it may load after this plugin.

use plugin_imaging::{Classify, Options};
use wisp_sdk::{nn, Error, Params, Plugin, Request, Response, Tensor};

/// The plugin's settings and its model handle.
pub struct ClassifyImage {
    options: Options,
    model_name: String,
    model_input: String,
    model_output: Option<String>,
    classify: Classify,
    input: String,
    output: String,
    model: Option<nn::Model>,
}

impl Plugin for ClassifyImage {
    fn init(params: &Params) -> Result<Self, Error> {
        let model_name = params
            .get("model")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                Error::invalid("parameter 'model' is required (the classifier to call)")
            })?
            .to_string();
        Ok(ClassifyImage {
            options: Options::from_params(params)?,
            model_name,
            model_input: params.get("model_input").unwrap_or("x").to_string(),
            model_output: params.get("model_output").map(str::to_string),
            classify: Classify::from_params(params)?,
            input: params.get("input").unwrap_or("IMAGE").to_string(),
            output: params.get("output").unwrap_or("CLASSES").to_string(),
            model: None,
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let input = request.input(&self.input)?;
        let images = input.strings()?;
        let pixels = plugin_imaging::preprocess_all(&images, &self.options)?;
        let mut shape = vec![images.len() as i64];
        shape.extend_from_slice(&self.options.shape());
        if self.model.is_none() {
            self.model = Some(nn::Model::load(&self.model_name)?);
        }
        let model = self.model.as_ref().expect("loaded above");
        let outputs = model.infer(&[Tensor::from_f32(self.model_input.clone(), shape, &pixels)])?;
        let scores = match &self.model_output {
            Some(name) => outputs.iter().find(|t| &t.name == name).ok_or_else(|| {
                Error::internal(format!(
                    "model '{}' returned no output '{name}'",
                    self.model_name
                ))
            })?,
            None => outputs.first().ok_or_else(|| {
                Error::internal(format!("model '{}' returned no outputs", self.model_name))
            })?,
        };
        let classes = *scores.shape.last().unwrap_or(&0) as usize;
        if classes == 0 {
            return Err(Error::internal(format!(
                "model '{}' output '{}' has shape {:?}",
                self.model_name, scores.name, scores.shape
            )));
        }
        let k = self.classify.top_k.min(classes);
        let out = self.classify.rows(&scores.to_f32()?, classes);
        let mut out_shape = match input.shape.split_last() {
            Some((1, lead)) if !lead.is_empty() => lead.to_vec(),
            _ => input.shape.clone(),
        };
        out_shape.push(k as i64);
        Ok(Response::new(vec![Tensor::from_strings(
            self.output.clone(),
            out_shape,
            out,
        )]))
    }
}

wisp_sdk::export_plugin!(ClassifyImage);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_a_model() {
        let e = ClassifyImage::init(&Params::default()).err().unwrap();
        assert!(e.message.contains("'model'"));
    }

    #[test]
    fn outside_the_server_the_model_call_is_unsupported() {
        let mut p = ClassifyImage::init(&Params::from_pairs(&[
            ("model", "m"),
            ("width", "2"),
            ("height", "2"),
        ]))
        .unwrap();
        // A 1x1 PNG decodes fine; the wasi-nn call then fails natively with a clear error.
        let png = plugin_imaging::encode_png(1, 1, |_, _| [255, 0, 0]);
        let e = p
            .execute(&Request::new(vec![Tensor::from_strings(
                "IMAGE",
                vec![1],
                [png],
            )]))
            .unwrap_err();
        assert_eq!(e.code, wisp_sdk::ErrorCode::Unsupported, "{}", e.message);
    }
}
