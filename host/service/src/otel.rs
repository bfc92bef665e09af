//! Triton's OpenTelemetry trace mode: finished traces become spans exported over OTLP/HTTP
//! (protobuf) by the OpenTelemetry SDK's batch span processor.
//!
//! Each traced request gives Triton's spans: a top-level `InferRequest` span, a span per model
//! (named after it, with the request, queue and end timestamps as events) and, under it, a
//! `compute` span with the compute timestamps. An ensemble's steps are model spans under the
//! ensemble's. Every model span carries `triton.model_name`, `triton.model_version`,
//! `triton.trace_id`, `triton.trace_parent_id` and `triton.request_id`. A request that carried a
//! W3C `traceparent` is exported under the client's span, in the client's trace.
//!
//! The collector's address and the batching come only from the command line
//! (`--trace-config opentelemetry,url=…`), never from the network.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use opentelemetry::trace::{
    Span, SpanBuilder, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use wisp_core::trace::Trace;

/// Triton's default collector address.
pub const DEFAULT_URL: &str = "http://localhost:4318/v1/traces";

/// The largest batch-processor queue or batch accepted (spans kept in memory at most).
const MAX_QUEUE: usize = 1 << 20;
/// The longest export delay accepted, in milliseconds.
const MAX_DELAY_MS: u64 = 3_600_000;
/// How long one export may take before it is abandoned.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest collector answer read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The `--trace-config opentelemetry,KEY=VALUE` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP traces endpoint.
    pub url: String,
    /// Resource attributes (`resource=KEY=VALUE`, repeatable); `service.name` defaults to `wisp`.
    pub resource: Vec<(String, String)>,
    /// `bsp_max_queue_size` (`None`: the SDK's default, or `OTEL_BSP_MAX_QUEUE_SIZE`).
    pub max_queue_size: Option<usize>,
    /// `bsp_schedule_delay`, in milliseconds.
    pub schedule_delay_ms: Option<u64>,
    /// `bsp_max_export_batch_size`.
    pub max_export_batch_size: Option<usize>,
}

impl Default for OtelConfig {
    fn default() -> Self {
        OtelConfig {
            url: DEFAULT_URL.into(),
            resource: Vec::new(),
            max_queue_size: None,
            schedule_delay_ms: None,
            max_export_batch_size: None,
        }
    }
}

impl OtelConfig {
    /// Applies one `opentelemetry,KEY=VALUE` item.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let bounded = |max: u64| -> Result<u64, String> {
            match value.trim().parse::<u64>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(format!("{key} must be an integer from 1 to {max}")),
            }
        };
        match key {
            "url" => {
                let uri: hyper::Uri = value
                    .parse()
                    .map_err(|e| format!("url '{value}' is not a URL: {e}"))?;
                if uri.scheme_str() != Some("http") || uri.host().is_none() {
                    return Err(format!(
                        "url '{value}' must be an http:// address of an OTLP/HTTP collector"
                    ));
                }
                self.url = value.to_string();
            }
            "resource" => {
                let (k, v) = value
                    .split_once('=')
                    .filter(|(k, _)| !k.is_empty())
                    .ok_or_else(|| format!("resource '{value}' must be KEY=VALUE"))?;
                self.resource.retain(|(old, _)| old != k);
                self.resource.push((k.to_string(), v.to_string()));
            }
            "bsp_max_queue_size" => self.max_queue_size = Some(bounded(MAX_QUEUE as u64)? as usize),
            "bsp_schedule_delay" => self.schedule_delay_ms = Some(bounded(MAX_DELAY_MS)?),
            "bsp_max_export_batch_size" => {
                self.max_export_batch_size = Some(bounded(MAX_QUEUE as u64)? as usize)
            }
            other => return Err(format!("unknown opentelemetry setting '{other}'")),
        }
        Ok(())
    }
}

/// Sends the exporter's requests on the server's Tokio runtime: the batch processor exports
/// from a thread of its own, which has no runtime to drive a connection.
#[derive(Debug)]
struct RuntimeClient {
    runtime: tokio::runtime::Handle,
    client: Client<HttpConnector, Full<Bytes>>,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RuntimeClient {
    async fn send_bytes(
        &self,
        request: hyper::http::Request<Bytes>,
    ) -> Result<hyper::http::Response<Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let (parts, body) = request.into_parts();
        let request = hyper::http::Request::from_parts(parts, Full::new(body));
        let exchange = async move {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(hyper::http::Response::from_parts(parts, body))
        };
        // the timer is made inside the runtime: this thread has none
        let sent = self
            .runtime
            .spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, exchange).await });
        match sent.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err("the OTLP collector did not answer in time".into()),
            Err(e) => Err(Box::new(e)),
        }
    }
}

