//! `model_warmup`: the samples Triton runs on every instance before a model is READY.

use std::path::Path;

use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::config::{self, ModelConfig, ModelWarmup, Signature};
use wisp_core::repository;
use wisp_core::tensor::encode_bytes_elements;
use wisp_core::{DataType, Error, InferRequest, Result, Tensor};

/// Runs every `model_warmup` sample `count` times (at least once) on every instance, as
/// Triton does before a model is READY. Any failure fails the load.
pub(super) fn warm_up(
    model_dir: &Path,
    cfg: &ModelConfig,
    sig: &Signature,
    instances: &mut [Box<dyn Instance>],
) -> Result<()> {
    for sample in &cfg.model_warmup {
        let req = warmup_request(model_dir, sig, sample)
            .map_err(|e| e.context(format!("warmup sample '{}'", sample.name)))?;
        for instance in instances.iter_mut() {
            for _ in 0..sample.count.max(1) {
                let mut t = ExecTiming::default();
                let mut out = instance.execute(std::slice::from_ref(&req), &mut t);
                match out.pop() {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        return Err(e.context(format!("warmup sample '{}' failed", sample.name)))
                    }
                    None => {
                        return Err(Error::internal(format!(
                            "warmup sample '{}': no response",
                            sample.name
                        )))
                    }
                }
            }
        }
        tracing::info!(model = %cfg.name, sample = %sample.name, "warmup done");
    }
    Ok(())
}

/// A tiny xorshift generator: random warm-up data needs no cryptographic quality.
fn pseudo_random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

pub(super) fn warmup_request(
    model_dir: &Path,
    sig: &Signature,
    sample: &ModelWarmup,
) -> Result<InferRequest> {
    let mut inputs = Vec::new();
    for (name, w) in &sample.inputs {
        let c = sig
            .input(name)
            .ok_or_else(|| Error::invalid(format!("'{name}' is not an input")))?;
        let dt = w.data_type.unwrap_or(c.datatype);
        let dims = if w.dims.is_empty() { &c.dims } else { &w.dims };
        if dims.iter().any(|&d| d < 0) {
            return Err(Error::invalid(format!(
                "input '{name}': warmup dims {dims:?} must be concrete"
            )));
        }
        let mut shape: Vec<i64> = if sig.batches() {
            vec![sample.batch_size.max(1) as i64]
        } else {
            Vec::new()
        };
        shape.extend(dims);
        let count = wisp_core::tensor::element_count(&shape)
            .map_err(|e| e.context(format!("input '{name}'")))?;
        let too_large = || {
            Error::invalid(format!(
                "input '{name}': warm-up data of shape {shape:?} is larger than {} bytes",
                config::bounds::MAX_WARMUP_BYTES
            ))
        };
        let elem_size = dt.size().unwrap_or(4);
        if count
            .checked_mul(elem_size)
            .is_none_or(|b| b as u64 > config::bounds::MAX_WARMUP_BYTES)
        {
            return Err(too_large());
        }
        let data: Vec<u8> = match (dt.size(), &w.input_data_file) {
            (_, Some(file)) => {
                let path = repository::confine(&model_dir.join("warmup"), file).map_err(|why| {
                    Error::invalid(format!("input '{name}': input_data_file {why}"))
                })?;
                let cannot_read = |e: std::io::Error| {
                    Error::invalid(format!(
                        "input '{name}': cannot read warmup/{file}: {}",
                        e.kind()
                    ))
                };
                // The file holds one batch item, repeated for the batch size. The bound is
                // checked on the file's size, before anything is read.
                let repeat = if sig.batches() {
                    sample.batch_size.max(1) as u64
                } else {
                    1
                };
                let len = std::fs::metadata(&path).map_err(cannot_read)?.len();
                if len
                    .checked_mul(repeat)
                    .is_none_or(|b| b > config::bounds::MAX_WARMUP_BYTES)
                {
                    return Err(too_large());
                }
                let mut row = Vec::with_capacity(len as usize);
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(
                        wisp_core::repository::open_regular(&path, len)
                            .map_err(cannot_read)?
                            .0,
                        len,
                    ),
                    &mut row,
                )
                .map_err(cannot_read)?;
                row.repeat(repeat as usize)
            }
            (None, None) => encode_bytes_elements(std::iter::repeat_n(&b""[..], count)),
            (Some(size), None) if w.random_data.is_some() => {
                let mut b = pseudo_random_bytes(count * size, 0x9E37_79B9_7F4A_7C15);
                if dt == DataType::Bool {
                    b.iter_mut().for_each(|x| *x &= 1);
                } else if matches!(
                    dt,
                    DataType::Fp16 | DataType::Fp32 | DataType::Fp64 | DataType::Bf16
                ) {
                    // random bytes may spell NaN/inf: use small floats instead
                    b = (0..count)
                        .flat_map(|i| {
                            let v = ((i * 37 % 101) as f64) / 101.0;
                            match dt {
                                DataType::Fp16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
                                DataType::Bf16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                                DataType::Fp32 => (v as f32).to_le_bytes().to_vec(),
                                _ => v.to_le_bytes().to_vec(),
                            }
                        })
                        .collect();
                }
                b
            }
            (Some(size), None) => vec![0u8; count * size],
        };
        inputs.push(Tensor::new(name.clone(), dt, shape, data.into())?);
    }
    Ok(InferRequest {
        id: format!("warmup:{}", sample.name),
        inputs,
        ..Default::default()
    })
}
