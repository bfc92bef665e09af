//! `batch-bls`: the batch-level way to call a model from a plugin ("BLS"). A batch of N
//! requests becomes **one** request to the model — each input concatenated along the batch
//! dimension — and the model's outputs are split back by each request's rows. The model runs
//! the whole batch in one execution, however the plugin was called.
//!
//! Parameters: `model` (required: `name` or `name:version`, a model with `max_batch_size` > 0
//! whose inputs and outputs this plugin's config repeats). Every input of a request is
//! forwarded; every output the model returns is split and returned (the host then checks them
//! against this plugin's config).

use wisp_sdk::models::Model;
use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// The plugin: the model it calls.
pub struct BatchBls {
    model: Model,
}

impl Plugin for BatchBls {
    fn init(params: &Params) -> Result<Self, Error> {
        let model = params
            .get("model")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| Error::invalid("parameter 'model' is required (the model to call)"))?;
        Ok(BatchBls {
            model: Model::new(model)?,
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        self.model.infer(request)
    }

    fn execute_batch(&mut self, batch: Vec<Request>) -> Vec<Result<Response, Error>> {
        match self.run(&batch) {
            Ok(responses) => responses.into_iter().map(Ok).collect(),
            Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
        }
    }
}

impl BatchBls {
    /// Concatenate, one call, split.
    fn run(&self, batch: &[Request]) -> Result<Vec<Response>, Error> {
        let first = batch
            .first()
            .ok_or_else(|| Error::internal("empty batch"))?;
        let rows: Vec<usize> = batch
            .iter()
            .map(|r| {
                r.inputs
                    .first()
                    .and_then(|t| t.shape.first())
                    .map(|&d| d.max(0) as usize)
                    .ok_or_else(|| Error::invalid("a request without a batched input"))
            })
            .collect::<Result<_, _>>()?;
        let mut inputs = Vec::with_capacity(first.inputs.len());
        for t in &first.inputs {
            let parts: Vec<&Tensor> = batch
                .iter()
                .map(|r| r.input(&t.name))
                .collect::<Result<_, _>>()?;
            inputs.push(Tensor::concat_rows(&parts)?);
        }
        let mut joined = Request::new(inputs);
        joined.requested_outputs = first.requested_outputs.clone();
        let answer = self.model.infer(&joined)?;
        let mut responses: Vec<Response> =
            batch.iter().map(|_| Response::new(Vec::new())).collect();
        for output in &answer.outputs {
            for (response, part) in responses.iter_mut().zip(output.split_rows(&rows)?) {
                response.outputs.push(part);
            }
        }
        Ok(responses)
    }
}

wisp_sdk::export_plugin!(BatchBls);

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_sdk::testing;

    #[test]
    fn a_batch_is_one_call_split_back() {
        testing::serve("double", |r: &Request| {
            let x = r.input("X")?;
            let y: Vec<f32> = x.to_f32()?.iter().map(|v| v * 2.0).collect();
            Ok(Response::new(vec![Tensor::from_f32(
                "Y",
                x.shape.clone(),
                &y,
            )]))
        });
        let mut p = BatchBls::init(&Params::from_pairs(&[("model", "double")])).unwrap();
        let batch = vec![
            Request::new(vec![Tensor::from_f32("X", vec![1, 2], &[1.0, 2.0])]),
            Request::new(vec![Tensor::from_f32(
                "X",
                vec![2, 2],
                &[3.0, 4.0, 5.0, 6.0],
            )]),
        ];
        let out = p.execute_batch(batch);
        assert_eq!(testing::calls("double"), 1, "one call for the batch");
        let second = out[1].as_ref().unwrap().output("Y").unwrap();
        assert_eq!(second.shape, vec![2, 2]);
        assert_eq!(second.to_f32().unwrap(), vec![6.0, 8.0, 10.0, 12.0]);
    }

    #[test]
    fn needs_a_model() {
        assert!(BatchBls::init(&Params::default()).is_err());
    }
}
