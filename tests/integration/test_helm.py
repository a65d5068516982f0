"""The Helm chart, rendered with the helm library: default values and variants, lint,
every manifest against Kubernetes' own schemas, the rendered config through
`weir check-config`, and values.schema.json in sync with Weir's settings model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from proxy.cli import main

CHART = Path(__file__).resolve().parents[2] / "helm" / "weir"
K8S = "1.30"
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "cpu": {"image": {"variant": "cpu"},
            "config": {"engine": {"model": "builtin:demo", "dtype": "float32",
                                  "cpu_kvcache_space_gib": 4}}},
    "bundled-redis-pvc": {"redis": {"bundled": True}, "modelCache": {"type": "pvc",
                                                                     "storageClass": "fast"}},
    "everything-on": {"autoscaling": {"enabled": True, "maxReplicas": 8},
                      "podDisruptionBudget": {"enabled": True},
                      "serviceMonitor": {"enabled": True}, "networkPolicy": {"enabled": True},
                      "grafanaDashboard": {"enabled": True}, "ingress": {"enabled": True},
                      "huggingface": {"tokenSecret": "hf"},
                      "apiKeys": {"values": {"WEIR_KEY_APP": "sk-x"}},
                      "nodeSelector": {"gpu": "a100"},
                      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                       "effect": "NoSchedule"}]},
    "external-redis-existing-secret": {"redis": {"url": "redis://redis.infra:6379/0"},
                                       "apiKeys": {"existingSecret": "weir-keys",
                                                   "reloader": True},
                                       "modelCache": {"type": "pvc", "existingClaim": "models"}},
    "hardened-spread": {
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 2000, "fsGroup": 2000,
                               "fsGroupChangePolicy": "OnRootMismatch"},
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "weir"}}}}]}},
        "autoscaling": {"enabled": True, "minReplicas": 2},
        "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"},
        "modelCache": {"type": "pvc", "accessMode": "ReadWriteMany", "storageClass": "efs"},
        "probes": {"startup": {"enabled": False}, "liveness": {"initialDelaySeconds": 900}}},
    "redis-password-from-secret": {
        "apiKeys": {"existingSecret": "weir-keys"},
        "extraEnv": [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
            "name": "redis", "key": "password"}}}],
        "networkPolicy": {"enabled": True}, "serviceMonitor": {"enabled": True},
        "config": {"plugins": [{"name": "cache", "config": {"l2": {"enabled": True}, "redis": {
            "url": "redis://:${REDIS_PASSWORD:-}@redis.infra:6379/0"}}}]}},
}


def merged(extra: dict[str, Any]) -> dict[str, Any]:
    base = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        for k, v in b.items():
            a[k] = merge(a.get(k, {}), v) if isinstance(v, dict) and isinstance(
                a.get(k), dict) else v
        return a

    return merge(base, json.loads(json.dumps(extra)))


def render(extra: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm_python.Chart.load(CHART).render(merged(extra), name="weir", namespace="ai")
    docs = []
    for name, text in out.items():
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


@pytest.mark.parametrize("variant", VARIANTS)
def test_manifests_are_valid_kubernetes(variant: str) -> None:
    docs = render(VARIANTS[variant])
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a CRD: not in Kubernetes' own schemas
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            assert doc["spec"]["endpoints"][0]["path"] == "/metrics"
            continue
        kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_config_passes_check_config(variant: str, tmp_path: Path) -> None:
    cm = by_kind(render(VARIANTS[variant]), "ConfigMap")
    f = tmp_path / "weir.yaml"
    f.write_text(cm["data"]["weir.yaml"])
    assert main(["check-config", str(f)]) == 0


def test_lint_is_clean() -> None:
    result = helm_python.chart.lint(CHART, strict=True)
    assert result["errors"] == []
    assert all(m["severity"] <= 1 for m in result["messages"]), result["messages"]


def test_deployment_details() -> None:
    docs = render(VARIANTS["everything-on"])
    dep = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["image"].endswith("-gpu")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert {v["name"]: v for v in pod["volumes"]}["dshm"]["emptyDir"]["medium"] == "Memory"
    assert c["startupProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    # a loop busy with the engine's output is load, not death: not Kubernetes' 1 s
    assert c["livenessProbe"]["timeoutSeconds"] == 10
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1200
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    assert pod["terminationGracePeriodSeconds"] == 10 + 60 + 25  # preStop + drain + slack
    assert "replicas" not in dep["spec"]  # the HPA owns it
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    assert c["envFrom"][0]["secretRef"]["name"] == "weir-keys"
    assert by_kind(docs, "Secret")["stringData"] == {"WEIR_KEY_APP": "sk-x"}
    assert json.loads(by_kind([d for d in docs if d["metadata"]["name"].endswith("dashboard")],
                              "ConfigMap")["data"]["weir.json"])["panels"]
    cpu = by_kind(render(VARIANTS["cpu"]), "Deployment")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"]
    redis = render(VARIANTS["bundled-redis-pvc"])
    assert by_kind(redis, "StatefulSet")["metadata"]["name"] == "weir-redis"
    env = {e["name"]: e for e in by_kind(redis, "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["env"]}
    assert env["REDIS_URL"]["value"] == "redis://weir-redis:6379/0"
    assert by_kind(redis, "PersistentVolumeClaim")["spec"]["storageClassName"] == "fast"


@pytest.mark.parametrize(("server", "grace", "port"), [
    ({"drain_timeout_s": "${DRAIN:-45}", "port": "${WEIR_PORT:-8080}"}, 10 + 45 + 25, 8080),
    ({"drain_timeout_s": 30.5, "port": 9000}, 10 + 31 + 25, 9000),
    ({}, 10 + 60 + 25, 8000),  # (values.yaml's drain; Weir's default port)
])
def test_the_numbers_the_chart_computes_with_may_be_references(
        server: dict[str, Any], grace: int, port: int) -> None:
    """`${VAR:-default}` is how Weir's own configs give a port (config/weir.yaml does):
    the chart computed with it as Helm reads text, 0: a grace period shorter than the
    drain (the pod killed mid-drain) and a port that was no number. It reads the
    default, which Weir reads too (the chart sets no such variable)."""
    pod = by_kind(render({"config": {"server": server}}), "Deployment")["spec"]["template"][
        "spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
    assert pod["containers"][0]["ports"][0]["containerPort"] == port


def test_the_service_monitor_scrapes_a_metrics_endpoint_behind_a_key() -> None:
    """`config.observability.metrics: admin` (the README's hardening) made every scrape a
    401: the ServiceMonitor sent no key, and the chart had no value for one."""
    closed = {"serviceMonitor": {"enabled": True, "keySecret": {"name": "scrape"}},
              "config": {"observability": {"metrics": "admin"}}}
    monitor = by_kind(render(closed), "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": "scrape", "key": "key"}}
    # open metrics: no key sent
    opened = by_kind(render({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    assert "authorization" not in opened["spec"]["endpoints"][0]
    # closed without a key to send: the render says so, rather than a monitor that 401s
    with pytest.raises(helm_python.HelmError) as e:
        render({**closed, "serviceMonitor": {"enabled": True}})
    assert "serviceMonitor.keySecret" in str(e.value)


@pytest.mark.parametrize(("bad", "named"), [
    ("${DRAIN}", "${DRAIN}"),  # (a variable nothing gives the pod: named as that)
    ("${DRAIN:-soon}", "config.server.drain_timeout_s")])
def test_a_number_the_chart_cannot_read_fails_the_render(bad: str, named: str) -> None:
    """(The values' schema takes a reference without a default: Weir would read its
    variable, which the chart cannot.)"""
    with pytest.raises(helm_python.HelmError) as e:
        render({"config": {"server": {"drain_timeout_s": bad}}})
    assert named in str(e.value)


@pytest.mark.parametrize(("bad", "where"), [
    ({"config": {"engine": {"max_num_seqs": 0}}}, "max_num_seqs"),
    ({"config": {"server": {"bogus": 1}}}, "bogus"),
    ({"config": {"auth": {"mode": "sometimes"}}}, "mode"),
    ({"modelCache": {"type": "nfs"}}, "type"),
    # the chart's own values: a typo was taken and ignored (the HPA never made), and
    # numbers Kubernetes refuses at apply time passed the install's check
    ({"autoscalling": {"enabled": True}}, "autoscalling"),
    ({"autoscaling": {"enable": True}}, "enable"),
    ({"serviceMonitor": {"keySecret": {"nam": "scrape"}}}, "nam"),
    ({"service": {"port": 0}}, "port"),
    ({"service": {"type": "Ingress"}}, "type"),
    ({"autoscaling": {"enabled": True, "minReplicas": 0}}, "minReplicas"),
    ({"probes": {"startup": {"periodSeconds": 0}}}, "periodSeconds"),
    ({"probes": {"readyness": {"periodSeconds": 5}}}, "readyness"),
])
def test_bad_values_are_refused(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(helm_python.HelmError) as e:
        render(bad)
    assert where in str(e.value)


def test_values_schema_is_in_sync_with_the_settings_model() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("chart_schema", CHART / "schema.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    committed = json.loads((CHART / "values.schema.json").read_text())
    assert committed == json.loads(json.dumps(mod.schema())), (
        "regenerate: python helm/weir/schema.py > helm/weir/values.schema.json")


def test_the_values_schema_takes_the_shipped_configs_and_refuses_bad_plugins() -> None:
    """What `helm install` checks: the chart's values and the shipped configs (numbers
    given as `${VAR:-default}`, which Weir reads from its environment) pass; an unknown
    plugin, or a typo in a plugin's config, does not (it took any plugin entry)."""
    import jsonschema
    import yaml

    validator = jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))
    assert not list(validator.iter_errors(yaml.safe_load((CHART / "values.yaml").read_text())))
    for name in ("weir.yaml", "production.yaml"):
        config = yaml.safe_load((CHART.parent.parent / "config" / name).read_text())
        assert not list(validator.iter_errors({"config": config})), name
    base = {"auth": {"mode": "open"}}
    for bad in ([{"name": "cahce"}], [{"name": "cache", "config": {"scopee": "tenant"}}],
                [{"name": "rate_limit", "config": {"rules": [{"per": "key", "rpm": "x"}]}}]):
        assert list(validator.iter_errors({"config": {**base, "plugins": bad}})), bad
    assert not list(validator.iter_errors({"config": {**base, "plugins": [
        {"name": "cache", "enabled": False, "config": {"scopee": 1}},
        {"name": "rate_limit", "config": {"rules": [{"per": "key", "rpm": "${RPM:-60}"}]}}]}}))
    # references where a string is narrowed (an enum, a length), an empty secret (unset),
    # and no `auth` at all (Weir refuses such a file)
    assert not list(validator.iter_errors({"config": {
        **base, "logging": {"level": "${LOG_LEVEL:-info}"},
        "engine": {"kind": "upstream", "base_url": "http://central:8000/v1",
                   "on_behalf_of_secret": "${SECRET}"}}}))
    assert not list(validator.iter_errors({"config": {
        **base, "engine": {"kind": "upstream", "base_url": "http://c/v1",
                           "on_behalf_of_secret": ""}}}))
    assert list(validator.iter_errors({"config": {"server": {"port": 8000}}}))


