//! The sequence batcher over a real scheduler and an accumulator instance: interleaved
//! sequences, control inputs, implicit state, slots and backlog, idle release.

use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::config::{parse_pbtxt, ModelConfig};
use wisp_core::infer::{CorrelationId, SequenceFlags};
use wisp_core::{DataType, ErrorKind, InferRequest, InferResponse, Result, Tensor};

use super::Sequencer;
use crate::{Policy, Scheduler};

const WAIT: Duration = Duration::from_secs(10);

/// OUTPUT = INPUT + STATE_IN (also STATE_OUT); echoes CORRID, START and END, and reports which
/// instance ran it as WHO. Runs each request of a batch on its own (rows of 1).
struct Accumulator(u64);

fn f32_of(t: &Tensor) -> f32 {
    f32::from_le_bytes(t.data[..4].try_into().unwrap())
}

fn input<'a>(r: &'a InferRequest, name: &str) -> &'a Tensor {
    r.inputs
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no input {name}"))
}

impl Instance for Accumulator {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        batch
            .iter()
            .map(|r| {
                let sum = f32_of(input(r, "INPUT")) + f32_of(input(r, "STATE_IN"));
                let shape = input(r, "INPUT").shape.clone();
                let f = |name: &str, v: f32| {
                    Tensor::new(
                        name,
                        DataType::Fp32,
                        shape.clone(),
                        v.to_le_bytes().to_vec().into(),
                    )
                };
                let echo = |name: &str, from: &str| {
                    let t = input(r, from);
                    Tensor::new(name, t.datatype, t.shape.clone(), t.data.clone())
                };
                Ok(InferResponse::new(vec![
                    f("OUTPUT", sum)?,
                    f("STATE_OUT", sum)?,
                    echo("CORRID_OUT", "CORRID")?,
                    echo("START_OUT", "START")?,
                    echo("END_OUT", "END")?,
                    Tensor::new(
                        "WHO",
                        DataType::Uint64,
                        shape.clone(),
                        self.0.to_le_bytes().to_vec().into(),
                    )?,
                ]))
            })
            .collect()
    }
}

fn config(strategy: &str, idle_us: u64) -> ModelConfig {
    parse_pbtxt(
        "acc",
        &format!(
            r#"max_batch_size: 4
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
}}
"#
        ),
    )
    .unwrap()
}

struct Rig {
    seq: Arc<Sequencer>,
    _scheduler: Arc<Scheduler>,
}

fn rig(cfg: &ModelConfig, instances: u64) -> Rig {
    let inst: Vec<Box<dyn Instance>> = (0..instances)
        .map(|i| Box::new(Accumulator(i)) as Box<dyn Instance>)
        .collect();
    let spec = wisp_core::config::sequence::read(cfg).unwrap().unwrap();
    let scheduler = Arc::new(
        Scheduler::start("acc", Policy::from_config(cfg, Some(&spec)), inst, None).unwrap(),
    );
    let seq = Sequencer::new(
        "acc",
        spec,
        cfg.max_batch_size,
        vec!["OUTPUT".into()],
        &scheduler,
        instances as usize,
    );
    Rig {
        seq,
        _scheduler: scheduler,
    }
}

fn request(id: u64, value: f32, start: bool, end: bool) -> InferRequest {
    InferRequest {
        inputs: vec![Tensor::new(
            "INPUT",
            DataType::Fp32,
            vec![1, 1],
            value.to_le_bytes().to_vec().into(),
        )
        .unwrap()],
        sequence: Some(SequenceFlags {
            id: CorrelationId::Number(id),
            start,
            end,
        }),
        ..Default::default()
    }
}

type Outcome = Receiver<Result<InferResponse>>;

fn send(r: &Rig, req: InferRequest) -> Result<Outcome> {
    let (tx, rx) = channel();
    r.seq.enqueue(
        req,
        Box::new(move |res| {
            let _ = tx.send(res);
        }),
    )?;
    Ok(rx)
}

fn output(res: &InferResponse, name: &str) -> Tensor {
    res.outputs
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no output {name}"))
        .clone()
}

fn value(o: Outcome) -> (f32, InferResponse) {
    let r = o.recv_timeout(WAIT).unwrap().unwrap();
    (f32_of(&output(&r, "OUTPUT")), r)
}

