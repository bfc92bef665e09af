//! The gRPC service's codec: prost's, except that a `ModelInferRequest` is charged to the
//! in-flight budget *before* prost decodes it.
//!
//! Typed tensor contents grow when decoded: a packed varint of one byte becomes eight in an
//! `int64` vector, and the service then converts the vector into a tensor of the same size. An
//! empty input is two bytes on the wire and a few hundred once decoded; a shape's dimension is
//! one byte, then eight. So a message within `--grpc-max-message-size` could cost
//! many times its size before the handler saw it. [`BudgetCodec`]'s decoder first walks the
//! message's wire format (no allocation: [`Survey`]), refuses too many parameters, tensors or
//! dimensions, charges what decoding will hold, and only then decodes; past the budget the
//! call fails with RESOURCE_EXHAUSTED and nothing is decoded. The charge travels to the handler through a
//! task-local slot ([`CALL`]), set by [`super::guard`] around every call and by the stream
//! reader around each stream, since the codec is built by tonic's generated code and has no
//! other way to reach the service.

use std::any::TypeId;
use std::cell::RefCell;
use std::sync::Arc;

use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use super::pb;
use crate::service::Charge;

/// One call's budget and what its decoder charged, for the handler to take.
pub struct CallBudget {
    budget: Arc<tokio::sync::Semaphore>,
    charged: RefCell<Option<Charge>>,
}

impl CallBudget {
    /// A slot charging `budget` (the service's in-flight budget).
    pub fn new(budget: &Arc<tokio::sync::Semaphore>) -> Self {
        CallBudget {
            budget: budget.clone(),
            charged: RefCell::new(None),
        }
    }
}

tokio::task_local! {
    /// The running call's budget slot (absent when the service is called directly, as the
    /// in-process tests do; the handler then charges after decoding).
    pub static CALL: CallBudget;
}

/// What the decoder charged for the message just decoded on this task, if it ran under a
/// [`CALL`] slot.
pub fn take_charge() -> Option<Charge> {
    CALL.try_with(|c| c.charged.borrow_mut().take())
        .ok()
        .flatten()
}

/// prost's codec with an infer request charged before it is decoded (see the module docs).
#[derive(Debug)]
pub struct BudgetCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for BudgetCodec<T, U> {
    fn default() -> Self {
        BudgetCodec(ProstCodec::default())
    }
}

impl<T, U> Codec for BudgetCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BudgetDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BudgetDecoder(self.0.decoder())
    }
}

/// The decoder of [`BudgetCodec`].
#[derive(Debug)]
pub struct BudgetDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + Send + 'static> Decoder for BudgetDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if TypeId::of::<U>() == TypeId::of::<pb::ModelInferRequest>() {
            let survey = Survey::of(bytes::Buf::chunk(buf));
            // Refused before prost builds a map, a vector or a shape of them.
            survey.check().map_err(super::status)?;
            let charged = CALL.try_with(|c| -> Result<(), Status> {
                let mut charge = Charge::new(&c.budget);
                charge.grow_to(survey.cost).map_err(super::status)?;
                *c.charged.borrow_mut() = Some(charge);
                Ok(())
            });
            if let Ok(result) = charged {
                result?;
            }
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}

/// What a `ModelInferRequest` encoded in a message holds, counted by walking its wire format
/// (no allocation) before prost decodes it. A malformed message counts what was walked before
/// the fault; prost then reports the fault.
#[derive(Debug, Default, PartialEq)]
pub struct Survey {
    /// The most parameters the request gives itself or any one of its inputs or outputs (each
    /// map entry is one field occurrence).
    pub most_parameters: usize,
    /// Inputs.
    pub inputs: usize,
    /// Requested outputs.
    pub outputs: usize,
    /// Raw input contents.
    pub raw: usize,
    /// The most dimensions one input's shape has.
    pub most_rank: usize,
    /// The bytes the decoded request holds: the message itself (raw contents are slices of
    /// it), its typed contents twice at their element sizes (the decoded vectors, then the
    /// tensor converted from them), its shapes at eight bytes a dimension, and each input,
    /// output, raw content and parameter at twice its in-memory size (a vector grown by
    /// doubling).
    pub cost: u64,
}

