//! Triton's `sequence_batching`, typed: stateful models whose requests form sequences, each
//! identified by a correlation ID. Read from the config once, when it is validated, so that
//! every problem is reported with the config's other errors (and covered by the golden tests).

use std::time::Duration;

use serde::Deserialize;

use super::{bounds, ModelConfig};
use crate::DataType;

/// The config field the sequence batcher's settings live in.
pub const FIELD: &str = "sequence_batching";

/// Triton's default `max_sequence_idle_microseconds`: one second.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// What a control input tells the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// The request starts its sequence.
    Start,
    /// The request ends its sequence.
    End,
    /// The batch slot holds a request.
    Ready,
    /// The sequence's correlation ID.
    CorrId,
}

/// A tensor the sequence batcher adds to every request of a sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlInput {
    /// The model input it feeds.
    pub name: String,
    /// What it says.
    pub kind: ControlKind,
    /// Its datatype.
    pub datatype: DataType,
    /// For START, END and READY: the little-endian encoding of (false, true).
    pub false_true: Option<(Vec<u8>, Vec<u8>)>,
}

/// Implicit state: the model's output `output_name` after one request of a sequence is its
/// input `input_name` in the next; the first request of a sequence gets zeros.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSpec {
    /// The model input that receives the state.
    pub input_name: String,
    /// The model output that produces it.
    pub output_name: String,
    /// Its datatype.
    pub datatype: DataType,
    /// Its dims (without the batch dim), all fixed.
    pub dims: Vec<i64>,
}

/// How sequences are batched.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    /// Each sequence holds a batch slot of one instance for its lifetime.
    Direct {
        /// How long a partial batch may wait for other slots' requests.
        max_queue_delay: Duration,
    },
    /// The oldest sequences' next requests are batched dynamically.
    Oldest {
        /// Sequences batched at once per instance (0: the model's max batch size).
        max_candidates: usize,
        /// Batch sizes dispatched as soon as formed.
        preferred: Vec<usize>,
        /// How long a partial batch may wait.
        max_queue_delay: Duration,
        /// Responses in request order.
        preserve_ordering: bool,
    },
}

/// A model's `sequence_batching`, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceBatching {
    /// A sequence with no request for this long is released.
    pub idle: Duration,
    /// The batching strategy.
    pub strategy: Strategy,
    /// Control inputs, one per kind at most.
    pub controls: Vec<ControlInput>,
    /// Implicit state.
    pub states: Vec<StateSpec>,
}

impl SequenceBatching {
    /// How many sequences one instance serves at once: its batch slots.
    pub fn slots_per_instance(&self, max_batch_size: i32) -> usize {
        let batch = max_batch_size.max(1) as usize;
        match &self.strategy {
            Strategy::Direct { .. } => batch,
            Strategy::Oldest { max_candidates, .. } => {
                if *max_candidates > 0 {
                    *max_candidates
                } else {
                    batch
                }
            }
        }
    }
}

