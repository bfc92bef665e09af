//! Known wrong answers: operators (and modes of them) an engine computes wrongly, found by
//! ONNX's own backend test cases through `./dev test engines`. A model using one is refused at
//! load on that engine, naming the operator, rather than answered wrongly.

use tract_onnx::pb;
use wisp_core::{Error, Result};

/// What tract computes wrongly, found by ONNX's own backend test cases through
/// `./dev test engines` (`benches/2026-12-04-engines.md`): a model using any of these is
/// refused at load on tract, naming the operator, rather than answered wrongly. ONNX Runtime
/// serves them.
fn tract_gets_wrong(node: &pb::NodeProto, graph: &GraphFacts) -> Option<String> {
    let has_fp16 = graph.has_fp16;
    let attr = |name: &str| node.attribute.iter().find(|a| a.name == name);
    let text = |name: &str| attr(name).map(|a| String::from_utf8_lossy(&a.s).into_owned());
    let input = |i: usize| node.input.get(i).is_some_and(|n| !n.is_empty());
    let why = match node.op_type.as_str() {
        "GRU" | "LSTM" | "RNN" if text("direction").as_deref() == Some("reverse") => {
            "direction 'reverse'".to_string()
        }
        "GRU" if text("direction").as_deref() == Some("bidirectional") => {
            "direction 'bidirectional'".to_string()
        }
        "GRU" | "LSTM" | "RNN" if input(4) => "a sequence_lens input".to_string(),
        "BitShift" => "shifts by a negative amount or past the width".to_string(),
        "Celu" if has_fp16 => "FLOAT16 tensors".to_string(),
        "SpaceToDepth" if text("mode").is_some_and(|m| m != "DCR") => {
            format!("mode '{}'", text("mode").unwrap_or_default())
        }
        "Swish" if attr("alpha").is_some_and(|a| a.f != 1.0) => "an alpha other than 1".to_string(),
        "Attention"
            if attr("left_window_size").is_some() || attr("right_window_size").is_some() =>
        {
            "a local attention window".to_string()
        }
        "Attention" if attr("is_causal").is_some_and(|a| a.i != 0) && input(4) => {
            "is_causal and a past key".to_string()
        }
        // tract folds from the lowest finite float, so a row of -inf reduces to -3.4e38 (and
        // a mask test `max == -inf` fails). Infinite constants are how masks get there.
        "ReduceMax" | "ReduceMin"
            if node
                .input
                .first()
                .is_some_and(|x| graph.from_infinity.contains(x.as_str())) =>
        {
            "an input computed from an infinite constant (a row of -inf reduces to the lowest finite float, not -inf)"
                .to_string()
        }
        // tract fuses DequantizeLinear → Softmax → QuantizeLinear into a quantized softmax
        // whose answers saturate (every class 1.0 in a QDQ classifier from ONNX Runtime's
        // quantizer); a float softmax between float tensors is right.
        "Softmax"
            if node
                .input
                .first()
                .is_some_and(|x| graph.dequantized.contains(x.as_str()))
                && node
                    .output
                    .first()
                    .is_some_and(|y| graph.quantized.contains(y.as_str())) =>
        {
            "a dequantized input and a quantized output (a QDQ softmax)".to_string()
        }
        _ => return None,
    };
    Some(format!(
        "tract computes ONNX {} with {why} wrongly; serve this model with --onnx-engine onnxruntime",
        node.op_type
    ))
}

/// What ONNX Runtime computes wrongly, found the same way: a model using it is refused at load
/// on ONNX Runtime, naming the operator. (tract refuses it too: it cannot plan it.)
fn ort_gets_wrong(node: &pb::NodeProto, graph: &GraphFacts) -> Option<String> {
    let attr = |name: &str| node.attribute.iter().find(|a| a.name == name);
    let text = |name: &str| attr(name).map(|a| String::from_utf8_lossy(&a.s).into_owned());
    let input = |i: usize| node.input.get(i).filter(|n| !n.is_empty());
    let output = |i: usize| node.output.get(i).is_some_and(|n| !n.is_empty());
    let why = match node.op_type.as_str() {
        "MaxUnpool" if input(2).is_some() => "an output_shape input",
        // Downsampling with align_corners answers wrongly (linear and cubic); upsampling is
        // right. Served only when constant scales prove every axis is kept or enlarged.
        "Resize"
            if text("coordinate_transformation_mode").as_deref() == Some("align_corners")
                && matches!(text("mode").as_deref(), Some("linear" | "cubic"))
                && input(2).is_some_and(|scales| {
                    graph
                        .float_constant(scales)
                        .is_none_or(|v| v.iter().any(|s| *s < 1.0))
                }) =>
        {
            "align_corners and scales that may downsample (not constants of at least 1)"
        }
        // The masked entries of qk_matmul_output come out as the lowest float, not -inf.
        "Attention" if attr("is_causal").is_some_and(|a| a.i != 0) && output(3) => {
            "is_causal and a qk_matmul_output output"
        }
        _ => return None,
    };
    Some(format!(
        "ONNX Runtime computes ONNX {} with {why} wrongly (ONNX's own test case expects another answer)",
        node.op_type
    ))
}

