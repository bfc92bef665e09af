//! `sequence-sum`: a stateful plugin for the sequence batcher. It keeps a running total per
//! sequence in its own memory, keyed by the correlation ID the host passes in.
//!
//! Config: `sequence_batching` with `control_input`s `START` (`CONTROL_SEQUENCE_START`,
//! `int32_false_true: [0, 1]`), `END` (`CONTROL_SEQUENCE_END`, the same) and `CORRID`
//! (`CONTROL_SEQUENCE_CORRID`, `TYPE_UINT64`). Input `INPUT` (FP32, one value per request) →
//! output `SUM` (FP32): the sum of the sequence's inputs so far. The host runs a sequence's
//! requests in order on one instance, so each instance's map holds the sequences whose slots it
//! owns; END forgets one. `max_sequences` (default 1024) bounds the map: a sequence the server
//! released as idle never sends END, so when the map is full a new START evicts the oldest.

use std::collections::{HashMap, VecDeque};

use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// Running totals by correlation ID.
pub struct SequenceSum {
    totals: HashMap<u64, f32>,
    /// Started sequences, oldest first (ended ones are skipped lazily).
    order: VecDeque<u64>,
    max_sequences: usize,
}

fn flag(request: &Request, name: &str) -> Result<bool, Error> {
    Ok(request.input(name)?.to_i32()?.first().copied().unwrap_or(0) != 0)
}

impl Plugin for SequenceSum {
    fn init(params: &Params) -> Result<Self, Error> {
        let max_sequences = params.parse_or("max_sequences", 1024usize)?;
        if max_sequences == 0 {
            return Err(Error::invalid("max_sequences must be at least 1"));
        }
        Ok(SequenceSum {
            totals: HashMap::new(),
            order: VecDeque::new(),
            max_sequences,
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let id = request
            .input("CORRID")?
            .to_u64()?
            .first()
            .copied()
            .ok_or_else(|| Error::invalid("CORRID is empty"))?;
        let input = request.input("INPUT")?;
        let value: f32 = input.to_f32()?.iter().sum();
        if flag(request, "START")? {
            if !self.totals.contains_key(&id) {
                while self.totals.len() >= self.max_sequences {
                    match self.order.pop_front() {
                        Some(oldest) => {
                            self.totals.remove(&oldest);
                        }
                        None => break,
                    }
                }
                self.order.push_back(id);
            }
            self.totals.insert(id, 0.0);
            if self.order.len() > 2 * self.max_sequences {
                let live = &self.totals;
                self.order.retain(|i| live.contains_key(i));
            }
        }
        let total = self.totals.get_mut(&id).ok_or_else(|| {
            Error::invalid(format!("sequence {id} was not started on this instance"))
        })?;
        *total += value;
        let sum = *total;
        if flag(request, "END")? {
            self.totals.remove(&id);
        }
        Ok(Response::new(vec![Tensor::from_f32(
            "SUM",
            input.shape.clone(),
            &[sum],
        )]))
    }
}

wisp_sdk::export_plugin!(SequenceSum);

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64, value: f32, start: bool, end: bool) -> Request {
        Request::new(vec![
            Tensor::from_f32("INPUT", vec![1, 1], &[value]),
            Tensor::from_u64("CORRID", vec![1, 1], &[id]),
            Tensor::from_i32("START", vec![1, 1], &[start.into()]),
            Tensor::from_i32("END", vec![1, 1], &[end.into()]),
        ])
    }

    fn sum(p: &mut SequenceSum, r: Request) -> f32 {
        p.execute(&r)
            .unwrap()
            .output("SUM")
            .unwrap()
            .to_f32()
            .unwrap()[0]
    }

    #[test]
    fn interleaved_sequences_keep_their_own_totals() {
        let mut p = SequenceSum::init(&Params::default()).unwrap();
        assert_eq!(sum(&mut p, request(1, 1.0, true, false)), 1.0);
        assert_eq!(sum(&mut p, request(2, 10.0, true, false)), 10.0);
        assert_eq!(sum(&mut p, request(1, 2.0, false, false)), 3.0);
        assert_eq!(sum(&mut p, request(2, 5.0, false, true)), 15.0);
        assert!(
            p.execute(&request(2, 1.0, false, false)).is_err(),
            "2 ended"
        );
        assert_eq!(sum(&mut p, request(1, 3.0, false, true)), 6.0);
        assert!(p.totals.is_empty());
    }

    #[test]
    fn a_full_map_evicts_the_oldest_sequence() {
        let mut p = SequenceSum::init(&Params::from_pairs(&[("max_sequences", "2")])).unwrap();
        sum(&mut p, request(1, 1.0, true, false));
        sum(&mut p, request(2, 1.0, true, false));
        // restarting a live sequence takes no new room
        assert_eq!(sum(&mut p, request(1, 4.0, true, false)), 4.0);
        assert_eq!(sum(&mut p, request(3, 1.0, true, false)), 1.0);
        assert!(
            p.execute(&request(1, 1.0, false, false)).is_err(),
            "1 was evicted"
        );
        assert_eq!(sum(&mut p, request(2, 1.0, false, false)), 2.0);
        for id in 10..1000 {
            sum(&mut p, request(id, 1.0, true, true));
        }
        assert!(p.totals.len() <= 2 && p.order.len() <= 4, "bounded");
    }
}
