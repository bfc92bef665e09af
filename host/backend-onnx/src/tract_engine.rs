//! The embedded pure-Rust engine (`tract`). It needs concrete shapes, so each distinct set of
//! input shapes (in practice: each batch size) gets its own optimized plan, built once and shared
//! by every instance of the model.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tract_hir::infer::InferenceOp;
use tract_onnx::pb;
use tract_onnx::prelude::{
    tract_ndarray, DatumType, Framework, InferenceFact, InferenceModel, InferenceModelExt,
    IntoRunnable, IntoTensor, TValue, TVec, Tensor as TractTensor, TypedRunnableModel,
};
use wisp_core::config::{IoSpec, ModelIo};
use wisp_core::{DataType, Error, Result, Tensor};

use crate::convert::{from_strings, to_strings};
use crate::{Runner, Spec};

fn onnx_dtype(elem_type: i32) -> Option<DataType> {
    Some(match elem_type {
        1 => DataType::Fp32,
        2 => DataType::Uint8,
        3 => DataType::Int8,
        4 => DataType::Uint16,
        5 => DataType::Int16,
        6 => DataType::Int32,
        7 => DataType::Int64,
        8 => DataType::Bytes,
        9 => DataType::Bool,
        10 => DataType::Fp16,
        11 => DataType::Fp64,
        12 => DataType::Uint32,
        13 => DataType::Uint64,
        16 => DataType::Bf16,
        _ => return None,
    })
}

fn datum(dt: DataType) -> DatumType {
    match dt {
        DataType::Bool => DatumType::Bool,
        DataType::Uint8 => DatumType::U8,
        DataType::Uint16 => DatumType::U16,
        DataType::Uint32 => DatumType::U32,
        DataType::Uint64 => DatumType::U64,
        DataType::Int8 => DatumType::I8,
        DataType::Int16 => DatumType::I16,
        DataType::Int32 => DatumType::I32,
        DataType::Int64 => DatumType::I64,
        DataType::Fp16 => DatumType::F16,
        DataType::Fp32 => DatumType::F32,
        DataType::Fp64 => DatumType::F64,
        // tract has no bf16; such models fail to plan with a clear error.
        DataType::Bf16 => DatumType::F16,
        DataType::Bytes => DatumType::String,
    }
}

fn from_datum(dt: DatumType) -> Option<DataType> {
    Some(match dt {
        DatumType::Bool => DataType::Bool,
        DatumType::U8 => DataType::Uint8,
        DatumType::U16 => DataType::Uint16,
        DatumType::U32 => DataType::Uint32,
        DatumType::U64 => DataType::Uint64,
        DatumType::I8 => DataType::Int8,
        DatumType::I16 => DataType::Int16,
        DatumType::I32 => DataType::Int32,
        DatumType::I64 => DataType::Int64,
        DatumType::F16 => DataType::Fp16,
        DatumType::F32 => DataType::Fp32,
        DatumType::F64 => DataType::Fp64,
        DatumType::String => DataType::Bytes,
        _ => return None,
    })
}

fn io_spec(v: &pb::ValueInfoProto) -> IoSpec {
    let (datatype, shape) = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(pb::type_proto::Value::TensorType(tt)) => {
            let shape = tt
                .shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match d.value {
                            Some(pb::tensor_shape_proto::dimension::Value::DimValue(n))
                                if n > 0 =>
                            {
                                n
                            }
                            _ => -1,
                        })
                        .collect()
                })
                .unwrap_or_default();
            (onnx_dtype(tt.elem_type), shape)
        }
        _ => (None, Vec::new()),
    };
    IoSpec {
        name: v.name.clone(),
        datatype,
        shape,
    }
}

/// An ONNX file's protobuf, from its bytes read once (bounded, a regular file only), not from
/// a mapping of the file, which would fault if the file shrank meanwhile.
pub(crate) fn read_proto(file: &Path) -> Result<pb::ModelProto> {
    read_model(file, None).map(|(_, proto)| proto)
}