/// Which engine's table of known wrong answers to check.
pub(crate) enum KnownWrong {
    /// `tract_gets_wrong`.
    Tract,
    /// `ort_gets_wrong`.
    OnnxRuntime,
}

/// The first node of `graph` (or of a graph nested in a node's attributes) that `rule` says
/// its engine gets wrong, as the reason to refuse the model.
fn known_wrong(
    graph: &pb::GraphProto,
    has_fp16: bool,
    rule: fn(&pb::NodeProto, &GraphFacts) -> Option<String>,
) -> Option<String> {
    let facts = GraphFacts::of(graph, has_fp16);
    graph.node.iter().find_map(|node| {
        rule(node, &facts).or_else(|| {
            node.attribute
                .iter()
                .flat_map(|a| a.g.iter().chain(a.graphs.iter()))
                .find_map(|g| known_wrong(g, has_fp16, rule))
        })
    })
}

/// What the known-wrong rules may ask of the graph a node is in.
struct GraphFacts<'a> {
    /// Any declared tensor of the model is FLOAT16.
    has_fp16: bool,
    /// Initializers and `Constant` outputs, by name.
    constants: std::collections::HashMap<&'a str, &'a pb::TensorProto>,
    /// Tensors computed (at any distance) from a FLOAT constant holding an infinity.
    from_infinity: std::collections::HashSet<&'a str>,
    /// Outputs of `DequantizeLinear` nodes.
    dequantized: std::collections::HashSet<&'a str>,
    /// Tensors a `QuantizeLinear` node quantizes.
    quantized: std::collections::HashSet<&'a str>,
}

impl<'a> GraphFacts<'a> {
    fn of(graph: &'a pb::GraphProto, has_fp16: bool) -> Self {
        let mut constants: std::collections::HashMap<&str, &pb::TensorProto> = graph
            .initializer
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        for node in graph.node.iter().filter(|n| n.op_type == "Constant") {
            let value = node.attribute.iter().find(|a| a.name == "value");
            if let (Some(out), Some(t)) = (node.output.first(), value.and_then(|a| a.t.as_ref())) {
                constants.insert(out.as_str(), t);
            }
        }
        let scalar_inf = graph
            .node
            .iter()
            .filter(|n| n.op_type == "Constant")
            .filter(|n| {
                n.attribute.iter().any(|a| {
                    (a.name == "value_float" && a.f.is_infinite())
                        || (a.name == "value_floats" && a.floats.iter().any(|f| f.is_infinite()))
                })
            })
            .filter_map(|n| n.output.first().map(String::as_str));
        let first = |op: &'static str, of: fn(&'a pb::NodeProto) -> Option<&'a String>| {
            graph
                .node
                .iter()
                .filter(move |n| n.op_type == op)
                .filter_map(of)
                .map(String::as_str)
        };
        let mut facts = GraphFacts {
            has_fp16,
            constants,
            from_infinity: Default::default(),
            dequantized: first("DequantizeLinear", |n| n.output.first()).collect(),
            quantized: first("QuantizeLinear", |n| n.input.first()).collect(),
        };
        let infinite: Vec<&str> = facts
            .constants
            .keys()
            .copied()
            .filter(|name| {
                facts
                    .float_constant(name)
                    .is_some_and(|v| v.iter().any(|f| f.is_infinite()))
            })
            .chain(scalar_inf)
            .collect();
        facts.from_infinity.extend(infinite);
        // Forward closure over the nodes, repeated until nothing changes (a DAG: it ends).
        loop {
            let before = facts.from_infinity.len();
            for node in &graph.node {
                if node
                    .input
                    .iter()
                    .any(|i| facts.from_infinity.contains(i.as_str()))
                {
                    facts
                        .from_infinity
                        .extend(node.output.iter().map(String::as_str));
                }
            }
            if facts.from_infinity.len() == before {
                break;
            }
        }
        facts
    }

    /// The values of FLOAT tensor `name` when the graph holds it as a constant.
    fn float_constant(&self, name: &str) -> Option<Vec<f32>> {
        let t = self.constants.get(name)?;
        if t.data_type != 1 {
            return None;
        }
        if !t.float_data.is_empty() {
            return Some(t.float_data.clone());
        }
        Some(
            t.raw_data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )
    }
}

/// Refuses a model whose graph uses what `engine` is known to compute wrongly.
pub(crate) fn refuse_known_wrong(proto: &pb::ModelProto, engine: KnownWrong) -> Result<()> {
    let rule = match engine {
        KnownWrong::Tract => tract_gets_wrong,
        KnownWrong::OnnxRuntime => ort_gets_wrong,
    };
    let graph = proto.graph.as_ref();
    match graph.and_then(|g| known_wrong(g, declares_fp16(g), rule)) {
        Some(why) => Err(Error::unsupported(why)),
        None => Ok(()),
    }
}