#[test]
fn interleaved_sequences_keep_their_own_state_on_both_strategies() {
    for strategy in [
        "direct { }",
        "oldest { max_candidate_sequences: 2 max_queue_delay_microseconds: 1000 }",
    ] {
        let r = rig(&config(strategy, 5_000_000), 2);
        // four sequences, each sending 1, 2, 3, 4 scaled by its id, all in flight together
        let ids = [11u64, 12, 13, 14];
        let mut pending = Vec::new();
        for step in 0..4u32 {
            for &id in &ids {
                let req = request(id, (step + 1) as f32 * id as f32, step == 0, step == 3);
                pending.push((id, step, send(&r, req).unwrap()));
            }
        }
        for (id, step, rx) in pending {
            let (v, res) = value(rx);
            let want: f32 = (1..=step + 1).map(|k| (k * id as u32) as f32).sum();
            assert_eq!(v, want, "{strategy}: sequence {id} step {step}");
            let corrid = output(&res, "CORRID_OUT");
            assert_eq!(corrid.data[..], id.to_le_bytes(), "CORRID");
            let start = output(&res, "START_OUT");
            assert_eq!(start.data[..], i32::from(step == 0).to_le_bytes(), "START");
            let end = output(&res, "END_OUT");
            assert_eq!(end.data[..], i32::from(step == 3).to_le_bytes(), "END");
            assert!(
                res.outputs.iter().all(|t| t.name != "STATE_OUT"),
                "state outputs stay with the server"
            );
        }
        assert_eq!(r.seq.live(), 0, "{strategy}: ended sequences are released");
    }
}

#[test]
fn a_sequence_stays_on_one_instance() {
    let r = rig(&config("direct { }", 5_000_000), 2);
    for id in [1u64, 2, 3] {
        let mut who = Vec::new();
        for step in 0..3 {
            let (_, res) = value(send(&r, request(id, 1.0, step == 0, false)).unwrap());
            who.push(output(&res, "WHO").data.to_vec());
        }
        assert!(who.windows(2).all(|w| w[0] == w[1]), "sequence {id} moved");
    }
}

#[test]
fn a_request_without_start_for_an_unknown_sequence_is_refused() {
    let r = rig(&config("direct { }", 5_000_000), 1);
    let e = send(&r, request(7, 1.0, false, false)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArg);
    assert!(
        e.message()
            .contains("must specify the START flag on the first request of the sequence"),
        "{e}"
    );
    let mut no_id = request(7, 1.0, true, false);
    no_id.sequence = None;
    let e = send(&r, no_id).unwrap_err();
    assert!(e.message().contains("correlation ID"), "{e}");
    // after END, the sequence is gone
    value(send(&r, request(7, 1.0, true, true)).unwrap());
    assert!(send(&r, request(7, 1.0, false, false)).is_err());
}

#[test]
fn an_idle_sequence_is_released_and_cannot_continue() {
    let r = rig(&config("direct { }", 50_000), 1);
    let (v, _) = value(send(&r, request(5, 2.0, true, false)).unwrap());
    assert_eq!(v, 2.0);
    std::thread::sleep(Duration::from_millis(200));
    let e = send(&r, request(5, 1.0, false, false)).unwrap_err();
    assert!(e.message().contains("START"), "{e}");
    assert_eq!(r.seq.live(), 0);
    // and starting it again begins from zero state
    let (v, _) = value(send(&r, request(5, 3.0, true, false)).unwrap());
    assert_eq!(v, 3.0);
}

#[test]
fn a_sequence_without_a_free_slot_waits_for_one() {
    // one instance, max_candidate_sequences 1: one slot
    let r = rig(
        &config("oldest { max_candidate_sequences: 1 }", 5_000_000),
        1,
    );
    let (v, _) = value(send(&r, request(1, 1.0, true, false)).unwrap());
    assert_eq!(v, 1.0);
    // sequence 2 has no slot while 1 lives
    let waiting = send(&r, request(2, 10.0, true, false)).unwrap();
    assert!(waiting.recv_timeout(Duration::from_millis(200)).is_err());
    assert_eq!(r.seq.live(), 2);
    // 1 ends; 2 gets its slot
    let (v, _) = value(send(&r, request(1, 1.0, false, true)).unwrap());
    assert_eq!(v, 2.0);
    let (v, _) = value(waiting);
    assert_eq!(v, 10.0);
}

#[test]
fn a_new_start_restarts_a_live_sequence() {
    let r = rig(&config("direct { }", 5_000_000), 1);
    value(send(&r, request(9, 5.0, true, false)).unwrap());
    let (v, _) = value(send(&r, request(9, 1.0, true, false)).unwrap());
    assert_eq!(v, 1.0, "START resets the state");
}

#[test]
fn slots_are_cut_so_that_all_state_fits_its_bound() {
    // 64 MiB of state a sequence, 4096 slots asked for: 1 GiB holds 16 of them
    let cfg = parse_pbtxt(
        "big",
        r#"max_batch_size: 4096
sequence_batching {
  state [ { input_name: "S" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 16777216 ] } ]
}
"#,
    )
    .unwrap();
    let spec = wisp_core::config::sequence::read(&cfg).unwrap().unwrap();
    let scheduler = Arc::new(
        Scheduler::start(
            "big",
            Policy::from_config(&cfg, Some(&spec)),
            vec![Box::new(Accumulator(0)) as Box<dyn Instance>],
            None,
        )
        .unwrap(),
    );
    let seq = Sequencer::new("big", spec, 4096, Vec::new(), &scheduler, 1);
    assert_eq!(seq.slots, 16);
}
