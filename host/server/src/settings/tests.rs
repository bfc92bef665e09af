use super::*;

#[test]
fn the_inflight_budget_follows_the_cgroup_limit() {
    assert_eq!(default_max_inflight_bytes(None), 2 << 30);
    // systemd's MemoryMax=1G (the Debian unit): half of it.
    assert_eq!(default_max_inflight_bytes(Some(1 << 30)), 512 << 20);
    assert_eq!(default_max_inflight_bytes(Some(64 << 30)), 2 << 30);
    assert_eq!(default_max_inflight_bytes(Some(1 << 20)), 16 << 20);
}

#[test]
fn triton_flags_parse() {
    let cli = Cli::try_parse_from([
        "wisp",
        "serve",
        "--model-repository=/a",
        "--model-store",
        "/b",
        "--http-port",
        "9000",
        "--log-verbose=1",
        "--strict-readiness=false",
        "--exit-on-error=true",
        "--http-max-input-size",
        "1024",
        "--metrics-port=9002",
        "--metrics-config",
        "summary_latencies=true",
        "--cache-config",
        "local,size=1000",
    ])
    .unwrap();
    let Command::Serve(s) = cli.command else {
        panic!("not serve")
    };
    assert_eq!(
        s.model_repositories,
        vec![PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert_eq!(s.http_port, 9000);
    assert_eq!(s.log_verbose, 1);
    assert!(!s.strict_readiness);
    assert!(s.exit_on_error);
    assert_eq!(s.http_max_input_size, 1024);
    assert_eq!(s.metrics_port, 9002);
    assert_eq!(s.metrics_config, vec!["summary_latencies=true".to_string()]);
    assert_eq!(s.cache_config, vec!["local,size=1000".to_string()]);
}

#[test]
fn defaults() {
    let s = Settings::for_repository("/r");
    assert_eq!(s.http_port, DEFAULT_HTTP_PORT);
    assert_eq!(s.http_max_input_size, DEFAULT_HTTP_MAX_INPUT_SIZE);
    assert!(s.strict_readiness);
    assert_eq!(s.onnx_engine, OnnxEngine::Auto);
    assert!(Cli::try_parse_from(["wisp", "serve"]).is_err());
}

#[test]
fn only_object_store_urls_are_remote() {
    let remote = |s: &str| Settings::is_remote_repository(std::path::Path::new(s));
    assert!(remote("s3://bucket/models"));
    assert!(remote("gs://bucket"));
    assert!(!remote("/srv/models"));
    assert!(!remote("s3"));
}

#[test]
fn caches_follow_xdg_then_home_then_the_flags() {
    let mut s = Settings::for_repository("/m");
    let env = |pairs: &[(&str, &str)]| -> Arc<dyn EnvSource> {
        Arc::new(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>(),
        )
    };
    s.env = env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
    assert_eq!(s.wasm_cache(), Some(PathBuf::from("/x/wisp/wasm")));
    assert_eq!(s.repository_cache(), PathBuf::from("/x/wisp/repos"));
    s.env = env(&[("HOME", "/h")]);
    assert_eq!(s.repository_cache(), PathBuf::from("/h/.cache/wisp/repos"));
    s.env = env(&[]);
    assert_eq!(s.wasm_cache(), None, "no cache without a home");
    assert_eq!(
        s.repository_cache(),
        std::env::temp_dir().join("wisp/repos")
    );
    s.repository_cache_dir = Some(PathBuf::from("/r"));
    assert_eq!(s.repository_cache(), PathBuf::from("/r"));
}
