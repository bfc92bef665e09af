//! `ModelInfer` and `ModelStreamInfer`: a decoded request through the service, and the
//! stream with its bounded in-flight window, per-stream sequences and decoupled models'
//! responses.

use super::*;

/// A request admitted to the in-flight budget, its model resolved and its message decoded.
pub(super) struct Admitted {
    budget: crate::service::Charge,
    model: Arc<crate::models::ModelVersion>,
    decoded: Result<Decoded, Error>,
    received: std::time::Instant,
}

/// Charges `req` to the in-flight budget (unless the codec did: `charged`), resolves its model
/// and decodes it.
pub(super) fn admit(
    service: &Service,
    mut req: pb::ModelInferRequest,
    scope: &Scope,
    charged: Option<crate::service::Charge>,
) -> Result<Admitted, Error> {
    let received = std::time::Instant::now();
    // Raw contents are sliced from the message without copies; typed contents are held as
    // decoded (a packed varint of one byte is eight in an int64 vector) and converted into a
    // second buffer of their element size.
    let size: u64 = req
        .raw_input_contents
        .iter()
        .map(|r| r.len() as u64)
        .sum::<u64>()
        + req
            .inputs
            .iter()
            .filter_map(|t| t.contents.as_ref())
            .map(|c| 2 * decoded_bytes(c))
            .sum::<u64>();
    // Charged by the codec before decoding when the call came through the front end; charged
    // here when the service trait is called directly.
    let budget = match charged {
        Some(charge) => charge,
        None => service.admit(size)?,
    };
    let version = (!req.model_version.is_empty()).then(|| std::mem::take(&mut req.model_version));
    let model = service.model(&req.model_name, version.as_deref())?;
    let decoded = decode(req).map(|mut d| {
        d.shm_scope = scope.clone();
        d
    });
    Ok(Admitted {
        budget,
        model,
        decoded,
        received,
    })
}

/// A message for the stream's client, with the in-flight budget its memory is charged to
/// until the stream hands it to the connection.
pub(super) type Outbound = (
    Result<pb::ModelStreamInferResponse, Status>,
    Option<crate::service::Charge>,
);

/// One request, one response: refused for a decoupled model, as Triton's `ModelInfer` does.
pub(super) async fn infer(
    service: &Service,
    a: Admitted,
    trace_parent: Option<TraceParent>,
) -> Result<pb::ModelInferResponse, Error> {
    let _budget = a.budget;
    if a.model.config.decoupled() {
        return Err(Error::unsupported(
            "ModelInfer RPC doesn't support models with decoupled transaction policy",
        ));
    }
    let answer = service
        .infer(a.model, a.decoded, a.received, trace_parent)
        .await?;
    Ok(encode(answer))
}

/// An answer as a `ModelInferResponse`.
fn encode(answer: crate::service::Answer) -> pb::ModelInferResponse {
    let mut resp = pb::ModelInferResponse {
        model_name: answer.model.name.clone(),
        model_version: answer.model.version.to_string(),
        id: answer.id,
        ..Default::default()
    };
    for (spec, t) in answer.outputs {
        let mut parameters = HashMap::new();
        let data = match &spec.shm {
            // written into the region by the service; an empty entry keeps the raw list aligned
            Some(at) => {
                let param = |c| pb::InferParameter {
                    parameter_choice: Some(c),
                };
                use pb::infer_parameter::ParameterChoice as C;
                parameters.insert(
                    "shared_memory_region".to_string(),
                    param(C::StringParam(at.region.clone())),
                );
                parameters.insert(
                    "shared_memory_byte_size".to_string(),
                    param(C::Int64Param(t.data.len() as i64)),
                );
                if at.offset > 0 {
                    parameters.insert(
                        "shared_memory_offset".to_string(),
                        param(C::Int64Param(at.offset as i64)),
                    );
                }
                Bytes::new()
            }
            None => t.data,
        };
        resp.outputs
            .push(pb::model_infer_response::InferOutputTensor {
                name: t.name,
                datatype: t.datatype.as_str().to_string(),
                shape: t.shape,
                parameters,
                ..Default::default()
            });
        resp.raw_output_contents.push(data);
    }
    resp
}

