//! `wisp quantize MODEL_DIR --calibration DIR`: an INT8 version of an ONNX model that has
//! earned its place.
//!
//! 1. The calibration directory's request bodies (KServe v2 JSON, as clients send them) are
//!    decoded against the model's signature, with the server's own decoder and bounds; every
//!    fifth is held out.
//! 2. ONNX Runtime's quantizer (`candidates.py`, run with a Python that has `onnxruntime`)
//!    makes one candidate per format: static QDQ with unsigned or signed activations and
//!    per-tensor or per-channel weights, calibrated on the other bodies, and dynamic INT8.
//! 3. Each candidate is judged by Wisp's own gate ([`wisp_models::gate`]) on this host and
//!    engine: a scratch repository serves the float version as version 1 and the candidates
//!    beside it, with the model's `gate.*` bounds (or, when it declares none, a cosine of 0.99
//!    and no slower than the float version), the held-out bodies as its `model_warmup`.
//! 4. The table is printed; the passing candidate with the lowest compute time is written as
//!    the new version (through a temporary name, so a polling server never sees half a file).
//!    When none passes, nothing is written and the command fails.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::Arc;

use anyhow::{bail, ensure, Context};
use wisp_backend_onnx::{find_onnxruntime, EngineChoice, OnnxBackend};
use wisp_core::config::params::{BASELINE_KEY, MAX_LATENCY_RATIO_KEY, MIN_COSINE_KEY};
use wisp_core::config::{self, ModelWarmup, Signature, WarmupInput};
use wisp_core::repository::{self, ModelDir};
use wisp_core::{DataType, Tensor};
use wisp_models::{LoadOptions, Registry};

use crate::settings::QuantizeArgs;

/// The candidate-making script, run with the user's Python.
const CANDIDATES_PY: &str = include_str!("candidates.py");
/// Most request bodies read from the calibration directory.
const MAX_BODIES: usize = 1000;
/// Largest request body read.
const MAX_BODY_BYTES: u64 = 64 << 20;
/// Most held-out samples (batch items) the gate runs.
const MAX_HELD_OUT: usize = 64;

/// One request body's inputs.
type Inputs = Vec<Tensor>;