def test_the_network_policy_keeps_the_bundled_redis_to_the_gateway() -> None:
    """With `networkPolicy.enabled` only the gateway's pods were fenced: the bundled
    Redis (no password; it holds the cache's answers and the stored conversations) took
    connections from any pod in the cluster. Its own policy admits the gateway only."""
    docs = render({"redis": {"bundled": True}, "networkPolicy": {"enabled": True}})
    redis_labels = by_kind(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    gateway_labels = by_kind(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (fence,) = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items()
                <= redis_labels.items()]
    assert fence["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = fence["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    assert rule["ports"] == [{"port": "redis", "protocol": "TCP"}]
    for doc in policies:
        kubernetes_validate.validate(doc, K8S, strict=True)
    # no bundled Redis, or no policy: none for it
    for values in ({"networkPolicy": {"enabled": True}}, {"redis": {"bundled": True}}):
        assert len([d for d in render(values) if d["kind"] == "NetworkPolicy"]) == len(
            [v for k, v in values.items() if k == "networkPolicy"])


def test_values_an_umbrella_chart_passes_are_taken() -> None:
    """(`global` is what a parent chart hands every subchart.)"""
    assert by_kind(render({"global": {"imageRegistry": "r.example"}}), "Deployment")


def test_a_bundled_redis_and_an_external_one_are_refused_together() -> None:
    """Both set, the bundled one won silently (REDIS_URL named it), and the Redis the
    operator named (shared with other replicas, say) was never used."""
    with pytest.raises(helm_python.HelmError) as e:
        render({"redis": {"bundled": True, "url": "redis://redis.infra:6379/0"}})
    assert "redis.url" in str(e.value) and "redis.bundled" in str(e.value)


def _notes(extra: dict[str, Any]) -> str:
    out = helm_python.Chart.load(CHART).render(merged(extra), name="weir", namespace="ai")
    return next(text for name, text in out.items() if name.endswith("NOTES.txt"))


def test_an_api_key_no_secret_holds_is_named_before_the_pod_crash_loops() -> None:
    """`config.auth.keys[].key_env` names a variable only the keys' Secret gives: with
    none (the default values) or one that lacks it, the pod refused to start, again
    and again, and the install said nothing."""
    with pytest.raises(helm_python.HelmError) as e:  # values given, the name missing
        render({"apiKeys": {"values": {"WEIR_KEY_OTHER": "sk-x"}}})
    assert "WEIR_KEY_APP" in str(e.value) and "apiKeys.values" in str(e.value)
    assert "WEIR_KEY_APP" in _notes({})  # no Secret at all: the install says so
    for given in ({"existingSecret": "weir-keys"}, {"values": {"WEIR_KEY_APP": "sk-x"}}):
        assert "WEIR_KEY_APP" not in _notes({"apiKeys": given})
    assert "WEIR_KEY_APP" not in _notes({"config": {"auth": {"mode": "open"}}})


def test_a_scrape_behind_operator_keys_asks_for_an_operator_key() -> None:
    """With `metrics: operator` the render asked for "an admin key": a tenant's admin
    key, which /metrics then refuses (403)."""
    with pytest.raises(helm_python.HelmError) as e:
        render({"serviceMonitor": {"enabled": True},
                "config": {"observability": {"metrics": "operator"}}})
    assert "an operator key" in str(e.value)


def test_name_overrides_and_service_account_annotations_are_honoured() -> None:
    """Values every `helm create` chart takes: `nameOverride`, `fullnameOverride`, and the
    service account's annotations (a cloud workload identity). The values schema is
    strict, so a chart lacking them refused them outright."""
    docs = render({"fullnameOverride": "gw", "serviceAccount": {
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/weir"}}})
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "gw") in names and ("Service", "gw") in names
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert sa["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/weir"}
    docs = render({"nameOverride": "edge"})
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["metadata"]["name"] == "weir-edge"
    assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "edge"
    import jsonschema
    validator = jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))
    validator.validate(merged({"nameOverride": "edge", "fullnameOverride": "gw",
                               "serviceAccount": {"annotations": {"a": "b"}}}))


def test_the_grace_period_outlasts_weir_s_own_worst_shutdown() -> None:
    """The slack past preStop and the drain covers what Weir may take after its drain
    (the cut requests' grace, the overrun, the teardown; proxy/cli.py): at 15 s it was
    5 s short, and a SIGKILL could land mid-teardown."""
    from proxy.cli import ABORT_GRACE_S, OVERRUN_S, TEARDOWN_S

    pod = by_kind(render({}), "Deployment")["spec"]["template"]["spec"]
    slack = pod["terminationGracePeriodSeconds"] - 10 - 60  # preStop, drain
    assert slack > ABORT_GRACE_S + OVERRUN_S + TEARDOWN_S


def test_the_bundled_redis_is_governed_by_a_headless_service() -> None:
    """A StatefulSet's `serviceName` names a headless Service (its pods' stable DNS
    names); it named the ordinary ClusterIP Service the gateway connects to."""
    docs = render({"redis": {"bundled": True}})
    sts = by_kind(docs, "StatefulSet")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    governing = services[sts["spec"]["serviceName"]]
    assert governing["spec"]["clusterIP"] == "None"
    assert "clusterIP" not in services["weir-redis"]["spec"]  # what REDIS_URL names


def test_a_change_of_the_api_keys_the_chart_holds_rolls_the_pods() -> None:
    """Keys reach the pod as environment variables, read once at its start: a
    `helm upgrade` that changed `apiKeys.values` (a key rotated) changed the Secret only,
    the running pods kept the old key and refused the new one until something restarted
    them. The Secret's checksum is a pod annotation, as the ConfigMap's is."""
    def annotations(keys: dict[str, str]) -> dict[str, str]:
        dep = by_kind(render({"apiKeys": {"values": keys}}), "Deployment")
        return dep["spec"]["template"]["metadata"]["annotations"]  # type: ignore[no-any-return]

    old, new = annotations({"WEIR_KEY_APP": "sk-old"}), annotations({"WEIR_KEY_APP": "sk-new"})
    assert old["checksum/config"] == new["checksum/config"]
    assert old["checksum/keys"] != new["checksum/keys"]
    assert old == annotations({"WEIR_KEY_APP": "sk-old"})
    # a Secret of the user's own: offline (`helm template`) its content is unknown here
    dep = by_kind(render({"apiKeys": {"existingSecret": "weir-keys"}}), "Deployment")
    assert "checksum/keys" not in dep["spec"]["template"]["metadata"]["annotations"]


class _FakeApiServer:
    """Just enough of a Kubernetes API server for `lookup` (its discovery of v1, and
    one Secret or PersistentVolumeClaim of namespace `ai`), as `helm upgrade` renders
    against the cluster."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.secrets: dict[str, dict[str, str]] = {}
        self.claims: dict[str, list[str]] = {}  # name: its accessModes
        self.bound: dict[str, list[str]] = {}  # name: its volume's (status.accessModes)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                name = path.removeprefix("/api/v1/namespaces/ai/secrets/")
                claim = path.removeprefix("/api/v1/namespaces/ai/persistentvolumeclaims/")
                body: dict[str, Any] | None = None
                if path == "/api/v1":
                    body = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "secrets", "singularName": "", "namespaced": True,
                         "kind": "Secret", "verbs": ["get", "list"]},
                        {"name": "persistentvolumeclaims", "singularName": "",
                         "namespaced": True, "kind": "PersistentVolumeClaim",
                         "verbs": ["get", "list"]}]}
                elif name in api.secrets:
                    body = {"apiVersion": "v1", "kind": "Secret", "data": api.secrets[name],
                            "metadata": {"name": name, "namespace": "ai"}}
                elif claim in api.claims:
                    body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "metadata": {"name": claim, "namespace": "ai"},
                            "spec": {"accessModes": api.claims[claim]}}
                    if claim in api.bound:
                        body["status"] = {"phase": "Bound", "accessModes": api.bound[claim]}
                raw = json.dumps(body or {"kind": "Status", "code": 404}).encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _render(self, extra: dict[str, Any]) -> dict[str, str]:
        with helm_python.Config(kube_apiserver=self.url, kube_token="t", namespace="ai") as cfg:
            out: dict[str, str] = cfg.render(helm_python.Chart.load(CHART), merged(extra),
                                             name="weir", namespace="ai", is_upgrade=True)
        return out

    def render(self, extra: dict[str, Any]) -> list[dict[str, Any]]:
        return [d for name, text in self._render(extra).items() if name.endswith(".yaml")
                for d in yaml.safe_load_all(text) if d]

    def notes(self, extra: dict[str, Any]) -> str:
        return next(text for name, text in self._render(extra).items()
                    if name.endswith("NOTES.txt"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_rotated_existing_secret_rolls_the_pods_at_the_next_upgrade() -> None:
    """The keys of the user's own Secret are read at a pod's start too, and only the
    chart's own Secret had a checksum: a key rotated in `apiKeys.existingSecret` and a
    `helm upgrade` left the pods on the old key. The upgrade reads the Secret from the
    cluster and sums its data; Stakater Reloader's annotation rolls them for a rotation
    outside helm, when asked for."""
    api = _FakeApiServer()

    def annotations(extra: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
        dep = by_kind(api.render(extra), "Deployment")
        return (dep["metadata"].get("annotations") or {},
                dep["spec"]["template"]["metadata"]["annotations"])

    mine = {"apiKeys": {"existingSecret": "weir-keys"}}
    try:
        api.secrets["weir-keys"] = {"WEIR_KEY_APP": "c2stb2xk"}  # sk-old
        _, old = annotations(mine)
        assert old["checksum/keys"] == annotations(mine)[1]["checksum/keys"]  # steady
        api.secrets["weir-keys"] = {"WEIR_KEY_APP": "c2stbmV3"}  # sk-new
        deployment, new = annotations(mine)
        assert old["checksum/keys"] != new["checksum/keys"]
        assert old["checksum/config"] == new["checksum/config"]
        assert "secret.reloader.stakater.com/reload" not in deployment
        deployment, _ = annotations({"apiKeys": {"existingSecret": "weir-keys",
                                                 "reloader": True}})
        assert deployment["secret.reloader.stakater.com/reload"] == "weir-keys"
        del api.secrets["weir-keys"]  # not there (yet): nothing to sum, no failure
        assert "checksum/keys" not in annotations(mine)[1]
    finally:
        api.close()


def test_the_bundled_redis_evicts_before_its_memory_limit() -> None:
    """`--maxmemory-policy allkeys-lru` acts only under a `maxmemory`, which the bundled
    Redis was not given (none: no limit): it grew to its container's memory limit and
    was killed there, every cache entry and rate-limit count with it. It now evicts at
    `redis.maxmemory`, below the limit (the values' default: 768mb of 1Gi)."""
    def maxmemory(values: dict[str, Any]) -> str:
        args = by_kind(render({"redis": {"bundled": True, **values}}),
                       "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--maxmemory-policy") + 1] == "allkeys-lru"
        return args[args.index("--maxmemory") + 1]  # type: ignore[no-any-return]

    values = yaml.safe_load((CHART / "values.yaml").read_text())["redis"]
    assert values["resources"]["limits"]["memory"] == "1Gi"
    assert maxmemory({}) == "768mb"
    assert maxmemory({"maxmemory": "3gb"}) == "3gb"


def test_the_values_schema_refuses_a_fallback_weir_refuses() -> None:
    """A breaker fallback's own rules (an upstream needs `base_url`; only an upstream
    has a `breaker` of its own) were Weir's alone: `helm install` took a static fallback
    with a `breaker`, and the pod refused its config, again and again."""
    import jsonschema

    validator = jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))

    def breaker(*fallback: dict[str, Any]) -> dict[str, Any]:
        return {"config": {"auth": {"mode": "open"}, "plugins": [
            {"name": "breaker", "config": {"fallback": list(fallback)}}]}}

    url = "http://central:8000/v1"
    for bad in ({"kind": "static", "breaker": {"minimum_calls": 3}}, {"kind": "stale",
                "breaker": {}}, {"kind": "upstream"}):
        assert list(validator.iter_errors(breaker(bad))), bad
    assert not list(validator.iter_errors(breaker(
        {"kind": "stale"}, {"kind": "upstream", "base_url": url, "breaker": {"open_s": 5}},
        {"kind": "upstream", "base_url": url}, {"kind": "static", "content": "Busy."},
        {"kind": "error"})))


