//! `vad-stream`: a decoupled plugin (`model_transaction_policy { decoupled: true }`) that
//! streams voice activity for a whole recording. One request carries the 16 kHz audio
//! (`AUDIO`, FP32 `[-1]`); the plugin runs it through the stateful `vad` model frame by frame
//! (one sequence per request, 512-sample frames with the 64 samples before each) and sends one
//! response per frame as soon as it has it: `FRAME` (INT64, the frame's index) and
//! `PROBABILITY` (FP32, the speech probability). The last frame is zero-padded. The final flag
//! follows the last frame; a request whose client has gone stops at the next frame (ending its
//! sequence so the `vad` model's slot is freed at once).
//!
//! Parameters: `model` (default `vad`), `frame` (samples per frame, default 512), `context`
//! (samples before each frame, default 64): the called model's input is `[1, frame+context]`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use wisp_sdk::models::Model;
use wisp_sdk::{Error, Param, ParamValue, Params, Plugin, Request, Response, Tensor};

/// The plugin: the VAD model it calls, its framing, and what makes its sequence IDs unique.
pub struct VadStream {
    model: Model,
    frame: usize,
    context: usize,
    /// Random per instance (wasi:random), so that two instances' sequences never collide.
    nonce: u64,
    next: u64,
}

impl Plugin for VadStream {
    fn init(params: &Params) -> Result<Self, Error> {
        let frame = params.parse_or("frame", 512usize)?;
        let context = params.parse_or("context", 64usize)?;
        if frame == 0 || frame > 1 << 16 || context > frame {
            return Err(Error::invalid(
                "parameters: 'frame' must be in 1..=65536 and 'context' at most 'frame'",
            ));
        }
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        Ok(VadStream {
            model: Model::new(params.get("model").unwrap_or("vad"))?,
            frame,
            context,
            nonce: h.finish(),
            next: 0,
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let audio = request.input("AUDIO")?.to_f32()?;
        let sender = request.response_sender();
        self.next += 1;
        let sequence = format!("vad-stream-{:016x}-{}", self.nonce, self.next);
        let frames = frames(&audio, self.frame, self.context);
        let count = frames.len();
        for (i, window) in frames.into_iter().enumerate() {
            let cancelled = sender.is_cancelled();
            let last = i + 1 == count || cancelled;
            let probability = self.probability(&sequence, window, i == 0, last)?;
            if cancelled {
                break;
            }
            sender.send(Response::new(vec![
                Tensor::from_i64("FRAME", vec![1], &[i as i64]),
                Tensor::from_f32("PROBABILITY", vec![1], &[probability]),
            ]))?;
        }
        // Empty: the final flag alone.
        Ok(Response::new(vec![]))
    }
}

impl VadStream {
    /// One frame through the model, as a step of `sequence`.
    fn probability(
        &self,
        sequence: &str,
        window: Vec<f32>,
        start: bool,
        end: bool,
    ) -> Result<f32, Error> {
        let n = window.len() as i64;
        let mut request = Request::new(vec![Tensor::from_f32(
            "audio_with_context",
            vec![1, n],
            &window,
        )]);
        request.parameters = vec![
            Param {
                key: "sequence_id".into(),
                value: ParamValue::Text(sequence.into()),
            },
            Param {
                key: "sequence_start".into(),
                value: ParamValue::Bool(start),
            },
            Param {
                key: "sequence_end".into(),
                value: ParamValue::Bool(end),
            },
        ];
        let response = self.model.infer(&request)?;
        let p = response
            .output("probability")
            .ok_or_else(|| Error::internal("the VAD model returned no 'probability'"))?
            .to_f32()?;
        p.first()
            .copied()
            .ok_or_else(|| Error::internal("the VAD model's 'probability' is empty"))
    }
}

/// The windows the model sees: each `frame` samples with the `context` before them (zeros
/// before the start), the last frame zero-padded.
pub fn frames(audio: &[f32], frame: usize, context: usize) -> Vec<Vec<f32>> {
    (0..audio.len().div_ceil(frame))
        .map(|i| {
            let start = i * frame;
            (0..frame + context)
                .map(|k| {
                    (start + k)
                        .checked_sub(context)
                        .and_then(|at| audio.get(at).copied())
                        .unwrap_or(0.0)
                })
                .collect()
        })
        .collect()
}

wisp_sdk::export_plugin!(VadStream);

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_sdk::testing;

    #[test]
    fn frames_carry_their_context_and_pad_the_last() {
        let audio: Vec<f32> = (1..=10).map(|v| v as f32).collect();
        let f = frames(&audio, 4, 2);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0], vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(f[1], vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        assert_eq!(f[2], vec![7.0, 8.0, 9.0, 10.0, 0.0, 0.0]);
        assert!(frames(&[], 4, 2).is_empty());
    }

    #[test]
    fn one_response_per_frame_then_the_final_flag() {
        testing::clear();
        testing::serve("vad", |r: &Request| {
            let x = r.input("audio_with_context")?.to_f32()?;
            let end = matches!(r.param("sequence_end"), Some(ParamValue::Bool(true)));
            let p = x.iter().sum::<f32>() + if end { 100.0 } else { 0.0 };
            Ok(Response::new(vec![Tensor::from_f32(
                "probability",
                vec![1],
                &[p],
            )]))
        });
        let params = Params::from_pairs(&[("frame", "2"), ("context", "1")]);
        let mut plugin = VadStream::init(&params).unwrap();
        let request = Request::new(vec![Tensor::from_f32("AUDIO", vec![3], &[1.0, 2.0, 3.0])]);
        let closing = plugin.execute(&request).unwrap();
        assert!(closing.outputs.is_empty());
        let sent = testing::sent();
        assert_eq!(sent.len(), 2);
        let probability = |i: usize| {
            let (_, r, last) = &sent[i];
            assert!(!last);
            let r = r.as_ref().unwrap().as_ref().unwrap();
            r.output("PROBABILITY").unwrap().to_f32().unwrap()[0]
        };
        assert_eq!(probability(0), 3.0); // [0, 1, 2]
        assert_eq!(probability(1), 105.0); // [2, 3, 0], the sequence's end
        assert_eq!(testing::calls("vad"), 2);
    }
}
