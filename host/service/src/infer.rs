//! Inference, whatever the protocol: a front end decodes its wire format into [`Decoded`] for a
//! model it resolved with [`Service::model`], and [`Service::infer`] does the rest — validate
//! against the model's signature, the response cache, the scheduler, output selection and the
//! classification extension — then hands back an [`Answer`] for the front end to encode.
//!
//! This is the one place front-end failures are written into a model's statistics: a request
//! that fails to decode or validate counts as a failure with the time since it was received,
//! whichever protocol carried it.

use std::sync::Arc;
use std::time::Instant;

use wisp_core::config::ModelConfig;
use wisp_core::infer::{Scheduling, SequenceFlags};
use wisp_core::tensor::encode_bytes_elements;
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};
use wisp_scheduler::FailReason;

use super::shm::ShmRef;
use super::Service;
use crate::models::ModelVersion;
use bytes::Bytes;

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
    /// `parameters.shared_memory_region` …: write the output there instead of returning it.
    pub shm: Option<ShmRef>,
}

/// An input whose bytes are in a registered shared memory region (read by the service).
#[derive(Debug)]
pub struct ShmInput {
    /// Input name.
    pub name: String,
    /// Its datatype.
    pub datatype: DataType,
    /// Its full shape.
    pub shape: Vec<i64>,
    /// Where its bytes are.
    pub at: ShmRef,
}

/// A request as a front end decoded it, before validation.
#[derive(Debug)]
pub struct Decoded {
    /// The request for the scheduler.
    pub request: InferRequest,
    /// Requested outputs (empty: all, in config order).
    pub outputs: Vec<OutputSpec>,
    /// Request-level `binary_data_output` (or a raw binary request); HTTP only.
    pub binary_default: bool,
    /// Inputs to read from shared memory, added to the request by the service.
    pub shm_inputs: Vec<ShmInput>,
    /// Whose shared memory regions the request's inputs and outputs name (the client's
    /// token; the shared scope without one).
    pub shm_scope: super::shm::Scope,
}

/// What a request produced: the version that ran it and the tensors to return, in the order
/// the client asked for them (config order when it named none).
pub struct Answer {
    /// The model version that served the request.
    pub model: Arc<ModelVersion>,
    /// The request's id, echoed.
    pub id: String,
    /// Each requested output with the tensor to return (classification applied).
    pub outputs: Vec<(OutputSpec, Tensor)>,
    /// Request-level `binary_data_output`; HTTP only.
    pub binary_default: bool,
}

/// A request ready for the scheduler, with what its answer needs.
pub(super) struct Prepared {
    pub request: InferRequest,
    pub outputs: Vec<OutputSpec>,
    pub binary_default: bool,
    pub shm_scope: super::shm::Scope,
    /// Bytes read from shared memory, charged to the in-flight budget until the request ends.
    pub _shm_permit: Option<super::Charge>,
}

impl Service {
    /// The ready version of `model` that serves a request (`version`: `None` for the policy's
    /// latest).
    pub fn model(&self, model: &str, version: Option<&str>) -> Result<Arc<ModelVersion>> {
        self.registry.get(model, version)
    }

    /// Validates `decoded` against `m`'s signature, reads its scheduling parameters, runs it
    /// (through the response cache when the model enables it) and selects its outputs.
    /// `received` is when the front end got the request: decode and validation failures are
    /// recorded with the time since then. `trace_parent` is the client's W3C trace context
    /// (the `traceparent` header or metadata), if it sent one.
    pub async fn infer(
        &self,
        m: Arc<ModelVersion>,
        decoded: Result<Decoded>,
        received: Instant,
        trace_parent: Option<wisp_core::trace::TraceParent>,
    ) -> Result<Answer> {
        if m.config.decoupled() {
            m.stats()
                .record_failure(FailReason::Other, received.elapsed());
            return Err(Error::unsupported(format!(
                "model '{}' has a decoupled transaction policy: it answers on a stream (gRPC ModelStreamInfer, HTTP generate_stream)",
                m.name
            )));
        }
        let Prepared {
            request,
            outputs,
            binary_default,
            shm_scope,
            _shm_permit,
        } = self.prepare(&m, decoded, received, trace_parent).await?;
        let id = request.id.clone();
        let trace = request.trace.clone();
        let response = self.run(&m, request).await;
        if let Some(t) = trace {
            t.mark("REQUEST_END");
            self.trace.finish(&t);
        }
        let response = response?;
        let wanted = if outputs.is_empty() {
            produced_outputs(&m.config, &response)
        } else {
            outputs
        };
        let labels = |name: &str| m.labels.get(name).cloned();
        let tensors = select_outputs(response, &wanted, &m.config, &labels)?;
        let mut writes = Vec::new();
        for (spec, t) in wanted.iter().zip(&tensors) {
            if let Some(at) = &spec.shm {
                let what = || format!("output '{}'", spec.name);
                let w = self
                    .shm
                    .window(&shm_scope, at, t.data.len())
                    .map_err(|e| e.context(what()))?;
                writes.push((w, t.data.clone(), what()));
            }
        }
        if !writes.is_empty() {
            let total: usize = writes.iter().map(|(w, _, _)| w.len()).sum();
            let write_all = move || -> Result<()> {
                for (w, data, what) in &writes {
                    w.write(data).map_err(|e| e.context(what))?;
                }
                Ok(())
            };
            if total > super::shm::INLINE_COPY_BYTES {
                tokio::task::spawn_blocking(write_all)
                    .await
                    .map_err(|_| Error::internal("a shared memory write panicked"))??;
            } else {
                write_all()?;
            }
        }
        Ok(Answer {
            id,
            outputs: wanted.into_iter().zip(tensors).collect(),
            binary_default,
            model: m,
        })
    }

