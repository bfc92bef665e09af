//! Dynamic batching: sizes, preferred sizes, shapes, priorities and full queues.

use super::*;

#[test]
fn batches_fill_up_to_max_batch_size_and_answer_the_right_request() {
    let h = harness(policy(4, dynamic(|_| {})), 1, "hold");
    h.hold(1);
    // queued while the instance is busy: rows 1, 2, 1, 3 → batches [a,b,c] (4 rows) then [d]
    for (id, rows) in [("a", 1), ("b", 2), ("c", 1), ("d", 3)] {
        h.send(id, rows, serde_json::json!({})).unwrap();
    }
    h.release();
    assert_eq!(h.batch_started(), vec!["a", "b", "c"]);
    assert_eq!(h.batch_started(), vec!["d"]);
    for _ in 0..5 {
        let (id, r) = h.result();
        let out = &r.unwrap().outputs[0];
        let rows = match id.as_str() {
            "b" => 2,
            "d" => 3,
            _ => 1,
        };
        assert_eq!(out.shape, vec![rows, 1], "{id}");
        let v: Vec<f32> = out
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want: Vec<f32> = (0..rows).map(|i| (i as f32 + 1.0) * 2.0).collect();
        assert_eq!(v, want, "{id} got another request's rows");
    }
    let st = h.s.stats();
    assert_eq!(st.execution_count(), 3);
    assert_eq!(st.inference_count(), 8);
    assert_eq!(st.success.get().0, 5);
    let b = st.batch_stats();
    assert_eq!(b[&4].count, 1);
    assert_eq!(b[&3].count, 1);
}

#[test]
fn a_preferred_size_goes_at_once_and_a_lone_request_after_the_delay() {
    let h = harness(
        policy(
            8,
            dynamic(|d| {
                d.preferred_batch_size = vec![2];
                d.max_queue_delay_microseconds = 100_000;
            }),
        ),
        1,
        "hold",
    );
    h.hold(1);
    for id in ["a", "b", "c"] {
        h.send(id, 1, serde_json::json!({})).unwrap();
    }
    h.release();
    // a preferred batch of 2 is formed from the 3 queued, without waiting for the delay
    assert_eq!(h.batch_started(), vec!["a", "b"]);
    // c is alone: it leaves once it has waited max_queue_delay (100 ms)
    assert_eq!(h.batch_started(), vec!["c"]);
    let t = Instant::now();
    h.send("lone", 1, serde_json::json!({})).unwrap();
    assert_eq!(h.batch_started(), vec!["lone"]);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(100),
        "left after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "left after {waited:?}");
}

#[test]
fn a_batch_gathers_its_shape_past_others_but_only_so_far() {
    let h = harness(policy(8, dynamic(|_| {})), 1, "hold");
    h.hold(1);
    // a0 is oldest; 3 requests of another shape separate a1 from it, and SHAPE_LOOKAHEAD + 1
    // separate a2
    h.send_wide("a0", 2).unwrap();
    for i in 0..3 {
        h.send_wide(&format!("b{i:03}"), 1).unwrap();
    }
    h.send_wide("a1", 2).unwrap();
    for i in 3..=crate::SHAPE_LOOKAHEAD {
        h.send_wide(&format!("b{i:03}"), 1).unwrap();
    }
    h.send_wide("a2", 2).unwrap();
    h.release();
    // the first batch looks past the b's for a1 but stops before reaching a2
    assert_eq!(h.batch_started(), vec!["a0", "a1"]);
    // then the b's go in full batches, FIFO, and a2 is served in its turn, after them all
    let b: Vec<String> = (0..8).map(|i| format!("b{i:03}")).collect();
    assert_eq!(h.batch_started(), b);
    // hold, the three a's and SHAPE_LOOKAHEAD + 1 b's
    let n = crate::SHAPE_LOOKAHEAD + 5;
    let got = h.outcomes(n);
    assert!(got.iter().all(|(_, ok)| *ok), "every request is served");
    assert_eq!(got.len(), n);
    let mut last = Vec::new();
    while let Ok(ids) = h.started.recv_timeout(Duration::from_millis(10)) {
        last = ids;
    }
    assert_eq!(last, vec!["a2"], "a2 goes last, alone");
    assert_eq!(shapes_counted(&h.s), (0, 0));
}

#[test]
fn a_batch_holding_all_of_its_shape_goes_at_once_and_the_rest_batch_by_shape() {
    let h = harness(
        policy(8, dynamic(|d| d.max_queue_delay_microseconds = 60_000_000)),
        1,
        "hold",
    );
    // a full batch: it goes without waiting for the queue delay
    h.hold(8);
    for (id, width) in [
        ("a0", 2),
        ("b0", 1),
        ("c0", 3),
        ("b1", 1),
        ("a1", 2),
        ("b2", 1),
    ] {
        h.send_wide(id, width).unwrap();
    }
    assert_eq!(shapes_counted(&h.s), (6, 3));
    h.release();
    // each batch is one shape, oldest first, and goes at once while another shape waits
    assert_eq!(h.batch_started(), vec!["a0", "a1"]);
    assert_eq!(h.batch_started(), vec!["b0", "b1", "b2"]);
    // c0, left alone, waits for the (long) queue delay, until its batch fills
    let c: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    for id in &c[1..] {
        h.send_wide(id, 3).unwrap();
    }
    assert_eq!(h.batch_started(), c);
    let got = h.outcomes(14);
    assert!(got.iter().all(|(_, ok)| *ok), "{got:?}");
    assert_eq!(shapes_counted(&h.s), (0, 0));
}

#[test]
fn priorities_order_service() {
    let h = harness(
        policy(
            1,
            dynamic(|d| {
                d.priority_levels = 2;
                d.default_priority_level = 2;
            }),
        ),
        1,
        "hold",
    );
    h.hold(1);
    h.send("low1", 1, serde_json::json!({})).unwrap();
    h.send("low2", 1, serde_json::json!({"priority": 2}))
        .unwrap();
    h.send("high", 1, serde_json::json!({"priority": 1}))
        .unwrap();
    h.release();
    assert_eq!(h.batch_started(), vec!["high"]);
    assert_eq!(h.batch_started(), vec!["low1"]);
    assert_eq!(h.batch_started(), vec!["low2"]);
}

#[test]
fn a_full_queue_rejects_at_once_without_disturbing_others() {
    let h = queued(
        4,
        QueuePolicy {
            max_queue_size: 2,
            ..Default::default()
        },
    );
    h.hold(1);
    h.send("a", 1, serde_json::json!({})).unwrap();
    h.send("b", 1, serde_json::json!({})).unwrap();
    let e = h.send("c", 1, serde_json::json!({})).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("Exceeds maximum queue size"), "{e}");
    assert_eq!(h.s.stats().failures(FailReason::Rejected), 1);
    h.release();
    let mut ok: Vec<String> = (0..3)
        .map(|_| {
            let (id, r) = h.result();
            assert!(r.is_ok());
            id
        })
        .collect();
    ok.sort();
    assert_eq!(ok, vec!["a", "b", "hold"]);
}