@pytest.mark.parametrize(("bad", "where"), [
    ({"shmSize": "lots"}, "shmSize"),
    ({"modelCache": {"type": "pvc", "size": "huge"}}, "size"),
    ({"resources": {"requests": {"cpu": "four"}}}, "cpu"),
    ({"resources": {"limits": {"memory": "48 GB"}}}, "memory"),
    ({"resources": {"limit": {"memory": "48Gi"}}}, "limit"),
    ({"redis": {"resources": {"limits": {"memory": "1gig"}}}}, "memory"),
    ({"podDisruptionBudget": {"enabled": True, "minAvailable": "most"}}, "minAvailable"),
    ({"podDisruptionBudget": {"enabled": True, "minAvailable": -1}}, "minAvailable"),
    # what the schema's first patterns took and the API server still refuses: an
    # exponent that is no whole number, more than every pod
    ({"shmSize": "1e1.5"}, "shmSize"),
    ({"resources": {"limits": {"memory": "2E.5"}}}, "memory"),
    ({"podDisruptionBudget": {"enabled": True, "minAvailable": "150%"}}, "minAvailable"),
])
def test_quantities_kubernetes_refuses_are_refused_at_install(
        bad: dict[str, Any], where: str) -> None:
    """Sizes, resources and a disruption budget's minAvailable were any text or value:
    `helm install` passed them and Kubernetes refused the Deployment (or PDB) at apply
    time, half the release made. They are checked as Kubernetes reads them."""
    with pytest.raises(helm_python.HelmError) as e:
        render(bad)
    assert where in str(e.value)


def test_quantities_kubernetes_takes_are_taken() -> None:
    docs = render({"shmSize": "512Mi", "modelCache": {"type": "pvc", "size": "1.5T"},
                   "resources": {"requests": {"cpu": 4, "memory": "24e9",
                                              "ephemeral-storage": "10G"},
                                 "limits": {"cpu": "500m", "memory": 1073741824}},
                   "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"}})
    for doc in docs:
        if doc["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(doc, K8S, strict=True)
    assert by_kind(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == "50%"


def test_an_autoscaler_whose_minimum_passes_its_maximum_fails_the_render() -> None:
    """Kubernetes refuses such an HPA at apply time (after the Deployment was made)."""
    with pytest.raises(helm_python.HelmError) as e:
        render({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}})
    assert "autoscaling.minReplicas" in str(e.value)
    # no maximum (a null drops the chart's): said so, not "above <nil>"
    with pytest.raises(helm_python.HelmError) as e:
        render({"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": None}})
    assert "autoscaling.maxReplicas is required" in str(e.value), str(e.value)
    assert by_kind(render({"autoscaling": {"enabled": True, "minReplicas": 3,
                                           "maxReplicas": 3}}), "HorizontalPodAutoscaler")


def test_the_quantities_and_percentages_kubernetes_reads_all_pass() -> None:
    """(Those the README and Kubernetes' docs show: fractions of a binary size, a
    millicore, an exponent, plain numbers, extended resources, hugepages; a PDB of no
    pod, of every pod.)"""
    docs = render({"shmSize": "1.5Gi", "modelCache": {"type": "pvc", "size": 1e3},
                   "resources": {"requests": {"cpu": 0.5, "memory": "1e3",
                                              "hugepages-2Mi": "2Mi"},
                                 "limits": {"cpu": "500m", "memory": "+1.5e+9",
                                            "hugepages-2Mi": "2Mi", "example.com/fpga": 1}},
                   "redis": {"bundled": True, "resources": {"limits": {"memory": ".5Gi"}}}})
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)
    for share in (0, 3, "0%", "050%", "100%"):
        pdb = by_kind(render({"podDisruptionBudget": {"enabled": True,
                                                      "minAvailable": share}}),
                      "PodDisruptionBudget")
        kubernetes_validate.validate(pdb, K8S, strict=True)


