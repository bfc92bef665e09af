//! `magika-labels`: the Magika model's scores (and the file itself) in, a content-type label out.
//!
//! Inputs `CONTENT` (BYTES, the file) and `SCORES` (FP32, `[n, 214]`) → outputs `LABEL` (BYTES,
//! e.g. `python`) and `SCORE` (FP32, the model's top score). Reproduces Magika 1.0's
//! high-confidence output: empty files are `empty`; files too small for the model (fewer than
//! `min_file_size_for_dl` bytes, also after stripping whitespace) are `txt` when valid UTF-8,
//! else `unknown`; otherwise the top label goes through the `overwrite_map`, and when its score
//! is below its threshold (per-label, else `medium_confidence_threshold`) it becomes `txt` or
//! `unknown` by whether the content type is text.
//!
//! The model's config and the content-types knowledge base are read at `init` from
//! `config_dir` (default `/data`, which the model config grants read-only with
//! `wasm.allow_read_dir`): `config.min.json` and `content_types_kb.min.json`.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// What the label mapping needs from Magika's config files.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Labels in model output order.
    pub labels: Vec<String>,
    /// Per-label high-confidence thresholds.
    pub thresholds: HashMap<String, f32>,
    /// The default threshold.
    pub medium: f32,
    /// Label replacements.
    pub overwrite: HashMap<String, String>,
    /// Content types that are text.
    pub text: HashSet<String>,
    /// Smallest file the model sees.
    pub min_size: usize,
    /// Bytes read from each end.
    pub block_size: usize,
}

fn field<'a>(v: &'a Value, key: &str) -> Result<&'a Value, Error> {
    v.get(key)
        .ok_or_else(|| Error::invalid(format!("config.min.json has no '{key}'")))
}

impl Config {
    /// Parses `config.min.json` and `content_types_kb.min.json`.
    pub fn parse(config: &str, kb: &str) -> Result<Config, Error> {
        let c: Value = serde_json::from_str(config)
            .map_err(|e| Error::invalid(format!("config.min.json: {e}")))?;
        let kb: Value = serde_json::from_str(kb)
            .map_err(|e| Error::invalid(format!("content_types_kb.min.json: {e}")))?;
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        };
        let map = |v: &Value| -> HashMap<String, Value> {
            v.as_object()
                .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default()
        };
        Ok(Config {
            labels: strings(field(&c, "target_labels_space")?),
            thresholds: map(field(&c, "thresholds")?)
                .into_iter()
                .filter_map(|(k, v)| v.as_f64().map(|f| (k, f as f32)))
                .collect(),
            medium: field(&c, "medium_confidence_threshold")?
                .as_f64()
                .unwrap_or(0.5) as f32,
            overwrite: map(field(&c, "overwrite_map")?)
                .into_iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k, s.to_string())))
                .collect(),
            text: map(&kb)
                .into_iter()
                .filter(|(_, v)| v.get("is_text").and_then(Value::as_bool) == Some(true))
                .map(|(k, _)| k)
                .collect(),
            min_size: field(&c, "min_file_size_for_dl")?.as_u64().unwrap_or(8) as usize,
            block_size: field(&c, "block_size")?.as_u64().unwrap_or(4096) as usize,
        })
    }

    fn few_bytes(content: &[u8]) -> &'static str {
        if std::str::from_utf8(content).is_ok() {
            "txt"
        } else {
            "unknown"
        }
    }

    /// The label of one file given its model scores.
    pub fn label(&self, content: &[u8], scores: &[f32]) -> (String, f32) {
        if content.is_empty() {
            return ("empty".into(), 1.0);
        }
        if content.len() < self.min_size {
            return (Self::few_bytes(content).into(), 1.0);
        }
        let head = &content[..content.len().min(self.block_size)];
        let meaningful = head
            .iter()
            .skip_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c))
            .count();
        if meaningful < self.min_size {
            return (Self::few_bytes(head).into(), 1.0);
        }
        let (best, score) =
            scores
                .iter()
                .copied()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |a, (i, s)| if s > a.1 { (i, s) } else { a },
                );
        let dl = self
            .labels
            .get(best)
            .cloned()
            .unwrap_or_else(|| "unknown".into());
        let out = self
            .overwrite
            .get(&dl)
            .cloned()
            .unwrap_or_else(|| dl.clone());
        let threshold = self.thresholds.get(&dl).copied().unwrap_or(self.medium);
        if score >= threshold {
            (out, score)
        } else if self.text.contains(&out) {
            ("txt".into(), score)
        } else {
            ("unknown".into(), score)
        }
    }
}

