//! Decoding a `ModelInferRequest` into the service's request: parameters, typed contents
//! (charged at their decoded size), raw contents, shared-memory references, trace context.

use super::*;
use wisp_core::tensor::naming_model;

pub(super) fn param_to_json(p: &pb::InferParameter) -> serde_json::Value {
    use pb::infer_parameter::ParameterChoice as C;
    match &p.parameter_choice {
        Some(C::BoolParam(b)) => (*b).into(),
        Some(C::Int64Param(i)) => (*i).into(),
        Some(C::StringParam(s)) => s.clone().into(),
        Some(C::DoubleParam(d)) => (*d).into(),
        Some(C::Uint64Param(u)) => (*u).into(),
        None => serde_json::Value::Null,
    }
}

/// `contents` (typed repeated fields) → little-endian bytes.
pub(super) fn contents_to_bytes(
    name: &str,
    dt: DataType,
    c: &pb::InferTensorContents,
) -> Result<Vec<u8>, Error> {
    let out: Vec<u8> = match dt {
        DataType::Bool => c.bool_contents.iter().map(|&b| b as u8).collect(),
        DataType::Int8 => c.int_contents.iter().map(|&v| v as i8 as u8).collect(),
        DataType::Int16 => c
            .int_contents
            .iter()
            .flat_map(|&v| (v as i16).to_le_bytes())
            .collect(),
        DataType::Int32 => c
            .int_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Int64 => c
            .int64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint8 => c.uint_contents.iter().map(|&v| v as u8).collect(),
        DataType::Uint16 => c
            .uint_contents
            .iter()
            .flat_map(|&v| (v as u16).to_le_bytes())
            .collect(),
        DataType::Uint32 => c
            .uint_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint64 => c
            .uint64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp32 => c
            .fp32_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp64 => c
            .fp64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Bytes => encode_bytes_elements(c.bytes_contents.iter()),
        DataType::Fp16 | DataType::Bf16 => {
            return Err(Error::invalid(format!(
                "input '{name}': {dt} data must be sent in raw_input_contents"
            )))
        }
    };
    Ok(out)
}

/// A `ModelInferRequest` → the service's [`Decoded`] (the service validates it against the
/// model).
pub(crate) fn decode(req: pb::ModelInferRequest) -> Result<Decoded, Error> {
    let params_json =
        |p: &HashMap<String, pb::InferParameter>| -> serde_json::Map<String, serde_json::Value> {
            p.iter()
                .map(|(k, v)| (k.clone(), param_to_json(v)))
                .collect()
        };
    // Inputs in shared memory carry no raw contents: the raw list matches the others.
    let in_shm: Vec<Option<ShmRef>> = req
        .inputs
        .iter()
        .map(|t| {
            shm_ref(
                &params_json(&t.parameters),
                format_args!("input '{}'", t.name),
            )
        })
        .collect::<Result<_, Error>>()?;
    let with_data = in_shm.iter().filter(|s| s.is_none()).count();
    if !req.raw_input_contents.is_empty() && req.raw_input_contents.len() != with_data {
        return Err(Error::invalid(format!(
            "expected {with_data} raw_input_contents (one per input not in shared memory), got {}",
            req.raw_input_contents.len()
        )));
    }
    let mut inputs = Vec::with_capacity(req.inputs.len());
    let mut shm_inputs = Vec::new();
    let mut raw = req.raw_input_contents.iter();
    // When several inputs' data disagree with their shapes, the last one is reported: Triton
    // checks a request's inputs from its hash map, newest first, and its QA expects that name.
    let mut shape_err = None;
    for (t, place) in req.inputs.into_iter().zip(in_shm) {
        let dt =
            DataType::parse(&t.datatype).map_err(|e| e.context(format!("input '{}'", t.name)))?;
        if t.shape.iter().any(|&d| d < 0) {
            return Err(Error::invalid(format!(
                "input '{}': shape has a negative dimension",
                t.name
            )));
        }
        if let Some(at) = place {
            shm_inputs.push(ShmInput {
                name: t.name,
                datatype: dt,
                shape: t.shape,
                at,
            });
            continue;
        }
        let data: Bytes = match raw.next() {
            Some(raw) => raw.clone(),
            None => {
                let c = t.contents.unwrap_or_default();
                contents_to_bytes(&t.name, dt, &c)?.into()
            }
        };
        let name = t.name.clone();
        match Tensor::new(t.name, dt, t.shape, data) {
            Ok(t) => inputs.push(t),
            Err(e) => shape_err = Some(naming_model(e, &name, &req.model_name)),
        }
    }
    if let Some(e) = shape_err {
        return Err(e);
    }
    let mut outputs = Vec::with_capacity(req.outputs.len());
    for o in req.outputs {
        let classification = match o.parameters.get("classification").map(param_to_json) {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|&n| n > 0 && n <= MAX_CLASSIFICATION)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "output '{}': 'classification' must be an integer in 1..={MAX_CLASSIFICATION}",
                            o.name
                        ))
                    })? as usize,
            ),
        };
        let shm = shm_ref(
            &params_json(&o.parameters),
            format_args!("output '{}'", o.name),
        )?;
        outputs.push(OutputSpec {
            name: o.name,
            binary: None,
            classification,
            shm,
        });
    }
    check_reserved_keys(req.parameters.keys())?;
    let request = InferRequest {
        id: req.id,
        inputs,
        requested_outputs: outputs.iter().map(|o| o.name.clone()).collect(),
        parameters: req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), param_to_json(v)))
            .collect(),
        // Scheduling and sequence flags are read from the parameters by the service.
        ..Default::default()
    };
    Ok(Decoded {
        request,
        outputs,
        binary_default: false,
        shm_inputs,
        shm_scope: Scope::default(),
    })
}