impl Survey {
    /// Walks the `ModelInferRequest` encoded in `msg`.
    pub fn of(msg: &[u8]) -> Survey {
        use std::mem::size_of;
        type Input = pb::model_infer_request::InferInputTensor;
        type Output = pb::model_infer_request::InferRequestedOutputTensor;
        // a map entry: its key and value, and the hash map's slot around them
        const PARAMETER: u64 = 2 * (size_of::<String>() + size_of::<pb::InferParameter>()) as u64;
        let mut s = Survey {
            cost: msg.len() as u64,
            ..Survey::default()
        };
        let mut top = 0usize;
        let mut typed = 0u64;
        let mut dims = 0u64;
        let mut params = 0u64;
        let _ = walk(msg, |field, value| match (field, value) {
            (4, _) => top += 1,
            (5, Value::Len(tensor)) => {
                s.inputs += 1;
                let (mut n, mut rank) = (0usize, 0usize);
                let _ = walk(tensor, |f, v| match (f, v) {
                    // shape: packed varints, or one varint per occurrence
                    (3, Value::Len(packed)) => rank += varints(packed),
                    (3, Value::Scalar) => rank += 1,
                    (4, _) => n += 1,
                    (5, Value::Len(contents)) => {
                        typed = typed.saturating_add(typed_bytes(contents))
                    }
                    _ => {}
                });
                dims += rank as u64;
                params += n as u64;
                s.most_rank = s.most_rank.max(rank);
                s.most_parameters = s.most_parameters.max(n);
            }
            (6, Value::Len(tensor)) => {
                s.outputs += 1;
                let mut n = 0usize;
                let _ = walk(tensor, |f, _| {
                    if f == 2 {
                        n += 1;
                    }
                });
                params += n as u64;
                s.most_parameters = s.most_parameters.max(n);
            }
            (7, _) => s.raw += 1,
            _ => {}
        });
        s.most_parameters = s.most_parameters.max(top);
        params += top as u64;
        let each = |n: usize, size: usize| (n as u64).saturating_mul(2 * size as u64);
        s.cost = s
            .cost
            .saturating_add(typed.saturating_mul(2))
            .saturating_add(dims.saturating_mul(8))
            .saturating_add(each(s.inputs, size_of::<Input>()))
            .saturating_add(each(s.outputs, size_of::<Output>()))
            .saturating_add(each(s.raw, size_of::<bytes::Bytes>()))
            .saturating_add(params.saturating_mul(PARAMETER));
        s
    }

    /// Refuses a request with too many parameters, tensors or dimensions before it is decoded.
    pub fn check(&self) -> wisp_core::Result<()> {
        use wisp_core::infer;
        infer::check_parameter_count(self.most_parameters, "the request (or one of its tensors)")?;
        infer::check_tensor_count(self.inputs, "inputs")?;
        infer::check_tensor_count(self.outputs, "requested outputs")?;
        infer::check_tensor_count(self.raw, "raw input contents")?;
        infer::check_rank(self.most_rank, "an input")
    }
}

/// The varints in a packed field: one ends at each byte without its continuation bit.
fn varints(packed: &[u8]) -> usize {
    packed.iter().filter(|b| **b & 0x80 == 0).count()
}

/// The bytes an `InferTensorContents` encoded in `msg` holds once decoded, each element at its
/// in-memory size (as [`super::decoded_bytes`] counts a decoded one).
fn typed_bytes(msg: &[u8]) -> u64 {
    let mut total = 0u64;
    let _ = walk(msg, |field, value| {
        // (element size, whether packed elements are varints)
        let size: u64 = match field {
            1 => 1,         // bool
            2 | 4 | 6 => 4, // int32, uint32, fp32
            3 | 5 | 7 => 8, // int64, uint64, fp64
            8 => {
                if let Value::Len(b) = value {
                    total = total.saturating_add(b.len() as u64 + 4);
                }
                return;
            }
            _ => return,
        };
        let count = match value {
            Value::Len(packed) if field == 6 => packed.len() as u64 / 4,
            Value::Len(packed) if field == 7 => packed.len() as u64 / 8,
            Value::Len(packed) => varints(packed) as u64,
            Value::Scalar => 1,
        };
        total = total.saturating_add(count.saturating_mul(size));
    });
    total
}

/// A field's value as the walk sees it.
enum Value<'a> {
    /// Length-delimited: a submessage, bytes, a string or a packed repeated field.
    Len(&'a [u8]),
    /// A varint, fixed32 or fixed64.
    Scalar,
}

/// Calls `each(field number, value)` for every field of the message in `msg`; `None` at the
/// first malformed byte (groups included: proto3 has none).
fn walk<'a>(mut msg: &'a [u8], mut each: impl FnMut(u64, Value<'a>)) -> Option<()> {
    while !msg.is_empty() {
        let key = varint(&mut msg)?;
        let field = key >> 3;
        match key & 7 {
            0 => {
                varint(&mut msg)?;
                each(field, Value::Scalar);
            }
            1 => {
                msg = msg.get(8..)?;
                each(field, Value::Scalar);
            }
            2 => {
                let len = usize::try_from(varint(&mut msg)?).ok()?;
                let (value, rest) = (msg.get(..len)?, msg.get(len..)?);
                msg = rest;
                each(field, Value::Len(value));
            }
            5 => {
                msg = msg.get(4..)?;
                each(field, Value::Scalar);
            }
            _ => return None,
        }
    }
    Some(())
}

