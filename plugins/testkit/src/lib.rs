//! `testkit`: an identity plugin that can also misbehave on purpose, for Wisp's own tests and
//! benchmarks. Not an example to copy.
//!
//! Parameter `mode` (or a request parameter `mode`, which overrides it for one request):
//! - `identity` (default): output `OUTPUT` = input `INPUT`, any datatype and shape;
//! - `loop`: never returns (the host's deadline must stop it);
//! - `bomb`: allocates until memory runs out (the host's memory cap must stop it);
//! - `trap`: panics;
//! - `bad_shape`: returns `OUTPUT` with one element too many;
//! - `bad_type`: returns `OUTPUT` as BYTES;
//! - `probe`: returns `OUTPUT` (BYTES, one element) describing what the sandbox let it see:
//!   `fs=<listing of /data or error>;env=<NAME=VALUE,...>;clock=<unix seconds>`.
//!
//! - `forward`: sends the whole batch, in one `wisp:plugin/models` call, to the model named by
//!   the `forward_to` parameter (`name` or `name:version`), and returns what it answers (any
//!   inputs and outputs; the request parameter `mode` is dropped, the rest pass through);
//! - `forward_each`: the same with one call per request (the benchmark's baseline).
//!
//! - `stream` (a decoupled model): sends responses `OUTPUT` = `INPUT` + i (INT32) for i in
//!   0..`count` (request parameter, default 3), an error in place of response `error_at` (if
//!   set), then ends as request parameter `end` says: `flag` (default: an empty result, the
//!   final flag alone), `response` (one more response, `INPUT` + `count`, returned as the
//!   last), `error` (an error as the last), `sent` (the last response sent as final), `none`
//!   (the flag sent alone before returning). With `forever` true it sends until a send fails
//!   or the client has gone, then fails with how many it sent.
//!
//! `init` fails when the `fail_init` parameter is `true`.

use wisp_sdk::models::Model;
use wisp_sdk::{Error, ParamValue, Params, Plugin, Request, Response, Tensor};

/// The plugin: its default mode, and where `forward` sends batches.
pub struct Testkit {
    mode: String,
    forward_to: Option<Model>,
}

fn probe() -> String {
    let fs = match std::fs::read_dir("/data") {
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.join(",")
        }
        Err(e) => format!("error({})", e.kind()),
    };
    let root = match std::fs::read_dir("/") {
        Ok(entries) => entries.count().to_string(),
        Err(e) => format!("error({})", e.kind()),
    };
    let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("fs={fs};root={root};env={};clock={clock}", env.join(","))
}

impl Plugin for Testkit {
    fn init(params: &Params) -> Result<Self, Error> {
        if params.parse_or("fail_init", false)? {
            return Err(Error::invalid("testkit: init refused (fail_init = true)"));
        }
        Ok(Testkit {
            mode: params.get("mode").unwrap_or("identity").to_string(),
            forward_to: params.get("forward_to").map(Model::new).transpose()?,
        })
    }

