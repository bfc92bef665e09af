//! The HTTP route table: every route this server answers, with the methods it accepts and the
//! restricted-API group it belongs to, in one list.
//!
//! A request's path is matched against [`TABLE`] once. The match gives `dispatch` its handler
//! ([`Kind`]), its methods (any other is answered 405 with `Allow`, after the group's check, as
//! in Triton) and its group, so a route cannot be added to the handlers and not to the
//! restrictions. Model names are read by position: a model may be named after any word the
//! table gives a meaning to ([`route_words`]) and keeps the groups of the routes it is reached
//! through. `docs/operations.md` carries the table as [`markdown`] writes it; a test keeps the
//! two equal.

use crate::restricted::ApiGroup;

/// What a route does: the handler `dispatch` calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Server metadata.
    ServerMetadata,
    /// Liveness.
    Live,
    /// Server readiness.
    ServerReady,
    /// Every model's statistics.
    AllStats,
    /// A model's (or a version's) metadata.
    ModelMetadata,
    /// A model's readiness.
    ModelReady,
    /// A model's configuration.
    ModelConfig,
    /// A model's statistics.
    ModelStats,
    /// KServe v2 inference.
    Infer,
    /// Triton's generate extension.
    Generate,
    /// Triton's generate extension, streamed as server-sent events.
    GenerateStream,
    /// A model's trace settings.
    ModelTrace,
    /// The global trace settings.
    Trace,
    /// Log settings.
    Logging,
    /// The repository index.
    RepositoryIndex,
    /// Load a model.
    Load,
    /// Unload a model.
    Unload,
    /// System shared memory status.
    ShmStatus,
    /// Register a system shared memory region.
    ShmRegister,
    /// Unregister one region or all.
    ShmUnregister,
    /// CUDA shared memory: refused, this server has no CUDA.
    CudaShm,
    /// OpenAI's embeddings.
    Embeddings,
    /// OpenAI's model list.
    OpenAiModels,
    /// One OpenAI model.
    OpenAiModel,
}

/// One row of the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The path's segments: literals, placeholders ([`M`], [`V`], [`R`], [`REGION`], [`ID`])
    /// and a final [`REST`] for any remainder.
    pub path: &'static [&'static str],
    /// The methods accepted, as the `Allow` header lists them.
    pub allow: &'static str,
    /// The restricted-API group.
    pub group: ApiGroup,
    /// The handler.
    pub kind: Kind,
}

/// Placeholder: a model's name.
pub const M: &str = "{m}";
/// Placeholder: a version.
pub const V: &str = "{v}";
/// Placeholder: a repository's name.
pub const R: &str = "{r}";
/// Placeholder: a shared memory region's name.
pub const REGION: &str = "{region}";
/// Placeholder: an OpenAI model id.
pub const ID: &str = "{id}";
/// Any remainder, however many segments (last only).
pub const REST: &str = "*";

impl Entry {
    /// The path as the docs show it: `/v2/models/{m}/infer`.
    pub fn pattern(&self) -> String {
        format!("/{}", self.path.join("/"))
    }

    /// Whether `method` (e.g. `GET`) is one this route accepts.
    pub fn allows(&self, method: &str) -> bool {
        self.allow.split(", ").any(|m| m == method)
    }

    /// Whether errors on this route take OpenAI's shape.
    pub fn openai(&self) -> bool {
        self.path.first() == Some(&"v1")
    }
}

const fn row(
    path: &'static [&'static str],
    allow: &'static str,
    group: ApiGroup,
    kind: Kind,
) -> Entry {
    Entry {
        path,
        allow,
        group,
        kind,
    }
}

use ApiGroup as G;