/// The ONNX file's bytes (a bounded regular file, read once) and their decoding; with
/// `sha256`, the bytes must hash to it (the signed manifest's), or the load fails.
pub(crate) fn read_model(
    file: &Path,
    sha256: Option<&[u8; 32]>,
) -> Result<(Vec<u8>, pb::ModelProto)> {
    let bytes =
        wisp_core::repository::read_regular(file, wisp_core::repository::MAX_MODEL_FILE_BYTES)
            .map_err(|e| {
                Error::invalid(format!("cannot read ONNX file {}: {e}", file.display()))
            })?;
    if let Some(want) = sha256 {
        use sha2::Digest as _;
        if sha2::Sha256::digest(&bytes).as_slice() != want.as_slice() {
            return Err(Error::invalid(format!(
                "integrity check failed: {} changed after its signature was checked",
                file.display()
            )));
        }
    }
    let proto = tract_onnx::onnx()
        .proto_model_for_read(&mut bytes.as_slice())
        .map_err(|e| Error::invalid(format!("cannot read ONNX file {}: {e}", file.display())))?;
    Ok((bytes, proto))
}

/// Whether any initializer of `proto`'s graph keeps its data in another file.
pub(crate) fn has_external_data(proto: &pb::ModelProto) -> bool {
    proto.graph.as_ref().is_some_and(|g| {
        g.initializer
            .iter()
            .any(|t| t.data_location == Some(pb::tensor_proto::DataLocation::External as i32))
    })
}

/// The inputs (initializers excluded) and outputs an ONNX file declares.
pub(crate) fn describe(file: &Path) -> Result<ModelIo> {
    model_io(file, &read_proto(file)?)
}

/// The inputs (initializers excluded) and outputs `proto`, read from `file`, declares.
pub(crate) fn model_io(file: &Path, proto: &pb::ModelProto) -> Result<ModelIo> {
    let graph = proto
        .graph
        .as_ref()
        .ok_or_else(|| Error::invalid(format!("ONNX file {} has no graph", file.display())))?;
    let init: std::collections::HashSet<&str> =
        graph.initializer.iter().map(|t| t.name.as_str()).collect();
    Ok(ModelIo {
        inputs: graph
            .input
            .iter()
            .filter(|v| !init.contains(v.name.as_str()))
            .map(io_spec)
            .collect(),
        outputs: graph.output.iter().map(io_spec).collect(),
        max_batch_size: None,
    })
}

/// How tract-onnx builds an inference op from an ONNX node.
type OpBuilder = fn(
    &tract_onnx::model::ParsingContext,
    &pb::NodeProto,
) -> tract_onnx::prelude::TractResult<(Box<dyn InferenceOp>, Vec<String>)>;

/// tract-onnx's own `Cast` builder, for every target type but INT64.
static TRACT_CAST: std::sync::OnceLock<Option<OpBuilder>> = std::sync::OnceLock::new();

/// ONNX `Cast` with `to: INT64`, as INT64. tract-onnx reads it as a cast to its dimension type
/// (`TDim`), for shape arithmetic; an INT64 value meeting that result is then cast to `TDim`
/// too, and tract-data 0.23.9 casts integers to `TDim` through `i32`: `Cast(UINT8 -> INT64) +
/// INT64` gave `255` for `255 + 2^40`, with no error. Wisp plans every shape concretely, so
/// nothing needs the symbolic type, and INT64 arithmetic stays 64-bit.
fn cast_to_int64(
    ctx: &tract_onnx::model::ParsingContext,
    node: &pb::NodeProto,
) -> tract_onnx::prelude::TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let to = node.get_attr::<DatumType>("to")?;
    if to == DatumType::I64 {
        return Ok((
            Box::new(tract_onnx::tract_core::ops::cast::cast(DatumType::I64)),
            vec![],
        ));
    }
    match TRACT_CAST.get().copied().flatten() {
        Some(builder) => builder(ctx, node),
        None => Err(tract_onnx::prelude::TractError::msg(
            "tract has no Cast operator",
        )),
    }
}

/// tract's ONNX framework as Wisp uses it: with [`cast_to_int64`] for `Cast`.
fn onnx() -> tract_onnx::Onnx {
    let mut onnx = tract_onnx::onnx();
    let original = onnx.op_register.0.get("Cast").copied();
    TRACT_CAST.get_or_init(|| original);
    onnx.op_register.insert("Cast", cast_to_int64);
    onnx
}

type PlanKey = Vec<Vec<i64>>;

/// A parsed model plus its per-shape plan cache, shared by all instances.
pub(crate) struct TractModel {
    model: InferenceModel,
    /// Model-file inputs in graph order.
    inputs: Vec<IoSpec>,
    outputs: Vec<String>,
    plans: Mutex<HashMap<PlanKey, Arc<TypedRunnableModel>>>,
}

