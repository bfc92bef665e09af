"""The deployment artefacts in deploy/, validated offline.

- Kubernetes objects against the Kubernetes 1.37 JSON schemas that the `kubernetes-validate`
  package bundles, strictly (an unknown field fails).
- KServe objects against KServe's own API types, as its Python SDK (`kserve`, installed without
  its dependencies, never imported) declares them: every field name and type, down to the
  Kubernetes types inside (a Container), which are checked against the same Kubernetes schemas.
- What ties them together: the probes, ports and shutdown timing against what `wisp serve`
  actually does, and the HPA's metric against the adapter rule that serves it.
"""
import ast
import glob
import importlib.util
import json
import os
import re
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml

from conftest import ROOT, wisp_command

DEPLOY = os.path.join(ROOT, "deploy")
K8S_VERSION = "1.37.0"


def documents(pattern):
    out = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, pattern))):
        with open(path) as f:
            out += [(os.path.basename(path), d) for d in yaml.safe_load_all(f) if d]
    return out


def by_kind(kind):
    found = [d for _, d in documents("*/*.yaml") if d["kind"] == kind]
    assert found, f"no {kind} in deploy/"
    return found


# --- Kubernetes ---------------------------------------------------------------------------

def test_kubernetes_objects_fit_the_schemas_strictly():
    checked = []
    for name, doc in documents("kubernetes/*.yaml"):
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a Prometheus Operator CRD: checked below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked.append(doc["kind"])
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ConfigMap"} <= set(checked)


def test_a_schema_violation_is_caught():
    (deployment,) = by_kind("Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def args_of(container):
    return dict(a.split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)


def check_deployment(deployment, service, monitor):
    """What the objects must agree on with each other and with what `wisp serve` does."""
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = args_of(c)
    # Shutdown: endpoints drop the pod (preStop), then Wisp finishes in-flight requests for up
    # to --exit-timeout-secs; the grace period must cover both.
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + int(args["--exit-timeout-secs"]) + 5
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert set(ports) == {"http", "grpc", "metrics"}
    for name, flag, default in (("http", "--http-port", 8000), ("grpc", "--grpc-port", 8001),
                                ("metrics", "--metrics-port", 8002)):
        assert ports[name] == int(args.get(flag, default)), f"{name}: the port wisp listens on"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    repo = args["--model-repository"]
    if re.match(r"^(s3|gs|as|az)://", repo):
        cache = args["--repository-cache-dir"]
        assert any(cache.startswith(m) for m in mounts), "the mirror is on a volume"
    else:
        assert repo in mounts, "the repository is mounted"
    wasm = args["--wasm-cache-dir"]
    (cache_mount,) = [m for m in mounts if wasm.startswith(m)]
    assert "emptyDir" in volumes[mounts[cache_mount]], "the plugin cache is an emptyDir"
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    if monitor is not None:
        assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


def test_deployment_matches_what_wisp_does():
    ((deployment,), (service,), (monitor,)) = (by_kind("Deployment"), by_kind("Service"),
                                               by_kind("ServiceMonitor"))
    check_deployment(deployment, service, monitor)


def test_the_hpa_metric_is_the_adapters_and_wisps():
    (hpa,) = by_kind("HorizontalPodAutoscaler")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    (adapter,) = [d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "adapter-config"]
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert any(r["name"]["as"] == metric for r in rules)
    series = re.match(r"(\w+)", rules[0]["seriesQuery"]).group(1)
    with open(os.path.join(ROOT, "host", "server", "src", "metrics.rs")) as f:
        assert f'"{series}"' in f.read(), f"Wisp exports no {series}"


# --- KServe -------------------------------------------------------------------------------

def kserve_types():
    """KServe's API types from its SDK's generated models: class -> {json key: type}."""
    spec = importlib.util.find_spec("kserve")
    assert spec is not None, "the kserve SDK is not installed (./dev test installs it)"
    models = os.path.join(spec.submodule_search_locations[0], "models")
    types = {}
    for path in glob.glob(os.path.join(models, "v*.py")):
        tree = ast.parse(open(path).read())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            found = {}
            for node in cls.body:
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    if node.targets[0].id in ("openapi_types", "attribute_map"):
                        found[node.targets[0].id] = ast.literal_eval(node.value)
            if len(found) == 2:
                types[cls.name] = {found["attribute_map"][a]: t
                                   for a, t in found["openapi_types"].items()}
    assert "V1alpha1ServingRuntimeSpec" in types
    return types


def k8s_validator():
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                        f"v{K8S_VERSION}-local-strict", "_definitions.json")
    defs = json.load(open(base))
    registry = referencing.Registry().with_resource(
        defs["$id"], referencing.Resource.from_contents(defs))
    names = {}
    for key in defs["$defs"]:
        m = re.search(r"\.(v\d\w*)\.(\w+)$", key)
        if m:
            names.setdefault(m.group(1).capitalize() + m.group(2), []).append(key)

    def validate(value, sdk_type, path):
        keys = names.get(sdk_type, [])
        keys.sort(key=lambda k: not k.startswith("io.k8s.api.core."))
        assert keys, f"{path}: no Kubernetes schema for {sdk_type}"
        schema = {"$id": "https://kubernetes.io/api/check.json",
                  "$ref": f"/api/_definitions.json#/$defs/{keys[0]}"}
        try:
            jsonschema.Draft202012Validator(schema, registry=registry).validate(value)
        except jsonschema.ValidationError as e:
            raise AssertionError(f"{path}: {e.message}") from None

    return validate


