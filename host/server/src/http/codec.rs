//! KServe v2 inference bodies: JSON tensors (flat or nested `data`), the binary tensor data
//! extension (`Inference-Header-Content-Length`, `binary_data_size`, `binary_data`,
//! `binary_data_output`, raw bodies with header value 0) and the classification extension.
//!
//! Decoding checks what the wire format itself must get right (JSON structure, datatypes, that
//! each shape matches the data actually present, binary lengths); the service then validates
//! the request against the model's signature. Every error names the offending input, output or
//! field.

use std::fmt::Display;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeSeed;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use wisp_core::config::Signature;
use wisp_core::tensor::{
    byte_size, decode_bytes_elements, element_count, encode_bytes_elements, naming_model,
};
use wisp_core::{DataType, Error, InferRequest, Result, Tensor};

use crate::service::shm::shm_ref;
use crate::service::Charge;
pub use crate::service::{Answer, Decoded, OutputSpec, ShmInput, MAX_CLASSIFICATION};

/// One decoded input: its bytes, or where in shared memory they are.
enum Input {
    Tensor(Tensor),
    Shm(ShmInput),
}

mod json_data;

/// Tensor `data` text (a JSON array, flat or nested) → bytes of `count` elements of `dt`
/// (also what `wisp plugin run` reads its inputs with, and the fuzz tests call).
pub fn json_data_decode(dt: DataType, json: &str, count: usize) -> Result<Vec<u8>> {
    json_data::decode(dt, json, count)
}

/// JSON values a request may hold outside its tensors' `data` (its id, parameters, names,
/// shapes and requested outputs). Those are parsed into `Value` trees, tens of bytes a value
/// (`[1,1,…]` is 32 bytes a value for 2 bytes of text), so their number is bounded and each is
/// charged before it is built; keys a request does not use are skipped unread.
pub const MAX_OUTLINE_VALUES: usize = 1 << 16;

/// What one outline value may hold once parsed: the `Value`, its slot in a vector grown by
/// doubling or a map's node, and a short string's allocation.
const OUTLINE_VALUE_BYTES: u64 = 128;

/// A request's outline values: how many more it may have, and the charge they are added to
/// (above the `base` it held before).
struct Outline<'c> {
    left: usize,
    base: u64,
    charge: &'c mut Charge,
}

impl Outline<'_> {
    /// [`small`], once the values in `raw` are counted (without allocating) against what is
    /// left and charged.
    fn parse(&mut self, raw: &RawValue, what: impl Display + Copy) -> Result<Value> {
        let n = self.count(raw, what)?;
        self.take(n, what)?;
        Ok(small(raw))
    }

    fn count(&self, raw: &RawValue, what: impl Display + Copy) -> Result<usize> {
        let mut n = 0usize;
        let counted = Counter {
            n: &mut n,
            most: self.left,
        }
        .deserialize(&mut serde_json::Deserializer::from_str(raw.get()));
        if counted.is_err() || n > self.left {
            return Err(self.too_many(what));
        }
        Ok(n)
    }

    /// Takes `n` values from what is left and charges them.
    fn take(&mut self, n: usize, what: impl Display + Copy) -> Result<()> {
        self.left = self
            .left
            .checked_sub(n)
            .ok_or_else(|| self.too_many(what))?;
        let used = (MAX_OUTLINE_VALUES - self.left) as u64 * OUTLINE_VALUE_BYTES;
        self.charge.grow_to(self.base + used)
    }

    fn too_many(&self, what: impl Display + Copy) -> Error {
        Error::invalid(format!(
            "{what} brings the request past {MAX_OUTLINE_VALUES} JSON values outside its tensors' 'data'"
        ))
    }
}

/// A small JSON value (a name, a shape, parameters) out of its raw text.
fn small(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// Counts the values (and object keys) of a JSON text into `n`, failing once past `most`.
struct Counter<'c> {
    n: &'c mut usize,
    most: usize,
}

impl Counter<'_> {
    /// A counter for a value nested in this one, adding to the same count.
    fn nested(&mut self) -> Counter<'_> {
        Counter {
            n: &mut *self.n,
            most: self.most,
        }
    }

    fn one<E: serde::de::Error>(&mut self) -> std::result::Result<(), E> {
        *self.n += 1;
        if *self.n > self.most {
            return Err(E::custom("too many values"));
        }
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Counter<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Counter<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: serde::de::Error>(mut self, _: bool) -> std::result::Result<(), E> {
        self.one()
    }
    fn visit_i64<E: serde::de::Error>(mut self, _: i64) -> std::result::Result<(), E> {
        self.one()
    }
    fn visit_u64<E: serde::de::Error>(mut self, _: u64) -> std::result::Result<(), E> {
        self.one()
    }
    fn visit_f64<E: serde::de::Error>(mut self, _: f64) -> std::result::Result<(), E> {
        self.one()
    }
    fn visit_str<E: serde::de::Error>(mut self, _: &str) -> std::result::Result<(), E> {
        self.one()
    }
    fn visit_unit<E: serde::de::Error>(mut self) -> std::result::Result<(), E> {
        self.one()
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        mut self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(self.nested())?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        mut self,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        self.one()?;
        while map.next_key_seed(self.nested())?.is_some() {
            map.next_value_seed(self.nested())?;
        }
        Ok(())
    }
}