/// The OpenTelemetry pipeline: a tracer whose spans go to the collector in batches.
pub struct Exporter {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    /// Starts exporting to `config.url`; requests are sent on `runtime`.
    pub fn start(config: &OtelConfig, runtime: tokio::runtime::Handle) -> Result<Exporter, String> {
        let client = RuntimeClient {
            runtime,
            client: Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(HttpConnector::new()),
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(config.url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("OpenTelemetry exporter for {}: {e}", config.url))?;
        let mut batch = BatchConfigBuilder::default();
        if let Some(n) = config.max_queue_size {
            batch = batch.with_max_queue_size(n);
        }
        if let Some(ms) = config.schedule_delay_ms {
            batch = batch.with_scheduled_delay(Duration::from_millis(ms));
        }
        if let Some(n) = config.max_export_batch_size {
            batch = batch.with_max_export_batch_size(n);
        }
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch.build())
            .build();
        let mut resource = Resource::builder_empty().with_service_name("wisp");
        for (k, v) in &config.resource {
            resource = resource.with_attribute(KeyValue::new(k.clone(), v.clone()));
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.build())
            // which requests are traced is decided before the spans are made
            .with_sampler(Sampler::AlwaysOn)
            .build();
        let tracer = provider.tracer("wisp");
        Ok(Exporter { provider, tracer })
    }

    /// Turns a finished trace (and its ensemble steps) into spans for the batch processor.
    fn spans(&self, trace: &Arc<Trace>) {
        let parent = match trace.remote_parent {
            Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from_bytes(p.trace_id),
                SpanId::from_bytes(p.span_id),
                TraceFlags::new(p.flags),
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let events = trace.events();
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return;
        };
        let mut top = self.tracer.build_with_context(
            SpanBuilder::from_name("InferRequest")
                .with_kind(SpanKind::Server)
                .with_start_time(at(first.1)),
            &parent,
        );
        let under_top = Context::new().with_remote_span_context(top.span_context().clone());
        self.model_span(trace, &under_top);
        top.end_with_timestamp(at(last.1));
    }

    /// The model span of `trace` under `parent`, its compute span, and its steps' spans.
    fn model_span(&self, trace: &Arc<Trace>, parent: &Context) {
        let events = trace.events();
        let (Some(&(_, first)), Some(&(_, last))) = (events.first(), events.last()) else {
            return;
        };
        let mut attributes = vec![
            KeyValue::new("triton.model_name", trace.model.clone()),
            KeyValue::new("triton.model_version", trace.version as i64),
            KeyValue::new("triton.trace_id", trace.id as i64),
        ];
        if let Some(p) = trace.parent_id {
            attributes.push(KeyValue::new("triton.trace_parent_id", p as i64));
        }
        if !trace.request_id.is_empty() {
            attributes.push(KeyValue::new("triton.request_id", trace.request_id.clone()));
        }
        let mut span = self.tracer.build_with_context(
            SpanBuilder::from_name(trace.model.clone())
                .with_start_time(at(first))
                .with_attributes(attributes),
            parent,
        );
        let children = trace.children();
        // an ensemble computes nothing itself: its steps have the compute spans (as Triton's)
        let (compute, own): (Vec<_>, Vec<_>) = events
            .into_iter()
            .partition(|(name, _)| children.is_empty() && name.starts_with("COMPUTE_"));
        for (name, ns) in own {
            span.add_event_with_timestamp(name, at(ns), Vec::new());
        }
        let under = Context::new().with_remote_span_context(span.span_context().clone());
        if let (Some(start), Some(end)) = (compute.first(), compute.last()) {
            let mut c = self.tracer.build_with_context(
                SpanBuilder::from_name("compute").with_start_time(at(start.1)),
                &under,
            );
            for (name, ns) in &compute {
                c.add_event_with_timestamp(*name, at(*ns), Vec::new());
            }
            c.end_with_timestamp(at(end.1));
        }
        for child in children {
            self.model_span(&child, &under);
        }
        span.end_with_timestamp(at(last));
    }
}

impl crate::trace::TraceExport for Exporter {
    fn export(&self, trace: &Arc<Trace>) {
        self.spans(trace);
    }

    /// Exports what the batch processor holds and waits for it.
    fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "OpenTelemetry export failed");
        }
    }

    /// Exports what is left and stops the batch processor.
    fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "OpenTelemetry shutdown");
        }
    }
}

/// The time `ns` nanoseconds after the Unix epoch.
fn at(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        let mut c = OtelConfig::default();
        c.set("url", "http://127.0.0.1:4318/v1/traces").unwrap();
        assert_eq!(c.url, "http://127.0.0.1:4318/v1/traces");
        assert!(c.set("url", "file:///etc/passwd").is_err());
        assert!(c.set("url", "not a url").is_err());
        c.set("resource", "service.name=edge").unwrap();
        c.set("resource", "service.name=edge2").unwrap();
        assert_eq!(c.resource, vec![("service.name".into(), "edge2".into())]);
        assert!(c.set("resource", "novalue").is_err());
        c.set("bsp_schedule_delay", "100").unwrap();
        assert_eq!(c.schedule_delay_ms, Some(100));
        for (k, v) in [
            ("bsp_schedule_delay", "0"),
            ("bsp_max_queue_size", "99999999999"),
            ("bsp_max_export_batch_size", "-1"),
            ("colour", "blue"),
        ] {
            assert!(c.set(k, v).is_err(), "{k}={v}");
        }
    }
}
