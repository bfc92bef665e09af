//! The gRPC service's codec: prost's, except that a `ModelInferRequest` is charged to the
//! in-flight budget *before* prost decodes it.
//!
//! Typed tensor contents grow when decoded: a packed varint of one byte becomes eight in an
//! `int64` vector, and the service then converts the vector into a tensor of the same size. So
//! a message within `--grpc-max-message-size` could cost many times its size before the handler
//! saw it. [`BudgetCodec`]'s decoder first walks the message's wire format (no allocation) to
//! count what its typed contents will hold, charges that (twice: the vectors and the tensor)
//! plus the raw contents, and only then decodes; past the budget the call fails with
//! RESOURCE_EXHAUSTED and nothing is decoded. The charge travels to the handler through a
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
            let msg = bytes::Buf::chunk(buf);
            // Refused before prost builds a map of them.
            let most = most_parameters(msg);
            wisp_core::infer::check_parameter_count(most, "the request (or one of its tensors)")
                .map_err(super::status)?;
            let cost = infer_request_cost(msg);
            let charged = CALL.try_with(|c| -> Result<(), Status> {
                let mut charge = Charge::new(&c.budget);
                charge.grow_to(cost).map_err(super::status)?;
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

/// The most parameters the `ModelInferRequest` encoded in `msg` gives itself or any one of its
/// inputs or outputs (each map entry is one field occurrence).
pub fn most_parameters(msg: &[u8]) -> usize {
    let mut top = 0usize;
    let mut most = 0usize;
    let _ = walk(msg, |field, value| match (field, value) {
        (4, _) => top += 1,
        (5 | 6, Value::Len(tensor)) => {
            // an input's parameters are its field 4, an output's its field 2
            let own = if field == 5 { 4 } else { 2 };
            let mut n = 0usize;
            let _ = walk(tensor, |f, _| {
                if f == own {
                    n += 1;
                }
            });
            most = most.max(n);
        }
        _ => {}
    });
    most.max(top)
}

/// What a `ModelInferRequest` encoded in `msg` will hold once decoded and converted: its raw
/// contents once (they are slices of the message), its typed contents twice at their element
/// sizes (the decoded vectors, then the tensor converted from them). A malformed message
/// counts what was walked before the fault; prost then reports the fault.
pub fn infer_request_cost(msg: &[u8]) -> u64 {
    let mut cost = 0u64;
    let _ = walk(msg, |field, value| {
        match (field, value) {
            // inputs
            (5, Value::Len(tensor)) => {
                let _ = walk(tensor, |f, v| {
                    if let (5, Value::Len(contents)) = (f, v) {
                        cost = cost.saturating_add(2 * typed_bytes(contents));
                    }
                });
            }
            // raw_input_contents
            (7, Value::Len(raw)) => cost = cost.saturating_add(raw.len() as u64),
            _ => {}
        }
    });
    cost
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
            // One varint ends at each byte without its continuation bit.
            Value::Len(packed) => packed.iter().filter(|b| **b & 0x80 == 0).count() as u64,
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
        let want = 2 * super::super::decoded_bytes(&contents) + 100;
        let msg = request(contents, 100).encode_to_vec();
        assert!(msg.len() < (2 << 20), "a megabyte encoded...");
        assert_eq!(infer_request_cost(&msg), want, "...holds sixteen decoded");
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
        assert_eq!(most_parameters(&req.encode_to_vec()), 9);
        req.parameters = (0..=wisp_core::infer::MAX_PARAMETERS)
            .map(|i| (format!("p{i}"), param()))
            .collect();
        let n = most_parameters(&req.encode_to_vec());
        assert_eq!(n, wisp_core::infer::MAX_PARAMETERS + 1);
        assert!(wisp_core::infer::check_parameter_count(n, "the request").is_err());
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
            let _ = infer_request_cost(&msg[..cut]);
        }
        assert_eq!(infer_request_cost(&[0xff; 12]), 0);
        assert_eq!(infer_request_cost(&[]), 0);
    }
}
