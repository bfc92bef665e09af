//! The plugin host's `models` and `responses` imports tested at their seams, with no wasm: a
//! [`State`] as an instance's store holds it, a fake [`ModelCaller`] for the models a plugin
//! calls and a fake [`ResponseSink`] for a streaming client. What a guest can send through
//! either import, and what it is told back, is checked here without compiling a plugin.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::WasiCtx;
use wisp_core::config::{normalize, parse_pbtxt, Signature};
use wisp_core::infer::{ResponseSink, StreamedResponse, MAX_CALL_DEPTH};
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};

use crate::host::{wit, State, Stream};
use crate::models::to_wit_error;
use crate::ModelCaller;

/// One call the fake caller received.
#[derive(Debug)]
struct Call {
    model: String,
    version: Option<String>,
    requests: Vec<InferRequest>,
}

/// A fake of the server's models: answers each request with its inputs renamed `OUT`, or
/// fails the call as a whole, or drops its last answer.
#[derive(Default)]
struct FakeModels {
    calls: Mutex<Vec<Call>>,
    fail_call: Option<Error>,
    drop_last: bool,
}

impl ModelCaller for FakeModels {
    fn check(&self, _: &str, _: Option<&str>) -> Result<()> {
        Ok(())
    }

    fn infer(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
        deadline: Instant,
    ) -> Result<InferResponse> {
        self.infer_batch(model, version, vec![request], deadline)?
            .remove(0)
    }

    fn infer_batch(
        &self,
        model: &str,
        version: Option<&str>,
        requests: Vec<InferRequest>,
        _deadline: Instant,
    ) -> Result<Vec<Result<InferResponse>>> {
        let mut answers: Vec<Result<InferResponse>> = requests
            .iter()
            .map(|r| {
                let t = &r.inputs[0];
                Ok(InferResponse::new(vec![Tensor::new(
                    "OUT",
                    t.datatype,
                    t.shape.clone(),
                    t.data.clone(),
                )?]))
            })
            .collect();
        self.calls.lock().unwrap().push(Call {
            model: model.into(),
            version: version.map(str::to_string),
            requests,
        });
        if let Some(e) = &self.fail_call {
            return Err(e.clone());
        }
        if self.drop_last {
            answers.pop();
        }
        Ok(answers)
    }
}

/// A fake client stream: keeps what it is sent; `closed` says whether the client has gone.
#[derive(Debug, Default)]
struct FakeStream {
    sent: Mutex<Vec<StreamedResponse>>,
    closed: std::sync::atomic::AtomicBool,
}

