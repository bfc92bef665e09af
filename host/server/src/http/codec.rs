//! KServe v2 inference bodies: JSON tensors (flat or nested `data`), the binary tensor data
//! extension (`Inference-Header-Content-Length`, `binary_data_size`, `binary_data`,
//! `binary_data_output`, raw bodies with header value 0) and the classification extension.
//!
//! Decoding checks the request against the model config (names, datatypes, shapes, batch size,
//! byte sizes) so a backend only ever sees valid tensors; every error names the offending
//! input, output or field.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};
use wisp_core::config::ModelConfig;
use wisp_core::tensor::{decode_bytes_elements, element_count, encode_bytes_elements};
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};

/// The largest `classification` count a request may ask for (each class becomes a string).
pub const MAX_CLASSIFICATION: u64 = 10_000;

/// What the client asked of one output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputSpec {
    /// Output name.
    pub name: String,
    /// `parameters.binary_data`, if given.
    pub binary: Option<bool>,
    /// `parameters.classification`: top-N classes instead of raw values.
    pub classification: Option<usize>,
}

/// A decoded, validated request plus how to encode its response.
#[derive(Debug)]
pub struct Decoded {
    /// The request for the scheduler.
    pub request: InferRequest,
    /// Requested outputs (empty: all, in config order).
    pub outputs: Vec<OutputSpec>,
    /// Request-level `binary_data_output` (or a raw binary request).
    pub binary_default: bool,
}

fn obj<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| Error::invalid(format!("{what} must be a JSON object")))
}

/// Splits the body at `header_len` and decodes it for `cfg`.
pub fn decode(body: Bytes, header_len: Option<usize>, cfg: &ModelConfig) -> Result<Decoded> {
    let (json, mut binary) = match header_len {
        Some(0) => return decode_raw(body, cfg),
        Some(n) if n > body.len() => {
            return Err(Error::invalid(format!(
                "Inference-Header-Content-Length is {n} but the body has only {} bytes",
                body.len()
            )))
        }
        Some(n) => (body.slice(..n), body.slice(n..)),
        None => (body, Bytes::new()),
    };
    let v: Value = serde_json::from_slice(&json)
        .map_err(|e| Error::invalid(format!("malformed JSON in request body: {e}")))?;
    let root = obj(&v, "the request")?;
    let id = match root.get("id") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(Error::invalid("'id' must be a string")),
    };
    let parameters = match root.get("parameters") {
        None | Some(Value::Null) => Map::new(),
        Some(p) => obj(p, "'parameters'")?.clone(),
    };
    let binary_default = match parameters.get("binary_data_output") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(Error::invalid(
                "parameter 'binary_data_output' must be a boolean",
            ))
        }
    };
    let inputs_v = root
        .get("inputs")
        .ok_or_else(|| Error::invalid("the request has no 'inputs'"))?
        .as_array()
        .ok_or_else(|| Error::invalid("'inputs' must be an array"))?;
    let mut inputs = Vec::with_capacity(inputs_v.len());
    for (i, input) in inputs_v.iter().enumerate() {
        inputs.push(decode_input(i, input, &mut binary, cfg)?);
    }
    if !binary.is_empty() {
        return Err(Error::invalid(format!(
            "the body has {} bytes of binary data that no input claimed with 'binary_data_size'",
            binary.len()
        )));
    }
    let outputs = match root.get("outputs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, o)| decode_output(i, o))
            .collect::<Result<_>>()?,
        Some(_) => return Err(Error::invalid("'outputs' must be an array")),
    };
    let request = InferRequest {
        id,
        inputs,
        requested_outputs: outputs
            .iter()
            .map(|o: &OutputSpec| o.name.clone())
            .collect(),
        parameters,
    };
    validate(&request, &outputs, cfg)?;
    Ok(Decoded {
        request,
        outputs,
        binary_default,
    })
}

