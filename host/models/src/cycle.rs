//! Ensembles that would call themselves: found before a load, and again when the loaded
//! entry is swapped in.
//!
//! An ensemble's instance waits for its steps. A step that leads back to the ensemble would
//! wait for an instance that waits for it, so a request would never be answered, and the
//! version could never drain. Triton refuses such a load ("circular dependency between
//! ensembles"); so does the registry, naming the whole path.

use std::collections::HashSet;

use super::MAX_ENSEMBLE_DEPTH;

/// The first cycle reachable from `root`, as the models along it with its first model repeated
/// at the end (`["a", "b", "a"]`); `next` gives the models a model's steps call (none for a
/// model that is not an ensemble). Looks at most [`MAX_ENSEMBLE_DEPTH`] levels deep, as deep as
/// loading goes.
pub(crate) fn find(root: &str, mut next: impl FnMut(&str) -> Vec<String>) -> Option<Vec<String>> {
    let mut path = vec![root.to_string()];
    let mut done = HashSet::new();
    let mut stack = vec![next(root).into_iter()];
    while let Some(children) = stack.last_mut() {
        let Some(child) = children.next() else {
            stack.pop();
            if let Some(left) = path.pop() {
                done.insert(left);
            }
            continue;
        };
        if let Some(start) = path.iter().position(|m| *m == child) {
            let mut cycle = path[start..].to_vec();
            cycle.push(child);
            return Some(cycle);
        }
        if done.contains(&child) || path.len() > MAX_ENSEMBLE_DEPTH {
            continue;
        }
        stack.push(next(&child).into_iter());
        path.push(child);
    }
    None
}

/// The refusal's words: Triton's, then the whole path.
pub(crate) fn message(cycle: &[String]) -> String {
    format!(
        "circular dependency between ensembles: {}",
        cycle.join(" -> ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph<'a>(edges: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Vec<String> + 'a {
        move |m| {
            edges
                .iter()
                .filter(|(from, _)| *from == m)
                .map(|(_, to)| to.to_string())
                .collect()
        }
    }

    #[test]
    fn a_step_calling_its_own_ensemble_is_a_cycle() {
        assert_eq!(find("a", graph(&[("a", "a")])).unwrap(), ["a", "a"]);
        assert_eq!(
            message(&find("a", graph(&[("a", "b"), ("b", "a")])).unwrap()),
            "circular dependency between ensembles: a -> b -> a"
        );
    }

    #[test]
    fn a_cycle_further_down_is_named_from_where_it_starts() {
        let edges = [("a", "x"), ("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")];
        assert_eq!(find("a", graph(&edges)).unwrap(), ["b", "c", "d", "b"]);
    }

    #[test]
    fn shared_steps_are_not_cycles() {
        // A diamond: two steps calling the same model.
        let edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "m")];
        assert_eq!(find("a", graph(&edges)), None);
        assert_eq!(find("m", graph(&edges)), None);
    }

    #[test]
    fn the_search_stops_at_the_loaders_depth() {
        // A chain deeper than loading goes, closing on itself at the end: not followed.
        let names: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
        let mut edges: Vec<(&str, &str)> = names
            .windows(2)
            .map(|w| (w[0].as_str(), w[1].as_str()))
            .collect();
        edges.push(("m39", "m38"));
        let mut calls = 0;
        let mut next = graph(&edges);
        assert_eq!(
            find("m0", |m| {
                calls += 1;
                next(m)
            }),
            None
        );
        assert!(calls <= MAX_ENSEMBLE_DEPTH + 2, "{calls}");
    }
}