def test_gpus_named_in_resources_too_are_one_field() -> None:
    """`gpu.count` was written after `resources`' own maps: a GPU named there as well
    (`nvidia.com/gpu: 1`, as Kubernetes' docs write it) came out twice, a duplicate field
    the API server refuses under strict validation (kubectl's default), and requests or
    limits given as null rendered no YAML at all. gpu.count's is the one field."""
    values = merged({"resources": {"requests": None, "limits": {"nvidia.com/gpu": 2,
                                                               "memory": "48Gi"}}})
    out = helm_python.Chart.load(CHART).render(values, name="weir", namespace="ai")
    text = next(t for name, t in out.items() if name.endswith("deployment.yaml"))
    assert text.count("nvidia.com/gpu") == 2, text  # (once in requests, once in limits)
    dep = by_kind(render({"resources": {"requests": None, "limits": {
        "nvidia.com/gpu": 2, "memory": "48Gi"}}}), "Deployment")
    kubernetes_validate.validate(dep, K8S, strict=True)
    resources = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"nvidia.com/gpu": 1},
                         "limits": {"nvidia.com/gpu": 1, "memory": "48Gi"}}
    cpu = by_kind(render({"gpu": {"count": 0}, "resources": {"limits": {
        "nvidia.com/gpu": 1}}}), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert cpu["resources"]["limits"] == {"memory": "48Gi", "nvidia.com/gpu": 1}


def test_extra_environment_and_volumes_reach_the_pod() -> None:
    """Weir's config reads `${VAR}` from the environment (a Redis password, an OTLP
    collector's headers, a key from a Secret of another name) and keys from files
    (`key_file`), but the chart gave the pod only its own variables and volumes, and its
    strict schema refused `extraEnv` outright: such a config could not be installed."""
    values = {
        "extraEnv": [
            {"name": "REDIS_PASSWORD",
             "valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "password"}}},
            {"name": "WEIR_KEY_APP",
             "valueFrom": {"secretKeyRef": {"name": "vault-keys", "key": "app"}}},
            {"name": "OTEL_EXPORTER_OTLP_HEADERS", "value": "x-team=ai"}],
        "extraEnvFrom": [{"configMapRef": {"name": "weir-env"}}],
        "extraVolumes": [{"name": "key-files", "secret": {"secretName": "weir-key-files"}}],
        "extraVolumeMounts": [{"name": "key-files", "mountPath": "/etc/weir-keys",
                               "readOnly": True}],
        "config": {"auth": {"mode": "keys", "keys": [
            {"key_env": "WEIR_KEY_APP", "tenant": "default"},
            {"key_file": "/etc/weir-keys/ops", "tenant": "ops", "role": "admin"}]},
            "plugins": [{"name": "cache", "config": {"l2": {"enabled": True}, "redis": {
                "url": "redis://:${REDIS_PASSWORD}@redis.infra:6379/0"}}}]},
    }
    docs = render(values)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)
    c = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in c["env"]]
    assert names[-3:] == ["REDIS_PASSWORD", "WEIR_KEY_APP", "OTEL_EXPORTER_OTLP_HEADERS"]
    assert c["envFrom"] == [{"configMapRef": {"name": "weir-env"}}]
    assert {"name": "key-files", "mountPath": "/etc/weir-keys", "readOnly": True} in c[
        "volumeMounts"]
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "key-files", "secret": {"secretName": "weir-key-files"}} in pod["volumes"]
    # a key an extra variable gives is given: no warning, and no refusal beside
    # apiKeys.values that lack it
    assert "WEIR_KEY_APP" not in _notes(values)
    both = {**values, "apiKeys": {"values": {"WEIR_KEY_OTHER": "sk-x"}}}
    assert by_kind(render(both), "Secret")["stringData"] == {"WEIR_KEY_OTHER": "sk-x"}
    # envFrom's content is unknown here, as an existingSecret's: trusted
    assert "WEIR_KEY_APP" not in _notes({"extraEnvFrom": [{"secretRef": {"name": "k"}}]})