def check_kserve(value, sdk_type, path, types, k8s):
    if sdk_type in ("str", "object"):
        assert sdk_type == "object" or isinstance(value, str), f"{path}: not a string"
    elif sdk_type == "int":
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: not an int"
    elif sdk_type == "bool":
        assert isinstance(value, bool), f"{path}: not a bool"
    elif sdk_type.startswith("list["):
        assert isinstance(value, list), f"{path}: not a list"
        for i, v in enumerate(value):
            check_kserve(v, sdk_type[5:-1], f"{path}[{i}]", types, k8s)
    elif sdk_type.startswith("dict("):
        assert isinstance(value, dict), f"{path}: not a map"
        inner = sdk_type[5:-1].split(", ", 1)[1]
        for k, v in value.items():
            check_kserve(v, inner, f"{path}.{k}", types, k8s)
    elif sdk_type in types:
        assert isinstance(value, dict), f"{path}: not an object"
        fields = types[sdk_type]
        for k, v in value.items():
            assert k in fields, f"{path}: {sdk_type} has no field '{k}' (it has {sorted(fields)})"
            check_kserve(v, fields[k], f"{path}.{k}", types, k8s)
    else:
        k8s(value, sdk_type, path)


@pytest.mark.parametrize("kind,sdk_type", [("ClusterServingRuntime", "V1alpha1ClusterServingRuntime"),
                                           ("InferenceService", "V1beta1InferenceService")])
def test_kserve_objects_fit_kserves_api_types(kind, sdk_type):
    types, k8s = kserve_types(), k8s_validator()
    for doc in by_kind(kind):
        check_kserve(doc, sdk_type, kind, types, k8s)


def test_a_kserve_violation_is_caught():
    types, k8s = kserve_types(), k8s_validator()
    (runtime,) = by_kind("ClusterServingRuntime")
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["protocolVersion"] = ["v2"]
    with pytest.raises(AssertionError, match="has no field 'protocolVersion'"):
        check_kserve(bad, "V1alpha1ClusterServingRuntime", "runtime", types, k8s)
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    with pytest.raises(AssertionError, match="containers"):
        check_kserve(bad, "V1alpha1ClusterServingRuntime", "runtime", types, k8s)