impl TractModel {
    /// The model `proto` (read from `file`, declaring `io`) on tract, unless it uses what tract
    /// computes wrongly.
    pub(crate) fn load(
        file: &Path,
        mut proto: pb::ModelProto,
        io: &ModelIo,
        spec: &Spec,
    ) -> Result<Self> {
        crate::known_wrong::refuse_known_wrong(&proto, crate::known_wrong::KnownWrong::Tract)?;
        drop_symbolic_value_info(&mut proto);
        // Built from the bytes read and checked once (tract's own path loader maps the file);
        // external data, if any, is looked up beside the file as tract does.
        let cannot = |e: &dyn std::fmt::Display| {
            Error::invalid(format!("tract cannot load {}: {e:#}", file.display()))
        };
        let dir = file.parent().and_then(Path::to_str);
        let parsed = onnx().parse(&proto, dir).map_err(|e| cannot(&e))?;
        if !parsed.unresolved_inputs.is_empty() {
            return Err(cannot(&format!(
                "inputs not resolved at the top level: {:?}",
                parsed.unresolved_inputs
            )));
        }
        drop(proto);
        let model = parsed.model;
        let m = TractModel {
            model,
            inputs: spec.file_inputs.clone(),
            outputs: io.outputs.iter().map(|o| o.name.clone()).collect(),
            plans: Mutex::new(HashMap::new()),
        };
        // Plan batch size 1 now when every shape is known, so a model tract cannot run fails
        // at load time, not on its first request.
        if let Some(key) = &spec.batch1_shapes {
            m.plan(key)?;
        }
        Ok(m)
    }

    fn plan(&self, key: &PlanKey) -> Result<Arc<TypedRunnableModel>> {
        if let Some(p) = self.plans.lock().expect("plan cache lock").get(key) {
            return Ok(p.clone());
        }
        let mut model = self.model.clone();
        for (i, (spec, shape)) in self.inputs.iter().zip(key).enumerate() {
            let dt = spec.datatype.unwrap_or(DataType::Fp32);
            let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            model
                .set_input_fact(i, InferenceFact::dt_shape(datum(dt), dims))
                .map_err(|e| Error::internal(format!("tract: input '{}': {e:#}", spec.name)))?;
        }
        let folded = fold_known_ifs(&mut model)
            .map_err(|e| Error::internal(format!("tract cannot plan shapes {key:?}: {e:#}")))?;
        if folded > 0 {
            tracing::debug!(shapes = ?key, folded, "tract: If nodes with a known condition inlined");
        }
        let plan = model
            .into_optimized()
            .and_then(|m| m.into_runnable())
            .map_err(|e| Error::internal(format!("tract cannot plan shapes {key:?}: {e:#}")))?;
        tracing::debug!(shapes = ?key, "tract plan built");
        self.plans
            .lock()
            .expect("plan cache lock")
            .insert(key.clone(), plan.clone());
        Ok(plan)
    }
}

/// Drops the graph's `value_info` hints that name a symbolic dimension. Each plan fixes the
/// inputs' shapes, and tract keeps a hint's symbol (`n`, say) apart from the batch size the
/// plan sets, so a hint `[n, 8]` on an intermediate tensor cannot unify with the `[1, 8]` it
/// computes: the model could not be planned at all. ONNX Runtime's tools (its quantizer among
/// them) write such hints; tract infers every shape without them.
fn drop_symbolic_value_info(proto: &mut pb::ModelProto) {
    use pb::tensor_shape_proto::dimension::Value as Dim;
    use pb::type_proto::Value;
    let Some(graph) = proto.graph.as_mut() else {
        return;
    };
    graph.value_info.retain(|info| {
        let dims = match info.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(Value::TensorType(t)) => t.shape.as_ref().map(|s| s.dim.as_slice()),
            _ => None,
        };
        !dims
            .unwrap_or_default()
            .iter()
            .any(|d| matches!(d.value, Some(Dim::DimParam(_))))
    });
}

