//! `pool`: a sentence embedding from a transformer's token embeddings, as sentence-transformers'
//! `Pooling` and `Normalize` modules compute it.
//!
//! Inputs `token_embeddings` (FP32 `[batch, length, hidden]`) and `attention_mask` (INT64
//! `[batch, length]`) → output `EMBEDDING` (FP32 `[batch, hidden]`).
//!
//! Parameters:
//! - `pooling`: `mean` (default: the average over the tokens the mask keeps), `cls` (the first
//!   token) or `max` (the element-wise maximum over kept tokens);
//! - `normalize`: `true` (default: scale each embedding to unit L2 length) or `false`.

use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// How token embeddings become one vector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pooling {
    Mean,
    Cls,
    Max,
}

/// The plugin: its settings.
pub struct Pool {
    pooling: Pooling,
    normalize: bool,
}

impl Pool {
    /// Pools `tokens` (`rows × length × hidden`, row-major) under `mask` (`rows × length`).
    pub fn pool(&self, tokens: &[f32], mask: &[i64], rows: usize, hidden: usize) -> Vec<f32> {
        let length = mask.len().checked_div(rows).unwrap_or(0);
        let mut out = vec![0f32; rows * hidden];
        for (r, embedding) in out.chunks_exact_mut(hidden.max(1)).enumerate().take(rows) {
            let row_mask = &mask[r * length..(r + 1) * length];
            let token =
                |t: usize| &tokens[(r * length + t) * hidden..(r * length + t + 1) * hidden];
            match self.pooling {
                Pooling::Cls if length > 0 => embedding.copy_from_slice(token(0)),
                Pooling::Cls => {}
                Pooling::Mean => {
                    let mut kept = 0f32;
                    for t in (0..length).filter(|&t| row_mask[t] != 0) {
                        kept += 1.0;
                        for (e, v) in embedding.iter_mut().zip(token(t)) {
                            *e += v;
                        }
                    }
                    // As sentence-transformers: the count clamped at 1e-9, so an all-padding
                    // row pools to zeros rather than NaN.
                    let count = kept.max(1e-9);
                    embedding.iter_mut().for_each(|e| *e /= count);
                }
                Pooling::Max => {
                    let mut any = false;
                    for t in (0..length).filter(|&t| row_mask[t] != 0) {
                        for (e, &v) in embedding.iter_mut().zip(token(t)) {
                            *e = if any { e.max(v) } else { v };
                        }
                        any = true;
                    }
                }
            }
            if self.normalize {
                let norm = embedding
                    .iter()
                    .map(|v| v * v)
                    .sum::<f32>()
                    .sqrt()
                    .max(1e-12);
                embedding.iter_mut().for_each(|e| *e /= norm);
            }
        }
        out
    }
}

impl Plugin for Pool {
    fn init(params: &Params) -> Result<Self, Error> {
        let pooling = match params.get("pooling").map(str::trim) {
            None | Some("") | Some("mean") => Pooling::Mean,
            Some("cls") => Pooling::Cls,
            Some("max") => Pooling::Max,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "parameter 'pooling' is mean, cls or max, not '{other}'"
                )))
            }
        };
        Ok(Pool {
            pooling,
            normalize: params.parse_or("normalize", true)?,
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let tokens = request.input("token_embeddings")?;
        let mask = request.input("attention_mask")?;
        let [rows, length, hidden] = tokens.shape[..] else {
            return Err(Error::invalid(format!(
                "token_embeddings must be [batch, length, hidden], not {:?}",
                tokens.shape
            )));
        };
        if rows < 0 || length < 0 || hidden < 0 {
            return Err(Error::invalid(format!(
                "token_embeddings has a negative dimension: {:?}",
                tokens.shape
            )));
        }
        if mask.shape != [rows, length] {
            return Err(Error::invalid(format!(
                "attention_mask is {:?}, token_embeddings {:?}: the mask must be [batch, length]",
                mask.shape, tokens.shape
            )));
        }
        let (values, mask_values) = (tokens.to_f32()?, mask.to_i64()?);
        let (rows, hidden) = (rows as usize, hidden as usize);
        // The SDK checked data against shape; an inconsistent tensor still must not index out.
        let expected = mask_values.len().checked_mul(hidden);
        if expected != Some(values.len())
            || Some(mask_values.len()) != rows.checked_mul(length as usize)
        {
            return Err(Error::invalid(
                "token_embeddings and attention_mask disagree in size",
            ));
        }
        let pooled = self.pool(&values, &mask_values, rows, hidden);
        Ok(Response::new(vec![Tensor::from_f32(
            "EMBEDDING",
            vec![rows as i64, hidden as i64],
            &pooled,
        )]))
    }
}

wisp_sdk::export_plugin!(Pool);

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(pooling: Pooling, normalize: bool) -> Pool {
        Pool { pooling, normalize }
    }

    // Two rows of three tokens of two values; the second row's last token is padding.
    const TOKENS: [f32; 12] = [1., 2., 3., 4., 5., 6., 10., 0., 20., 0., 99., 99.];
    const MASK: [i64; 6] = [1, 1, 1, 1, 1, 0];

    #[test]
    fn mean_skips_padding() {
        let out = pool(Pooling::Mean, false).pool(&TOKENS, &MASK, 2, 2);
        assert_eq!(out, vec![3., 4., 15., 0.]);
    }

    #[test]
    fn normalizes_to_unit_length() {
        let out = pool(Pooling::Mean, true).pool(&TOKENS, &MASK, 2, 2);
        assert!((out[0] - 0.6).abs() < 1e-6 && (out[1] - 0.8).abs() < 1e-6);
        assert_eq!(&out[2..], &[1., 0.]);
    }

    #[test]
    fn cls_and_max() {
        assert_eq!(
            pool(Pooling::Cls, false).pool(&TOKENS, &MASK, 2, 2),
            vec![1., 2., 10., 0.]
        );
        assert_eq!(
            pool(Pooling::Max, false).pool(&TOKENS, &MASK, 2, 2),
            vec![5., 6., 20., 0.]
        );
    }

    #[test]
    fn all_padding_pools_to_zeros() {
        let out = pool(Pooling::Mean, true).pool(&[1., 1.], &[0], 1, 2);
        assert_eq!(out, vec![0., 0.]);
    }

    #[test]
    fn execute_checks_shapes() {
        let mut p = pool(Pooling::Mean, true);
        let ok = Request::new(vec![
            Tensor::from_f32("token_embeddings", vec![2, 3, 2], &TOKENS),
            Tensor::from_i64("attention_mask", vec![2, 3], &MASK),
        ]);
        let out = p.execute(&ok).unwrap();
        assert_eq!(out.output("EMBEDDING").unwrap().shape, vec![2, 2]);
        let bad = Request::new(vec![
            Tensor::from_f32("token_embeddings", vec![2, 3, 2], &TOKENS),
            Tensor::from_i64("attention_mask", vec![3, 2], &MASK),
        ]);
        let e = p.execute(&bad).unwrap_err();
        assert!(e.to_string().contains("attention_mask"), "{e}");
        let flat = Request::new(vec![
            Tensor::from_f32("token_embeddings", vec![6, 2], &TOKENS),
            Tensor::from_i64("attention_mask", vec![6], &MASK),
        ]);
        assert!(p.execute(&flat).is_err());
    }

    #[test]
    fn rejects_unknown_pooling() {
        let e = Pool::init(&Params::from_pairs(&[("pooling", "median")]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("pooling"), "{e}");
    }
}