impl ResponseSink for FakeStream {
    fn send(&self, part: StreamedResponse, _deadline: Instant) -> Result<()> {
        self.sent.lock().unwrap().push(part);
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The signature of a batching model with one FP32 output `y` of dims `[2]`.
fn signature() -> Arc<Signature> {
    let mut c = parse_pbtxt(
        "plug",
        r#"
        backend: "wasm"
        max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
        "#,
    )
    .unwrap();
    normalize(&mut c, "plug", std::path::Path::new("/nonexistent"));
    Arc::new(Signature::of(&c).unwrap())
}

/// The store of an instance of model `plug`, mid-`execute`, as `instance.rs` builds it.
fn state(caller: Option<Arc<dyn ModelCaller>>) -> State {
    State {
        wasi: WasiCtx::builder().build(),
        table: ResourceTable::new(),
        limits: crate::limits::Limiter {
            memory_bytes: 1 << 20,
        },
        model: "plug".into(),
        caller,
        deadline: Instant::now() + Duration::from_secs(30),
        trace: None,
        call_path: vec!["front".into(), "plug".into()],
        signature: Some(signature()),
        decoupled: false,
        streams: Vec::new(),
    }
}

fn tensor(name: &str, shape: Vec<i64>) -> wit::TensorResult {
    let n: i64 = shape.iter().product();
    wit::TensorResult {
        name: name.into(),
        datatype: wit::Datatype::Fp32,
        shape,
        data: vec![0; 4 * n.max(0) as usize],
    }
}

fn request(id: &str, shape: Vec<i64>) -> wit::RequestResult {
    wit::RequestResult {
        id: id.into(),
        inputs: vec![tensor("IN", shape)],
        requested_outputs: Vec::new(),
        parameters: Vec::new(),
    }
}

mod models {
    use super::*;

    #[test]
    fn a_host_without_models_says_so() {
        let e = state(None)
            .call_model("other", None, vec![request("a", vec![1])])
            .unwrap_err();
        assert!(matches!(e.code, wit::ErrorCode::Unsupported), "{e:?}");
        assert!(e.message.contains("serves no models"), "{}", e.message);
    }

    #[test]
    fn a_model_on_the_call_path_is_refused_naming_the_path() {
        let fake = Arc::new(FakeModels::default());
        let mut s = state(Some(fake.clone()));
        for model in ["plug", "front"] {
            let e = s
                .call_model(model, None, vec![request("a", vec![1])])
                .unwrap_err();
            assert!(matches!(e.code, wit::ErrorCode::InvalidArgument));
            assert!(e.message.contains("front → plug"), "{model}: {}", e.message);
        }
        assert!(
            fake.calls.lock().unwrap().is_empty(),
            "nothing reached a model"
        );
    }

    #[test]
    fn calls_nested_too_deep_or_past_the_deadline_are_refused() {
        let fake = Arc::new(FakeModels::default());
        let mut deep = state(Some(fake.clone()));
        deep.call_path = (0..MAX_CALL_DEPTH)
            .map(|n| format!("m{n}").into())
            .collect();
        let e = deep
            .call_model("other", None, vec![request("a", vec![1])])
            .unwrap_err();
        assert!(e.message.contains("deep"), "{}", e.message);

        let mut late = state(Some(fake.clone()));
        late.deadline = Instant::now() - Duration::from_millis(1);
        let e = late
            .call_model("other", None, vec![request("a", vec![1])])
            .unwrap_err();
        assert!(matches!(e.code, wit::ErrorCode::Unavailable), "{e:?}");
        assert!(e.message.contains("deadline"), "{}", e.message);
        assert!(fake.calls.lock().unwrap().is_empty());
    }

    /// A request that does not convert fails alone; the rest reach the model in one batch, in
    /// order, carrying the version, typed parameters and the call path.
    #[test]
    fn a_bad_request_fails_alone_and_the_rest_go_as_one_batch() {
        let fake = Arc::new(FakeModels::default());
        let mut s = state(Some(fake.clone()));
        let mut first = request("a", vec![1, 2]);
        first.parameters = vec![
            wit::ParamResult {
                key: "b".into(),
                value: wit::ParamValueResult::Bool(true),
            },
            wit::ParamResult {
                key: "i".into(),
                value: wit::ParamValueResult::Int(-3),
            },
            wit::ParamResult {
                key: "d".into(),
                value: wit::ParamValueResult::Double(0.5),
            },
            wit::ParamResult {
                key: "nan".into(),
                value: wit::ParamValueResult::Double(f64::NAN),
            },
            wit::ParamResult {
                key: "t".into(),
                value: wit::ParamValueResult::Text("x".into()),
            },
        ];
        let negative = request("b", vec![-1, 2]);
        let mut short = request("c", vec![3]);
        short.inputs[0].data.truncate(4);
        let last = request("d", vec![2]);
        let out = s
            .call_model("other", Some(7), vec![first, negative, short, last])
            .unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].as_ref().unwrap().outputs[0].shape, [1, 2]);
        let e = out[1].as_ref().unwrap_err();
        assert!(matches!(e.code, wit::ErrorCode::InvalidArgument));
        assert!(e.message.contains("negative dimension -1"), "{}", e.message);
        assert!(
            out[2].is_err(),
            "a tensor shorter than its shape fails alone"
        );
        assert_eq!(out[3].as_ref().unwrap().outputs[0].shape, [2]);

        let calls = fake.calls.lock().unwrap();
        assert_eq!(calls.len(), 1, "one batch");
        let call = &calls[0];
        assert_eq!(call.model, "other");
        assert_eq!(call.version.as_deref(), Some("7"));
        let ids: Vec<&str> = call.requests.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "d"]);
        let p = &call.requests[0].parameters;
        assert_eq!(p["b"], serde_json::json!(true));
        assert_eq!(p["i"], serde_json::json!(-3));
        assert_eq!(p["d"], serde_json::json!(0.5));
        assert_eq!(p["nan"], serde_json::Value::Null);
        assert_eq!(p["t"], serde_json::json!("x"));
        let path: Vec<&str> = call.requests[0].call_path.iter().map(|m| &**m).collect();
        assert_eq!(path, ["front", "plug"]);
        assert_eq!(call.requests[0].inputs[0].datatype, DataType::Fp32);
    }

    #[test]
    fn a_failed_call_names_the_model_and_keeps_its_code() {
        let fake = Arc::new(FakeModels {
            fail_call: Some(Error::not_found("version 9 is not found")),
            ..Default::default()
        });
        let e = state(Some(fake))
            .call_model("other", Some(9), vec![request("a", vec![1])])
            .unwrap_err();
        assert!(matches!(e.code, wit::ErrorCode::NotFound), "{e:?}");
        assert!(e.message.contains("model 'other'"), "{}", e.message);
        assert!(e.message.contains("version 9"), "{}", e.message);
    }

    #[test]
    fn fewer_answers_than_requests_is_an_internal_error_for_the_unanswered() {
        let fake = Arc::new(FakeModels {
            drop_last: true,
            ..Default::default()
        });
        let out = state(Some(fake))
            .call_model(
                "other",
                None,
                vec![request("a", vec![1]), request("b", vec![1])],
            )
            .unwrap();
        assert!(out[0].is_ok());
        let e = out[1].as_ref().unwrap_err();
        assert!(matches!(e.code, wit::ErrorCode::Internal), "{e:?}");
        assert!(e.message.contains("fewer results"), "{}", e.message);
    }

    #[test]
    fn error_kinds_map_to_the_codes_the_front_ends_would_answer() {
        for (e, code) in [
            (Error::invalid("x"), wit::ErrorCode::InvalidArgument),
            (Error::not_found("x"), wit::ErrorCode::NotFound),
            (Error::unsupported("x"), wit::ErrorCode::Unsupported),
            (Error::unavailable("x"), wit::ErrorCode::Unavailable),
            (Error::internal("x"), wit::ErrorCode::Internal),
        ] {
            let w = to_wit_error(&e);
            assert_eq!(
                std::mem::discriminant(&w.code),
                std::mem::discriminant(&code),
                "{e:?}"
            );
            assert_eq!(w.message, "x");
        }
    }
}