/// Runs `wisp quantize`.
pub fn run(args: &QuantizeArgs) -> anyhow::Result<()> {
    let dir = model_dir(&args.model_dir)?;
    let backend = Arc::new(engine(args)?);
    let engine_name = backend.engine();
    let spec = wisp_models::prepare_config(&dir, backend.as_ref(), true)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let cfg = &spec.config;
    ensure!(
        cfg.is_onnx(),
        "{} is not an ONNX model (platform '{}')",
        dir.name,
        cfg.platform
    );
    let versions = repository::versions(&dir.path);
    let from = match args.from {
        Some(v) => {
            ensure!(
                versions.contains(&v),
                "there is no version {v} in {}",
                dir.path.display()
            );
            v
        }
        None => *versions
            .last()
            .with_context(|| format!("no version directory in {}", dir.path.display()))?,
    };
    let highest = versions.last().copied().unwrap_or(0);
    let version = args.version.unwrap_or(highest + 1);
    ensure!(
        version >= 1 && !dir.path.join(version.to_string()).exists(),
        "version {version} exists already in {}: name another with --version",
        dir.path.display()
    );
    let float = wisp_models::model_file(&dir.path, from, cfg);
    let bodies = read_bodies(&args.calibration, &spec.signature)?;
    let (calibration, held_out) = split(bodies);
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let candidates = make_candidates(args, &float, &calibration, scratch.path())?;
    ensure!(
        candidates.iter().any(|c| c.file.is_some()),
        "ONNX Runtime's quantizer made no candidate: {}",
        candidates
            .iter()
            .map(|c| format!("{}: {}", c.format, c.error.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let judged = judge(
        &dir,
        &spec,
        &float,
        &candidates,
        &held_out,
        backend,
        scratch.path(),
    )?;
    print_table(&judged, engine_name);
    let best = judged
        .iter()
        .filter(|j| j.report.as_ref().is_some_and(|r| r.passed()))
        .min_by(|a, b| {
            let ratio = |j: &Judged| j.report.as_ref().map_or(f64::MAX, |r| r.latency_ratio());
            ratio(a).total_cmp(&ratio(b))
        });
    let Some(best) = best else {
        bail!("no INT8 format passed the gate against version {from}; nothing was written");
    };
    let file = best.file.as_ref().expect("a judged candidate has a file");
    write_version(&dir.path, version, &cfg.default_model_filename, file)?;
    println!(
        "wrote {}/{version}/{} ({}, judged against version {from})",
        dir.path.display(),
        cfg.default_model_filename,
        best.format
    );
    Ok(())
}

fn model_dir(path: &Path) -> anyhow::Result<ModelDir> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    ensure!(meta.is_dir(), "{} is not a model directory", path.display());
    let name = path
        .canonicalize()?
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .with_context(|| format!("{} has no model name", path.display()))?;
    Ok(ModelDir {
        name,
        path: path.to_path_buf(),
    })
}

fn engine(args: &QuantizeArgs) -> anyhow::Result<OnnxBackend> {
    let choice = EngineChoice::from(args.onnx_engine);
    let lib = match choice {
        EngineChoice::Tract => None,
        _ => find_onnxruntime(args.onnxruntime_lib.as_deref(), &wisp_core::env::ProcessEnv),
    };
    OnnxBackend::new(choice, lib).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The request bodies of `dir`, decoded for the model: regular `*.json` files only, in name
/// order, each within [`MAX_BODY_BYTES`], at most [`MAX_BODIES`].
fn read_bodies(dir: &Path, sig: &Signature) -> anyhow::Result<Vec<(String, Inputs)>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("--calibration: cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    ensure!(
        names.len() <= MAX_BODIES,
        "--calibration: {} holds {} request bodies; at most {MAX_BODIES} are read",
        dir.display(),
        names.len()
    );
    let budget = Arc::new(tokio::sync::Semaphore::new(
        tokio::sync::Semaphore::MAX_PERMITS,
    ));
    let mut out = Vec::new();
    for path in names {
        let shown = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let body = repository::read_regular(&path, MAX_BODY_BYTES)
            .with_context(|| format!("--calibration: {shown}"))?;
        let mut charge = wisp_service::Charge::new(&budget);
        let decoded = crate::http::codec::decode(body.into(), None, sig, &mut charge)
            .map_err(|e| anyhow::anyhow!("--calibration: {shown}: {e}"))?;
        wisp_core::infer::validate(&decoded.request, sig)
            .map_err(|e| anyhow::anyhow!("--calibration: {shown}: {e}"))?;
        if let Some(t) = decoded
            .request
            .inputs
            .iter()
            .find(|t| t.datatype == DataType::Bytes)
        {
            bail!(
                "--calibration: {shown}: input '{}' is BYTES; INT8 quantization needs numeric inputs",
                t.name
            );
        }
        out.push((shown, decoded.request.inputs));
    }
    ensure!(
        out.len() >= 2,
        "--calibration: {} needs at least two request bodies (one to calibrate, one to hold out), found {}",
        dir.display(),
        out.len()
    );
    Ok(out)
}

/// Every fifth body held out (the last one when there are fewer than five).
fn split(bodies: Vec<(String, Inputs)>) -> (Vec<Inputs>, Vec<(String, Inputs)>) {
    let n = bodies.len();
    let mut calibration = Vec::new();
    let mut held_out = Vec::new();
    for (i, b) in bodies.into_iter().enumerate() {
        if (n < 5 && i == n - 1) || (n >= 5 && i % 5 == 4) {
            held_out.push(b);
        } else {
            calibration.push(b.1);
        }
    }
    (calibration, held_out)
}

/// One format's candidate, as the quantizer reported it.
#[derive(Debug, serde::Deserialize)]
struct Candidate {
    format: String,
    file: Option<PathBuf>,
    error: Option<String>,
}

fn python(args: &QuantizeArgs) -> PathBuf {
    args.python
        .clone()
        .or_else(|| std::env::var_os("WISP_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Writes the calibration inputs and runs the quantizer: one candidate per format.
fn make_candidates(
    args: &QuantizeArgs,
    float: &Path,
    calibration: &[Inputs],
    scratch: &Path,
) -> anyhow::Result<Vec<Candidate>> {
    let data = scratch.join("calibration");
    std::fs::create_dir_all(&data)?;
    let mut requests = Vec::new();
    for (i, inputs) in calibration.iter().enumerate() {
        let mut listed = Vec::new();
        for (k, t) in inputs.iter().enumerate() {
            let file = format!("calibration/{i}-{k}.bin");
            std::fs::write(scratch.join(&file), &t.data)?;
            listed.push(serde_json::json!({
                "name": t.name, "datatype": t.datatype.to_string(), "shape": t.shape, "file": file,
            }));
        }
        requests.push(listed);
    }
    let manifest = scratch.join("manifest.json");
    std::fs::write(
        &manifest,
        serde_json::json!({ "calibration": requests }).to_string(),
    )?;
    let script = scratch.join("candidates.py");
    std::fs::write(&script, CANDIDATES_PY)?;
    let out = scratch.join("candidates");
    std::fs::create_dir_all(&out)?;
    let py = python(args);
    let check = Process::new(&py)
        .args(["-c", "import onnxruntime.quantization, onnx, numpy"])
        .output();
    ensure!(
        check.as_ref().is_ok_and(|o| o.status.success()),
        "{} cannot import ONNX Runtime's quantizer: run `{} -m pip install onnxruntime onnx numpy`, or name a Python that has it with --python",
        py.display(),
        py.display()
    );
    eprintln!(
        "wisp quantize: making INT8 candidates with ONNX Runtime's quantizer ({})",
        py.display()
    );
    let run = Process::new(&py)
        .arg(&script)
        .arg(float)
        .arg(&manifest)
        .arg(&out)
        .stderr(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", py.display()))?;
    ensure!(
        run.status.success(),
        "ONNX Runtime's quantizer failed ({})",
        run.status
    );
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).context("the quantizer's report"))
        .collect()
}

/// A candidate with what the gate measured (`None` when it could not be judged).
struct Judged {
    format: String,
    file: Option<PathBuf>,
    bytes: u64,
    report: Option<Arc<wisp_models::gate::Report>>,
    why: Option<String>,
}

/// Judges each candidate against the float version with the gate, in a scratch repository.
fn judge(
    dir: &ModelDir,
    spec: &config::ModelSpec,
    float: &Path,
    candidates: &[Candidate],
    held_out: &[(String, Inputs)],
    backend: Arc<OnnxBackend>,
    scratch: &Path,
) -> anyhow::Result<Vec<Judged>> {
    let (cfg, sig) = (&*spec.config, &*spec.signature);
    let root = scratch.join("repo");
    let model = root.join(&dir.name);
    let link_or_copy = |from: &Path, to: &Path| -> anyhow::Result<()> {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::hard_link(from, to)
            .or_else(|_| std::fs::copy(from, to).map(|_| ()))
            .with_context(|| format!("cannot copy {} for judging", from.display()))
    };
    link_or_copy(float, &model.join("1").join(&cfg.default_model_filename))?;
    let mut numbered = Vec::new();
    for (k, c) in candidates.iter().enumerate() {
        if let Some(file) = &c.file {
            let v = k as u64 + 2;
            link_or_copy(
                file,
                &model.join(v.to_string()).join(&cfg.default_model_filename),
            )?;
            numbered.push((v, c));
        }
    }
    let mut judging = cfg.clone();
    judging.model_warmup = held_out_samples(&model, sig, held_out)?;
    // Labels name classes in answers; the gate compares the numbers.
    judging
        .output
        .iter_mut()
        .for_each(|o| o.label_filename.clear());
    if judging.parameter_set(MIN_COSINE_KEY).is_none()
        && [
            wisp_core::config::params::MIN_TOP1_KEY,
            wisp_core::config::params::MAX_ABS_DIFF_KEY,
            MAX_LATENCY_RATIO_KEY,
        ]
        .iter()
        .all(|k| judging.parameter_set(k).is_none())
    {
        judging.set_parameter(MIN_COSINE_KEY, "0.99");
        judging.set_parameter(MAX_LATENCY_RATIO_KEY, "1");
    }
    judging.set_parameter(BASELINE_KEY, "1");
    judging.version_policy = Some(config::VersionPolicy {
        all: Some(Default::default()),
        ..Default::default()
    });
    let json = config::config_to_json(&judging).to_string();
    let opts = LoadOptions {
        autocomplete: true,
        threads: 1,
        observers: None,
        host_policies: Default::default(),
        verification: None,
        state_dir: None,
        rate_limiter: None,
    };
    let registry = Registry::new(vec![root], backend, opts);
    eprintln!(
        "wisp quantize: judging {} candidate(s) against version 1 on {} held-out sample(s)",
        numbered.len(),
        judging.model_warmup.len()
    );
    let loaded = registry.load(&dir.name, Some(&json));
    let outcomes = registry.gate_outcomes(&dir.name);
    let index = registry.index(false).unwrap_or_default();
    registry.shutdown();
    if outcomes.is_empty() {
        if let Err(e) = loaded {
            bail!("the float version could not be judged against: {e}");
        }
    }
    Ok(numbered
        .into_iter()
        .map(|(v, c)| {
            let report = outcomes
                .iter()
                .find(|o| o.version == v)
                .map(|o| o.report.clone());
            let why = match &report {
                Some(_) => None,
                None => index
                    .iter()
                    .find(|e| e.version == Some(v))
                    .map(|e| e.reason.clone())
                    .or_else(|| Some("not loaded".into())),
            };
            Judged {
                format: c.format.clone(),
                bytes: c
                    .file
                    .as_ref()
                    .and_then(|f| std::fs::metadata(f).ok())
                    .map_or(0, |m| m.len()),
                file: c.file.clone(),
                report,
                why,
            }
        })
        .collect())
}

/// The held-out bodies as `model_warmup` samples, one per batch item (a warm-up file holds one
/// item), at most [`MAX_HELD_OUT`], their data in the scratch model's `warmup/`.
fn held_out_samples(
    model: &Path,
    sig: &Signature,
    held_out: &[(String, Inputs)],
) -> anyhow::Result<Vec<ModelWarmup>> {
    let warmup = model.join("warmup");
    std::fs::create_dir_all(&warmup)?;
    let mut samples = Vec::new();
    for (i, (name, inputs)) in held_out.iter().enumerate() {
        let items = if sig.batches() {
            inputs
                .first()
                .and_then(|t| t.shape.first())
                .copied()
                .unwrap_or(1)
                .max(0) as usize
        } else {
            1
        };
        for item in 0..items {
            if samples.len() == MAX_HELD_OUT {
                return Ok(samples);
            }
            let mut sample = ModelWarmup {
                name: format!("{name}#{item}"),
                batch_size: 1,
                ..Default::default()
            };
            for (k, t) in inputs.iter().enumerate() {
                let (dims, data) = if sig.batches() {
                    let row = t.data.len() / items.max(1);
                    (t.shape[1..].to_vec(), &t.data[item * row..(item + 1) * row])
                } else {
                    (t.shape.clone(), &t.data[..])
                };
                let file = format!("h{i}-{item}-{k}.bin");
                std::fs::write(warmup.join(&file), data)?;
                sample.inputs.insert(
                    t.name.clone(),
                    WarmupInput {
                        data_type: Some(t.datatype),
                        dims,
                        input_data_file: Some(file),
                        ..Default::default()
                    },
                );
            }
            samples.push(sample);
        }
    }
    Ok(samples)
}

fn print_table(judged: &[Judged], engine: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "INT8 candidates on {engine}, against the float version:"
    );
    let _ = writeln!(
        out,
        "| format | MB | min cosine | top-1 | max abs diff | compute vs float | gate |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for j in judged {
        let mb = j.bytes as f64 / 1e6;
        match &j.report {
            Some(r) => {
                let verdict = if r.passed() {
                    "passed".to_string()
                } else {
                    format!("failed: {}", r.failures.join("; "))
                };
                let _ = writeln!(
                    out,
                    "| {} | {mb:.1} | {:.4} | {:.3} | {:.3e} | {:.2}× | {verdict} |",
                    j.format,
                    r.min_cosine,
                    r.top1,
                    r.max_abs_diff,
                    r.latency_ratio()
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "| {} | {mb:.1} | | | | | not judged: {} |",
                    j.format,
                    j.why.as_deref().unwrap_or("")
                );
            }
        }
    }
}

/// Writes `file` as `version` of the model, through a temporary name.
fn write_version(model: &Path, version: u64, filename: &str, file: &Path) -> anyhow::Result<()> {
    let tmp = model.join(format!(".{version}.wisp-quantize"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    std::fs::copy(file, tmp.join(filename))
        .with_context(|| format!("cannot write {}", tmp.join(filename).display()))?;
    std::fs::rename(&tmp, model.join(version.to_string()))
        .with_context(|| format!("cannot move {} into place", tmp.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(name: &str, batch: i64) -> (String, Inputs) {
        let values: Vec<f32> = (0..batch * 2).map(|v| v as f32).collect();
        let t = Tensor::from_values("X", vec![batch, 2], &values).unwrap();
        (name.to_string(), vec![t])
    }

    #[test]
    fn every_fifth_body_is_held_out_and_at_least_one() {
        let names =
            |held: &[(String, Inputs)]| held.iter().map(|b| b.0.clone()).collect::<Vec<_>>();
        let bodies: Vec<_> = (0..10).map(|i| body(&format!("{i}"), 1)).collect();
        let (calibration, held) = split(bodies);
        assert_eq!(
            (calibration.len(), names(&held)),
            (8, vec!["4".into(), "9".into()])
        );
        let (calibration, held) = split(vec![body("a", 1), body("b", 1)]);
        assert_eq!(
            (calibration.len(), names(&held)),
            (1, vec!["b".to_string()])
        );
    }

    #[test]
    fn a_held_out_batch_becomes_one_sample_per_item() {
        let cfg = config::parse_pbtxt(
            "m",
            r#"max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]"#,
        )
        .unwrap();
        let sig = Signature::of(&cfg).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let samples = held_out_samples(dir.path(), &sig, &[body("b.json", 3)]).unwrap();
        assert_eq!(samples.len(), 3);
        for (item, s) in samples.iter().enumerate() {
            assert_eq!(s.name, format!("b.json#{item}"));
            assert_eq!(s.batch_size, 1);
            let x = &s.inputs["X"];
            assert_eq!(x.dims, [2]);
            let file = dir
                .path()
                .join("warmup")
                .join(x.input_data_file.as_ref().unwrap());
            let want: Vec<u8> = [item as f32 * 2.0, item as f32 * 2.0 + 1.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            assert_eq!(std::fs::read(file).unwrap(), want);
        }
    }
}