/// Streams a decoupled model's responses to one request onto the call's stream, each carrying
/// the echoed sequence flags and `triton_final_response`. The final flag alone (after the
/// last response) is sent only when the request set `triton_enable_empty_final_response`, as
/// Triton does.
///
/// A message the client has not made room for within `write_timeout` cancels the request:
/// its parts are dropped (the model's next send fails at once) and its budget released.
async fn stream_decoupled(
    service: &Service,
    a: Admitted,
    trace_parent: Option<TraceParent>,
    request: StreamedRequest,
    tx: &tokio::sync::mpsc::Sender<Outbound>,
    write_timeout: std::time::Duration,
) {
    let empty_final = request.empty_final;
    let (name, version) = (a.model.name.clone(), a.model.version.to_string());
    let _budget = a.budget;
    let (parts_tx, mut parts) = tokio::sync::mpsc::channel(crate::service::stream::STREAM_BUFFER);
    let run = service.infer_stream(a.model, a.decoded, a.received, trace_parent, parts_tx);
    let forward = async {
        while let Some(part) = parts.recv().await {
            let mut msg = match part.answer {
                Some(Ok(answer)) => pb::ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(encode(answer)),
                },
                Some(Err(e)) => pb::ModelStreamInferResponse {
                    error_message: e.message().to_string(),
                    infer_response: Some(pb::ModelInferResponse {
                        model_name: name.clone(),
                        model_version: version.clone(),
                        ..Default::default()
                    }),
                },
                None if empty_final => pb::ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(pb::ModelInferResponse {
                        model_name: name.clone(),
                        model_version: version.clone(),
                        ..Default::default()
                    }),
                },
                None => break,
            };
            request.stamp(&mut msg, part.last);
            let sent = tokio::time::timeout(write_timeout, tx.send((Ok(msg), part.held))).await;
            if !matches!(sent, Ok(Ok(()))) || part.last {
                break;
            }
        }
        // Dropping the receiver tells a model still sending that the client has gone.
        drop(parts);
    };
    tokio::join!(run, forward);
}

fn bool_param(b: bool) -> pb::InferParameter {
    pb::InferParameter {
        parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(b)),
    }
}

/// What a stream's responses to one request repeat from it.
pub(super) struct StreamedRequest {
    /// Its id.
    id: String,
    /// Its sequence flags, echoed so that a client running several sequences on one stream can
    /// tell their responses apart.
    echoed: Vec<(String, pb::InferParameter)>,
    /// `triton_enable_empty_final_response`: send the final flag alone when the model's last
    /// response did not carry it.
    empty_final: bool,
}

impl StreamedRequest {
    pub(super) fn of(req: &pb::ModelInferRequest) -> Self {
        let echoed = ["sequence_id", "sequence_start", "sequence_end"]
            .into_iter()
            .filter_map(|k| req.parameters.get(k).map(|p| (k.to_string(), p.clone())))
            .collect();
        let empty_final = matches!(
            req.parameters
                .get(super::request::ENABLE_EMPTY_FINAL)
                .and_then(|p| p.parameter_choice.as_ref()),
            Some(pb::infer_parameter::ParameterChoice::BoolParam(true))
        );
        StreamedRequest {
            id: req.id.clone(),
            echoed,
            empty_final,
        }
    }

    /// `msg` as one of this request's responses: its id if it has none, the echoed flags and
    /// `triton_final_response`.
    fn stamp(&self, msg: &mut pb::ModelStreamInferResponse, last: bool) {
        let r = msg.infer_response.get_or_insert_with(Default::default);
        if r.id.is_empty() {
            r.id = self.id.clone();
        }
        r.parameters.extend(self.echoed.iter().cloned());
        r.parameters
            .insert("triton_final_response".to_string(), bool_param(last));
    }
}

/// Sequences of one stream whose last request is remembered for ordering, before finished ones
/// are forgotten.
pub(super) const STREAM_SEQUENCES_KEPT: usize = 256;

/// A `ModelStreamInfer` message that failed to decode: tonic's status, except that a message
/// over `--grpc-max-message-size` is RESOURCE_EXHAUSTED.
pub(super) fn stream_decode_status(e: Status) -> Status {
    if e.code() == tonic::Code::OutOfRange && is_oversize(e.message().as_bytes()) {
        Status::resource_exhausted(e.message().to_string())
    } else {
        e
    }
}

/// Whether an OUT_OF_RANGE message from tonic is its "message length too large" decode error
/// (in a `grpc-message` header it is percent-encoded).
pub(super) fn is_oversize(message: &[u8]) -> bool {
    message.windows(9).any(|w| w == b"too large")
        || message.windows(11).any(|w| w == b"too%20large")
}