/// Every HTTP route, first match wins (`/v2/models/stats` before a model named `stats`).
pub static TABLE: &[Entry] = &[
    row(&["v2"], "GET", G::Metadata, Kind::ServerMetadata),
    row(&["v2", "health", "live"], "GET", G::Health, Kind::Live),
    row(
        &["v2", "health", "ready"],
        "GET",
        G::Health,
        Kind::ServerReady,
    ),
    row(
        &["v2", "models", "stats"],
        "GET",
        G::Statistics,
        Kind::AllStats,
    ),
    row(
        &["v2", "models", M],
        "GET",
        G::Metadata,
        Kind::ModelMetadata,
    ),
    row(
        &["v2", "models", M, "versions", V],
        "GET",
        G::Metadata,
        Kind::ModelMetadata,
    ),
    row(
        &["v2", "models", M, "ready"],
        "GET",
        G::Health,
        Kind::ModelReady,
    ),
    row(
        &["v2", "models", M, "versions", V, "ready"],
        "GET",
        G::Health,
        Kind::ModelReady,
    ),
    row(
        &["v2", "models", M, "config"],
        "GET",
        G::ModelConfig,
        Kind::ModelConfig,
    ),
    row(
        &["v2", "models", M, "versions", V, "config"],
        "GET",
        G::ModelConfig,
        Kind::ModelConfig,
    ),
    row(
        &["v2", "models", M, "stats"],
        "GET",
        G::Statistics,
        Kind::ModelStats,
    ),
    row(
        &["v2", "models", M, "versions", V, "stats"],
        "GET",
        G::Statistics,
        Kind::ModelStats,
    ),
    row(
        &["v2", "models", M, "infer"],
        "POST",
        G::Inference,
        Kind::Infer,
    ),
    row(
        &["v2", "models", M, "versions", V, "infer"],
        "POST",
        G::Inference,
        Kind::Infer,
    ),
    row(
        &["v2", "models", M, "generate"],
        "POST",
        G::Inference,
        Kind::Generate,
    ),
    row(
        &["v2", "models", M, "versions", V, "generate"],
        "POST",
        G::Inference,
        Kind::Generate,
    ),
    row(
        &["v2", "models", M, "generate_stream"],
        "POST",
        G::Inference,
        Kind::GenerateStream,
    ),
    row(
        &["v2", "models", M, "versions", V, "generate_stream"],
        "POST",
        G::Inference,
        Kind::GenerateStream,
    ),
    row(
        &["v2", "models", M, "trace", "setting"],
        "GET, POST",
        G::Trace,
        Kind::ModelTrace,
    ),
    row(
        &["v2", "trace", "setting"],
        "GET, POST",
        G::Trace,
        Kind::Trace,
    ),
    row(&["v2", "logging"], "GET, POST", G::Logging, Kind::Logging),
    row(
        &["v2", "repository", "index"],
        "POST",
        G::ModelRepository,
        Kind::RepositoryIndex,
    ),
    row(
        &["v2", "repository", R, "index"],
        "POST",
        G::ModelRepository,
        Kind::RepositoryIndex,
    ),
    row(
        &["v2", "repository", "models", M, "load"],
        "POST",
        G::ModelRepository,
        Kind::Load,
    ),
    row(
        &["v2", "repository", R, "models", M, "load"],
        "POST",
        G::ModelRepository,
        Kind::Load,
    ),
    row(
        &["v2", "repository", "models", M, "unload"],
        "POST",
        G::ModelRepository,
        Kind::Unload,
    ),
    row(
        &["v2", "repository", R, "models", M, "unload"],
        "POST",
        G::ModelRepository,
        Kind::Unload,
    ),
    row(
        &["v2", "systemsharedmemory", "status"],
        "GET",
        G::SharedMemory,
        Kind::ShmStatus,
    ),
    row(
        &["v2", "systemsharedmemory", "region", REGION, "status"],
        "GET",
        G::SharedMemory,
        Kind::ShmStatus,
    ),
    row(
        &["v2", "systemsharedmemory", "region", REGION, "register"],
        "POST",
        G::SharedMemory,
        Kind::ShmRegister,
    ),
    row(
        &["v2", "systemsharedmemory", "unregister"],
        "POST",
        G::SharedMemory,
        Kind::ShmUnregister,
    ),
    row(
        &["v2", "systemsharedmemory", "region", REGION, "unregister"],
        "POST",
        G::SharedMemory,
        Kind::ShmUnregister,
    ),
    row(
        &["v2", "cudasharedmemory", REST],
        "GET, POST",
        G::SharedMemory,
        Kind::CudaShm,
    ),
    row(
        &["v1", "embeddings"],
        "POST",
        G::Inference,
        Kind::Embeddings,
    ),
    row(&["v1", "models"], "GET", G::Inference, Kind::OpenAiModels),
    row(
        &["v1", "models", ID],
        "GET",
        G::Inference,
        Kind::OpenAiModel,
    ),
];

/// What a matched path names. A field the route's pattern does not hold is empty (`None`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Params<'a> {
    /// `{m}`.
    pub model: &'a str,
    /// `{v}`.
    pub version: Option<&'a str>,
    /// `{r}`; empty: the server's own repositories.
    pub repository: &'a str,
    /// `{region}`.
    pub region: Option<&'a str>,
    /// `{id}`.
    pub id: &'a str,
}

/// The entry and parameters of a path given as its segments after the leading `/` (`None`:
/// no route; [`not_found`] says why).
pub fn find<'a>(segs: &[&'a str]) -> Option<(&'static Entry, Params<'a>)> {
    TABLE
        .iter()
        .find_map(|e| matches(e.path, segs).map(|p| (e, p)))
}