    fn execute_batch(&mut self, batch: Vec<Request>) -> Vec<Result<Response, Error>> {
        if self.mode != "forward" && self.mode != "forward_each" {
            return batch.iter().map(|r| self.execute(r)).collect();
        }
        let Some(target) = &self.forward_to else {
            let e = Error::invalid("testkit: forwarding needs the 'forward_to' parameter");
            return batch.iter().map(|_| Err(e.clone())).collect();
        };
        let batch: Vec<Request> = batch
            .into_iter()
            .map(|mut r| {
                r.parameters.retain(|p| p.key != "mode");
                r
            })
            .collect();
        if self.mode == "forward_each" {
            // one call per request: what a plugin without batched calls does
            return batch.iter().map(|r| target.infer(r)).collect();
        }
        match target.infer_batch(&batch) {
            Ok(results) => results,
            Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let mode = match request.param("mode") {
            Some(ParamValue::Text(m)) => m.as_str(),
            _ => self.mode.as_str(),
        };
        let input = request.input("INPUT")?;
        let output = |datatype, shape: Vec<i64>, data: Vec<u8>| {
            Ok(Response::new(vec![Tensor {
                name: "OUTPUT".into(),
                datatype,
                shape,
                data,
            }]))
        };
        match mode {
            "identity" => output(input.datatype, input.shape.clone(), input.data.clone()),
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 16 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "trap" => panic!("testkit: deliberate panic"),
            "bad_shape" => {
                let mut shape = input.shape.clone();
                if let Some(last) = shape.last_mut() {
                    *last += 1;
                }
                let mut data = input.data.clone();
                data.extend(std::iter::repeat_n(0, input.datatype.size().unwrap_or(4)));
                output(input.datatype, shape, data)
            }
            "bad_type" => {
                let n = input.element_count();
                let t = Tensor::from_strings("OUTPUT", input.shape.clone(), vec!["x"; n]);
                Ok(Response::new(vec![t]))
            }
            "probe" => {
                let t = Tensor::from_strings("OUTPUT", vec![1], [probe()]);
                Ok(Response::new(vec![t]))
            }
            "stream" => stream(request),
            other => Err(Error::invalid(format!("testkit: unknown mode '{other}'"))),
        }
    }
}

/// An integer request parameter.
fn int_param(request: &Request, key: &str) -> Option<i64> {
    match request.param(key) {
        Some(ParamValue::Int(v)) => Some(*v),
        _ => None,
    }
}

/// The `stream` mode (see the crate docs).
fn stream(request: &Request) -> Result<Response, Error> {
    let input = request.input("INPUT")?;
    let x = input.to_i32()?;
    let plus = |i: i64| {
        let y: Vec<i32> = x.iter().map(|v| v.wrapping_add(i as i32)).collect();
        Response::new(vec![Tensor::from_i32("OUTPUT", input.shape.clone(), &y)])
    };
    let sender = request.response_sender();
    if matches!(request.param("forever"), Some(ParamValue::Bool(true))) {
        let mut sent = 0i64;
        while !sender.is_cancelled() {
            if let Err(e) = sender.send(plus(sent)) {
                return Err(Error::unavailable(format!(
                    "testkit: stopped after {sent} responses: {}",
                    e.message
                )));
            }
            sent += 1;
        }
        return Err(Error::unavailable(format!(
            "testkit: cancelled after {sent} responses"
        )));
    }
    let count = int_param(request, "count").unwrap_or(3).clamp(0, 10_000);
    let error_at = int_param(request, "error_at");
    let end = match request.param("end") {
        Some(ParamValue::Text(t)) => t.as_str(),
        _ => "flag",
    };
    for i in 0..count {
        let last = end == "sent" && i + 1 == count;
        if error_at == Some(i) {
            sender.send_error(Error::invalid(format!("testkit: error at {i}")), last)?;
        } else if last {
            sender.send_final(plus(i))?;
        } else {
            sender.send(plus(i))?;
        }
    }
    match end {
        "response" => Ok(plus(count)),
        "error" => Err(Error::invalid("testkit: the last response is an error")),
        "none" => {
            sender.finish()?;
            Ok(Response::new(vec![]))
        }
        _ => Ok(Response::new(vec![])),
    }
}

wisp_sdk::export_plugin!(Testkit);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_bad_shape() {
        let mut p = Testkit::init(&Params::default()).unwrap();
        let req = Request::new(vec![Tensor::from_i32("INPUT", vec![1, 2], &[3, 4])]);
        let out = p.execute(&req).unwrap();
        assert_eq!(out.output("OUTPUT").unwrap().to_i32().unwrap(), vec![3, 4]);
        let mut bad = Testkit::init(&Params::from_pairs(&[("mode", "bad_shape")])).unwrap();
        let t = bad.execute(&req).unwrap().outputs.remove(0);
        assert_eq!(t.shape, vec![1, 3]);
        assert!(t.check().is_ok());
    }

    #[test]
    fn forward_sends_the_whole_batch_in_one_call() {
        wisp_sdk::testing::serve("target", |r: &Request| {
            assert!(r.param("mode").is_none(), "mode is not forwarded");
            let x = r.input("INPUT")?.to_i32()?;
            let y: Vec<i32> = x.iter().map(|v| v + 1).collect();
            Ok(Response::new(vec![Tensor::from_i32(
                "OUTPUT",
                vec![1, 2],
                &y,
            )]))
        });
        let mut p = Testkit::init(&Params::from_pairs(&[
            ("mode", "forward"),
            ("forward_to", "target"),
        ]))
        .unwrap();
        let mut req = Request::new(vec![Tensor::from_i32("INPUT", vec![1, 2], &[3, 4])]);
        req.parameters.push(wisp_sdk::Param {
            key: "mode".into(),
            value: ParamValue::Text("forward".into()),
        });
        let out = p.execute_batch(vec![req.clone(), req]);
        assert_eq!(out.len(), 2);
        let y = out[1]
            .as_ref()
            .unwrap()
            .output("OUTPUT")
            .unwrap()
            .to_i32()
            .unwrap();
        assert_eq!(y, vec![4, 5]);
        assert_eq!(
            wisp_sdk::testing::calls("target"),
            1,
            "one call for the batch"
        );
    }

    #[test]
    fn stream_sends_count_responses_then_ends_as_asked() {
        wisp_sdk::testing::clear();
        let mut p = Testkit::init(&Params::from_pairs(&[("mode", "stream")])).unwrap();
        let mut req = Request::new(vec![Tensor::from_i32("INPUT", vec![1, 2], &[3, 4])]);
        req.parameters.push(wisp_sdk::Param {
            key: "end".into(),
            value: ParamValue::Text("response".into()),
        });
        let last = p.execute(&req).unwrap();
        assert_eq!(last.output("OUTPUT").unwrap().to_i32().unwrap(), vec![6, 7]);
        let sent = wisp_sdk::testing::sent();
        assert_eq!(sent.len(), 3);
        let (_, r, final_) = &sent[2];
        assert!(!final_);
        let y = r.as_ref().unwrap().as_ref().unwrap().outputs[0].to_i32();
        assert_eq!(y.unwrap(), vec![5, 6]);
    }

    #[test]
    fn init_can_be_refused() {
        let e = Testkit::init(&Params::from_pairs(&[("fail_init", "true")]))
            .err()
            .unwrap();
        assert!(e.message.contains("fail_init"));
    }
}