/// The plugin.
pub struct MagikaLabels {
    config: Config,
}

impl Plugin for MagikaLabels {
    fn init(params: &Params) -> Result<Self, Error> {
        let dir = params.get("config_dir").unwrap_or("/data");
        let read = |name: &str| {
            std::fs::read_to_string(format!("{dir}/{name}")).map_err(|e| {
                Error::invalid(format!(
                    "cannot read {dir}/{name} ({e}): grant the directory holding Magika's config with wasm.allow_read_dir"
                ))
            })
        };
        let config = Config::parse(
            &read("config.min.json")?,
            &read("content_types_kb.min.json")?,
        )?;
        Ok(MagikaLabels { config })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let content = request.input("CONTENT")?;
        let files = content.strings()?;
        let scores = request.input("SCORES")?;
        let classes = self.config.labels.len();
        let values = scores.to_f32()?;
        if values.len() != files.len() * classes {
            return Err(Error::invalid(format!(
                "SCORES has {} values for {} files of {classes} classes",
                values.len(),
                files.len()
            )));
        }
        let (labels, top): (Vec<String>, Vec<f32>) = files
            .iter()
            .zip(values.chunks(classes))
            .map(|(f, s)| self.config.label(f, s))
            .unzip();
        let shape = content.shape.clone();
        Ok(Response::new(vec![
            Tensor::from_strings("LABEL", shape.clone(), &labels),
            Tensor::from_f32("SCORE", shape, &top),
        ]))
    }
}

wisp_sdk::export_plugin!(MagikaLabels);

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::parse(
            r#"{"target_labels_space": ["python", "markdown", "randomtxt", "png"],
                "thresholds": {"markdown": 0.75}, "medium_confidence_threshold": 0.5,
                "overwrite_map": {"randomtxt": "txt"}, "min_file_size_for_dl": 8,
                "block_size": 4096}"#,
            r#"{"python": {"is_text": true}, "markdown": {"is_text": true},
                "png": {"is_text": false}, "txt": {"is_text": true}}"#,
        )
        .unwrap()
    }

    #[test]
    fn follows_magikas_rules() {
        let c = config();
        let file = b"import os\nprint(os.name)\n";
        assert_eq!(c.label(file, &[0.9, 0.05, 0.03, 0.02]).0, "python");
        // Below its own threshold a text type becomes txt, a binary one unknown.
        assert_eq!(c.label(file, &[0.1, 0.7, 0.1, 0.1]).0, "txt");
        assert_eq!(c.label(file, &[0.1, 0.1, 0.1, 0.4]).0, "unknown");
        assert_eq!(c.label(file, &[0.0, 0.0, 0.9, 0.1]).0, "txt");
        assert_eq!(c.label(b"", &[]).0, "empty");
        assert_eq!(c.label(b"hi", &[]).0, "txt");
        assert_eq!(c.label(&[0xff, 0xfe], &[]).0, "unknown");
        assert_eq!(c.label(b"          ab", &[1.0, 0.0, 0.0, 0.0]).0, "txt");
    }

    #[test]
    fn names_a_missing_grant() {
        let e = MagikaLabels::init(&Params::from_pairs(&[("config_dir", "/nonexistent")]))
            .err()
            .unwrap();
        assert!(e.message.contains("wasm.allow_read_dir"), "{}", e.message);
    }
}