def test_the_runtime_serves_what_kserve_expects():
    (runtime,) = by_kind("ClusterServingRuntime")
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {f["name"] for f in spec["supportedModelFormats"]} >= {"onnx", "wasm"}
    (c,) = spec["containers"]
    args = args_of(c)
    assert args["--model-repository"] == "/mnt/models", "where KServe's storage initializer puts them"
    assert args["--http-port"] == "8080" and c["ports"][0]["containerPort"] == 8080
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    (isvc,) = by_kind("InferenceService")
    assert isvc["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    assert isvc["spec"]["predictor"]["model"]["modelFormat"]["name"] in formats


def test_every_wisp_flag_in_deploy_exists():
    """Each `--flag` the artefacts pass is one `wisp serve --help` lists."""
    help_text = subprocess.run([*wisp_command(), "serve", "--help"], capture_output=True,
                               text=True, timeout=120, check=True).stdout
    known = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
    assert "--model-repository" in known
    charted = [d for values in CHART_VALUES.values() for d in render_chart(values)]
    for kind in ("Deployment", "ClusterServingRuntime"):
        for doc in by_kind(kind) + [d for d in charted if d["kind"] == kind]:
            spec = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc["spec"]
            for c in spec["containers"]:
                for flag in args_of(c):
                    assert flag in known, f"{kind}: wisp serve has no {flag}"


# --- Helm ---------------------------------------------------------------------------------

CHART = os.path.join(DEPLOY, "helm", "wisp")
CHART_VALUES = {
    "defaults": {},
    "s3, polled, monitored, fixed size": {
        "modelRepository": "s3://models/prod", "modelControlMode": "poll", "pollSeconds": 30,
        "serviceMonitor": {"enabled": True}, "autoscaling": {"enabled": False}, "replicas": 2,
        "env": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "envFrom": [{"secretRef": {"name": "wisp-s3"}}],
        "service": {"httpPort": 8080, "grpcPort": 9000, "metricsPort": 9090},
        "shutdown": {"preStopSeconds": 10, "exitTimeoutSeconds": 60},
        "extraArgs": ["--log-verbose=1"],
        "nodeSelector": {"kubernetes.io/arch": "arm64"},
        "tolerations": [{"key": "edge", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def render_chart(values, name="wisp"):
    """The chart rendered by Helm's own engine (the Go SDK, through helm-python-sdk's bundled
    library: no helm binary needed)."""
    import helm_python as helm
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=name, namespace="serving")
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def test_the_chart_lints_clean():
    import helm_python as helm
    assert helm.lint(CHART)["errors"] == []


@pytest.mark.parametrize("case", sorted(CHART_VALUES))
def test_the_chart_renders_valid_objects_that_agree(case):
    docs = render_chart(CHART_VALUES[case])
    kinds = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (deployment,), (service,) = kinds["Deployment"], kinds["Service"]
    monitor = kinds.get("ServiceMonitor", [None])[0]
    check_deployment(deployment, service, monitor)
    values = CHART_VALUES[case]
    assert ("HorizontalPodAutoscaler" in kinds) == values.get("autoscaling", {}).get("enabled", True)
    assert (monitor is not None) == values.get("serviceMonitor", {}).get("enabled", False)
    if "HorizontalPodAutoscaler" in kinds:
        (hpa,) = kinds["HorizontalPodAutoscaler"]
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    args = args_of(deployment["spec"]["template"]["spec"]["containers"][0])
    if values.get("modelControlMode") == "poll":
        assert args["--repository-poll-secs"] == str(values["pollSeconds"])


def test_chart_names_follow_the_release():
    names = {d["metadata"]["name"] for d in render_chart({}, name="prod")}
    assert names == {"prod-wisp"}
    assert {d["metadata"]["name"] for d in render_chart({}, name="wisp-a")} == {"wisp-a"}


def test_the_chart_refuses_bad_values():
    import helm_python as helm
    for bad in ({"modelControlMode": "sometimes"}, {"shutdown": {"exitTimeoutSeconds": -1}},
                {"modelRepository": ""}):
        with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match="schema"):
            chart.render(bad, name="wisp", namespace="serving")


# --- Container image ----------------------------------------------------------------------
# No base image can be pulled here, so the image is not built. Its stages are checked as what
# they are: their wiring (stages, copies, user, entry point) read from the Containerfile, and
# the ONNX Runtime stage's commands run as a script, whose library must then serve a model.

def containerfile_stages():
    stages, current = {}, None
    text = open(os.path.join(DEPLOY, "Containerfile")).read().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest)
            current = m.group(2) or f"<final: {m.group(1)}>"
            stages[current] = {"from": m.group(1), "steps": []}
        else:
            stages[current]["steps"].append((op, rest.strip()))
    return stages


def steps(stage, op):
    return [rest for o, rest in stage["steps"] if o == op]


def test_the_containerfile_stages_fit_together():
    stages = containerfile_stages()
    names = list(stages)
    for i, name in enumerate(names):
        for copy in steps(stages[name], "COPY"):
            m = re.match(r"--from=(\S+)\s+(\S+)\s+(\S+)", copy)
            if m:
                assert m.group(1) in names[:i], f"{name} copies from later or unknown {m.group(1)}"
                made = " ".join(steps(stages[m.group(1)], "RUN"))
                assert m.group(2).rsplit("/", 1)[0] in made, f"{m.group(1)} does not make {m.group(2)}"
    (final,) = [n for n in names if n.startswith("<final")]
    assert stages[final]["from"] == "runtime", "a plain build is the tract-only runtime"
    runtime = stages["runtime"]
    (user,) = steps(runtime, "USER")
    assert user.split(":")[0] == "10001", "non-root, the uid the manifests run as"
    (deployment,) = by_kind("Deployment")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001
    (entry,) = steps(runtime, "ENTRYPOINT")
    assert json.loads(entry) == ["/usr/local/bin/wisp"]
    assert any("/usr/local/bin/wisp" in c for c in steps(runtime, "COPY"))
    (build,) = steps(stages["build"], "RUN")
    assert "cargo build --release -p wisp-server" in build
    # The serve flags of the default command exist.
    (cmd,) = steps(runtime, "CMD")
    help_text = subprocess.run([*wisp_command(), "serve", "--help"], capture_output=True,
                               text=True, timeout=120, check=True).stdout
    for arg in json.loads(cmd)[1:]:
        assert arg.split("=")[0] in help_text, arg
    ort = stages["onnxruntime"]
    env = dict(e.split("=", 1) for e in steps(ort, "ENV"))
    assert env["ORT_DYLIB_PATH"] in " ".join(steps(ort, "COPY"))


def test_the_onnxruntime_stage_runs_as_a_script_and_its_library_serves(tmp_path, monkeypatch):
    """The stage's RUN, with its /tmp and /out moved under tmp_path and pip the test's own;
    then `wisp serve --onnx-engine onnxruntime` with ORT_DYLIB_PATH at what it produced."""
    from conftest import start_wisp, stop_wisp
    import sys
    (script,) = steps(containerfile_stages()["onnxruntime-lib"], "RUN")
    script = (script.replace("/tmp/ort", str(tmp_path / "ort"))
              .replace("/out/", str(tmp_path / "out") + "/")
              .replace("pip install", f"{sys.executable} -m pip install --quiet"))
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True, timeout=600)
    lib = tmp_path / "out" / "libonnxruntime.so"
    assert lib.is_file()
    monkeypatch.setenv("ORT_DYLIB_PATH", str(lib))
    # (with --onnx-engine onnxruntime a library that does not load fails start-up)
    proc, log, urls = start_wisp(os.path.join(ROOT, "tests", "fixtures", "repo"), "onnxruntime",
                                 "conformance-containerfile-ort.log")
    try:
        import urllib.request
        with urllib.request.urlopen(f"http://{urls['url']}/v2/models/add_sub", timeout=10) as r:
            assert json.load(r)["platform"] == "onnxruntime_onnx"
    finally:
        stop_wisp(proc, log)
