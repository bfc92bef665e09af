//! `classify-postprocess`: scores in, Triton-style `score:index:label` strings out.
//!
//! Input `SCORES` (FP32, `[n, classes]` or `[classes]`) → output `CLASSES` (BYTES, `[n, k]` or
//! `[k]`), best first. Parameters: `top_k` (default 1), `softmax` (`true` applies a softmax
//! first; default `false`, for models that already output probabilities), `labels`
//! (comma-separated class names; without them the strings are `score:index`), `input`/`output`
//! to rename the tensors.

use plugin_imaging::Classify;
use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// The plugin's settings.
pub struct ClassifyPostprocess {
    classify: Classify,
    input: String,
    output: String,
}

impl Plugin for ClassifyPostprocess {
    fn init(params: &Params) -> Result<Self, Error> {
        Ok(ClassifyPostprocess {
            classify: Classify::from_params(params)?,
            input: params.get("input").unwrap_or("SCORES").to_string(),
            output: params.get("output").unwrap_or("CLASSES").to_string(),
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let scores = request.input(&self.input)?;
        let Some((&classes, lead)) = scores.shape.split_last() else {
            return Err(Error::invalid(format!(
                "input '{}' is a scalar",
                self.input
            )));
        };
        if classes <= 0 {
            return Err(Error::invalid(format!(
                "input '{}' has no classes",
                self.input
            )));
        }
        let values = scores.to_f32()?;
        let k = self.classify.top_k.min(classes as usize);
        let out = self.classify.rows(&values, classes as usize);
        let mut shape = lead.to_vec();
        shape.push(k as i64);
        Ok(Response::new(vec![Tensor::from_strings(
            self.output.clone(),
            shape,
            out,
        )]))
    }
}

wisp_sdk::export_plugin!(ClassifyPostprocess);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_with_labels_per_row() {
        let mut p = ClassifyPostprocess::init(&Params::from_pairs(&[
            ("top_k", "2"),
            ("labels", "cat, dog, bird"),
        ]))
        .unwrap();
        let req = Request::new(vec![Tensor::from_f32(
            "SCORES",
            vec![2, 3],
            &[0.1, 0.7, 0.2, 0.6, 0.3, 0.1],
        )]);
        let out = p.execute(&req).unwrap();
        let t = out.output("CLASSES").unwrap();
        assert_eq!(t.shape, vec![2, 2]);
        let s: Vec<String> = t
            .strings()
            .unwrap()
            .iter()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect();
        assert_eq!(
            s,
            vec![
                "0.700000:1:dog",
                "0.200000:2:bird",
                "0.600000:0:cat",
                "0.300000:1:dog"
            ]
        );
    }

    #[test]
    fn softmax_turns_logits_into_probabilities() {
        let mut p = ClassifyPostprocess::init(&Params::from_pairs(&[("softmax", "true")])).unwrap();
        let req = Request::new(vec![Tensor::from_f32("SCORES", vec![2], &[0.0, 0.0])]);
        let out = p.execute(&req).unwrap();
        let t = out.output("CLASSES").unwrap();
        assert_eq!(t.shape, vec![1]);
        assert_eq!(t.strings().unwrap(), vec![&b"0.500000:0"[..]]);
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(ClassifyPostprocess::init(&Params::from_pairs(&[("top_k", "0")])).is_err());
        let mut p = ClassifyPostprocess::init(&Params::default()).unwrap();
        let e = p
            .execute(&Request::new(vec![Tensor::from_i64(
                "SCORES",
                vec![1],
                &[1],
            )]))
            .unwrap_err();
        assert!(e.message.contains("expected FP32"), "{}", e.message);
    }
}