/// Reads one varint from the front of `msg`.
fn varint(msg: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, b) in msg.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *msg = &msg[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(contents: pb::InferTensorContents, raw: usize) -> pb::ModelInferRequest {
        pb::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "x".into(),
                datatype: "INT64".into(),
                shape: vec![1, 3],
                contents: Some(contents),
                ..Default::default()
            }],
            raw_input_contents: vec![vec![7u8; raw].into()],
            ..Default::default()
        }
    }

    #[test]
    fn the_walk_counts_what_decoding_will_hold() {
        let contents = pb::InferTensorContents {
            int64_contents: vec![1; 1 << 20],
            int_contents: vec![-1, 300, 5],
            bool_contents: vec![true, false],
            fp64_contents: vec![0.5; 3],
            bytes_contents: vec![b"abc".to_vec(), Vec::new()],
            ..Default::default()
        };
        let typed = 2 * super::super::decoded_bytes(&contents);
        let msg = request(contents, 100).encode_to_vec();
        assert!(msg.len() < (2 << 20), "a megabyte encoded...");
        let s = Survey::of(&msg);
        assert!(
            s.cost >= typed + msg.len() as u64,
            "...holds sixteen decoded"
        );
        assert!(
            s.cost < typed + msg.len() as u64 + 4096,
            "and not much more"
        );
        assert_eq!((s.inputs, s.outputs, s.raw, s.most_rank), (1, 0, 1, 2));
    }

    #[test]
    fn empty_tensors_and_long_shapes_are_counted_then_refused() {
        // Two bytes an input on the wire, hundreds decoded: charged at what they hold.
        let mut req = request(pb::InferTensorContents::default(), 0);
        req.inputs = vec![Default::default(); 1000];
        let msg = req.encode_to_vec();
        let s = Survey::of(&msg);
        assert_eq!(s.inputs, 1000);
        assert!(
            s.cost > 100 * msg.len() as u64,
            "{} for {} bytes",
            s.cost,
            msg.len()
        );
        assert!(s.check().is_ok());
        req.inputs = vec![Default::default(); wisp_core::infer::MAX_REQUEST_TENSORS + 1];
        let e = Survey::of(&req.encode_to_vec()).check().unwrap_err();
        assert!(e.message().contains("inputs"), "{}", e.message());
        // A shape of a million one-byte dimensions is eight megabytes decoded: refused.
        let mut req = request(pb::InferTensorContents::default(), 0);
        req.inputs[0].shape = vec![1; 1 << 20];
        let s = Survey::of(&req.encode_to_vec());
        assert_eq!(s.most_rank, 1 << 20);
        assert!(s.cost > 8 << 20);
        let e = s.check().unwrap_err();
        assert!(e.message().contains("dimensions"), "{}", e.message());
        req.inputs[0].shape = vec![1; wisp_core::infer::MAX_REQUEST_RANK];
        assert!(Survey::of(&req.encode_to_vec()).check().is_ok());
    }

    #[test]
    fn parameters_are_counted_before_decoding() {
        let param = || pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(true)),
        };
        let mut req = request(pb::InferTensorContents::default(), 0);
        for i in 0..5 {
            req.parameters.insert(format!("p{i}"), param());
        }
        for i in 0..9 {
            req.inputs[0].parameters.insert(format!("i{i}"), param());
        }
        req.outputs
            .push(pb::model_infer_request::InferRequestedOutputTensor {
                name: "y".into(),
                parameters: (0..7).map(|i| (format!("o{i}"), param())).collect(),
            });
        assert_eq!(Survey::of(&req.encode_to_vec()).most_parameters, 9);
        req.parameters = (0..=wisp_core::infer::MAX_PARAMETERS)
            .map(|i| (format!("p{i}"), param()))
            .collect();
        let s = Survey::of(&req.encode_to_vec());
        assert_eq!(s.most_parameters, wisp_core::infer::MAX_PARAMETERS + 1);
        assert!(s.check().is_err());
    }

    #[test]
    fn malformed_messages_cost_what_was_walked_and_never_panic() {
        let msg = request(
            pb::InferTensorContents {
                uint64_contents: vec![u64::MAX; 4],
                ..Default::default()
            },
            0,
        )
        .encode_to_vec();
        for cut in 0..msg.len() {
            let s = Survey::of(&msg[..cut]);
            assert!(s.cost >= cut as u64);
        }
        assert_eq!(Survey::of(&[0xff; 12]).cost, 12);
        assert_eq!(Survey::of(&[]), Survey::default());
    }
}
