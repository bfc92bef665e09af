use super::*;

fn t(name: &str, shape: Vec<i64>, v: &[f32]) -> Tensor {
    Tensor::from_values(name, shape, v).unwrap()
}

fn gate() -> Gate {
    Gate {
        min_cosine: None,
        min_top1: None,
        max_abs_diff: None,
        max_latency_ratio: None,
        baseline: None,
        rounds: 1,
    }
}

fn report(a: &Agreement, new_us: u64, old_us: u64) -> Report {
    Report {
        baseline: 1,
        samples: 1,
        rows: a.rows,
        min_cosine: a.min_cosine,
        top1: a.top1(),
        max_abs_diff: a.max_abs_diff,
        new_time: Duration::from_micros(new_us),
        old_time: Duration::from_micros(old_us),
        failures: Vec::new(),
    }
}

#[test]
fn equal_answers_agree_fully() {
    let mut a = Agreement::default();
    let x = t("y", vec![2, 3], &[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]);
    a.add(std::slice::from_ref(&x), std::slice::from_ref(&x))
        .unwrap();
    assert_eq!(a.rows, 2);
    assert_eq!(a.top1(), 1.0);
    assert!((a.min_cosine - 1.0).abs() < 1e-12);
    assert_eq!(a.max_abs_diff, 0.0);
}

#[test]
fn rows_are_the_last_axis() {
    let mut a = Agreement::default();
    // Row 0 keeps its arg-max and direction; row 1's arg-max moves and it points elsewhere.
    let new = t("y", vec![2, 2], &[2.0, 1.0, 0.0, 1.0]);
    let old = t("y", vec![2, 2], &[4.0, 2.0, 1.0, 0.0]);
    a.add(&[new], &[old]).unwrap();
    assert_eq!((a.rows, a.agreeing), (2, 1));
    assert_eq!(a.top1(), 0.5);
    assert!(a.min_cosine.abs() < 1e-12, "{}", a.min_cosine);
    assert_eq!(a.max_abs_diff, 2.0);
    let g = Gate {
        min_cosine: Some(0.99),
        min_top1: Some(0.9),
        max_abs_diff: Some(0.5),
        ..gate()
    };
    let broken = broken_bounds(&g, &report(&a, 10, 10));
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(broken[0].contains(MIN_COSINE_KEY) && broken[1].contains(MIN_TOP1_KEY));
    assert!(broken[2].contains(MAX_ABS_DIFF_KEY));
}

#[test]
fn a_difference_of_kind_is_an_error_naming_the_output() {
    let mut a = Agreement::default();
    let x = t("y", vec![1, 2], &[1.0, 2.0]);
    let wide = t("y", vec![1, 3], &[1.0, 2.0, 3.0]);
    assert!(a
        .add(&[wide], std::slice::from_ref(&x))
        .unwrap_err()
        .contains("shape"));
    let other = t("z", vec![1, 2], &[1.0, 2.0]);
    assert!(a
        .add(&[other], std::slice::from_ref(&x))
        .unwrap_err()
        .contains("'y' is missing"));
    let s = |v: &[&str]| Tensor::from_strings("s", vec![v.len() as i64], v.iter()).unwrap();
    assert!(a.add(&[s(&["a", "b"])], &[s(&["a", "b"])]).is_ok());
    assert!(a
        .add(&[s(&["a", "c"])], &[s(&["a", "b"])])
        .unwrap_err()
        .contains("1 of 2 strings differ"));
    assert!(a
        .add(&[s(&["a", "b"])], &[t("s", vec![2], &[1.0, 2.0])])
        .is_err());
}

#[test]
fn a_nan_fails_every_bound_it_touches() {
    let mut a = Agreement::default();
    a.add(
        &[t("y", vec![1, 2], &[f32::NAN, 1.0])],
        &[t("y", vec![1, 2], &[0.5, 1.0])],
    )
    .unwrap();
    let g = Gate {
        min_cosine: Some(-1.0),
        max_abs_diff: Some(1e9),
        ..gate()
    };
    let broken = broken_bounds(&g, &report(&a, 1, 1));
    assert_eq!(broken.len(), 2, "{broken:?}");
    // Both NaN where the baseline is NaN: the same answer.
    let mut same = Agreement::default();
    let y = t("y", vec![1, 2], &[f32::NAN, 1.0]);
    same.add(std::slice::from_ref(&y), std::slice::from_ref(&y))
        .unwrap();
    assert_eq!(same.max_abs_diff, 0.0);
}

#[test]
fn latency_is_judged_as_a_ratio() {
    let a = Agreement::default();
    let g = Gate {
        max_latency_ratio: Some(1.5),
        ..gate()
    };
    assert!(broken_bounds(&g, &report(&a, 140, 100)).is_empty());
    let broken = broken_bounds(&g, &report(&a, 160, 100));
    assert!(broken[0].contains("1.60×"), "{broken:?}");
    assert_eq!(report(&a, 5, 0).latency_ratio(), 1.0);
}

#[test]
fn argmax_takes_the_first_largest_and_skips_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
    assert_eq!(argmax(&[f64::NAN, 0.5]), Some(1));
    assert_eq!(argmax(&[]), None);
}
