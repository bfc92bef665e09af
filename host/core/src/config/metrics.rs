//! Triton's `model_metrics` (24.12): per-model options of metric families. The one family
//! Triton lets a model customise is the time-to-first-response histogram of a decoupled
//! model, `nv_inference_first_response_histogram_ms`; its buckets may be overridden:
//!
//! ```text
//! model_metrics { metric_control: [ {
//!   metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
//!   histogram_options: { buckets: [ 1, 2, 4, 8 ] } } ] }
//! ```
//!
//! A family Triton cannot customise is named in a warning at load, as Triton does, and
//! otherwise ignored; buckets are bounded in number and must be finite and strictly
//! increasing (Prometheus's rule), or the model is refused.

use super::ModelConfig;

/// The config field.
pub const FIELD: &str = "model_metrics";

/// The time-to-first-response histogram's family (milliseconds).
pub const FIRST_RESPONSE: &str = "nv_inference_first_response_histogram_ms";

/// Triton's default buckets for [`FIRST_RESPONSE`], in milliseconds.
pub const DEFAULT_BUCKETS: [f64; 4] = [100.0, 500.0, 2000.0, 5000.0];

/// The most buckets an override may list.
pub const MAX_BUCKETS: usize = 64;

/// The most `metric_control` entries a config may list.
pub const MAX_CONTROLS: usize = 64;

/// What a config's `model_metrics` says.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMetrics {
    /// The first-response histogram's bucket bounds (ms), Triton's defaults unless overridden.
    pub first_response_buckets: Vec<f64>,
    /// Families named that cannot be customised (warned about at load, as Triton does).
    pub ignored_families: Vec<String>,
}

/// Reads `model_metrics` from `cfg`.
pub fn read(cfg: &ModelConfig) -> Result<ModelMetrics, String> {
    let mut out = ModelMetrics {
        first_response_buckets: DEFAULT_BUCKETS.to_vec(),
        ignored_families: Vec::new(),
    };
    let Some(field) = cfg.other.get(FIELD) else {
        return Ok(out);
    };
    let controls = match field.get("metric_control") {
        None => return Ok(out),
        Some(serde_json::Value::Array(a)) => a.as_slice(),
        Some(one @ serde_json::Value::Object(_)) => std::slice::from_ref(one),
        Some(_) => return Err("'metric_control' must be a list".into()),
    };
    if controls.len() > MAX_CONTROLS {
        return Err(format!(
            "'metric_control' has {} entries, more than {MAX_CONTROLS}",
            controls.len()
        ));
    }
    for (n, c) in controls.iter().enumerate() {
        let family = c
            .get("metric_identifier")
            .and_then(|i| i.get("family"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        if family != FIRST_RESPONSE {
            out.ignored_families.push(family.to_string());
            continue;
        }
        let Some(buckets) = c.get("histogram_options").and_then(|h| h.get("buckets")) else {
            continue;
        };
        let list = match buckets {
            serde_json::Value::Array(a) => a.as_slice(),
            one => std::slice::from_ref(one),
        };
        if list.len() > MAX_BUCKETS {
            return Err(format!(
                "metric_control {n}: {} buckets, more than {MAX_BUCKETS}",
                list.len()
            ));
        }
        let mut bounds = Vec::with_capacity(list.len());
        for v in list {
            let b = v
                .as_f64()
                .or_else(|| v.as_str()?.parse().ok())
                .filter(|b: &f64| b.is_finite())
                .ok_or_else(|| format!("metric_control {n}: bucket {v} is not a finite number"))?;
            if bounds.last().is_some_and(|&last| b <= last) {
                return Err(format!(
                    "metric_control {n}: buckets must be strictly increasing, got {b} after {}",
                    bounds[bounds.len() - 1]
                ));
            }
            bounds.push(b);
        }
        out.first_response_buckets = bounds;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_pbtxt;

    fn read_text(extra: &str) -> Result<ModelMetrics, String> {
        let cfg = parse_pbtxt("m", &format!("backend: \"wasm\"\n{extra}")).unwrap();
        read(&cfg)
    }

    #[test]
    fn tritons_override_and_defaults() {
        assert_eq!(
            read_text("").unwrap().first_response_buckets,
            DEFAULT_BUCKETS
        );
        // Triton's QA override (L0_metrics): a negative and a zero bound are fine.
        let m = read_text(
            r#"model_metrics { metric_control: [ {
                 metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                 histogram_options: { buckets: [ -1, 0.0, 1, 2.5 ] } } ] }"#,
        )
        .unwrap();
        assert_eq!(m.first_response_buckets, [-1.0, 0.0, 1.0, 2.5]);
        assert!(m.ignored_families.is_empty());
    }

    #[test]
    fn another_family_is_ignored_and_named() {
        let m = read_text(
            r#"model_metrics { metric_control: [ {
                 metric_identifier: { family: "nv_inference_request_duration_us" }
                 histogram_options: { buckets: [ 1 ] } } ] }"#,
        )
        .unwrap();
        assert_eq!(m.first_response_buckets, DEFAULT_BUCKETS);
        assert_eq!(m.ignored_families, ["nv_inference_request_duration_us"]);
    }

    #[test]
    fn buckets_out_of_order_or_too_many_are_refused() {
        let control = |buckets: &str| {
            format!(
                r#"model_metrics {{ metric_control: [ {{
                     metric_identifier: {{ family: "{FIRST_RESPONSE}" }}
                     histogram_options: {{ buckets: [ {buckets} ] }} }} ] }}"#
            )
        };
        let e = read_text(&control("1, 1")).unwrap_err();
        assert!(e.contains("strictly increasing"), "{e}");
        let e = read_text(&control("5, 2")).unwrap_err();
        assert!(e.contains("got 2 after 5"), "{e}");
        let many: Vec<String> = (0..=MAX_BUCKETS).map(|n| n.to_string()).collect();
        let e = read_text(&control(&many.join(", "))).unwrap_err();
        assert!(e.contains("more than 64"), "{e}");
    }
}
