//! `route`: steers an ensemble by leaving outputs unset.
//!
//! Input `CONTENT` (any datatype) is passed unchanged to the one output whose route lists the
//! request's `LABEL` (BYTES, one element per row), and every other output is left unset, so an
//! ensemble runs only the branch that reads the output that was set. Routes are parameters
//! `route.<OUTPUT>` = comma-separated labels; a label no route lists sets no output (nothing
//! downstream runs). Parameters `input` and `by` rename `CONTENT` and `LABEL`.

use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// The plugin's routes.
pub struct Route {
    input: String,
    by: String,
    /// (output, labels routed to it), in config order.
    routes: Vec<(String, Vec<String>)>,
}

impl Route {
    /// The output `label` routes to, if any.
    fn output_for(&self, label: &[u8]) -> Option<&str> {
        let label = std::str::from_utf8(label).ok()?.trim();
        self.routes
            .iter()
            .find(|(_, labels)| labels.iter().any(|l| l == label))
            .map(|(o, _)| o.as_str())
    }
}

impl Plugin for Route {
    fn init(params: &Params) -> Result<Self, Error> {
        let mut routes: Vec<(String, Vec<String>)> = Vec::new();
        for (key, value) in params.iter() {
            let Some(output) = key.strip_prefix("route.") else {
                continue;
            };
            if output.is_empty() {
                return Err(Error::invalid("parameter 'route.': names no output"));
            }
            let labels: Vec<String> = value
                .split(',')
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect();
            for l in &labels {
                if let Some((other, _)) = routes.iter().find(|(_, ls)| ls.contains(l)) {
                    return Err(Error::invalid(format!(
                        "parameter '{key}': label '{l}' is already routed to '{other}'"
                    )));
                }
            }
            routes.push((output.to_string(), labels));
        }
        if routes.is_empty() {
            return Err(Error::invalid(
                "no routes: set parameters 'route.<OUTPUT>' to comma-separated labels",
            ));
        }
        Ok(Route {
            input: params.get("input").unwrap_or("CONTENT").to_string(),
            by: params.get("by").unwrap_or("LABEL").to_string(),
            routes,
        })
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let content = request.input(&self.input)?;
        let labels = request.input(&self.by)?.strings()?;
        // One request goes one way: its rows must agree (send mixed files separately).
        let mut chosen: Option<Option<&str>> = None;
        for label in &labels {
            let out = self.output_for(label);
            match chosen {
                None => chosen = Some(out),
                Some(c) if c != out => {
                    return Err(Error::invalid(format!(
                        "the rows of one request route to different outputs ({} and {}): send them as separate requests",
                        c.unwrap_or("none"),
                        out.unwrap_or("none")
                    )))
                }
                Some(_) => {}
            }
        }
        let outputs = match chosen.flatten() {
            Some(output) => vec![Tensor {
                name: output.to_string(),
                ..content.clone()
            }],
            None => Vec::new(),
        };
        Ok(Response::new(outputs))
    }
}

wisp_sdk::export_plugin!(Route);

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Route {
        Route::init(&Params::from_pairs(&[
            ("route.TEXT", "txt, markdown, python"),
            ("route.IMAGE", "png,jpeg"),
        ]))
        .unwrap()
    }

    fn request(labels: &[&str]) -> Request {
        let n = labels.len() as i64;
        Request::new(vec![
            Tensor::from_strings("CONTENT", vec![n, 1], labels.iter().map(|_| b"bytes")),
            Tensor::from_strings("LABEL", vec![n, 1], labels.iter().copied()),
        ])
    }

    #[test]
    fn sets_only_the_output_the_label_routes_to() {
        let mut r = route();
        let out = r.execute(&request(&["markdown"])).unwrap();
        assert_eq!(out.outputs.len(), 1);
        let text = out.output("TEXT").unwrap();
        assert_eq!(text.shape, vec![1, 1]);
        assert_eq!(text.strings().unwrap(), vec![&b"bytes"[..]]);
        let out = r.execute(&request(&["png", "png"])).unwrap();
        assert!(out.output("IMAGE").is_some() && out.output("TEXT").is_none());
    }

    #[test]
    fn an_unrouted_label_sets_nothing() {
        let out = route().execute(&request(&["pdf"])).unwrap();
        assert!(out.outputs.is_empty());
    }

    #[test]
    fn rows_that_disagree_are_refused() {
        let e = route().execute(&request(&["png", "txt"])).unwrap_err();
        assert!(e.message.contains("IMAGE and TEXT"), "{}", e.message);
    }

    #[test]
    fn bad_routes_are_refused_at_init() {
        assert!(Route::init(&Params::default()).is_err());
        let e = Route::init(&Params::from_pairs(&[("route.A", "x"), ("route.B", "x")]))
            .err()
            .unwrap();
        assert!(e.message.contains("already routed to 'A'"), "{}", e.message);
    }
}