/// Whether any declared tensor of `graph` is FLOAT16.
fn declares_fp16(graph: &pb::GraphProto) -> bool {
    let fp16 = |v: &pb::ValueInfoProto| {
        matches!(
            v.r#type.as_ref().and_then(|t| t.value.as_ref()),
            Some(pb::type_proto::Value::TensorType(t)) if t.elem_type == 10
        )
    };
    graph
        .input
        .iter()
        .chain(&graph.output)
        .chain(&graph.value_info)
        .any(fp16)
        || graph.initializer.iter().any(|t| t.data_type == 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<pb::AttributeProto>,
    ) -> pb::NodeProto {
        pb::NodeProto {
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        }
    }

    fn text(name: &str, value: &str) -> pb::AttributeProto {
        pb::AttributeProto {
            name: name.into(),
            s: value.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    fn floats(name: &str, values: &[f32]) -> pb::TensorProto {
        pb::TensorProto {
            name: name.into(),
            data_type: 1,
            dims: vec![values.len() as i64],
            float_data: values.to_vec(),
            ..Default::default()
        }
    }

    fn model(nodes: Vec<pb::NodeProto>, initializers: Vec<pb::TensorProto>) -> pb::ModelProto {
        pb::ModelProto {
            graph: Some(pb::GraphProto {
                node: nodes,
                initializer: initializers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A max over values reached from an infinite constant is refused on tract (its fold
    /// starts at the lowest finite float), and one over plain inputs is served.
    #[test]
    fn a_reduce_max_over_an_infinite_mask_is_refused_on_tract() {
        let masked = model(
            vec![
                node("Where", &["cond", "x", "neg_inf"], &["masked"], vec![]),
                node("ReduceMax", &["masked"], &["y"], vec![]),
            ],
            vec![floats("neg_inf", &[f32::NEG_INFINITY])],
        );
        let e = refuse_known_wrong(&masked, KnownWrong::Tract).unwrap_err();
        assert!(e.message().contains("ReduceMax"), "{e}");
        assert!(refuse_known_wrong(&masked, KnownWrong::OnnxRuntime).is_ok());
        let plain = model(
            vec![
                node("Where", &["cond", "x", "zero"], &["masked"], vec![]),
                node("ReduceMax", &["masked"], &["y"], vec![]),
            ],
            vec![floats("zero", &[0.0])],
        );
        assert!(refuse_known_wrong(&plain, KnownWrong::Tract).is_ok());
    }

    /// Resize with align_corners is refused on ONNX Runtime unless constant scales prove it
    /// never downsamples.
    #[test]
    fn an_align_corners_resize_is_served_on_ort_only_when_it_cannot_downsample() {
        let resize = |scales: &[f32]| {
            model(
                vec![node(
                    "Resize",
                    &["x", "", "scales"],
                    &["y"],
                    vec![
                        text("coordinate_transformation_mode", "align_corners"),
                        text("mode", "linear"),
                    ],
                )],
                vec![floats("scales", scales)],
            )
        };
        let down = refuse_known_wrong(&resize(&[1.0, 1.0, 0.6, 0.6]), KnownWrong::OnnxRuntime);
        assert!(down.unwrap_err().message().contains("Resize"));
        assert!(
            refuse_known_wrong(&resize(&[1.0, 1.0, 2.0, 2.0]), KnownWrong::OnnxRuntime).is_ok()
        );
        // Scales computed at run time cannot be proved.
        let mut dynamic = resize(&[2.0]);
        dynamic.graph.as_mut().unwrap().initializer.clear();
        assert!(refuse_known_wrong(&dynamic, KnownWrong::OnnxRuntime).is_err());
    }

    /// A softmax between a DequantizeLinear and a QuantizeLinear (a QDQ classifier's last
    /// step) is refused on tract; a float softmax, or one that only reads dequantized values,
    /// is served.
    #[test]
    fn a_qdq_softmax_is_refused_on_tract() {
        let qdq = model(
            vec![
                node("DequantizeLinear", &["a", "s", "z"], &["b"], vec![]),
                node("Softmax", &["b"], &["p"], vec![]),
                node("QuantizeLinear", &["p", "s2", "z2"], &["q"], vec![]),
            ],
            vec![],
        );
        let e = refuse_known_wrong(&qdq, KnownWrong::Tract).unwrap_err();
        assert!(
            e.message().contains("Softmax") && e.message().contains("QDQ softmax"),
            "{e}"
        );
        assert!(refuse_known_wrong(&qdq, KnownWrong::OnnxRuntime).is_ok());
        let float_out = model(
            vec![
                node("DequantizeLinear", &["a", "s", "z"], &["b"], vec![]),
                node("Softmax", &["b"], &["p"], vec![]),
            ],
            vec![],
        );
        assert!(refuse_known_wrong(&float_out, KnownWrong::Tract).is_ok());
        let plain = model(vec![node("Softmax", &["x"], &["p"], vec![])], vec![]);
        assert!(refuse_known_wrong(&plain, KnownWrong::Tract).is_ok());
    }
}
