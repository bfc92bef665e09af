//! Triton's time-to-first-response histogram (`--metrics-config histogram_latencies=true`):
//! one per decoupled model version, with Triton's default buckets or its `model_metrics`
//! override, none for a model that is not decoupled, none at all when the flag is off; buckets
//! out of order refuse the model by name.

use serde_json::json;
use wisp_server::settings::OnnxEngine;
use wisp_tests::{add_plugin_model, copy_dir, fixture_repo, Client};

use crate::common::start_with;

const FAMILY: &str = "nv_inference_first_response_histogram_ms";

fn stream_config(model_metrics: &str) -> String {
    format!(
        r#"backend: "wasm"
max_batch_size: 0
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
model_transaction_policy {{ decoupled: true }}
parameters {{ key: "mode" value {{ string_value: "stream" }} }}
{model_metrics}
"#
    )
}

fn override_buckets(buckets: &str) -> String {
    format!(
        r#"model_metrics {{ metric_control: [
  {{ metric_identifier: {{ family: "{FAMILY}" }} histogram_options: {{ buckets: [ {buckets} ] }} }},
  {{ metric_identifier: {{ family: "nv_inference_request_duration_us" }} histogram_options: {{ buckets: [ 1 ] }} }}
] }}"#
    )
}

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_repo().join("add_sub"), &dir.path().join("add_sub")).unwrap();
    add_plugin_model(dir.path(), "streamer", 1, "testkit", &stream_config(""));
    // Triton's QA override (L0_metrics), and a family Triton cannot customise (warned, ignored).
    add_plugin_model(
        dir.path(),
        "streamer_buckets",
        1,
        "testkit",
        &stream_config(&override_buckets("-1, 0.0, 1, 2.5")),
    );
    add_plugin_model(
        dir.path(),
        "streamer_unordered",
        1,
        "testkit",
        &stream_config(&override_buckets("5, 2")),
    );
    dir
}

async fn metrics(server: &wisp_server::Server) -> String {
    let mut m = Client::connect(server.metrics_addr().unwrap())
        .await
        .unwrap();
    String::from_utf8(m.get("/metrics").await.unwrap().body.to_vec()).unwrap()
}

async fn stream_once(c: &mut Client, model: &str) {
    let r = c
        .post_json(
            &format!("/v2/models/{model}/generate_stream"),
            &json!({"INPUT": [1, 2, 3], "count": 2}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(body.matches("data:").count(), 2, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoupled_models_have_a_first_response_histogram_with_their_buckets() {
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.metrics_config = vec!["histogram_latencies=true".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();

    let row = wisp_tests::index_row(&mut c, "streamer_unordered", None).await;
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains("model_metrics") && reason.contains("strictly increasing"),
        "{reason}"
    );

    stream_once(&mut c, "streamer").await;
    stream_once(&mut c, "streamer").await;
    stream_once(&mut c, "streamer_buckets").await;
    let r = c
        .post_json("/v2/models/add_sub/infer", &wisp_tests::add_sub_json())
        .await
        .unwrap();
    assert_eq!(r.status, 200);

    let text = metrics(&server).await;
    let labels = |model: &str| format!("model=\"{model}\",version=\"1\"");
    assert_eq!(
        text.matches(&format!("# TYPE {FAMILY} histogram")).count(),
        1,
        "{text}"
    );
    // Triton's default buckets, and one first response per request.
    for le in ["100", "500", "2000", "5000", "+Inf"] {
        let line = format!("{FAMILY}_bucket{{{},le=\"{le}\"}} ", labels("streamer"));
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    assert!(
        text.contains(&format!("{FAMILY}_count{{{}}} 2\n", labels("streamer"))),
        "{text}"
    );
    assert!(text.contains(&format!("{FAMILY}_sum{{{}}} ", labels("streamer"))));
    // The override, exactly (as Triton's test_buckets_override counts them).
    let own: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{FAMILY}_bucket{{{}", labels("streamer_buckets"))))
        .collect();
    let les: Vec<&str> = own
        .iter()
        .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(les, ["-1", "0", "1", "2.5", "+Inf"], "{own:?}");
    assert!(text.contains(&format!(
        "{FAMILY}_count{{{}}} 1\n",
        labels("streamer_buckets")
    )));
    // Not decoupled: no histogram, as in Triton.
    assert!(!text.contains(&format!("{FAMILY}_count{{{}}}", labels("add_sub"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_histogram_latencies_there_is_no_histogram() {
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    stream_once(&mut c, "streamer").await;
    let text = metrics(&server).await;
    assert!(text.contains("nv_inference_request_success"), "{text}");
    assert!(!text.contains(FAMILY), "{text}");
}