    /// Reads `decoded`'s shared memory inputs, validates it against `m`'s signature and reads
    /// its scheduling and sequence parameters and trace context. A failure is recorded in the
    /// model's statistics with the time since `received`.
    pub(super) async fn prepare(
        &self,
        m: &ModelVersion,
        decoded: Result<Decoded>,
        received: Instant,
        trace_parent: Option<wisp_core::trace::TraceParent>,
    ) -> Result<Prepared> {
        // Bytes read from shared memory count against the in-flight budget like a body's.
        let mut shm_permit = None;
        let decoded = match decoded {
            Ok(mut d) if !d.shm_inputs.is_empty() => self
                .read_shm_inputs(&mut d, &mut shm_permit)
                .await
                .map(|()| d),
            other => other,
        };
        let checked = decoded.and_then(|mut d| {
            wisp_core::infer::validate(&d.request, &m.signature)?;
            d.request.scheduling = Scheduling::from_parameters(&d.request.parameters)?;
            d.request.sequence = SequenceFlags::from_parameters(&d.request.parameters)?;
            d.request.trace = self
                .trace
                .sample(&m.name, m.version, &d.request.id, trace_parent);
            if let Some(t) = &d.request.trace {
                t.mark_ago("REQUEST_START", received.elapsed());
            }
            Ok(d)
        });
        match checked {
            Ok(d) => Ok(Prepared {
                request: d.request,
                outputs: d.outputs,
                binary_default: d.binary_default,
                shm_scope: d.shm_scope,
                _shm_permit: shm_permit,
            }),
            Err(e) => {
                m.stats()
                    .record_failure(FailReason::Other, received.elapsed());
                Err(e)
            }
        }
    }

    /// Reads the inputs `d` names in shared memory into its request: every region and window
    /// checked, then the bytes charged to the in-flight budget (the permit goes to `permit`),
    /// then copied, on the blocking pool when they are large.
    async fn read_shm_inputs(
        &self,
        d: &mut Decoded,
        permit: &mut Option<super::Charge>,
    ) -> Result<()> {
        let windows = d
            .shm_inputs
            .iter()
            .map(|s| {
                self.shm
                    .window(&d.shm_scope, &s.at, s.at.byte_size)
                    .map_err(|e| e.context(format!("input '{}'", s.name)))
            })
            .collect::<Result<Vec<_>>>()?;
        let total = windows
            .iter()
            .fold(0u64, |sum, w| sum.saturating_add(w.len() as u64));
        if total > 0 {
            *permit = Some(self.admit(total)?);
        }
        let names: Vec<String> = d.shm_inputs.iter().map(|s| s.name.clone()).collect();
        let read_all = move || -> Result<Vec<Bytes>> {
            windows
                .iter()
                .zip(&names)
                .map(|(w, name)| w.read().map_err(|e| e.context(format!("input '{name}'"))))
                .collect()
        };
        let data = if total > super::shm::INLINE_COPY_BYTES as u64 {
            tokio::task::spawn_blocking(read_all)
                .await
                .map_err(|_| Error::internal("a shared memory read panicked"))??
        } else {
            read_all()?
        };
        for (s, data) in std::mem::take(&mut d.shm_inputs).into_iter().zip(data) {
            let what = format!("input '{}'", s.name);
            let t = Tensor::new(s.name, s.datatype, s.shape, data)
                .map_err(|e| Error::invalid(format!("{what}: {}", e.message())))?;
            d.request.inputs.push(t);
        }
        Ok(())
    }