fn matches<'a>(path: &[&str], segs: &[&'a str]) -> Option<Params<'a>> {
    let (fixed, rest) = match path.split_last() {
        Some((&REST, fixed)) => (fixed, true),
        _ => (path, false),
    };
    // Most rows are refused by their length alone.
    if segs.len() < fixed.len() || (!rest && segs.len() != fixed.len()) {
        return None;
    }
    let mut params = Params::default();
    for (&part, &seg) in fixed.iter().zip(segs) {
        match part {
            M => params.model = seg,
            V => params.version = Some(seg),
            R => params.repository = seg,
            REGION => params.region = Some(seg),
            ID => params.id = seg,
            literal if literal == seg => {}
            _ => return None,
        }
    }
    Some(params)
}

/// Why a path is no route: the 404's message, in the words the router has always used for the
/// family of routes the path is nearest to. `true` with it: answer in OpenAI's error shape.
pub fn not_found(segs: &[&str], method: &str, path: &str) -> (String, bool) {
    let message = match segs {
        ["v1", ..] => {
            let message = format!(
                "no route for {method} {path}: this server implements /v1/embeddings and /v1/models"
            );
            return (message, true);
        }
        ["v2", "models", _, action] | ["v2", "models", _, "versions", _, action] => {
            format!("unknown model action '{action}'")
        }
        ["v2", "models", _, ..] => "no such model route".into(),
        ["v2", "systemsharedmemory", action]
        | ["v2", "systemsharedmemory", "region", _, action] => {
            format!("unknown shared memory action '{action}'")
        }
        ["v2", "systemsharedmemory", ..] => "no such shared memory route".into(),
        ["v2", "repository", ..] => "no such repository route".into(),
        _ => format!("no route for {method} {path}"),
    };
    (message, false)
}

/// Every word the table gives a meaning to after `/v2/models/`: a model may be named after any
/// of them (tests load such models).
pub fn route_words() -> Vec<&'static str> {
    let mut words: Vec<&'static str> = TABLE
        .iter()
        .filter_map(|e| e.path.strip_prefix(&["v2", "models"][..]))
        .flatten()
        .copied()
        .filter(|w| ![M, V, R, REGION, ID, REST].contains(w))
        .collect();
    words.sort_unstable();
    words.dedup();
    words
}

