//! What the HTTP route table costs a request: `route::find` (first match wins over every row)
//! for paths near the top, in the middle and at the bottom of the table, and for a path that
//! is no route (every row tried, then the miss named). Each figure is the median over rounds
//! of the mean time per lookup of `--lookups` lookups; the paths take turns within each round.
//!
//! `cargo bench -p wisp-server --bench route_table -- [--rounds N] [--lookups N]`, or
//! `./dev bench routes`.

use std::hint::black_box;
use std::time::Instant;

use wisp_server::http::route;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a count"))
        .unwrap_or(default)
}

fn main() {
    let rounds = arg("--rounds", 15).clamp(1, 1000);
    let lookups = arg("--lookups", 200_000).clamp(1, 10_000_000);
    let cases = [
        ("health (row 2)", "/v2/health/live"),
        ("infer (row 13)", "/v2/models/add_sub/infer"),
        (
            "versioned generate_stream (row 18)",
            "/v2/models/add_sub/versions/1/generate_stream",
        ),
        ("OpenAI model (last row)", "/v1/models/all_minilm_l6_v2"),
        (
            "no route (every row, then the miss)",
            "/v2/models/add_sub/frobnicate",
        ),
    ];
    let mut per_case: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    // The split alone, which the router before the table did too: the table's own share is
    // each figure less this one.
    let mut split_only = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..lookups {
            let path = black_box(cases[1].1);
            let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
            black_box(&segs);
        }
        split_only.push(start.elapsed().as_nanos() as f64 / lookups as f64);
        for (n, (_, path)) in cases.iter().enumerate() {
            let start = Instant::now();
            for _ in 0..lookups {
                // As `dispatch` does: split the path, then look it up.
                let path = black_box(*path);
                let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
                match route::find(&segs) {
                    Some((entry, params)) => {
                        black_box((entry.group, params.model));
                    }
                    None => {
                        black_box(route::not_found(&segs, "GET", path));
                    }
                }
            }
            per_case[n].push(start.elapsed().as_nanos() as f64 / lookups as f64);
        }
    }
    println!(
        "route table: {} rows; median of {rounds} rounds of {lookups} lookups (path split included)",
        route::TABLE.len()
    );
    println!("| path | ns per lookup |\n|---|---|");
    split_only.sort_by(f64::total_cmp);
    println!(
        "| the path split alone: `{}` | {:.0} |",
        cases[1].1,
        split_only[split_only.len() / 2]
    );
    for (n, (label, path)) in cases.iter().enumerate() {
        let v = &mut per_case[n];
        v.sort_by(f64::total_cmp);
        println!("| {label}: `{path}` | {:.0} |", v[v.len() / 2]);
    }
}