@pytest.mark.parametrize(("bad", "where"), [
    ({"extraEnv": {"FOO": "bar"}}, "extraEnv"),
    ({"extraEnv": [{"value": "bar"}]}, "name"),
    ({"extraVolumeMounts": [{"name": "x"}]}, "mountPath"),
    ({"extraVolumes": [{"secret": {"secretName": "x"}}]}, "name"),
    # the API server refuses a variable with both (these passed the install)
    ({"extraEnv": [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {
        "fieldPath": "status.podIP"}}}]}, "valueFrom"),
    # a volume or a mount path the chart has already (a duplicate the API server
    # refuses, or a mount hiding the chart's): the render names it
    *[({"extraVolumes": [{"name": n, "emptyDir": {}}]}, "extraVolumes[0].name")
      for n in ("config", "model-cache", "tmp", "dshm")],
    ({"extraVolumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]},
     "extraVolumes[1].name"),
    *[({"extraVolumeMounts": [{"name": "x", "mountPath": p}]}, "extraVolumeMounts[0].mountPath")
      for p in ("/etc/weir", "/dev/shm", "/models", "/tmp/", "/etc/weir/",
                # inside the chart's read-only config mount: weir.yaml hidden by a
                # subPath mount, or a mount point the runtime cannot make
                "/etc/weir/weir.yaml", "/etc/weir/certs", "/etc//weir/./tls/")],
    ({"modelCache": {"mountPath": "/data"}, "extraVolumeMounts": [
        {"name": "x", "mountPath": "/data"}]}, "modelCache.mountPath"),
    ({"extraVolumeMounts": [{"name": "x", "mountPath": "/a"}, {"name": "y", "mountPath": "/a"}]},
     "extraVolumeMounts[1].mountPath"),
])
def test_bad_extra_values_are_refused(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(helm_python.HelmError) as e:
        render(bad)
    assert where in str(e.value), str(e.value)


def test_extra_mounts_of_the_charts_own_volumes_elsewhere_pass() -> None:
    """A path of its own is no clash, nor the chart's volume mounted again elsewhere
    (a `subPath` of the model cache)."""
    dep = by_kind(render({"extraVolumes": [{"name": "keys", "emptyDir": {}}],
                          "extraVolumeMounts": [
                              {"name": "keys", "mountPath": "/etc/weir-keys"},
                              {"name": "keys", "mountPath": "/etc/weirx", "subPath": "x"},
                              {"name": "model-cache", "mountPath": "/models/hub",
                               "subPath": "hub"},
                              {"name": "model-cache", "mountPath": "/hf", "subPath": "hf"}]}),
                  "Deployment")
    kubernetes_validate.validate(dep, K8S, strict=True)



def test_an_ingress_routes_the_api_and_keeps_metrics_off_it() -> None:
    """No Ingress could be made from the chart (its strict schema refused `ingress`).
    Its default path is the API's, `/v1`: `/metrics` is open by default, for the
    ServiceMonitor, and must stay off a public ingress."""
    assert not [d for d in render({}) if d["kind"] == "Ingress"]
    docs = render({"ingress": {
        "enabled": True, "className": "nginx",
        "annotations": {"nginx.ingress.kubernetes.io/proxy-buffering": "off"},
        "hosts": [{"host": "llm.example.com"}],
        "tls": [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]},
        "service": {"port": 9000}})
    ing = by_kind(docs, "Ingress")
    kubernetes_validate.validate(ing, K8S, strict=True)
    assert ing["spec"]["ingressClassName"] == "nginx"
    assert ing["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/proxy-buffering": "off"}
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/v1" and path["pathType"] == "Prefix"
    service = by_kind(docs, "Service")
    assert path["backend"]["service"] == {"name": service["metadata"]["name"],
                                          "port": {"name": "http"}}
    assert ing["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]
    # paths of one's own, and a host-less rule (every host)
    ing = by_kind(render({"ingress": {"enabled": True, "hosts": [
        {"paths": [{"path": "/v1/chat", "pathType": "Exact"}, {"path": "/dashboard"}]}]}}),
        "Ingress")
    kubernetes_validate.validate(ing, K8S, strict=True)
    (rule,) = ing["spec"]["rules"]
    assert "host" not in rule and "ingressClassName" not in ing["spec"]
    assert [(p["path"], p["pathType"]) for p in rule["http"]["paths"]] == [
        ("/v1/chat", "Exact"), ("/dashboard", "Prefix")]


@pytest.mark.parametrize(("bad", "where"), [
    ({"ingress": {"enabled": True, "hosts": [{"paths": [{"path": "/v1"}]}],
                  "tls": "yes"}}, "tls"),
    ({"ingress": {"enabled": True, "hosts": [{"host": "a.example", "paths": [
        {"path": "/v1", "pathType": "Regex"}]}]}}, "pathType"),
    ({"ingress": {"enabled": True, "hosts": [{"host": "a.example", "paths": [
        {"path": "v1"}]}]}}, "path"),
    ({"ingress": {"enable": True}}, "enable"),
    # no rule and no default backend: the API server refuses such an Ingress
    ({"ingress": {"enabled": True, "hosts": []}}, "ingress.hosts"),
])
def test_bad_ingress_values_are_refused(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(helm_python.HelmError) as e:
        render(bad)
    assert where in str(e.value)


def test_an_autoscaler_on_cpu_needs_the_pods_to_request_cpu() -> None:
    """The HPA scales on CPU utilization, a share of the pod's CPU request: without one
    (`resources.requests` dropped, or given without `cpu`) it installed and never scaled
    (the controller reports "missing request for cpu")."""
    for resources in ({"requests": None}, {"requests": {"cpu": None, "memory": "24Gi"}}):
        with pytest.raises(helm_python.HelmError) as e:
            render({"autoscaling": {"enabled": True}, "resources": resources})
        assert "resources.requests.cpu" in str(e.value), str(e.value)
    hpa = by_kind(render({"autoscaling": {"enabled": True},
                          "resources": {"requests": {"cpu": "500m"}}}),
                  "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    # no autoscaler: no CPU request needed
    assert by_kind(render({"resources": {"requests": None}}), "Deployment")


def test_pod_labels_that_would_unmatch_the_selector_fail_the_render() -> None:
    """A `podLabels` key the selector reads (`app.kubernetes.io/component`, say) was
    written twice in the pod's labels, the second winning: the pods no longer matched
    the Deployment's selector, which the API server refuses."""
    for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                "app.kubernetes.io/component"):
        with pytest.raises(helm_python.HelmError) as e:
            render({"podLabels": {key: "other", "team": "ai"}})
        assert f"podLabels.{key}" in str(e.value), str(e.value)
    dep = by_kind(render({"podLabels": {"team": "ai", "app.kubernetes.io/part-of": "llm"}}),
                  "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels["team"] == "ai"



def test_probes_given_as_null_are_refused_by_name() -> None:
    """A probe dropped with `null` (`--set probes.liveness=null`) failed the render with
    "nil pointer evaluating interface {}.periodSeconds"; the values schema names it."""
    for probe in ("startup", "readiness", "liveness"):
        with pytest.raises(helm_python.HelmError) as e:
            render({"probes": {probe: None}})
        assert f"'{probe}'" in str(e.value) and "nil pointer" not in str(e.value), str(e.value)
    with pytest.raises(helm_python.HelmError) as e:
        render({"probes": {"liveness": {"timeoutSeconds": None}}})
    assert "'timeoutSeconds'" in str(e.value), str(e.value)


def test_a_disruption_budget_that_allows_no_eviction_is_warned_of() -> None:
    """`podDisruptionBudget.minAvailable: 1` (the chart's) with one replica, and no
    autoscaler to add one, lets no pod be evicted: every `kubectl drain` of its node
    (an upgrade of the cluster) waits for good, and the install said nothing."""
    pdb = {"enabled": True, "minAvailable": 1}
    assert "podDisruptionBudget" in _notes({"podDisruptionBudget": pdb})
    assert "podDisruptionBudget" in _notes({"podDisruptionBudget": {
        "enabled": True, "minAvailable": 3}, "replicaCount": 3})
    assert "podDisruptionBudget" in _notes({"podDisruptionBudget": {
        "enabled": True, "minAvailable": "100%"}, "replicaCount": 3})
    for fine in ({"podDisruptionBudget": pdb, "replicaCount": 2},
                 {"podDisruptionBudget": {"enabled": True, "minAvailable": "50%"},
                  "replicaCount": 2},
                 {"podDisruptionBudget": pdb, "autoscaling": {"enabled": True,
                                                              "minReplicas": 2}},
                 {"podDisruptionBudget": {"enabled": False}}):
        assert "podDisruptionBudget" not in _notes(fine), fine


def test_numbers_the_chart_computes_with_read_the_variables_extra_env_sets() -> None:
    """`config.server.port: ${WEIR_PORT:-8080}` with `extraEnv` setting WEIR_PORT: Weir
    listens on the variable's port, the chart read the default (the container port and
    the probes named another port: never ready), and likewise the drain behind the grace
    period. A variable set from a Secret (`valueFrom`) is not the chart's to read: the
    render says so rather than compute with a default Weir will not use."""
    server = {"port": "${WEIR_PORT:-8080}", "drain_timeout_s": "${DRAIN:-45}"}
    env = [{"name": "WEIR_PORT", "value": "9100"}, {"name": "DRAIN", "value": "100"}]
    pod = by_kind(render({"config": {"server": server}, "extraEnv": env}),
                  "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["ports"][0]["containerPort"] == 9100
    assert pod["terminationGracePeriodSeconds"] == 10 + 100 + 25
    # set empty: Weir reads the default (as a shell's `:-` does)
    pod = by_kind(render({"config": {"server": server},
                          "extraEnv": [{"name": "WEIR_PORT", "value": ""}]}),
                  "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["ports"][0]["containerPort"] == 8080
    with pytest.raises(helm_python.HelmError) as e:
        render({"config": {"server": server}, "extraEnv": [
            {"name": "WEIR_PORT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "p"}}}]})
    assert "config.server.port" in str(e.value) and "WEIR_PORT" in str(e.value), str(e.value)
    with pytest.raises(helm_python.HelmError) as e:
        render({"config": {"server": server}, "extraEnv": [{"name": "DRAIN", "value": "x"}]})
    assert "config.server.drain_timeout_s" in str(e.value), str(e.value)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.1.1",
                                  "${WEIR_HOST:-127.0.0.1}",
                                  # the loopback's other spellings (these passed)
                                  "0:0:0:0:0:0:0:1", "0000::0001", "::0:1", "[::1]",
                                  "[0:0:0:0:0:0:0:1]", "::ffff:127.0.0.1", "::FFFF:7f00:1",
                                  "0:0:0:0:0:ffff:127.0.0.1", "localhost.", "::1%lo",
                                  "${WEIR_HOST:-0:0:0:0:0:0:0:1}",
                                  # the forms the resolver (inet_aton) reads as
                                  # 127.0.0.1, which Weir's listener binds (these passed)
                                  "2130706433", "0x7f000001", "0X7F000001", "017700000001",
                                  "127.1", "0x7f.1", "0177.1", "127.0.1", "0x7F.0.0.1",
                                  "[::ffff:127.0.0.1]", "2147483647"])
def test_a_loopback_listen_address_fails_the_render(host: str) -> None:
    """`config.server.host` on the loopback (config/weir.yaml's `${WEIR_HOST:-127.0.0.1}`,
    copied into the values) made a pod the probes and the Service cannot reach: never
    ready, restarted when the startup probe gave up half an hour later."""
    with pytest.raises(helm_python.HelmError) as e:
        render({"config": {"server": {"host": host}}})
    assert "config.server.host" in str(e.value) and "0.0.0.0" in str(e.value), str(e.value)


def test_listen_addresses_a_pod_can_be_reached_on_pass() -> None:
    for host in ("0.0.0.0", "::", "${WEIR_HOST:-0.0.0.0}", "::ffff:0.0.0.0", "::10",
                 "1::1", "10.127.0.1", "weir.internal",
                 # not the loopback: 0.0.0.127, 128.0.0.0, 0127 is octal 87, 126.255.255.255
                 "0x7f", "2147483648", "0127.0.0.1", "2130706431", "127.cafe.internal",
                 "127.0.0.1.1"):
        assert by_kind(render({"config": {"server": {"host": host}}}), "Deployment")
    # the variable extraEnv sets, not the default
    assert by_kind(render({"config": {"server": {"host": "${WEIR_HOST:-127.0.0.1}"}},
                           "extraEnv": [{"name": "WEIR_HOST", "value": "0.0.0.0"}]}),
                   "Deployment")
    # Weir's own default is the loopback: the values' server block dropped, refused too
    with pytest.raises(helm_python.HelmError):
        render({"config": {"server": {"host": None}}})


def test_a_port_weir_picks_itself_fails_the_render() -> None:
    """`config.server.port: 0` (Weir takes any free port: a test's setting) rendered
    `containerPort: 0`, which the API server refuses (1-65535), and probes that could
    not know the port."""
    for port in (0, "${WEIR_PORT:-0}"):
        with pytest.raises(helm_python.HelmError) as e:
            render({"config": {"server": {"port": port}}})
        assert "config.server.port" in str(e.value), str(e.value)


def test_a_variable_the_config_needs_and_nothing_gives_fails_the_render() -> None:
    """`cache.config.redis.url: ${REDIS_URL}` (the README's scale-out) with neither
    `redis.bundled` nor `redis.url` set: Weir refuses a `${VAR}` that is unset with no
    default, so every pod failed at its start, and the install said nothing."""
    l2 = [{"name": "cache", "config": {"l2": {"enabled": True},
                                       "redis": {"url": "${REDIS_URL}"}}}]
    keys = {"apiKeys": {"values": {"WEIR_KEY_APP": "sk-x"}}}
    with pytest.raises(helm_python.HelmError) as e:
        render({**keys, "config": {"plugins": l2}})
    assert "REDIS_URL" in str(e.value) and "redis.url" in str(e.value), str(e.value)
    given: list[dict[str, Any]] = [
        {"redis": {"bundled": True}}, {"redis": {"url": "redis://r:6379/0"}},
        {"extraEnv": [{"name": "REDIS_URL", "value": "redis://r:6379/0"}]},
        {"apiKeys": {"values": {"WEIR_KEY_APP": "sk-x", "REDIS_URL": "redis://r"}}},
        # what these hold is unknown at render: trusted
        {"apiKeys": {"existingSecret": "keys"}},
        {"extraEnvFrom": [{"secretRef": {"name": "env"}}]}]
    for extra in given:
        assert by_kind(render({**keys, **extra, "config": {"plugins": l2}}), "ConfigMap")
    # a default, or `$${...}` (the text itself), needs no variable
    for plugins in (
            [{"name": "cache", "config": {"l2": {"enabled": True},
                                          "redis": {"url": "${REDIS_URL:-redis://r:6379}"}}}],
            [{"name": "breaker", "config": {"fallback": [
                {"kind": "static", "content": "Busy: say $${NAME} later."}]}}]):
        assert by_kind(render({**keys, "config": {"plugins": plugins}}), "ConfigMap")


def test_the_bundled_redis_names_fit_kubernetes_limits_under_a_long_name() -> None:
    """The bundled Redis's names are the release's full name (up to 63 characters) with
    `-redis` and `-redis-headless` added: past 63 a Service name (a DNS label) is
    refused, and past 52 a StatefulSet's revision label is."""
    for name in ("a" * 63, "weir-" + "b" * 44 + "-", "gw"):
        docs = render({"fullnameOverride": name, "redis": {"bundled": True}})
        services = [d["metadata"]["name"] for d in docs if d["kind"] == "Service"]
        assert all(len(s) <= 63 for s in services), services
        assert len(set(services)) == len(services) == 3
        sts = by_kind(docs, "StatefulSet")
        assert len(sts["metadata"]["name"]) <= 52
        assert sts["spec"]["serviceName"] in services
        env = {e["name"]: e.get("value") for e in by_kind(docs, "Deployment")["spec"][
            "template"]["spec"]["containers"][0]["env"]}
        assert env["REDIS_URL"] == f"redis://{sts['metadata']['name']}:6379/0"
        assert sts["metadata"]["name"] in services
    assert by_kind(render({"fullnameOverride": "gw", "redis": {"bundled": True}}),
                   "StatefulSet")["metadata"]["name"] == "gw-redis"


def test_a_model_cache_claim_many_pods_share_can_be_read_write_many() -> None:
    """The chart's model-cache claim was ReadWriteOnce, always: replicas (or an
    autoscaler's) on other nodes could not mount it (a Multi-Attach error, stuck
    creating), and no value could ask for a shared volume. `modelCache.accessMode`
    chooses; a ReadWriteOnce claim with more than one pod is warned of."""
    pvc = {"type": "pvc", "accessMode": "ReadWriteMany", "storageClass": "nfs"}
    docs = render({"modelCache": pvc, "replicaCount": 3})
    claim = by_kind(docs, "PersistentVolumeClaim")
    kubernetes_validate.validate(claim, K8S, strict=True)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "modelCache" not in _notes({"modelCache": pvc, "replicaCount": 3})
    assert by_kind(render({"modelCache": {"type": "pvc"}}), "PersistentVolumeClaim")[
        "spec"]["accessModes"] == ["ReadWriteOnce"]
    for many in ({"replicaCount": 2}, {"autoscaling": {"enabled": True}}):
        assert "modelCache" in _notes({"modelCache": {"type": "pvc"}, **many}), many
    # (one pod: not this warning; a rolling update of it is warned of as such)
    assert "ContainerCreating" not in _notes({"modelCache": {"type": "pvc"}})
    assert "modelCache" not in _notes({"replicaCount": 2})  # (emptyDir: each pod its own)
    with pytest.raises(helm_python.HelmError) as e:
        render({"modelCache": {"type": "pvc", "accessMode": "ReadWriteSometimes"}})
    assert "accessMode" in str(e.value)


def test_a_listen_address_a_variable_gives_from_the_pod_passes() -> None:
    """`config.server.host: ${POD_IP}` with `extraEnv` setting POD_IP from the pod's own
    address (`valueFrom: fieldRef: status.podIP`, what the probes and the Service reach)
    failed the render as a value the chart could not read; the chart computes nothing
    with the host, it only refuses a loopback it can see."""
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    for host in ("${POD_IP}", "${POD_IP:-0.0.0.0}"):
        pod = by_kind(render({"config": {"server": {"host": host}}, "extraEnv": env}),
                      "Deployment")["spec"]["template"]["spec"]
        assert pod["containers"][0]["env"][-1]["name"] == "POD_IP"


def test_variables_every_pod_has_need_no_value() -> None:
    """`tracing.service_name: weir-${HOSTNAME}`: the container runtime sets HOSTNAME (the
    pod's name), HOME and PATH in every container, and Kubernetes its API server's
    address; the render failed it as a variable nothing gives the pod."""
    keys = {"apiKeys": {"values": {"WEIR_KEY_APP": "sk-x"}}}
    for name in ("HOSTNAME", "HOME", "PATH", "KUBERNETES_SERVICE_HOST"):
        cm = by_kind(render({**keys, "config": {"tracing": {"service_name": f"w-${{{name}}}"}}}),
                     "ConfigMap")
        assert f"${{{name}}}" in cm["data"]["weir.yaml"]


def test_a_variable_right_after_another_is_checked_too() -> None:
    """`${USER}${SUFFIX}`: the check read each reference with the character before it,
    so the second of two adjacent ones went unseen and its pod failed at its start."""
    keys = {"apiKeys": {"values": {"WEIR_KEY_APP": "sk-x"}}}
    env = [{"name": "A", "value": "a"}]
    with pytest.raises(helm_python.HelmError) as e:
        render({**keys, "extraEnv": env,
                "config": {"tracing": {"service_name": "${A}${NOT_GIVEN}"}}})
    assert "NOT_GIVEN" in str(e.value), str(e.value)
    # `$${A}` is the text itself, also right after a reference
    assert by_kind(render({**keys, "extraEnv": env,
                           "config": {"tracing": {"service_name": "${A}$${NOT_GIVEN}"}}}),
                   "ConfigMap")
    # as is a `${...}` inside a default (Weir's default ends at the first `}`)
    assert by_kind(render({**keys, "config": {"tracing": {
        "service_name": "${NOT_GIVEN:-${ALSO_NOT}}"}}}), "ConfigMap")


def test_an_autoscaler_on_pods_whose_cpu_request_is_their_limit_renders() -> None:
    """A CPU limit with no CPU request is the request too (Kubernetes copies it), so the
    autoscaler can scale; the render refused it as a pod with no CPU request."""
    for requests in (None, {"memory": "24Gi"}):
        hpa = by_kind(render({"autoscaling": {"enabled": True}, "resources": {
            "requests": requests, "limits": {"cpu": "4", "memory": "48Gi"}}}),
            "HorizontalPodAutoscaler")
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_a_model_cache_claim_only_one_pod_may_mount_is_refused() -> None:
    """`modelCache.accessMode: ReadWriteOncePod`: the Deployment rolls a new pod up
    before the old one stops (maxSurge), and the new one can never mount the claim the
    old one holds, so every upgrade (a config change rolls the pods) waited for good."""
    with pytest.raises(helm_python.HelmError) as e:
        render({"modelCache": {"type": "pvc", "accessMode": "ReadWriteOncePod"}})
    assert "accessMode" in str(e.value), str(e.value)


def test_a_loopback_default_says_how_to_give_the_variable() -> None:
    """config/weir.yaml's `${WEIR_HOST:-127.0.0.1}` with WEIR_HOST in an `extraEnvFrom`
    ConfigMap: the chart cannot see it and reads the default, so the render fails; the
    message said only "listen on 0.0.0.0", not that setting WEIR_HOST in `extraEnv` is
    read (an `existingSecret` holding only keys must not hide a loopback pod)."""
    for extra in ({"extraEnvFrom": [{"configMapRef": {"name": "env"}}]},
                  {"apiKeys": {"existingSecret": "keys"}}):
        with pytest.raises(helm_python.HelmError) as e:
            render({**extra, "config": {"server": {"host": "${WEIR_HOST:-127.0.0.1}"}}})
        assert "WEIR_HOST" in str(e.value) and "extraEnv" in str(e.value), str(e.value)
    assert by_kind(render({"extraEnvFrom": [{"configMapRef": {"name": "env"}}],
                           "extraEnv": [{"name": "WEIR_HOST", "value": "0.0.0.0"}],
                           "config": {"server": {"host": "${WEIR_HOST:-127.0.0.1}"}}}),
                   "Deployment")


def test_a_one_node_model_cache_claim_can_be_rolled_by_recreating_the_pods() -> None:
    """A ReadWriteOnce model-cache claim with one replica: a rolling update starts the
    new pod before the old one stops, and where the new one lands on another node it
    cannot mount the claim the old one holds, so every upgrade waited for good, with no
    value to change how the pods roll. `updateStrategy` chooses (RollingUpdate by
    default), and a rolling update of such a claim is warned of."""
    rwo = {"modelCache": {"type": "pvc"}}
    dep = by_kind(render(rwo), "Deployment")
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate"}
    assert "updateStrategy" in _notes(rwo)
    recreate = {**rwo, "updateStrategy": {"type": "Recreate"}}
    dep = by_kind(render(recreate), "Deployment")
    kubernetes_validate.validate(dep, K8S, strict=True)
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert "updateStrategy" not in _notes(recreate)
    one_at_a_time = {**rwo, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {
        "maxSurge": 0, "maxUnavailable": 1}}}
    dep = by_kind(render(one_at_a_time), "Deployment")
    kubernetes_validate.validate(dep, K8S, strict=True)
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "updateStrategy" not in _notes(one_at_a_time)
    assert "updateStrategy" in _notes({**rwo, "updateStrategy": {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": "50%"}}})
    # each pod its own cache, or a claim every node mounts: nothing to warn of
    for fine in ({}, {"modelCache": {"type": "pvc", "accessMode": "ReadWriteMany"}}):
        assert "updateStrategy" not in _notes(fine), fine
    for bad in ({"type": "Rolling"}, {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}},
                {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "half"}}):
        with pytest.raises(helm_python.HelmError) as e:
            render({"updateStrategy": bad})
        assert "updateStrategy" in str(e.value), (bad, str(e.value))


def test_numbers_read_from_a_variable_the_chart_cannot_see_are_warned_of() -> None:
    """`config.server.port: ${WEIR_PORT:-8000}` with WEIR_PORT in an `extraEnvFrom`
    ConfigMap or the keys' `existingSecret`: the chart cannot read it, so the container
    port and the probes took the default, in silence, while Weir listens where the
    variable says (never ready). The notes say what the chart assumed; a variable
    `extraEnv` sets (which Kubernetes sets over envFrom) or `apiKeys.values` holds is
    read."""
    server = {"port": "${WEIR_PORT:-8000}", "drain_timeout_s": "${DRAIN:-45}"}
    for unknown in ({"extraEnvFrom": [{"configMapRef": {"name": "env"}}]},
                    {"apiKeys": {"existingSecret": "keys"}}):
        notes = _notes({**unknown, "config": {"server": server}})
        assert "config.server.port reads ${WEIR_PORT}: the container port and the probes " \
               "assume 8000" in notes, notes
        assert "config.server.drain_timeout_s reads ${DRAIN}" in notes, notes
        notes = _notes({**unknown, "config": {"server": server}, "extraEnv": [
            {"name": "WEIR_PORT", "value": "9100"}]})
        assert "${WEIR_PORT}" not in notes and "${DRAIN}" in notes, notes
    # nothing unknown, or numbers written as such: no warning
    assert "reads ${" not in _notes({"config": {"server": server}})
    assert "reads ${" not in _notes({"extraEnvFrom": [{"configMapRef": {"name": "env"}}]})
    # the chart's own Secret it reads (Kubernetes sets extraEnv over it)
    keys = {"WEIR_KEY_APP": "sk-x", "WEIR_PORT": "9100"}
    pod = by_kind(render({"apiKeys": {"values": keys}, "config": {"server": server}}),
                  "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["ports"][0]["containerPort"] == 9100
    pod = by_kind(render({"apiKeys": {"values": keys}, "config": {"server": server},
                          "extraEnv": [{"name": "WEIR_PORT", "value": "9200"}]}),
                  "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["ports"][0]["containerPort"] == 9200
    # as is the listen address the loopback check reads
    assert by_kind(render({"apiKeys": {"values": {"WEIR_KEY_APP": "sk-x", "WEIR_HOST": "::"}},
                           "config": {"server": {"host": "${WEIR_HOST:-127.0.0.1}"}}}),
                   "Deployment")



def test_an_existing_model_cache_claim_is_read_for_its_access_mode() -> None:
    """`modelCache.existingClaim`: the chart's warnings of a one-node claim under several
    pods (or a rolling update) were skipped for it, and `modelCache.accessMode` was
    ignored in silence, so a ReadWriteOnce claim of the user's under three replicas
    rendered with no word and the pods on other nodes never started. The claim's access
    modes are read from the cluster at an install or upgrade (`helm template`: as
    accessMode says), a ReadWriteMany said of a claim that is not fails, and an
    existingClaim the emptyDir type would not mount fails."""
    mine = {"type": "pvc", "existingClaim": "models"}
    # helm template: the claim unseen, accessMode is what the user says of it
    assert "modelCache" not in _notes({})
    notes = _notes({"modelCache": mine, "replicaCount": 3})
    assert "one ReadWriteOnce claim (models)" in notes, notes
    assert "updateStrategy" in _notes({"modelCache": mine})
    shared = {"modelCache": {**mine, "accessMode": "ReadWriteMany"}, "replicaCount": 3}
    assert "modelCache" not in _notes(shared)
    assert not [d for d in render(shared) if d["kind"] == "PersistentVolumeClaim"]
    api = _FakeApiServer()
    try:
        api.claims["models"] = ["ReadWriteOnce"]
        with pytest.raises(helm_python.HelmError) as e:
            api.render(shared)
        assert "modelCache.accessMode" in str(e.value) and "models" in str(e.value)
        assert "one ReadWriteOnce claim (models)" in api.notes(
            {"modelCache": mine, "replicaCount": 3})
        api.claims["models"] = ["ReadWriteMany"]  # the cluster's word over the default
        assert "modelCache" not in api.notes({"modelCache": mine, "replicaCount": 3})
        dep = by_kind(api.render(shared), "Deployment")["spec"]["template"]["spec"]
        assert {v["name"]: v for v in dep["volumes"]}["model-cache"] == {
            "name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}}
        for modes in (["ReadWriteOncePod"], ["ReadOnlyMany"]):
            api.claims["models"] = modes
            with pytest.raises(helm_python.HelmError) as e:
                api.render({"modelCache": mine})
            assert "modelCache.existingClaim" in str(e.value), str(e.value)
        del api.claims["models"]  # not there (yet): as accessMode says
        assert by_kind(api.render(shared), "Deployment")
    finally:
        api.close()
    with pytest.raises(helm_python.HelmError) as e:
        render({"modelCache": {"existingClaim": "models"}})  # type emptyDir
    assert "modelCache.existingClaim" in str(e.value) and "type: pvc" in str(e.value)


def test_probes_can_be_disabled_and_timed() -> None:
    """The three probes were always rendered with three fixed fields each: no value
    dropped one (a mesh or a platform with its own health checks, a debug pod that must
    not be restarted), nor set an initial delay or a readiness success threshold."""
    c = by_kind(render({}), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c)
    assert c["readinessProbe"] == {"httpGet": {"path": "/health/ready", "port": "http"},
                                   "periodSeconds": 5, "timeoutSeconds": 3,
                                   "failureThreshold": 2}
    for kind in ("startup", "readiness", "liveness"):
        dep = by_kind(render({"probes": {kind: {"enabled": False}}}), "Deployment")
        kubernetes_validate.validate(dep, K8S, strict=True)
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert f"{kind}Probe" not in c
        assert len([k for k in c if k.endswith("Probe")]) == 2
    assert "probes.readiness.enabled" in _notes({"probes": {"readiness": {"enabled": False}}})
    assert "probes.readiness" not in _notes({"probes": {"liveness": {"enabled": False}}})
    timed = {"probes": {"liveness": {"initialDelaySeconds": 30, "timeoutSeconds": 20},
                        "readiness": {"successThreshold": 2, "periodSeconds": 1}}}
    dep = by_kind(render(timed), "Deployment")
    kubernetes_validate.validate(dep, K8S, strict=True)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["initialDelaySeconds"] == 30
    assert c["livenessProbe"]["timeoutSeconds"] == 20
    assert c["livenessProbe"]["periodSeconds"] == 10  # the chart's, kept
    assert c["readinessProbe"]["successThreshold"] == 2
    assert c["readinessProbe"]["periodSeconds"] == 1
    # Kubernetes refuses a liveness or startup successThreshold other than 1; a
    # misspelt field is refused, not ignored
    for bad in ({"liveness": {"successThreshold": 2}}, {"startup": {"enabled": "no"}},
                {"readiness": {"initialDelay": 5}}, {"liveness": {"initialDelaySeconds": -1}}):
        with pytest.raises(helm_python.HelmError) as e:
            render({"probes": bad})
        assert "probes" in str(e.value), (bad, str(e.value))


def test_the_cpu_image_with_a_gpu_asked_for_fails_the_render() -> None:
    """`image.variant: cpu` with the chart's `gpu.count: 1` (or `nvidia.com/gpu` in
    resources) rendered a pod holding a GPU its CPU build of the engine never uses, and
    waiting for a GPU node: the render names what asks for it."""
    cpu = {"image": {"variant": "cpu"}}
    for asked, named in (({"gpu": {"count": 1}}, "gpu.count"),
                         ({"gpu": {"count": 0}, "resources": {"limits": {
                             "nvidia.com/gpu": 1}}}, "nvidia.com/gpu"),
                         ({"gpu": {"count": 0}, "resources": {"requests": {
                             "amd.com/gpu": "2"}}}, "amd.com/gpu")):
        with pytest.raises(helm_python.HelmError) as e:
            render({**cpu, **asked})
        assert "image.variant" in str(e.value) and named in str(e.value), str(e.value)
    # none asked for (or zero): renders
    for fine in ({"gpu": {"count": 0}},
                 {"gpu": {"count": 0}, "resources": {"limits": {"nvidia.com/gpu": 0}}}):
        assert by_kind(render({**cpu, **fine}), "Deployment")
    assert by_kind(render({"image": {"variant": "gpu"}}), "Deployment")


def test_a_redis_url_reading_a_variable_fails_the_render() -> None:
    """`redis.url: redis://:${REDIS_PASSWORD}@...` (or `$(REDIS_PASSWORD)`) with the
    password in extraEnv: REDIS_URL is set before extraEnv's variables, so Kubernetes
    does not expand `$(...)` in it, and Weir reads a variable's value as it is, so the
    password sent was the reference's text: every Redis call refused, in silence. The
    render fails and says the ways that work."""
    for url in ("redis://:${REDIS_PASSWORD}@redis.infra:6379/0",
                "redis://default:$(REDIS_PASSWORD)@redis.infra:6379/0",
                "rediss://${REDIS_HOST:-redis}:6380/0"):
        with pytest.raises(helm_python.HelmError) as e:
            render({"redis": {"url": url}})
        assert "redis.url" in str(e.value) and "extraEnv" in str(e.value), str(e.value)
        assert url[url.index("$"):url.index("$") + 8] in str(e.value), str(e.value)
    # the documented ways: the password in config, or the whole URL from a Secret
    password = [{"name": "REDIS_PASSWORD",
                 "valueFrom": {"secretKeyRef": {"name": "redis", "key": "password"}}}]
    l2 = [{"name": "cache", "config": {"l2": {"enabled": True}, "redis": {
        "url": "redis://:${REDIS_PASSWORD}@redis.infra:6379/0"}}}]
    docs = render({"extraEnv": password, "config": {"plugins": l2},
                   "apiKeys": {"existingSecret": "keys"}})
    kubernetes_validate.validate(by_kind(docs, "Deployment"), K8S, strict=True)
    whole = [{"name": "REDIS_URL",
              "valueFrom": {"secretKeyRef": {"name": "redis", "key": "url"}}}]
    l2 = [{"name": "cache", "config": {"l2": {"enabled": True}, "redis": {
        "url": "${REDIS_URL}"}}}]
    env = by_kind(render({"extraEnv": whole, "config": {"plugins": l2},
                          "apiKeys": {"existingSecret": "keys"}}),
                  "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env].count("REDIS_URL") == 1
    assert by_kind(render({"redis": {"url": "redis://redis.infra:6379/0"}}), "Deployment")


def test_a_read_only_root_file_system_moves_home_to_a_writable_volume() -> None:
    """`securityContext.readOnlyRootFilesystem: true` rendered, but the image's home
    (/home/weir) is on the root file system, where the engine writes its caches (vLLM's
    compile cache and config, Triton's kernels): they failed on a read-only one. HOME
    is /tmp (the chart's emptyDir) then; the caches Weir and Hugging Face keep stay on
    the model cache."""
    ro = {"securityContext": {"readOnlyRootFilesystem": True,
                              "allowPrivilegeEscalation": False,
                              "capabilities": {"drop": ["ALL"]}}}
    dep = by_kind(render(ro), "Deployment")
    kubernetes_validate.validate(dep, K8S, strict=True)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HOME"] == "/tmp"
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert env["HF_HOME"] == "/models/huggingface"
    # a writable root file system, but another user than the image's (OpenShift's
    # random uid, a runAsUser of the operator's): HOME was `/` (no such user in the
    # image's passwd), not writable, and the same caches failed there: HOME is /tmp
    # whatever the security context
    for values in ({}, {"podSecurityContext": {"runAsUser": 2000}},
                   {"securityContext": {"runAsUser": 1000740000}}):
        c = by_kind(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert [e.get("value") for e in c["env"] if e["name"] == "HOME"] == ["/tmp"], values
    # one HOME of the operator's own (extraEnv) is the one HOME: no duplicate entry,
    # which Kubernetes warns of and a server-side apply refuses
    mine = [{"name": "HOME", "value": "/models/home"}]
    for values in ({"extraEnv": mine}, {**ro, "extraEnv": mine}):
        c = by_kind(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert [e.get("value") for e in c["env"] if e["name"] == "HOME"] == [
            "/models/home"], values


def test_the_cpu_image_alone_asks_for_no_gpu() -> None:
    """`image.variant: cpu`, the obvious way to run on CPU nodes, failed the render
    unless `gpu.count: 0` was set beside it (the chart's default count was 1). The
    count's default follows the variant: 1 GPU with the GPU image, none with the CPU
    one; a count the user gives is theirs (one above 0 with the CPU image fails)."""
    for values in ({"image": {"variant": "cpu"}},
                   {"image": {"variant": "cpu"}, "gpu": None},
                   {"image": {"variant": "cpu"}, "gpu": {"count": None}}):
        pod = by_kind(render(values), "Deployment")["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert not [k for where in ("requests", "limits") for k in c["resources"][where]
                    if "gpu" in k], (values, c["resources"])
        assert not c["image"].endswith("-gpu")
    with pytest.raises(helm_python.HelmError) as e:
        render({"image": {"variant": "cpu"}, "gpu": {"count": 2}})
    assert "gpu.count: 2" in str(e.value), str(e.value)
    for values in ({}, {"image": {"variant": "gpu"}}, {"gpu": {"count": None}}):
        c = by_kind(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1, values
    c = by_kind(render({"gpu": {"count": 0}}), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    # the chart's values say so, for `helm show values` and the README's CPU install
    assert yaml.safe_load((CHART / "values.yaml").read_text())["gpu"]["count"] is None


def test_an_existing_claim_is_read_for_its_volume_s_access_modes() -> None:
    """A claim asking ReadWriteOnce bound to a volume that is ReadWriteMany (a shared
    file system's volume made beforehand) mounts on every node: it is the volume's
    access modes (the claim's status) that say so, not what the claim asked for. The
    render read only what it asked for: with `accessMode: ReadWriteMany` it failed,
    without it warned of pods that would never start. A ReadWriteOncePod claim stays
    one pod's, whatever its volume."""
    mine = {"type": "pvc", "existingClaim": "models"}
    shared = {"modelCache": {**mine, "accessMode": "ReadWriteMany"}, "replicaCount": 3}
    api = _FakeApiServer()
    try:
        api.claims["models"] = ["ReadWriteOnce"]
        api.bound["models"] = ["ReadWriteMany", "ReadWriteOnce"]
        assert by_kind(api.render(shared), "Deployment")
        assert "modelCache" not in api.notes({"modelCache": mine, "replicaCount": 3})
        # a volume of one node's under a claim of one node's: as before
        api.bound["models"] = ["ReadWriteOnce"]
        with pytest.raises(helm_python.HelmError) as e:
            api.render(shared)
        assert "modelCache.accessMode" in str(e.value), str(e.value)
        api.claims["models"] = ["ReadWriteOncePod"]
        api.bound["models"] = ["ReadWriteMany", "ReadWriteOncePod"]
        with pytest.raises(helm_python.HelmError) as e:
            api.render({"modelCache": mine})
        assert "ReadWriteOncePod" in str(e.value), str(e.value)
    finally:
        api.close()


def test_the_readme_s_helm_installs_render(tmp_path: Path) -> None:
    """Each `helm install` the README shows (the GPU one, the CPU one: `image.variant:
    cpu` alone) renders with its `--set`s, its config passes `weir check-config`, and
    the CPU one asks for no GPU."""
    import re
    import shlex

    readme = (CHART.parents[1] / "README.md").read_text()
    installs = [shlex.split(line) for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
                for line in block.replace("\\\n", " ").splitlines()
                if line.startswith("helm install ")]
    assert len(installs) >= 2, installs
    for args in installs:
        assert args[:4] == ["helm", "install", "weir", "helm/weir"], args
        values: dict[str, Any] = {}
        for flag, expr in zip(args[4::2], args[5::2], strict=True):
            assert flag == "--set", args
            values = merged_into(values, helm_python.parse_set_string(expr))
        docs = render(values)
        for d in docs:
            kubernetes_validate.validate(d, K8S, strict=True)
        c = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        f = tmp_path / "weir.yaml"
        f.write_text(by_kind(docs, "ConfigMap")["data"]["weir.yaml"])
        assert main(["check-config", str(f)]) == 0, args
        gpus = c["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == (None if "image.variant=cpu" in args else 1), (args, gpus)
    assert any("image.variant=cpu" in args for args in installs)


def merged_into(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    for k, v in b.items():
        a[k] = merged_into(a.get(k, {}), v) if isinstance(v, dict) and isinstance(
            a.get(k), dict) else v
    return a