/// Inlines each `If` node whose condition is known once the input shapes are, in place of the
/// node: the branch taken, as ONNX Runtime would run it. tract otherwise plans both branches
/// and refuses an `If` whose branches give different shapes, as the VAD demo's do (`Squeeze`
/// of a dimension that is 1, else `Identity`, on a dimension its input shapes fix). An `If`
/// whose condition depends on input values is left to tract. Returns how many were inlined.
fn fold_known_ifs(model: &mut InferenceModel) -> tract_onnx::prelude::TractResult<usize> {
    use tract_hir::infer::{Factoid, InferenceModelPatch};
    use tract_onnx::ops::logic::If;
    use tract_onnx::prelude::OutletId;
    let mut folded = 0;
    // Each pass inlines one node: its branch may hold further `If`s, whose conditions the
    // next analysis may know.
    while folded < MAX_FOLDED_IFS {
        let live = model.eval_order()?;
        if !live.iter().any(|&n| model.node(n).op_is::<If>()) {
            break;
        }
        // A model tract cannot analyse is reported by the plan itself, with its own words.
        if model.analyse(false).is_err() {
            break;
        }
        let known = live.iter().find_map(|&n| {
            let n = model.node(n);
            n.op_as::<If>()?;
            let cond = model.outlet_fact(n.inputs[0]).ok()?.value.concretize()?;
            Some((n.id, cond.cast_to_scalar::<bool>().ok()?))
        });
        let Some((id, cond)) = known else { break };
        let node = model.node(id).clone();
        let op = node.op_as::<If>().expect("an If node").clone();
        // The node's inputs are its condition, then the outer values either branch reads,
        // sorted by name (tract-onnx's own wiring of `If`); a body's inputs are named after them.
        let mut outer: Vec<&str> = [&op.then_body, &op.else_body]
            .iter()
            .flat_map(|b| b.inputs.iter().map(|o| b.node(o.node).name.as_str()))
            .collect();
        outer.sort_unstable();
        outer.dedup();
        let body = if cond { &op.then_body } else { &op.else_body };
        let mut patch = InferenceModelPatch::default();
        let mut wired: HashMap<OutletId, OutletId> = HashMap::new();
        for input in &body.inputs {
            let name = &body.node(input.node).name;
            let at = outer
                .iter()
                .position(|n| n == name)
                .and_then(|i| node.inputs.get(i + 1))
                .ok_or_else(|| {
                    tract_onnx::tract_core::tract_data::internal::anyhow!(
                        "If '{}': no outer value '{name}'",
                        node.name
                    )
                })?;
            wired.insert(*input, patch.tap_model(model, *at)?);
        }
        for inner in body.eval_order()? {
            if body.inputs.iter().any(|o| o.node == inner) {
                continue;
            }
            let n = body.node(inner);
            let inputs: TVec<OutletId> = n.inputs.iter().map(|o| wired[o]).collect();
            let outs =
                patch.wire_node(format!("{}.{}", node.name, n.name), n.op.clone(), &inputs)?;
            for (slot, out) in outs.into_iter().enumerate() {
                wired.insert(OutletId::new(inner, slot), out);
            }
        }
        for (slot, out) in body.outputs.iter().enumerate() {
            patch.shunt_outside(model, OutletId::new(id, slot), wired[out])?;
        }
        patch.apply(model)?;
        // (the node and what only it read are left as placeholders: dropped)
        model.compact()?;
        folded += 1;
    }
    Ok(folded)
}

/// The most `If` nodes one plan inlines (each costs an analysis of the whole model).
const MAX_FOLDED_IFS: usize = 64;

pub(crate) struct TractRunner {
    model: Arc<TractModel>,
}

impl TractRunner {
    pub(crate) fn new(model: Arc<TractModel>) -> Self {
        TractRunner { model }
    }
}

fn to_tract(t: &Tensor) -> Result<TractTensor> {
    let dims: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    if t.datatype == DataType::Bytes {
        let strings = to_strings(&t.data, &t.name)?;
        let arr = tract_ndarray::ArrayD::from_shape_vec(dims, strings)
            .map_err(|e| Error::invalid(format!("input '{}': {e}", t.name)))?;
        return Ok(arr.into_tensor());
    }
    let mut out = TractTensor::zero_dt(datum(t.datatype), &dims)
        .map_err(|e| Error::internal(format!("tract: input '{}': {e:#}", t.name)))?;
    out.as_bytes_mut().copy_from_slice(&t.data);
    Ok(out)
}

fn from_tract(name: &str, t: &TractTensor) -> Result<Tensor> {
    // tract computes on INT64 values as dimension expressions (TDim) in places: once concrete
    // they are plain INT64.
    let cast;
    let t = if t.datum_type() == DatumType::TDim {
        cast = t
            .cast_to::<i64>()
            .map_err(|e| Error::internal(format!("output '{name}': {e:#}")))?;
        &*cast
    } else {
        t
    };
    let dt = from_datum(t.datum_type()).ok_or_else(|| {
        Error::unsupported(format!(
            "output '{name}' has tract type {:?}, which Wisp does not serve",
            t.datum_type()
        ))
    })?;
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    let data = if dt == DataType::Bytes {
        let view = t
            .to_plain_array_view::<String>()
            .map_err(|e| Error::internal(format!("output '{name}': {e:#}")))?;
        from_strings(&view.iter().cloned().collect::<Vec<_>>())
    } else {
        t.as_bytes().to_vec()
    };
    Tensor::new(name, dt, shape, data.into())
}