fn decode_input(i: usize, v: &Value, binary: &mut Bytes, cfg: &ModelConfig) -> Result<Tensor> {
    let o = obj(v, &format!("inputs[{i}]"))?;
    let name = o
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(format!("inputs[{i}]: missing string 'name'")))?;
    let at = |msg: String| Error::invalid(format!("input '{name}': {msg}"));
    let datatype = o
        .get("datatype")
        .and_then(Value::as_str)
        .ok_or_else(|| at("missing string 'datatype'".into()))?;
    let datatype = DataType::parse(datatype).map_err(|e| at(e.message().to_string()))?;
    // Check the datatype before reading `data`, so a mismatch is reported as such.
    if let Some(c) = cfg.input.iter().find(|c| c.name == name) {
        let want = DataType::from_config_name(&c.data_type);
        if want != Some(datatype) {
            return Err(Error::invalid(format!(
                "inference input '{name}' data-type is '{datatype}', but model '{}' expects '{}'",
                cfg.name,
                want.map_or("?", |d| d.as_str())
            )));
        }
    }
    let shape: Vec<i64> = o
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| at("missing 'shape' array".into()))?
        .iter()
        .map(|d| d.as_i64().filter(|&d| d >= 0))
        .collect::<Option<_>>()
        .ok_or_else(|| at("'shape' must hold non-negative integers".into()))?;
    let count = element_count(&shape).map_err(|e| at(e.message().to_string()))?;
    let params = match o.get("parameters") {
        None | Some(Value::Null) => None,
        Some(p) => Some(obj(p, &format!("input '{name}' parameters"))?),
    };
    let binary_size = match params.and_then(|p| p.get("binary_data_size")) {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| at("'binary_data_size' must be a non-negative integer".into()))?
                as usize,
        ),
    };
    if params.is_some_and(|p| p.contains_key("shared_memory_region")) {
        return Err(Error::unsupported(format!(
            "input '{name}': shared memory is not supported"
        )));
    }
    let data: Bytes = match (binary_size, o.get("data")) {
        (Some(_), Some(_)) => {
            return Err(at("has both 'data' and 'binary_data_size'".into()));
        }
        (Some(n), None) => {
            if n > binary.len() {
                return Err(at(format!(
                    "'binary_data_size' is {n} but only {} bytes of binary data remain in the body",
                    binary.len()
                )));
            }
            binary.split_to(n)
        }
        (None, Some(d)) => json_to_bytes(datatype, d, count)
            .map_err(|e| at(e.message().to_string()))?
            .into(),
        (None, None) => return Err(at("has neither 'data' nor 'binary_data_size'".into())),
    };
    Tensor::new(name, datatype, shape, data).map_err(|e| Error::invalid(e.message().to_string()))
}

fn decode_output(i: usize, v: &Value) -> Result<OutputSpec> {
    let o = obj(v, &format!("outputs[{i}]"))?;
    let name = o
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(format!("outputs[{i}]: missing string 'name'")))?
        .to_string();
    let mut spec = OutputSpec {
        name,
        ..Default::default()
    };
    if let Some(p) = o.get("parameters").filter(|p| !p.is_null()) {
        let p = obj(p, &format!("output '{}' parameters", spec.name))?;
        if let Some(b) = p.get("binary_data") {
            spec.binary = Some(b.as_bool().ok_or_else(|| {
                Error::invalid(format!(
                    "output '{}': 'binary_data' must be a boolean",
                    spec.name
                ))
            })?);
        }
        if let Some(c) = p.get("classification") {
            let n = c
                .as_u64()
                .filter(|&n| n > 0 && n <= MAX_CLASSIFICATION)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "output '{}': 'classification' must be an integer in 1..={MAX_CLASSIFICATION}",
                        spec.name
                    ))
                })?;
            spec.classification = Some(n as usize);
        }
        if p.contains_key("shared_memory_region") {
            return Err(Error::unsupported(format!(
                "output '{}': shared memory is not supported",
                spec.name
            )));
        }
    }
    Ok(spec)
}

