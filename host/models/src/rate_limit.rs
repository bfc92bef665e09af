//! Each instance's `instance_group { rate_limiter { resources [...] priority } }`, read from a
//! model's config for the server's rate limiter ([`wisp_scheduler::rate_limit`]).

use serde_json::Value;
use wisp_core::config::ModelConfig;
use wisp_core::{Error, Result};
use wisp_scheduler::rate_limit::{Needs, MAX_PRIORITY, MAX_RESOURCE_COUNT};

/// What each instance of `cfg` needs, in start order (groups in order, `count` each).
pub fn instance_needs(cfg: &ModelConfig) -> Result<Vec<Needs>> {
    let mut out = Vec::with_capacity(cfg.instance_count());
    for (i, g) in cfg.instance_group.iter().enumerate() {
        let needs = match g.other.get("rate_limiter") {
            Some(v) => group_needs(v).map_err(|why| {
                Error::invalid(format!(
                    "model '{}': instance_group[{i}].rate_limiter: {why}",
                    cfg.name
                ))
            })?,
            None => Needs::default(),
        };
        out.extend(std::iter::repeat_n(needs, g.count.max(0) as usize));
    }
    Ok(out)
}

fn group_needs(v: &Value) -> std::result::Result<Needs, String> {
    let count = |v: Option<&Value>, what: &str, max: u64| -> std::result::Result<u64, String> {
        match v {
            None => Ok(0),
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{what} must be an integer in 0..={max}")),
        }
    };
    let mut needs = Needs {
        resources: Vec::new(),
        priority: count(v.get("priority"), "priority", MAX_PRIORITY)?,
    };
    let resources = match v.get("resources") {
        None => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("resources must be a list".into()),
    };
    for (j, r) in resources.iter().enumerate() {
        let name = r
            .get("name")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("resources[{j}] needs a name"))?;
        let n = count(
            r.get("count"),
            &format!("resources[{j}].count"),
            MAX_RESOURCE_COUNT,
        )?;
        if needs.resources.iter().any(|(have, _)| have == name) {
            return Err(format!("resource '{name}' is listed twice"));
        }
        if n > 0 {
            needs.resources.push((name.to_string(), n));
        }
    }
    Ok(needs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::config::{normalize, parse_pbtxt};

    fn config(groups: &str) -> ModelConfig {
        let text = format!(
            "name: \"m\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 0\n\
             input [ {{ name: \"x\" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n\
             output [ {{ name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n{groups}"
        );
        let mut c = parse_pbtxt("m", &text).unwrap();
        normalize(&mut c, "m", std::path::Path::new("/nonexistent"));
        c
    }

    #[test]
    fn each_instance_gets_its_groups_resources_and_priority() {
        let c = config(
            "instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ \
             { name: \"R1\" count: 4 }, { name: \"R2\" global: true count: 1 } ] priority: 2 } }, \
             { count: 1 kind: KIND_CPU } ]",
        );
        let needs = instance_needs(&c).unwrap();
        assert_eq!(needs.len(), 3);
        assert_eq!(needs[0].resources, vec![("R1".into(), 4), ("R2".into(), 1)]);
        assert_eq!(needs[0].priority, 2);
        assert_eq!(needs[1], needs[0]);
        assert_eq!(needs[2], Needs::default());
    }

    #[test]
    fn bad_resources_are_refused_naming_the_field() {
        for (groups, why) in [
            (
                "instance_group [ { count: 1 rate_limiter { resources [ { count: 1 } ] } } ]",
                "resources[0] needs a name",
            ),
            (
                "instance_group [ { count: 1 rate_limiter { resources [ { name: \"R\" count: 4000000000 } ] } } ]",
                "resources[0].count must be an integer",
            ),
            (
                "instance_group [ { count: 1 rate_limiter { resources [ { name: \"R\" count: 1 }, { name: \"R\" count: 2 } ] } } ]",
                "listed twice",
            ),
        ] {
            let e = instance_needs(&config(groups)).unwrap_err();
            assert!(e.message().contains("instance_group[0].rate_limiter"), "{e}");
            assert!(e.message().contains(why), "{e}");
        }
    }
}