impl Runner for TractRunner {
    fn run(&mut self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        // tract takes inputs positionally, in the model file's order.
        let mut ordered: TVec<TValue> = TVec::new();
        let mut key = Vec::with_capacity(self.model.inputs.len());
        for spec in &self.model.inputs {
            let t = inputs.iter().find(|t| t.name == spec.name).ok_or_else(|| {
                Error::invalid(format!(
                    "input '{}' is required by the tract engine",
                    spec.name
                ))
            })?;
            key.push(t.shape.clone());
            ordered.push(to_tract(t)?.into());
        }
        let plan = self.model.plan(&key)?;
        let outputs = plan
            .run(ordered)
            .map_err(|e| Error::internal(format!("tract: {e:#}")))?;
        self.model
            .outputs
            .iter()
            .zip(outputs.iter())
            .map(|(name, v)| from_tract(name, v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::prelude::{tvec, Framework, InferenceModelExt};

    /// Under a signed manifest the bytes read must be the bytes signed: a file swapped after
    /// the signature check fails the load instead of loading.
    #[test]
    fn the_bytes_read_are_checked_against_the_signed_hash() {
        use sha2::Digest as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.onnx");
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/repo/cast_add_int64/1/model.onnx"
        );
        std::fs::copy(fixture, &file).unwrap();
        let signed: [u8; 32] = sha2::Sha256::digest(std::fs::read(&file).unwrap()).into();
        let (bytes, proto) = read_model(&file, Some(&signed)).unwrap();
        assert_eq!(bytes, std::fs::read(&file).unwrap());
        assert!(!has_external_data(&proto));
        // Swapped after the check: another valid model.
        std::fs::copy(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/repo/add_int64/1/model.onnx"
            ),
            &file,
        )
        .unwrap();
        let e = read_model(&file, Some(&signed)).unwrap_err();
        assert!(
            e.message()
                .contains("changed after its signature was checked"),
            "{e}"
        );
        assert!(
            read_model(&file, None).is_ok(),
            "unsigned: no hash to check"
        );
    }

    /// `Cast(UINT8 -> INT64) + INT64` keeps 64 bits (tract alone gave `[1, 126, 255]`).
    #[test]
    fn a_cast_to_int64_keeps_64_bits() {
        let file = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/repo/cast_add_int64/1/model.onnx"
        );
        let mut model = onnx().model_for_path(file).unwrap();
        model
            .set_input_fact(0, InferenceFact::dt_shape(DatumType::U8, [1usize, 3]))
            .unwrap();
        model
            .set_input_fact(1, InferenceFact::dt_shape(DatumType::I64, [1usize, 3]))
            .unwrap();
        let plan = model.into_optimized().unwrap().into_runnable().unwrap();
        let x = tract_ndarray::arr2(&[[0u8, 128, 255]])
            .into_dyn()
            .into_tensor();
        let y = tract_ndarray::arr2(&[[1i64, -2, 1 << 40]])
            .into_dyn()
            .into_tensor();
        let out = plan.run(tvec![x.into(), y.into()]).unwrap();
        let sum = from_tract("Z", &out[0]).unwrap();
        assert_eq!(sum.datatype, DataType::Int64);
        let values: Vec<i64> = sum
            .data
            .chunks(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(values, [1, 126, (1 << 40) + 255]);
    }

    #[test]
    fn value_info_with_a_symbolic_dimension_is_dropped_and_the_rest_kept() {
        use pb::tensor_shape_proto::{dimension::Value as Dim, Dimension};
        let info = |name: &str, dims: Vec<Dim>| pb::ValueInfoProto {
            name: name.into(),
            r#type: Some(pb::TypeProto {
                value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                    elem_type: 1,
                    shape: Some(pb::TensorShapeProto {
                        dim: dims
                            .into_iter()
                            .map(|v| Dimension {
                                value: Some(v),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut proto = pb::ModelProto {
            graph: Some(pb::GraphProto {
                value_info: vec![
                    info("h", vec![Dim::DimParam("n".into()), Dim::DimValue(8)]),
                    info("fixed", vec![Dim::DimValue(1), Dim::DimValue(8)]),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        drop_symbolic_value_info(&mut proto);
        let kept: Vec<_> = proto
            .graph
            .unwrap()
            .value_info
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(kept, ["fixed"]);
    }
}
