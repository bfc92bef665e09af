//! `add-sub`: Triton's `add_sub` example as a plugin — `OUTPUT0 = INPUT0 + INPUT1` and
//! `OUTPUT1 = INPUT0 - INPUT1` on 16 floats — that **describes itself**: its model directory
//! needs no `config.pbtxt` (the server completes the config from [`Plugin::describe`], as it
//! does from an ONNX file). Also the plugin side of the per-request cost benchmark.

use wisp_sdk::{Datatype, Error, Params, Plugin, Request, Response, Signature, Tensor, TensorSpec};

/// The plugin (no settings).
pub struct AddSub;

impl Plugin for AddSub {
    fn describe() -> Option<Signature> {
        let spec = |name: &str| TensorSpec::new(name, Datatype::Fp32, &[16]);
        Some(Signature {
            inputs: vec![spec("INPUT0"), spec("INPUT1")],
            outputs: vec![spec("OUTPUT0"), spec("OUTPUT1")],
            max_batch_size: 8,
        })
    }

    fn init(_params: &Params) -> Result<Self, Error> {
        Ok(AddSub)
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let a = request.input("INPUT0")?;
        let b = request.input("INPUT1")?;
        let (x, y) = (a.to_f32()?, b.to_f32()?);
        if x.len() != y.len() {
            return Err(Error::invalid("INPUT0 and INPUT1 differ in size"));
        }
        let sum: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
        let diff: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p - q).collect();
        let mut outputs = Vec::with_capacity(2);
        if request.wants("OUTPUT0") {
            outputs.push(Tensor::from_f32("OUTPUT0", a.shape.clone(), &sum));
        }
        if request.wants("OUTPUT1") {
            outputs.push(Tensor::from_f32("OUTPUT1", a.shape.clone(), &diff));
        }
        Ok(Response::new(outputs))
    }
}

wisp_sdk::export_plugin!(AddSub);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_and_subtracts() {
        let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let r = Request::new(vec![
            Tensor::from_f32("INPUT0", vec![1, 16], &x),
            Tensor::from_f32("INPUT1", vec![1, 16], &[1.0; 16]),
        ]);
        let out = AddSub.execute(&r).unwrap();
        assert_eq!(out.output("OUTPUT0").unwrap().to_f32().unwrap()[3], 4.0);
        assert_eq!(out.output("OUTPUT1").unwrap().to_f32().unwrap()[3], 2.0);
        let sig = AddSub::describe().unwrap();
        assert_eq!(sig.inputs.len(), 2);
        assert_eq!(sig.max_batch_size, 8);
    }
}
