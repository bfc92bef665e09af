//! One route table decides both a request's handler and its API group: models named after
//! every route word are restricted by the route they are reached through, never by the word.

use wisp_server::http::route::route_words;
use wisp_server::settings::OnnxEngine;
use wisp_tests::{copy_dir, fixture_repo, Client};

use crate::common::start_with;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_named_after_route_words_keep_their_routes_groups() {
    let dir = tempfile::tempdir().unwrap();
    for word in route_words() {
        let to = dir.path().join(word);
        copy_dir(&fixture_repo().join("add_sub"), &to).unwrap();
        let config = std::fs::read_to_string(to.join("config.pbtxt")).unwrap();
        let config = config.replace("name: \"add_sub\"", &format!("name: \"{word}\""));
        std::fs::write(to.join("config.pbtxt"), config).unwrap();
    }
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.http_restricted_api = vec![
            "metadata:x-key=m".into(),
            "model-config:x-key=c".into(),
            "statistics:x-key=s".into(),
            "inference:x-key=i".into(),
        ];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let body = serde_json::json!({ "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
    ]});
    let body = serde_json::to_vec(&body).unwrap();
    for word in route_words() {
        // `/v2/models/stats` is every model's statistics, in Triton as here.
        let bare = if word == "stats" { "s" } else { "m" };
        for (method, path, key) in [
            ("GET", format!("/v2/models/{word}"), bare),
            ("GET", format!("/v2/models/{word}/versions/1"), "m"),
            ("GET", format!("/v2/models/{word}/config"), "c"),
            ("GET", format!("/v2/models/{word}/stats"), "s"),
            ("POST", format!("/v2/models/{word}/infer"), "i"),
        ] {
            let body = if method == "POST" {
                body.clone()
            } else {
                Vec::new()
            };
            let refused = c.send(method, &path, &[], body.clone()).await.unwrap();
            assert_eq!(
                refused.status, 403,
                "{method} {path} answered without its key"
            );
            // The other groups' keys do not open it either.
            for other in ["m", "c", "s", "i"].into_iter().filter(|k| *k != key) {
                let r = c
                    .send(method, &path, &[("x-key", other.to_string())], body.clone())
                    .await
                    .unwrap();
                assert_eq!(r.status, 403, "{method} {path} opened by key {other}");
            }
            let r = c
                .send(method, &path, &[("x-key", key.to_string())], body.clone())
                .await
                .unwrap();
            assert_eq!(
                r.status,
                200,
                "{method} {path}: {}",
                String::from_utf8_lossy(&r.body)
            );
        }
        // Readiness is health, which is not restricted here.
        let r = c.get(&format!("/v2/models/{word}/ready")).await.unwrap();
        assert_eq!(r.status, 200, "{word}/ready");
    }
    server.shutdown().await.unwrap();
}