    /// Runs a validated request through the response cache (when the model enables it) and the
    /// model's scheduler. Without the cache the request moves to the scheduler uncopied.
    async fn run(&self, m: &ModelVersion, request: InferRequest) -> Result<InferResponse> {
        let started = Instant::now();
        let cache = self
            .cache
            .as_ref()
            .filter(|_| m.config.response_cache.as_ref().is_some_and(|c| c.enable));
        let Some(cache) = cache else {
            return m.infer(request).await;
        };
        let lookup = Instant::now();
        let key = crate::cache::key(&m.name, m.version, &request);
        if let Some(hit) = cache.get(key) {
            m.stats()
                .record_cache_hit(lookup.elapsed(), started.elapsed());
            return Ok((*hit).clone());
        }
        let miss = lookup.elapsed();
        let r = m.infer(request).await?;
        let insert = Instant::now();
        cache.insert(key, Arc::new(r.clone()));
        m.stats().cache_miss.add(miss + insert.elapsed());
        Ok(r)
    }
}

/// The classification extension: top-`n` of each batch row as `"<value>:<index>[:<label>]"`.
pub fn classify(t: &Tensor, n: usize, batched: bool, labels: Option<&[String]>) -> Result<Tensor> {
    let values = t.to_f64s().ok_or_else(|| {
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

/// The tensors to return, in `wanted` order, with the classification extension applied.
pub fn select_outputs(
    resp: InferResponse,
    wanted: &[OutputSpec],
    cfg: &ModelConfig,
    labels: &dyn Fn(&str) -> Option<std::sync::Arc<Vec<String>>>,
) -> Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(wanted.len());
    for spec in wanted {
        // Only a named output can be missing here: the others are picked from the response.
        let Some(t) = resp.outputs.iter().find(|t| t.name == spec.name) else {
            return Err(Error::invalid(format!(
                "model '{}' did not produce output '{}', which the request asked for",
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

/// What a request that names no outputs gets: every output `response` holds, in config order.
/// A model answers all its outputs, except a plugin that leaves one unset (and an ensemble
/// whose branch did not run), which the client simply does not get.
pub fn produced_outputs(cfg: &ModelConfig, response: &InferResponse) -> Vec<OutputSpec> {
    cfg.output
        .iter()
        .filter(|o| response.outputs.iter().any(|t| t.name == o.name))
        .map(|o| OutputSpec {
            name: o.name.clone(),
            ..Default::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::tensor::decode_bytes_elements;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn classification_top_k_with_labels() {
        let t = Tensor::new(
            "y",
            DataType::Fp32,
            vec![2, 3],
            f32_bytes(&[0.1, 0.7, 0.2, 0.5, 0.1, 0.4]).into(),
        )
        .unwrap();
        let labels = vec!["a".to_string(), "b".into(), "c".into()];
        let c = classify(&t, 2, true, Some(&labels)).unwrap();
        assert_eq!(c.shape, vec![2, 2]);
        let items: Vec<String> = decode_bytes_elements(&c.data)
            .unwrap()
            .iter()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect();
        assert_eq!(
            items,
            vec![
                "0.700000:1:b",
                "0.200000:2:c",
                "0.500000:0:a",
                "0.400000:2:c"
            ]
        );
        let c = classify(&t, 10, true, None).unwrap();
        assert_eq!(c.shape, vec![2, 3]);
    }

    /// A model that leaves an output unset (a plugin, an ensemble whose branch did not run):
    /// a request naming no outputs gets the others; one naming it gets a 400 that says so.
    #[test]
    fn an_unset_output_is_left_out_unless_it_was_named() {
        let cfg = wisp_core::config::parse_pbtxt(
            "m",
            r#"
            name: "m"
            backend: "wasm"
            output [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] },
                     { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]
            "#,
        )
        .unwrap();
        let b = Tensor::from_values("B", vec![1], &[2.0f32]).unwrap();
        let response = InferResponse::new(vec![b]);
        let wanted = produced_outputs(&cfg, &response);
        let names: Vec<&str> = wanted.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["B"]);
        let no_labels = |_: &str| None;
        let got = select_outputs(response.clone(), &wanted, &cfg, &no_labels).unwrap();
        assert_eq!(got[0].name, "B");
        let named = [OutputSpec {
            name: "A".into(),
            ..Default::default()
        }];
        let e = select_outputs(response, &named, &cfg, &no_labels).unwrap_err();
        assert_eq!(e.kind(), wisp_core::ErrorKind::InvalidArg);
        assert_eq!(
            e.message(),
            "model 'm' did not produce output 'A', which the request asked for"
        );
    }
}