/// A raw binary body (`Inference-Header-Content-Length: 0`): the whole body is the single
/// input's data, batch 1; every output comes back binary.
fn decode_raw(body: Bytes, cfg: &ModelConfig) -> Result<Decoded> {
    let [input] = cfg.input.as_slice() else {
        return Err(Error::invalid(format!(
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; '{}' has {}",
            cfg.name,
            cfg.input.len()
        )));
    };
    let dt = DataType::from_config_name(&input.data_type)
        .ok_or_else(|| Error::internal("validated config has a bad data_type"))?;
    let mut shape: Vec<i64> = if cfg.batches() { vec![1] } else { vec![] };
    let data: Bytes = match dt.size() {
        None => {
            if input.dims.iter().product::<i64>().abs() != 1 {
                return Err(Error::invalid(format!(
                    "input '{}': a raw binary BYTES request needs dims [1], the config has {:?}",
                    input.name, input.dims
                )));
            }
            shape.extend(input.dims.iter().map(|_| 1));
            encode_bytes_elements([&body[..]]).into()
        }
        Some(size) => {
            let variable = input.dims.iter().filter(|&&d| d < 0).count();
            let known: i64 = input.dims.iter().filter(|&&d| d >= 0).product();
            let elems = body.len() / size;
            if variable > 1 {
                return Err(Error::invalid(format!(
                    "input '{}': a raw binary request allows at most one variable dimension, dims are {:?}",
                    input.name, input.dims
                )));
            }
            let fill = if known == 0 { 0 } else { elems as i64 / known };
            shape.extend(input.dims.iter().map(|&d| if d < 0 { fill } else { d }));
            body
        }
    };
    let tensor = Tensor::new(input.name.clone(), dt, shape, data)?;
    let request = InferRequest {
        inputs: vec![tensor],
        ..Default::default()
    };
    validate(&request, &[], cfg)?;
    Ok(Decoded {
        request,
        outputs: Vec::new(),
        binary_default: true,
    })
}