pub(super) async fn model_infer(
    svc: &GrpcService,
    r: Request<pb::ModelInferRequest>,
) -> Result<Response<pb::ModelInferResponse>, Status> {
    let parent = trace_parent(r.metadata());
    let scope = shm_scope(r.metadata()).map_err(status)?;
    let admitted =
        admit(&svc.service, r.into_inner(), &scope, codec::take_charge()).map_err(status)?;
    infer(&svc.service, admitted, parent)
        .await
        .map(Response::new)
        .map_err(status)
}

pub(super) async fn model_stream_infer(
    svc: &GrpcService,
    r: Request<Streaming<pb::ModelInferRequest>>,
) -> Result<Response<ResponseStream>, Status> {
    // a stream's requests are traced under the context the stream was opened with
    let stream_parent = trace_parent(r.metadata());
    let scope = shm_scope(r.metadata()).map_err(status)?;
    let slots = r.extensions().get::<crate::conn::DecoupledSlots>().cloned();
    let mut inbound = r.into_inner();
    let service = svc.service.clone();
    let write_timeout = svc.stream_write_timeout;
    let (tx, rx) = tokio::sync::mpsc::channel::<Outbound>(64);
    // At most this many requests of the stream are in flight, counting responses the client
    // has not read yet: past it the next message is not read, so a client that does not read
    // its responses is slowed down by HTTP/2 flow control instead of buffered without limit.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(svc.stream_in_flight));
    // Messages are decoded in this task as it reads them: under its own budget slot.
    let slot = codec::CallBudget::new(service.budget());
    tokio::spawn(codec::CALL.scope(slot, async move {
        // The requests of one sequence reach the model in stream order: each waits for the
        // one before it (a sequence runs one request at a time anyway).
        let mut sequences: HashMap<String, tokio::sync::oneshot::Receiver<()>> = HashMap::new();
        loop {
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                break;
            };
            let Some(next) = inbound.next().await else {
                break;
            };
            let (req, charged) = match next {
                Ok(req) => (req, codec::take_charge()),
                Err(e) => {
                    // The stream ends with the decode error, an oversize message reported
                    // as RESOURCE_EXHAUSTED as for unary calls.
                    let _ = tx.send((Err(stream_decode_status(e)), None)).await;
                    break;
                }
            };
            let (service, tx) = (service.clone(), tx.clone());
            let (done, after) = match req.parameters.get("sequence_id") {
                Some(p) => {
                    if sequences.len() >= STREAM_SEQUENCES_KEPT {
                        sequences.retain(|_, rx| {
                            rx.try_recv().is_err_and(|e| {
                                e == tokio::sync::oneshot::error::TryRecvError::Empty
                            })
                        });
                    }
                    let (done, next) = tokio::sync::oneshot::channel();
                    (
                        Some(done),
                        sequences.insert(param_to_json(p).to_string(), next),
                    )
                }
                None => (None, None),
            };
            let (scope, slots) = (scope.clone(), slots.clone());
            tokio::spawn(async move {
                let _permit = permit;
                if let Some(previous) = after {
                    let _ = previous.await;
                }
                let _done = done;
                let request = StreamedRequest::of(&req);
                let admitted = match admit(&service, req, &scope, charged) {
                    Ok(a) if a.model.config.decoupled() => {
                        // It holds one of its connection's slots until it ends.
                        match slots.as_ref().map(|s| s.take()).transpose() {
                            Ok(_slot) => {
                                stream_decoupled(
                                    &service,
                                    a,
                                    stream_parent,
                                    request,
                                    &tx,
                                    write_timeout,
                                )
                                .await;
                                return;
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Ok(a) => infer(&service, a, stream_parent).await,
                    Err(e) => Err(e),
                };
                // The response is charged to the budget while it waits for the client; when
                // the budget cannot hold it, the client gets the refusal in its place.
                let held = admitted.as_ref().ok().map(|resp| {
                    let bytes = resp
                        .raw_output_contents
                        .iter()
                        .map(|b| b.len() as u64)
                        .sum();
                    service.admit(bytes)
                });
                let (admitted, held) = match held {
                    Some(Err(e)) => (Err(e), None),
                    Some(Ok(charge)) => (admitted, Some(charge)),
                    None => (admitted, None),
                };
                let mut msg = match admitted {
                    Ok(resp) => pb::ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(resp),
                    },
                    Err(e) => pb::ModelStreamInferResponse {
                        error_message: e.message().to_string(),
                        infer_response: None,
                    },
                };
                request.stamp(&mut msg, true);
                let _ = tokio::time::timeout(write_timeout, tx.send((Ok(msg), held))).await;
            });
        }
    }));
    // A message's charge is released as tonic takes it to encode for the connection.
    Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        |(m, _)| m,
    ))))
}