/// The values of `keys` in the JSON object `json`, as raw text borrowed from it; other keys
/// are skipped unread (nothing is allocated for them), and a repeated key keeps its last value.
pub(crate) fn pick<'a, const N: usize>(
    json: &'a [u8],
    keys: [&'static str; N],
) -> serde_json::Result<[Option<&'a RawValue>; N]> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let out = Pick(keys).deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

struct Pick<const N: usize>([&'static str; N]);

impl<'de, const N: usize> serde::de::DeserializeSeed<'de> for Pick<N> {
    type Value = [Option<&'de RawValue>; N];
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, const N: usize> serde::de::Visitor<'de> for Pick<N> {
    type Value = [Option<&'de RawValue>; N];
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut out = [None; N];
        while let Some(at) = map.next_key_seed(KeyIn(&self.0))? {
            match at {
                Some(i) => out[i] = Some(map.next_value::<&'de RawValue>()?),
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// A key's place among the wanted keys, compared without copying it.
struct KeyIn<'k>(&'k [&'static str]);

impl<'de> serde::de::DeserializeSeed<'de> for KeyIn<'_> {
    type Value = Option<usize>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeyIn<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: serde::de::Error>(self, key: &str) -> std::result::Result<Self::Value, E> {
        Ok(self.0.iter().position(|k| *k == key))
    }
}

fn obj(v: &Value, what: impl Display + Copy) -> Result<&Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| Error::invalid(format!("{what} must be a JSON object")))
}

/// A `parameters` object, at most [`wisp_core::infer::MAX_PARAMETERS`] of them.
fn params(v: &Value, what: impl Display + Copy) -> Result<&Map<String, Value>> {
    let p = obj(v, what)?;
    wisp_core::infer::check_parameter_count(p.len(), what)?;
    Ok(p)
}

/// Splits the body at `header_len` and decodes it for the model `sig` describes, charging the
/// values of its outline to `charge` before they are built.
pub fn decode(
    body: Bytes,
    header_len: Option<usize>,
    sig: &Signature,
    charge: &mut Charge,
) -> Result<Decoded> {
    let (json, mut binary) = match header_len {
        Some(0) => return decode_raw(body, sig),
        Some(n) if n > body.len() => {
            return Err(Error::invalid(format!(
                "Inference-Header-Content-Length is {n} but the body has only {} bytes",
                body.len()
            )))
        }
        Some(n) => (body.slice(..n), body.slice(n..)),
        None => (body, Bytes::new()),
    };
    // Only the outline is parsed here, bounded in values: tensor data stays raw text until
    // its datatype is known, then goes straight to bytes (json_data), never through a `Value`
    // tree.
    let [id_raw, params_raw, inputs_raw, outputs_raw] =
        pick(&json, ["id", "parameters", "inputs", "outputs"]).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => {
                Error::invalid("the request must be a JSON object")
            }
            _ => Error::invalid(format!("malformed JSON in request body: {e}")),
        })?;
    let mut outline = Outline {
        left: MAX_OUTLINE_VALUES,
        base: charge.bytes(),
        charge,
    };
    let id = match id_raw.map(|r| outline.parse(r, "'id'")).transpose()? {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(_) => return Err(Error::invalid("'id' must be a string")),
    };
    let parameters = match params_raw
        .map(|r| outline.parse(r, "'parameters'"))
        .transpose()?
    {
        None | Some(Value::Null) => Map::new(),
        Some(p) => params(&p, "'parameters'")?.clone(),
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
    let inputs_raw = inputs_raw.ok_or_else(|| Error::invalid("the request has no 'inputs'"))?;
    let inputs_v: Vec<&RawValue> = serde_json::from_str(inputs_raw.get())
        .map_err(|_| Error::invalid("'inputs' must be an array"))?;
    wisp_core::infer::check_tensor_count(inputs_v.len(), "inputs")?;
    outline.take(inputs_v.len(), "'inputs'")?;
    let mut inputs = Vec::with_capacity(inputs_v.len());
    let mut shm_inputs = Vec::new();
    for (i, input) in inputs_v.iter().enumerate() {
        match decode_input(i, input, &mut binary, sig, &mut outline)? {
            Input::Tensor(t) => inputs.push(t),
            Input::Shm(s) => shm_inputs.push(s),
        }
    }
    if !binary.is_empty() {
        return Err(Error::invalid(format!(
            "the body has {} bytes of binary data that no input claimed with 'binary_data_size'",
            binary.len()
        )));
    }
    let outputs = match outputs_raw
        .map(|r| outline.parse(r, "'outputs'"))
        .transpose()?
    {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            wisp_core::infer::check_tensor_count(a.len(), "requested outputs")?;
            a.iter()
                .enumerate()
                .map(|(i, o)| decode_output(i, o))
                .collect::<Result<_>>()?
        }
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
        // Scheduling and sequence flags are read from the parameters by the service.
        ..Default::default()
    };
    Ok(Decoded {
        request,
        outputs,
        binary_default,
        shm_inputs,
        shm_scope: Default::default(),
    })
}

fn decode_input(
    i: usize,
    raw: &RawValue,
    binary: &mut Bytes,
    sig: &Signature,
    outline: &mut Outline,
) -> Result<Input> {
    // The outline keys of an input, then its `data` (the last of `INPUT_KEYS`).
    const INPUT_KEYS: [&str; 5] = ["name", "datatype", "shape", "parameters", "data"];
    let fields = pick(raw.get().as_bytes(), INPUT_KEYS)
        .map_err(|_| Error::invalid(format!("inputs[{i}] must be a JSON object")))?;
    let [outline_fields @ .., data_raw] = fields;
    let mut o = Map::new();
    for (key, value) in INPUT_KEYS.iter().zip(outline_fields) {
        if let Some(v) = value {
            let v = outline.parse(v, format_args!("inputs[{i}].{key}"))?;
            o.insert(key.to_string(), v);
        }
    }
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
    if let Some(c) = sig.input(name) {
        if c.datatype != datatype {
            return Err(Error::invalid(format!(
                "inference input '{name}' data-type is '{datatype}', but model '{}' expects '{}'",
                sig.model, c.datatype
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
    wisp_core::infer::check_rank(shape.len(), format_args!("input '{name}'"))?;
    let count = element_count(&shape).map_err(|e| at(e.message().to_string()))?;
    // before `data` is read, so an overflowing shape gets Triton's overflow message
    byte_size(name, datatype, count)?;
    let params = match o.get("parameters") {
        None | Some(Value::Null) => None,
        Some(p) => Some(params(p, format_args!("input '{name}' parameters"))?),
    };
    let binary_size = match params.and_then(|p| p.get("binary_data_size")) {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| at("'binary_data_size' must be a non-negative integer".into()))?
                as usize,
        ),
    };
    if let Some(place) = params
        .map(|p| shm_ref(p, format_args!("input '{name}'")))
        .transpose()?
        .flatten()
    {
        if data_raw.is_some() || binary_size.is_some() {
            return Err(at(
                "has 'shared_memory_region' and also 'data' or 'binary_data_size'".into(),
            ));
        }
        return Ok(Input::Shm(ShmInput {
            name: name.to_string(),
            datatype,
            shape,
            at: place,
        }));
    }
    let data: Bytes = match (binary_size, data_raw) {
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
        (None, Some(d)) => json_data::decode(datatype, d.get(), count)
            .map_err(|e| at(e.message().to_string()))?
            .into(),
        (None, None) => return Err(at("has neither 'data' nor 'binary_data_size'".into())),
    };
    let input = name.to_string();
    Tensor::new(name, datatype, shape, data)
        .map(Input::Tensor)
        .map_err(|e| Error::invalid(naming_model(e, &input, &sig.model).message().to_string()))
}

fn decode_output(i: usize, v: &Value) -> Result<OutputSpec> {
    let o = obj(v, format_args!("outputs[{i}]"))?;
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
        let p = params(p, format_args!("output '{}' parameters", spec.name))?;
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
        spec.shm = shm_ref(p, format_args!("output '{}'", spec.name))?;
    }
    Ok(spec)
}

/// A raw binary body (`Inference-Header-Content-Length: 0`): the whole body is the single
/// input's data, batch 1; every output comes back binary.
fn decode_raw(body: Bytes, sig: &Signature) -> Result<Decoded> {
    let [input] = sig.inputs.as_slice() else {
        return Err(Error::invalid(format!(
            "Raw request must only have 1 input (found 1) to be deduced but got {} inputs in '{}' model configuration (a raw binary request, Inference-Header-Content-Length: 0, carries one input)",
            sig.inputs.len(),
            sig.model
        )));
    };
    let dt = input.datatype;
    let mut shape: Vec<i64> = if sig.batches() { vec![1] } else { vec![] };
    let data: Bytes = match dt.size() {
        None => {
            // Triton's rule: one element and no variable-sized dimension to deduce
            if input.dims.iter().any(|&d| d != 1) {
                return Err(Error::invalid(format!(
                    "For BYTE datatype raw input '{}', the model must have input shape [1] (the config has dims {:?})",
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
                    "The shape of the raw input '{}' can not be deduced because there are more than one variable-sized dimension (dims {:?})",
                    input.name, input.dims
                )));
            }
            let fill = if known == 0 { 0 } else { elems as i64 / known };
            shape.extend(input.dims.iter().map(|&d| if d < 0 { fill } else { d }));
            body
        }
    };
    let tensor = Tensor::new(input.name.clone(), dt, shape, data)
        .map_err(|e| naming_model(e, &input.name, &sig.model))?;
    let request = InferRequest {
        inputs: vec![tensor],
        ..Default::default()
    };
    Ok(Decoded {
        request,
        outputs: Vec::new(),
        binary_default: true,
        shm_inputs: Vec::new(),
        shm_scope: Default::default(),
    })
}

/// Whether every element of `t` can be a JSON value unchanged: all but BYTES can; BYTES
/// when each element is UTF-8.
fn json_safe(t: &Tensor) -> bool {
    t.datatype != DataType::Bytes
        || decode_bytes_elements(&t.data)
            .map(|els| els.iter().all(|e| std::str::from_utf8(e).is_ok()))
            .unwrap_or(false)
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

/// An encoded response body and, when it carries binary data, the JSON header length.
pub struct Encoded {
    /// The body.
    pub body: Bytes,
    /// `Some(json length)` when binary data follows the JSON.
    pub header_len: Option<usize>,
}

/// Builds the response body: each answered output binary or JSON, as its request asked.
pub fn encode(answer: &Answer) -> Encoded {
    encode_parts(
        &answer.model.name,
        answer.model.version,
        &answer.id,
        &answer.outputs,
        answer.binary_default,
    )
}

/// [`encode`] from its parts.
pub fn encode_parts(
    model: &str,
    version: u64,
    id: &str,
    outputs: &[(OutputSpec, Tensor)],
    binary_default: bool,
) -> Encoded {
    // A BYTES output that is not UTF-8 cannot be a JSON string without changing it, so it goes
    // as binary data (Triton's binary extension) even when JSON was asked for.
    let binary_of = |spec: &OutputSpec, t: &Tensor| {
        spec.binary.unwrap_or(binary_default) || (spec.shm.is_none() && !json_safe(t))
    };
    let mut json_outputs = Vec::with_capacity(outputs.len());
    let mut binary = BytesMut::new();
    let mut any_binary = false;
    for (spec, t) in outputs {
        let mut o = Map::new();
        o.insert("name".into(), Value::from(t.name.clone()));
        o.insert("datatype".into(), Value::from(t.datatype.as_str()));
        o.insert("shape".into(), Value::from(t.shape.clone()));
        if let Some(at) = &spec.shm {
            // written into the region by the service
            let mut p = Map::new();
            p.insert(
                "shared_memory_region".into(),
                Value::from(at.region.clone()),
            );
            p.insert("shared_memory_byte_size".into(), Value::from(t.data.len()));
            if at.offset > 0 {
                p.insert("shared_memory_offset".into(), Value::from(at.offset));
            }
            o.insert("parameters".into(), Value::Object(p));
        } else if binary_of(spec, t) {
            let mut p = Map::new();
            p.insert("binary_data_size".into(), Value::from(t.data.len()));
            o.insert("parameters".into(), Value::Object(p));
            binary.put_slice(&t.data);
            any_binary = true;
        } else {
            o.insert("data".into(), tensor_to_json(t));
        }
        json_outputs.push(Value::Object(o));
    }
    let mut root = Map::new();
    root.insert("model_name".into(), Value::from(model));
    root.insert("model_version".into(), Value::from(version.to_string()));
    if !id.is_empty() {
        root.insert("id".into(), Value::from(id));
    }
    root.insert("outputs".into(), Value::Array(json_outputs));
    let json = serde_json::to_vec(&Value::Object(root)).expect("JSON values serialize");
    if !any_binary {
        return Encoded {
            body: json.into(),
            header_len: None,
        };
    }
    let header_len = json.len();
    let mut body = BytesMut::with_capacity(header_len + binary.len());
    body.put_slice(&json);
    body.put_slice(&binary);
    Encoded {
        body: body.freeze(),
        header_len: Some(header_len),
    }
}

#[cfg(test)]
mod tests;