/// A number that proto JSON may spell as a number or a string.
#[derive(Debug, Default, Clone, Copy)]
struct Num(f64);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => n
                .as_f64()
                .map(Num)
                .ok_or_else(|| serde::de::Error::custom("not a number")),
            serde_json::Value::String(s) => s
                .parse()
                .map(Num)
                .map_err(|_| serde::de::Error::custom(format!("'{s}' is not a number"))),
            other => Err(serde::de::Error::custom(format!("{other} is not a number"))),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawControl {
    kind: Option<String>,
    int32_false_true: Vec<Num>,
    fp32_false_true: Vec<Num>,
    bool_false_true: Vec<bool>,
    data_type: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawControlInput {
    name: String,
    control: Vec<RawControl>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawState {
    input_name: String,
    output_name: String,
    data_type: Option<String>,
    dims: Vec<Num>,
    initial_state: Vec<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawDirect {
    max_queue_delay_microseconds: Num,
    minimum_slot_utilization: Num,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawOldest {
    max_candidate_sequences: Num,
    preferred_batch_size: Vec<Num>,
    max_queue_delay_microseconds: Num,
    preserve_ordering: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Raw {
    max_sequence_idle_microseconds: Option<Num>,
    control_input: Vec<RawControlInput>,
    state: Vec<RawState>,
    direct: Option<RawDirect>,
    oldest: Option<RawOldest>,
    iterative_sequence: bool,
}

/// An unsigned integer in `0..=max`, or the problem with it.
fn bounded(v: Num, field: &str, max: u64) -> Result<u64, String> {
    if v.0 < 0.0 || v.0.fract() != 0.0 || v.0 > max as f64 {
        Err(format!(
            "{field} must be an integer in 0..={max}, got {}",
            v.0
        ))
    } else {
        Ok(v.0 as u64)
    }
}

fn datatype(name: Option<&str>, field: &str, errs: &mut Vec<String>) -> Option<DataType> {
    let name = name.unwrap_or("TYPE_INVALID");
    let dt = DataType::from_config_name(name);
    if dt.is_none() {
        errs.push(format!("{field}: '{name}' is not a datatype"));
    }
    dt
}

/// `cfg`'s sequence batching (`None` when it has none), or every problem found reading it.
pub fn read(cfg: &ModelConfig) -> Result<Option<SequenceBatching>, Vec<String>> {
    let Some(value) = cfg.other.get(FIELD) else {
        return Ok(None);
    };
    let raw: Raw = serde_json::from_value(value.clone()).map_err(|e| vec![e.to_string()])?;
    let mut errs = Vec::new();
    let idle = match raw.max_sequence_idle_microseconds {
        None => DEFAULT_IDLE,
        Some(v) => match bounded(v, "max_sequence_idle_microseconds", bounds::MAX_TIMEOUT_US) {
            Ok(0) => DEFAULT_IDLE,
            Ok(us) => Duration::from_micros(us),
            Err(e) => {
                errs.push(e);
                DEFAULT_IDLE
            }
        },
    };
    if raw.iterative_sequence {
        errs.push("iterative_sequence is not supported".into());
    }
    let delay = |v: Num, field: &str, errs: &mut Vec<String>| {
        bounded(v, field, bounds::MAX_QUEUE_DELAY_US)
            .map(Duration::from_micros)
            .unwrap_or_else(|e| {
                errs.push(e);
                Duration::ZERO
            })
    };
    let strategy = match (raw.direct, raw.oldest) {
        (Some(_), Some(_)) => {
            errs.push("set either direct or oldest, not both".into());
            Strategy::Direct {
                max_queue_delay: Duration::ZERO,
            }
        }
        (Some(d), None) => {
            if d.minimum_slot_utilization.0 != 0.0 {
                errs.push("direct.minimum_slot_utilization is not supported".into());
            }
            Strategy::Direct {
                max_queue_delay: delay(
                    d.max_queue_delay_microseconds,
                    "direct.max_queue_delay_microseconds",
                    &mut errs,
                ),
            }
        }
        (None, None) => Strategy::Direct {
            max_queue_delay: Duration::ZERO,
        },
        (None, Some(o)) => {
            let max_candidates = bounded(
                o.max_candidate_sequences,
                "oldest.max_candidate_sequences",
                bounds::MAX_SEQUENCES as u64,
            )
            .unwrap_or_else(|e| {
                errs.push(e);
                0
            }) as usize;
            let mut preferred = Vec::new();
            for p in o.preferred_batch_size.iter().take(bounds::MAX_TENSORS) {
                match bounded(
                    *p,
                    "oldest.preferred_batch_size",
                    bounds::MAX_BATCH_SIZE as u64,
                ) {
                    Ok(n) => preferred.push(n.max(1) as usize),
                    Err(e) => errs.push(e),
                }
            }
            preferred.sort_unstable();
            Strategy::Oldest {
                max_candidates,
                preferred,
                max_queue_delay: delay(
                    o.max_queue_delay_microseconds,
                    "oldest.max_queue_delay_microseconds",
                    &mut errs,
                ),
                preserve_ordering: o.preserve_ordering,
            }
        }
    };
    let mut controls: Vec<ControlInput> = Vec::new();
    for (i, ci) in raw.control_input.iter().enumerate() {
        let field = format!("control_input[{i}]");
        if ci.name.is_empty() {
            errs.push(format!("{field}: name is empty"));
        }
        if ci.control.len() != 1 {
            errs.push(format!(
                "{field}: needs exactly one control, got {}",
                ci.control.len()
            ));
        }
        let Some(c) = ci.control.first() else {
            continue;
        };
        let kind = match c.kind.as_deref().unwrap_or("CONTROL_SEQUENCE_START") {
            "CONTROL_SEQUENCE_START" => ControlKind::Start,
            "CONTROL_SEQUENCE_END" => ControlKind::End,
            "CONTROL_SEQUENCE_READY" => ControlKind::Ready,
            "CONTROL_SEQUENCE_CORRID" => ControlKind::CorrId,
            other => {
                errs.push(format!("{field}: unknown control kind '{other}'"));
                continue;
            }
        };
        if controls.iter().any(|k| k.kind == kind) {
            errs.push(format!("{field}: a second {kind:?} control"));
        }
        let pair = |v: &[u8], w: &[u8]| Some((v.to_vec(), w.to_vec()));
        let (dt, false_true) = if kind == ControlKind::CorrId {
            let dt = datatype(c.data_type.as_deref(), &field, &mut errs);
            if dt.is_some_and(|d| {
                !matches!(
                    d,
                    DataType::Uint64
                        | DataType::Int64
                        | DataType::Uint32
                        | DataType::Int32
                        | DataType::Bytes
                )
            }) {
                errs.push(format!(
                    "{field}: a CORRID control is TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
                ));
            }
            (dt, None)
        } else {
            let set = [
                !c.int32_false_true.is_empty(),
                !c.fp32_false_true.is_empty(),
                !c.bool_false_true.is_empty(),
            ];
            if set.iter().filter(|s| **s).count() != 1 {
                errs.push(format!(
                    "{field}: set exactly one of int32_false_true, fp32_false_true, bool_false_true"
                ));
                continue;
            }
            let two = |n: usize, errs: &mut Vec<String>| {
                if n != 2 {
                    errs.push(format!(
                        "{field}: the false_true list needs 2 values, got {n}"
                    ));
                }
                n == 2
            };
            if set[0] && two(c.int32_false_true.len(), &mut errs) {
                let v = |n: Num| (n.0 as i32).to_le_bytes();
                let (f, t) = (v(c.int32_false_true[0]), v(c.int32_false_true[1]));
                (Some(DataType::Int32), pair(&f, &t))
            } else if set[1] && two(c.fp32_false_true.len(), &mut errs) {
                let v = |n: Num| (n.0 as f32).to_le_bytes();
                let (f, t) = (v(c.fp32_false_true[0]), v(c.fp32_false_true[1]));
                (Some(DataType::Fp32), pair(&f, &t))
            } else if set[2] && two(c.bool_false_true.len(), &mut errs) {
                let v = |b: bool| [u8::from(b)];
                let (f, t) = (v(c.bool_false_true[0]), v(c.bool_false_true[1]));
                (Some(DataType::Bool), pair(&f, &t))
            } else {
                continue;
            }
        };
        if let Some(datatype) = dt {
            controls.push(ControlInput {
                name: ci.name.clone(),
                kind,
                datatype,
                false_true,
            });
        }
    }
    let mut states = Vec::new();
    for (i, s) in raw.state.iter().enumerate() {
        let field = format!("state[{i}]");
        if s.input_name.is_empty() || s.output_name.is_empty() {
            errs.push(format!("{field}: input_name and output_name are required"));
        }
        if !s.initial_state.is_empty() {
            errs.push(format!(
                "{field}: initial_state is not supported (a sequence's state starts as zeros)"
            ));
        }
        let dt = datatype(s.data_type.as_deref(), &field, &mut errs);
        if dt == Some(DataType::Bytes) {
            errs.push(format!("{field}: a state cannot be TYPE_STRING"));
        }
        if s.dims.len() > bounds::MAX_RANK {
            errs.push(format!("{field}: more than {} dims", bounds::MAX_RANK));
            continue;
        }
        let mut dims = Vec::new();
        for d in &s.dims {
            match bounded(*d, &format!("{field}.dims"), bounds::MAX_DIM as u64) {
                Ok(n) => dims.push(n as i64),
                Err(_) => errs.push(format!(
                    "{field}: dims must be fixed (0..={}), got {}",
                    bounds::MAX_DIM,
                    d.0
                )),
            }
        }
        let bytes = dims
            .iter()
            .try_fold(dt.and_then(|d| d.size()).unwrap_or(1) as u64, |acc, &d| {
                acc.checked_mul(d as u64)
            });
        if bytes.is_none_or(|b| b > bounds::MAX_STATE_BYTES) {
            errs.push(format!(
                "{field}: a state of dims {dims:?} is larger than {} bytes",
                bounds::MAX_STATE_BYTES
            ));
        }
        if let Some(datatype) = dt {
            states.push(StateSpec {
                input_name: s.input_name.clone(),
                output_name: s.output_name.clone(),
                datatype,
                dims,
            });
        }
    }
    let names: Vec<&str> = controls
        .iter()
        .map(|c| c.name.as_str())
        .chain(states.iter().map(|s| s.input_name.as_str()))
        .collect();
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            errs.push(format!("input '{n}' is fed by two controls or states"));
        }
        if cfg.input.iter().any(|input| input.name == *n) {
            errs.push(format!(
                "'{n}' is a control or state input, and is listed in 'input' too (the sequence batcher supplies it)"
            ));
        }
    }
    if errs.is_empty() {
        Ok(Some(SequenceBatching {
            idle,
            strategy,
            controls,
            states,
        }))
    } else {
        Err(errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_pbtxt;

    fn read_text(text: &str) -> Result<Option<SequenceBatching>, Vec<String>> {
        read(&parse_pbtxt("m", text).unwrap())
    }

    #[test]
    fn reads_controls_states_and_strategy() {
        let s = read_text(
            r#"sequence_batching {
  max_sequence_idle_microseconds: 5000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "h" output_name: "h_out" data_type: TYPE_FP32 dims: [ 1, 128 ] } ]
}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.idle, Duration::from_micros(5000));
        assert_eq!(
            s.strategy,
            Strategy::Oldest {
                max_candidates: 4,
                preferred: vec![2, 4],
                max_queue_delay: Duration::from_micros(100),
                preserve_ordering: false,
            }
        );
        assert_eq!(s.controls.len(), 4);
        assert_eq!(s.controls[0].kind, ControlKind::Start);
        assert_eq!(
            s.controls[0].false_true,
            Some((0i32.to_le_bytes().to_vec(), 1i32.to_le_bytes().to_vec()))
        );
        assert_eq!(s.controls[1].datatype, DataType::Fp32);
        assert_eq!(s.controls[2].false_true, Some((vec![0], vec![1])));
        assert_eq!(s.controls[3].datatype, DataType::Uint64);
        assert_eq!(s.states[0].dims, vec![1, 128]);
        assert_eq!(s.slots_per_instance(8), 4);
    }

    #[test]
    fn defaults_are_tritons() {
        let s = read_text("sequence_batching { }").unwrap().unwrap();
        assert_eq!(s.idle, DEFAULT_IDLE);
        assert_eq!(
            s.strategy,
            Strategy::Direct {
                max_queue_delay: Duration::ZERO
            }
        );
        assert_eq!(s.slots_per_instance(0), 1);
        assert_eq!(s.slots_per_instance(8), 8);
        assert_eq!(read_text("max_batch_size: 1").unwrap(), None);
    }

    #[test]
    fn reports_every_problem() {
        let errs = read_text(
            r#"input [ { name: "START" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  direct { minimum_slot_utilization: 0.5 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0 ] } ] },
    { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] }
  ]
  state [
    { input_name: "h" output_name: "o" data_type: TYPE_FP32 dims: [ -1 ] },
    { input_name: "g" output_name: "p" data_type: TYPE_FP32 dims: [ 100000, 100000 ] }
  ]
}"#,
        )
        .unwrap_err();
        let all = errs.join("\n");
        for want in [
            "minimum_slot_utilization is not supported",
            "needs 2 values",
            "CORRID control is TYPE_UINT64",
            "dims must be fixed",
            "larger than",
        ] {
            assert!(all.contains(want), "missing '{want}' in:\n{all}");
        }
    }
}