mod responses {
    use super::*;

    /// A decoupled store executing two requests of 1 row each: the first from a streaming
    /// client, the second from one that takes a single response.
    fn streaming() -> (State, Arc<FakeStream>) {
        let sink = Arc::new(FakeStream::default());
        let mut s = state(None);
        s.decoupled = true;
        s.streams = vec![
            Stream {
                sink: Some(sink.clone()),
                rows: 1,
                finished: false,
            },
            Stream {
                sink: None,
                rows: 1,
                finished: false,
            },
        ];
        (s, sink)
    }

    fn answer(name: &str, shape: Vec<i64>) -> wit::Response {
        wit::Response {
            outputs: vec![tensor(name, shape)],
        }
    }

    #[test]
    fn a_model_that_is_not_decoupled_is_told_how_to_become_one() {
        let (mut s, sink) = streaming();
        s.decoupled = false;
        let e = s
            .send_response(0, Some(Ok(answer("y", vec![1, 2]))), false)
            .unwrap_err();
        assert!(e.message().contains("decoupled: true"), "{}", e.message());
        assert!(sink.sent.lock().unwrap().is_empty());
    }

    #[test]
    fn responses_reach_the_stream_in_order_and_end_with_the_final_flag() {
        let (mut s, sink) = streaming();
        s.send_response(0, Some(Ok(answer("y", vec![1, 2]))), false)
            .unwrap();
        s.send_response(
            0,
            Some(Err(wit::Error {
                code: wit::ErrorCode::InvalidArgument,
                message: "bad frame".into(),
            })),
            false,
        )
        .unwrap();
        s.send_response(0, None, true).unwrap();
        let e = s.send_response(0, None, true).unwrap_err();
        assert!(e.message().contains("sent already"), "{}", e.message());

        let sent = sink.sent.lock().unwrap();
        assert_eq!(sent.len(), 3);
        let first = sent[0].response.as_ref().unwrap().as_ref().unwrap();
        assert_eq!(first.outputs[0].name, "y");
        let second = sent[1].response.as_ref().unwrap().as_ref().unwrap_err();
        assert_eq!(second.kind(), wisp_core::ErrorKind::InvalidArg);
        assert_eq!(second.message(), "bad frame");
        assert!(sent[2].response.is_none() && sent[2].last);
        assert!(!sent[0].last && !sent[1].last);
    }

    #[test]
    fn what_a_guest_may_not_send_is_refused_by_name() {
        let (mut s, sink) = streaming();
        for (request, response, last, needle) in [
            (
                5,
                Some(Ok(answer("y", vec![1, 2]))),
                false,
                "not in the batch",
            ),
            (
                1,
                Some(Ok(answer("y", vec![1, 2]))),
                false,
                "takes one response",
            ),
            (0, None, false, "only when it is final"),
            (
                0,
                Some(Ok(answer("z", vec![1, 2]))),
                false,
                "does not declare",
            ),
            (0, Some(Ok(answer("y", vec![2, 2]))), false, "shape [2, 2]"),
            (0, Some(Ok(answer("y", vec![1, 3]))), false, "[1] + [2]"),
        ] {
            let e = s.send_response(request, response, last).unwrap_err();
            assert!(e.message().contains(needle), "{needle}: {}", e.message());
        }
        let mut twice = answer("y", vec![1, 2]);
        twice.outputs.push(tensor("y", vec![1, 2]));
        let e = s.send_response(0, Some(Ok(twice)), false).unwrap_err();
        assert!(e.message().contains("twice"), "{}", e.message());
        let mut int = answer("y", vec![1, 2]);
        int.outputs[0].datatype = wit::Datatype::Int32;
        let e = s.send_response(0, Some(Ok(int)), false).unwrap_err();
        assert!(e.message().contains("as INT32"), "{}", e.message());
        assert!(
            sink.sent.lock().unwrap().is_empty(),
            "nothing refused was sent"
        );
        // The stream is still open for a good response after all that.
        s.send_response(0, Some(Ok(answer("y", vec![1, 2]))), true)
            .unwrap();
        assert_eq!(sink.sent.lock().unwrap().len(), 1);
    }

    #[test]
    fn cancellation_is_the_clients_stream_closing() {
        use crate::host::v3::wisp::plugin0_3_0::responses::Host as _;
        let (mut s, sink) = streaming();
        assert!(!s.is_cancelled(0).unwrap());
        sink.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(s.is_cancelled(0).unwrap());
        assert!(!s.is_cancelled(1).unwrap(), "no stream: nothing to cancel");
        assert!(!s.is_cancelled(9).unwrap(), "not in the batch");
    }
}