/// The request parameter that asks a stream for the final flag alone when the model's last
/// response did not carry it.
pub(super) const ENABLE_EMPTY_FINAL: &str = "triton_enable_empty_final_response";

/// The `triton_` request parameters Triton's gRPC front end lets a client set.
const TRITON_REQUEST_PARAMS: [&str; 1] = [ENABLE_EMPTY_FINAL];

/// Triton's rule (26.05): request parameter keys starting with `triton_` are its own, and only
/// those it lets clients set are accepted, in its words.
fn check_reserved_keys<'a>(mut keys: impl Iterator<Item = &'a String>) -> Result<(), Error> {
    match keys.find(|k| k.starts_with("triton_") && !TRITON_REQUEST_PARAMS.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(Error::invalid(format!(
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the \
             following keys starting with 'triton_' are allowed: {} (got '{}')",
            TRITON_REQUEST_PARAMS.join(" "),
            k.escape_debug()
        ))),
    }
}

/// The call's shared memory scope, from its `wisp-shm-token` metadata.
pub(super) fn shm_scope(metadata: &tonic::metadata::MetadataMap) -> Result<Scope, Error> {
    Scope::from_token(metadata.get(shm::TOKEN_HEADER).map(|v| v.as_bytes()))
}

/// The client's W3C trace context, from the call's `traceparent` metadata.
pub(super) fn trace_parent(metadata: &tonic::metadata::MetadataMap) -> Option<TraceParent> {
    metadata
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse)
}

/// The memory typed contents hold once decoded: each element at its in-memory size (prost's
/// `encoded_len` undercounts packed varints up to eightfold).
pub(crate) fn decoded_bytes(c: &pb::InferTensorContents) -> u64 {
    let n = |len: usize, size: usize| (len as u64).saturating_mul(size as u64);
    n(c.bool_contents.len(), 1)
        + n(c.int_contents.len(), 4)
        + n(c.uint_contents.len(), 4)
        + n(c.fp32_contents.len(), 4)
        + n(c.int64_contents.len(), 8)
        + n(c.uint64_contents.len(), 8)
        + n(c.fp64_contents.len(), 8)
        + c.bytes_contents
            .iter()
            .map(|b| b.len() as u64 + 4)
            .sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Triton's QA (`InputShapeTest.test_input_string_shape_validation`): two BYTES inputs
    /// whose data disagree with their shapes are reported by the second one's name, in its words
    /// for too few and for too many.
    #[test]
    fn string_count_errors_name_the_last_input_in_tritons_words() {
        let request = |count: usize| pb::ModelInferRequest {
            model_name: "onnx_object_int32_int32".into(),
            inputs: ["INPUT0", "INPUT1"]
                .into_iter()
                .map(|name| pb::model_infer_request::InferInputTensor {
                    name: name.into(),
                    datatype: "BYTES".into(),
                    shape: vec![1, 16],
                    ..Default::default()
                })
                .collect(),
            raw_input_contents: (0..2)
                .map(|_| encode_bytes_elements((0..count).map(|i| i.to_string())).into())
                .collect(),
            ..Default::default()
        };
        let e = decode(request(14)).err().unwrap();
        assert!(
            e.message().starts_with(
                "expected 16 string elements for inference input 'INPUT1' for model \
                 'onnx_object_int32_int32', got 14"
            ),
            "{e}"
        );
        let e = decode(request(18)).err().unwrap();
        assert!(
            e.message().starts_with(
                "unexpected number of string elements 17 for inference input 'INPUT1' for model \
                 'onnx_object_int32_int32', expecting 16"
            ),
            "{e}"
        );
        assert!(decode(request(16)).is_ok());
    }

    /// Triton 26.05: `triton_` parameter keys are reserved, but for the ones it lets clients set.
    #[test]
    fn reserved_parameter_keys_are_refused_in_tritons_words() {
        let with = |key: &str| pb::ModelInferRequest {
            model_name: "m".into(),
            parameters: [(key.to_string(), pb::InferParameter::default())].into(),
            ..Default::default()
        };
        let e = decode(with("triton_final_response")).err().unwrap();
        assert!(
            e.message().starts_with(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the \
                 following keys starting with 'triton_' are allowed: \
                 triton_enable_empty_final_response"
            ),
            "{e}"
        );
        assert!(decode(with("triton_enable_empty_final_response")).is_ok());
        assert!(decode(with("tritonish")).is_ok());
        assert!(decode(with("my_key")).is_ok());
    }
}