/// Checks names, datatypes, shapes and batch size against the config.
pub fn validate(req: &InferRequest, outputs: &[OutputSpec], cfg: &ModelConfig) -> Result<()> {
    let model = &cfg.name;
    let mut batch: Option<i64> = None;
    for t in &req.inputs {
        let Some(c) = cfg.input.iter().find(|c| c.name == t.name) else {
            let known: Vec<&str> = cfg.input.iter().map(|c| c.name.as_str()).collect();
            return Err(Error::invalid(format!(
                "unexpected inference input '{}' for model '{model}' (inputs: {})",
                t.name,
                known.join(", ")
            )));
        };
        if req.inputs.iter().filter(|o| o.name == t.name).count() > 1 {
            return Err(Error::invalid(format!(
                "input '{}' is given more than once",
                t.name
            )));
        }
        let want = DataType::from_config_name(&c.data_type);
        if want != Some(t.datatype) {
            return Err(Error::invalid(format!(
                "inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                t.name,
                t.datatype,
                want.map_or("?", |d| d.as_str())
            )));
        }
        let dims = if cfg.batches() {
            let Some((&b, rest)) = t.shape.split_first() else {
                return Err(Error::invalid(format!(
                    "input '{}': shape [] has no batch dimension; model '{model}' expects [-1{}]",
                    t.name,
                    c.dims.iter().map(|d| format!(", {d}")).collect::<String>()
                )));
            };
            if b < 1 || b > cfg.max_batch_size as i64 {
                return Err(Error::invalid(format!(
                    "input '{}': batch size {b} is outside 1..={} for model '{model}'",
                    t.name, cfg.max_batch_size
                )));
            }
            if *batch.get_or_insert(b) != b {
                return Err(Error::invalid(format!(
                    "input '{}': batch size {b} differs from the other inputs' {}",
                    t.name,
                    batch.unwrap_or_default()
                )));
            }
            rest
        } else {
            &t.shape[..]
        };
        let fits = dims.len() == c.dims.len()
            && dims
                .iter()
                .zip(&c.dims)
                .all(|(&got, &want)| want < 0 || got == want);
        if !fits {
            let expect: Vec<i64> = if cfg.batches() {
                std::iter::once(-1).chain(c.dims.iter().copied()).collect()
            } else {
                c.dims.clone()
            };
            return Err(Error::invalid(format!(
                "unexpected shape for input '{}' for model '{model}'. Expected {expect:?}, got {:?}",
                t.name, t.shape
            )));
        }
    }
    for c in cfg.input.iter().filter(|c| !c.optional) {
        if !req.inputs.iter().any(|t| t.name == c.name) {
            return Err(Error::invalid(format!(
                "expected {} inputs but got {} inputs for model '{model}': missing input '{}'",
                cfg.input.iter().filter(|c| !c.optional).count(),
                req.inputs.len(),
                c.name
            )));
        }
    }
    for o in outputs {
        if !cfg.output.iter().any(|c| c.name == o.name) {
            let known: Vec<&str> = cfg.output.iter().map(|c| c.name.as_str()).collect();
            return Err(Error::invalid(format!(
                "unexpected inference output '{}' for model '{model}' (outputs: {})",
                o.name,
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// JSON `data` (flat or nested) → little-endian bytes, checking the element count.
///
/// `count` comes from the client's `shape` and is not trusted: nothing is sized from it. The
/// elements actually present are gathered first, and buffers are sized from those once the two
/// agree, so a request's memory follows its real size.
fn json_to_bytes(dt: DataType, data: &Value, count: usize) -> Result<Vec<u8>> {
    let mut flat = Vec::new();
    flatten(data, &mut flat, 0)?;
    if flat.len() != count {
        return Err(Error::invalid(format!(
            "'data' has {} elements but the shape needs {count}",
            flat.len()
        )));
    }
    let mut out = Vec::with_capacity(flat.len() * dt.size().unwrap_or(8));
    let bad =
        |i: usize, v: &Value| Error::invalid(format!("data[{i}] = {v} is not a valid {dt} value"));
    macro_rules! ints {
        ($t:ty) => {
            for (i, v) in flat.iter().enumerate() {
                let x: $t = v
                    .as_i64()
                    .and_then(|n| <$t>::try_from(n).ok())
                    .or_else(|| v.as_u64().and_then(|n| <$t>::try_from(n).ok()))
                    .ok_or_else(|| bad(i, v))?;
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match dt {
        DataType::Bool => {
            for (i, v) in flat.iter().enumerate() {
                out.push(v.as_bool().ok_or_else(|| bad(i, v))? as u8);
            }
        }
        DataType::Uint8 => ints!(u8),
        DataType::Uint16 => ints!(u16),
        DataType::Uint32 => ints!(u32),
        DataType::Uint64 => ints!(u64),
        DataType::Int8 => ints!(i8),
        DataType::Int16 => ints!(i16),
        DataType::Int32 => ints!(i32),
        DataType::Int64 => ints!(i64),
        DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64 => {
            for (i, v) in flat.iter().enumerate() {
                let x = v.as_f64().ok_or_else(|| bad(i, v))?;
                match dt {
                    DataType::Fp16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
                    DataType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
                    DataType::Fp32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
                    _ => out.extend_from_slice(&x.to_le_bytes()),
                }
            }
        }
        DataType::Bytes => {
            let strs = flat
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_str().ok_or_else(|| bad(i, v)))
                .collect::<Result<Vec<_>>>()?;
            out = encode_bytes_elements(strs);
        }
    }
    Ok(out)
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>, depth: usize) -> Result<()> {
    if depth > 64 {
        return Err(Error::invalid("'data' is nested too deeply"));
    }
    match v {
        Value::Array(a) => {
            for x in a {
                flatten(x, out, depth + 1)?;
            }
        }
        other => out.push(other),
    }
    Ok(())
}

/// Elements of a tensor as f64 (for classification), `None` for BYTES.
fn as_f64s(t: &Tensor) -> Option<Vec<f64>> {
    let d = &t.data;
    macro_rules! conv {
        ($t:ty, $n:expr) => {
            d.chunks_exact($n)
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk")) as f64)
                .collect()
        };
    }
    Some(match t.datatype {
        DataType::Bool | DataType::Uint8 => d.iter().map(|&b| b as f64).collect(),
        DataType::Int8 => d.iter().map(|&b| b as i8 as f64).collect(),
        DataType::Uint16 => conv!(u16, 2),
        DataType::Int16 => conv!(i16, 2),
        DataType::Uint32 => conv!(u32, 4),
        DataType::Int32 => conv!(i32, 4),
        DataType::Uint64 => conv!(u64, 8),
        DataType::Int64 => conv!(i64, 8),
        DataType::Fp32 => conv!(f32, 4),
        DataType::Fp64 => conv!(f64, 8),
        DataType::Fp16 => d
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DataType::Bf16 => d
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DataType::Bytes => return None,
    })
}

/// The classification extension: top-`n` of each batch row as `"<value>:<index>[:<label>]"`.
pub fn classify(t: &Tensor, n: usize, batched: bool, labels: Option<&[String]>) -> Result<Tensor> {
    let values = as_f64s(t).ok_or_else(|| {
        Error::invalid(format!(
            "output '{}': classification needs a numeric output, it is BYTES",
            t.name
        ))
    })?;
    let rows = if batched {
        t.shape.first().copied().unwrap_or(1).max(0) as usize
    } else {
        1
    };
    let per_row = values.len().checked_div(rows).unwrap_or(0);
    let k = n.min(per_row);
    let is_float = matches!(
        t.datatype,
        DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64
    );
    let mut items = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let row = &values[r * per_row..(r + 1) * per_row];
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for &i in idx.iter().take(k) {
            let value = if is_float {
                format!("{:.6}", row[i])
            } else {
                format!("{}", row[i] as i64)
            };
            items.push(match labels.and_then(|l| l.get(i)) {
                Some(label) => format!("{value}:{i}:{label}"),
                None => format!("{value}:{i}"),
            });
        }
    }
    let shape = if batched {
        vec![rows as i64, k as i64]
    } else {
        vec![k as i64]
    };
    Tensor::new(
        t.name.clone(),
        DataType::Bytes,
        shape,
        encode_bytes_elements(items).into(),
    )
}

/// Tensor bytes → flat JSON array.
pub fn tensor_to_json(t: &Tensor) -> Value {
    let d = &t.data;
    let num = |x: f64| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
    macro_rules! ints {
        ($t:ty, $n:expr) => {
            d.chunks_exact($n)
                .map(|c| Value::from(<$t>::from_le_bytes(c.try_into().expect("chunk"))))
                .collect()
        };
    }
    let v: Vec<Value> = match t.datatype {
        DataType::Bool => d.iter().map(|&b| Value::Bool(b != 0)).collect(),
        DataType::Uint8 => d.iter().map(|&b| Value::from(b)).collect(),
        DataType::Int8 => d.iter().map(|&b| Value::from(b as i8)).collect(),
        DataType::Uint16 => ints!(u16, 2),
        DataType::Int16 => ints!(i16, 2),
        DataType::Uint32 => ints!(u32, 4),
        DataType::Int32 => ints!(i32, 4),
        DataType::Uint64 => ints!(u64, 8),
        DataType::Int64 => ints!(i64, 8),
        DataType::Fp32 => d
            .chunks_exact(4)
            .map(|c| num(f32::from_le_bytes(c.try_into().expect("chunk")) as f64))
            .collect(),
        DataType::Fp64 => d
            .chunks_exact(8)
            .map(|c| num(f64::from_le_bytes(c.try_into().expect("chunk"))))
            .collect(),
        DataType::Fp16 => d
            .chunks_exact(2)
            .map(|c| num(half::f16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DataType::Bf16 => d
            .chunks_exact(2)
            .map(|c| num(half::bf16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DataType::Bytes => decode_bytes_elements(d)
            .unwrap_or_default()
            .into_iter()
            .map(|e| Value::String(String::from_utf8_lossy(e).into_owned()))
            .collect(),
    };
    Value::Array(v)
}

/// The tensors to return, in `wanted` order, with the classification extension applied.
pub fn select_outputs(
    resp: InferResponse,
    wanted: &[OutputSpec],
    cfg: &ModelConfig,
    labels: &dyn Fn(&str) -> Option<std::sync::Arc<Vec<String>>>,
) -> Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(wanted.len());
    for spec in wanted {
        let Some(t) = resp.outputs.iter().find(|t| t.name == spec.name) else {
            return Err(Error::internal(format!(
                "model '{}' did not produce output '{}'",
                cfg.name, spec.name
            )));
        };
        out.push(match spec.classification {
            Some(n) => {
                let l = labels(&spec.name);
                classify(t, n, cfg.batches(), l.as_deref().map(|v| v.as_slice()))?
            }
            None => t.clone(),
        });
    }
    Ok(out)
}

/// Every output of the model, in config order, when the client named none.
pub fn all_outputs(cfg: &ModelConfig) -> Vec<OutputSpec> {
    cfg.output
        .iter()
        .map(|o| OutputSpec {
            name: o.name.clone(),
            ..Default::default()
        })
        .collect()
}

/// An encoded response body and, when it carries binary data, the JSON header length.
pub struct Encoded {
    /// The body.
    pub body: Bytes,
    /// `Some(json length)` when binary data follows the JSON.
    pub header_len: Option<usize>,
}

/// Builds the response: requested outputs (or all, in config order), classification applied,
/// binary or JSON per output.
pub fn encode(
    resp: InferResponse,
    dec: &Decoded,
    cfg: &ModelConfig,
    version: u64,
    labels: &dyn Fn(&str) -> Option<std::sync::Arc<Vec<String>>>,
) -> Result<Encoded> {
    let wanted: Vec<OutputSpec> = if dec.outputs.is_empty() {
        all_outputs(cfg)
    } else {
        dec.outputs.clone()
    };
    let tensors = select_outputs(resp, &wanted, cfg, labels)?;
    let mut json_outputs = Vec::with_capacity(wanted.len());
    let mut binary = BytesMut::new();
    for (spec, t) in wanted.iter().zip(&tensors) {
        let mut o = Map::new();
        o.insert("name".into(), Value::from(t.name.clone()));
        o.insert("datatype".into(), Value::from(t.datatype.as_str()));
        o.insert("shape".into(), Value::from(t.shape.clone()));
        if spec.binary.unwrap_or(dec.binary_default) {
            let mut p = Map::new();
            p.insert("binary_data_size".into(), Value::from(t.data.len()));
            o.insert("parameters".into(), Value::Object(p));
            binary.put_slice(&t.data);
        } else {
            o.insert("data".into(), tensor_to_json(t));
        }
        json_outputs.push(Value::Object(o));
    }
    let mut root = Map::new();
    root.insert("model_name".into(), Value::from(cfg.name.clone()));
    root.insert("model_version".into(), Value::from(version.to_string()));
    if !dec.request.id.is_empty() {
        root.insert("id".into(), Value::from(dec.request.id.clone()));
    }
    root.insert("outputs".into(), Value::Array(json_outputs));
    let json = serde_json::to_vec(&Value::Object(root)).expect("JSON values serialize");
    if binary.is_empty()
        && !wanted
            .iter()
            .any(|s| s.binary.unwrap_or(dec.binary_default))
    {
        return Ok(Encoded {
            body: json.into(),
            header_len: None,
        });
    }
    let header_len = json.len();
    let mut body = BytesMut::with_capacity(header_len + binary.len());
    body.put_slice(&json);
    body.put_slice(&binary);
    Ok(Encoded {
        body: body.freeze(),
        header_len: Some(header_len),
    })
}

#[cfg(test)]
mod tests;