/// The table as `docs/operations.md` shows it.
pub fn markdown() -> String {
    let mut out = String::from("| route | methods | group |\n|---|---|---|\n");
    for e in TABLE {
        out.push_str(&format!(
            "| `{}` | {} | `{}` |\n",
            e.pattern(),
            e.allow,
            e.group.name()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find_path(path: &str) -> Option<(&'static Entry, Params<'_>)> {
        let segs: Vec<&str> = path.split('/').skip(1).collect();
        find(&segs)
    }

    #[test]
    fn every_row_is_reachable_and_reads_its_placeholders() {
        for (n, e) in TABLE.iter().enumerate() {
            let path = e
                .pattern()
                .replace("{m}", "mod")
                .replace("{v}", "3")
                .replace("{r}", "repo")
                .replace("{region}", "reg")
                .replace("{id}", "emb")
                .replace('*', "status");
            let (got, params) = find_path(&path).unwrap_or_else(|| panic!("{path}"));
            assert!(
                std::ptr::eq(got, &TABLE[n]),
                "{path} is shadowed by {got:?}"
            );
            let has = |p: &str| e.path.contains(&p);
            assert_eq!(params.model, if has("{m}") { "mod" } else { "" });
            assert_eq!(params.version, has("{v}").then_some("3"));
            assert_eq!(params.repository, if has("{r}") { "repo" } else { "" });
            assert_eq!(params.region, has("{region}").then_some("reg"));
            assert_eq!(params.id, if has("{id}") { "emb" } else { "" });
        }
    }

    #[test]
    fn routes_map_to_triton_groups() {
        use ApiGroup::*;
        for (path, group) in [
            ("/v2", Some(Metadata)),
            ("/v2/health/live", Some(Health)),
            ("/v2/models/m/ready", Some(Health)),
            ("/v2/models/m/versions/1/ready", Some(Health)),
            ("/v2/models/m", Some(Metadata)),
            ("/v2/models/m/versions/2", Some(Metadata)),
            ("/v2/models/m/infer", Some(Inference)),
            ("/v2/models/m/config", Some(ModelConfig)),
            ("/v2/models/m/stats", Some(Statistics)),
            ("/v2/models/stats", Some(Statistics)),
            ("/v2/repository/index", Some(ModelRepository)),
            ("/v2/repository/models/m/load", Some(ModelRepository)),
            ("/v2/logging", Some(Logging)),
            ("/v2/trace/setting", Some(Trace)),
            ("/v2/systemsharedmemory/status", Some(SharedMemory)),
            ("/v2/cudasharedmemory/region/r/register", Some(SharedMemory)),
            ("/v1/embeddings", Some(Inference)),
            ("/v1/models", Some(Inference)),
            ("/v1/models/m", Some(Inference)),
            ("/v2/models/m/trace/setting", Some(Trace)),
            ("/v2/health/other", None),
            ("/v2/models/m/frobnicate", None),
            ("/v1/chat/completions", None),
            ("/v3", None),
        ] {
            assert_eq!(find_path(path).map(|(e, _)| e.group), group, "{path}");
        }
    }

    #[test]
    fn models_named_after_route_words_are_read_by_position() {
        let words = route_words();
        assert_eq!(
            words,
            [
                "config",
                "generate",
                "generate_stream",
                "infer",
                "ready",
                "setting",
                "stats",
                "trace",
                "versions"
            ]
        );
        for word in words {
            let route = |path: String| {
                let (e, p) = find_path(&path).unwrap_or_else(|| panic!("{path}"));
                (e.kind, p.model.to_string(), p.version.map(str::to_string))
            };
            let want = |kind, model: &str, version: Option<&str>| {
                (kind, model.to_string(), version.map(str::to_string))
            };
            // `/v2/models/stats` is every model's statistics (as in Triton, whatever is loaded).
            let bare = if word == "stats" {
                want(Kind::AllStats, "", None)
            } else {
                want(Kind::ModelMetadata, word, None)
            };
            assert_eq!(route(format!("/v2/models/{word}")), bare);
            for (action, kind) in [
                ("ready", Kind::ModelReady),
                ("infer", Kind::Infer),
                ("config", Kind::ModelConfig),
                ("stats", Kind::ModelStats),
            ] {
                assert_eq!(
                    route(format!("/v2/models/{word}/{action}")),
                    want(kind, word, None)
                );
                assert_eq!(
                    route(format!("/v2/models/{word}/versions/1/{action}")),
                    want(kind, word, Some("1"))
                );
            }
            assert_eq!(
                route(format!("/v2/models/m/versions/{word}")),
                want(Kind::ModelMetadata, "m", Some(word))
            );
            assert_eq!(
                route(format!("/v2/models/{word}/trace/setting")),
                want(Kind::ModelTrace, word, None)
            );
        }
    }

    #[test]
    fn a_miss_is_named_after_its_nearest_routes() {
        for (path, message, openai) in [
            (
                "/v2/models/m/frobnicate",
                "unknown model action 'frobnicate'",
                false,
            ),
            (
                "/v2/models/m/versions",
                "unknown model action 'versions'",
                false,
            ),
            (
                "/v2/models/m/versions/1/x",
                "unknown model action 'x'",
                false,
            ),
            ("/v2/models/m/a/b/c/d", "no such model route", false),
            (
                "/v2/systemsharedmemory/x",
                "unknown shared memory action 'x'",
                false,
            ),
            (
                "/v2/systemsharedmemory/a/b",
                "no such shared memory route",
                false,
            ),
            ("/v2/repository/x", "no such repository route", false),
            ("/v2/health/x", "no route for GET /v2/health/x", false),
            (
                "/v1/chat/completions",
                "no route for GET /v1/chat/completions: this server implements",
                true,
            ),
        ] {
            let segs: Vec<&str> = path.split('/').skip(1).collect();
            assert!(find(&segs).is_none(), "{path}");
            let (got, shape) = not_found(&segs, "GET", path);
            assert!(got.starts_with(message), "{path}: {got}");
            assert_eq!(shape, openai, "{path}");
        }
    }

    #[test]
    fn methods_are_listed_as_allow_lists_them() {
        let logging = find_path("/v2/logging").unwrap().0;
        assert!(logging.allows("GET") && logging.allows("POST") && !logging.allows("PUT"));
        for e in TABLE {
            for m in e.allow.split(", ") {
                assert!(["GET", "POST"].contains(&m), "{:?}: {}", e.path, e.allow);
            }
        }
    }

    /// The operator's guide shows the table as it is.
    #[test]
    fn operations_guide_holds_the_table() {
        let doc = include_str!("../../../../docs/operations.md");
        let table = markdown();
        assert!(
            doc.contains(&table),
            "docs/operations.md must hold the route table as route::markdown() writes it:\n{table}"
        );
    }
}
