"""The README's configuration examples are real: each YAML block validates, and the
`check-config` transcript is what the command prints."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.auth import Authenticator
from proxy.chain import validate_plugins
from proxy.cli import main
from proxy.settings import ConfigError, Settings, interpolate

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
YAML_BLOCKS = re.findall(r"```yaml\n(.*?)```", README, re.S)


def test_readme_has_yaml_examples() -> None:
    assert len(YAML_BLOCKS) >= 2


@pytest.mark.parametrize("block", YAML_BLOCKS)
def test_yaml_examples_validate(block: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_KEY_APP", "sk-example")
    monkeypatch.setenv("EDGE_GATEWAY_KEY", "sk-edge")
    settings = Settings.model_validate(interpolate(yaml.safe_load(block), env={}))
    auth = Authenticator(settings.auth)
    if any(k.on_behalf_of for k in settings.auth.keys):  # the edge's callers, apart
        from proxy.auth import ON_BEHALF_OF, Principal, caller_digest

        caller = caller_digest(Principal("acme", "user", "u"), "an-edge-own-secret")
        seen = auth.authenticate({"Authorization": "Bearer sk-edge", ON_BEHALF_OF: caller})
        gateway = auth.authenticate({"Authorization": "Bearer sk-edge"})
        assert seen.tenant == f"edge~{gateway.user}~{caller.split('.')[0]}"
    validate_plugins(settings.plugins)


def test_check_config_transcript(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = re.search(r"```\n\$ weir check-config bad.yaml\n(.*?)```", README, re.S)
    assert m, "README lost its check-config example"
    expected = m.group(1).strip().splitlines()
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  max_num_seqs: 0\nplugins:\n  - name: cahce\n")
    assert main(["check-config", str(bad)]) == 1
    got = [ln.replace(str(bad), "bad.yaml") for ln in capsys.readouterr().err.splitlines()]
    assert got == expected


def _metrics_table() -> dict[str, str]:
    """The README's Metrics table: each metric it names, with its row's Labels cell."""
    m = re.search(r"\*\*Metrics\*\* at `/metrics`.*?\n\n(\|.*?)\n\n", README, re.S)
    assert m, "README lost its Metrics table"
    rows: dict[str, str] = {}
    for line in m.group(1).splitlines()[2:]:
        names, labels = line.split("|")[1:3]
        for name in re.findall(r"`(weir_\w+)`", names):
            rows[name] = labels
    return rows


def test_the_metrics_table_names_every_metric_and_its_labels() -> None:
    """Every metric /metrics can expose (all five plugins and the embedding model) is in
    the README's table with each of its label names, and every metric the table names
    exists: the embedding model's histograms and the semantic race's counter were
    missing, and the breaker's transition labels were given as `from`/`to`."""
    from proxy.app import create_app
    from proxy.app_state import STATE
    from tests.conftest import make_settings
    from tests.fakes import FakeEngine

    settings = make_settings(embeddings={"enabled": True}, plugins=[
        {"name": n} for n in ("sanitizer", "rate_limit", "cache", "breaker", "admission")])
    registry = create_app(settings, engine=FakeEngine())[STATE].metrics.registry
    exposed: dict[str, tuple[str, ...]] = {}
    for collector in list(registry._collector_to_names):  # (no public list of them)
        name = getattr(collector, "_name", "")
        if name.startswith("weir_"):
            suffix = "_total" if getattr(collector, "_type", "") == "counter" else ""
            exposed[name + suffix] = tuple(getattr(collector, "_labelnames", ()))
    table = _metrics_table()
    assert sorted(set(exposed) - set(table)) == [], "metrics the README does not list"
    assert sorted(set(table) - set(exposed)) == [], "README metrics that do not exist"
    for name, labels in exposed.items():
        words = set(re.findall(r"\w+", table[name]))
        assert set(labels) <= words, (name, labels, table[name])


def _loads(doc: dict[str, Any]) -> Settings:
    """A config the README shows inline, read as `weir serve` reads it: settings and
    every plugin's config."""
    settings = Settings.model_validate(interpolate({"auth": {"mode": "open"}, **doc}, env={
        "REDIS_URL": "redis://redis:6379/0", "REDIS_PASSWORD": "pw"}))
    validate_plugins(settings.plugins)
    return settings


#: The config examples the README gives inline (in prose, not in a YAML block), each
#: with the text it is written as there.
INLINE_EXAMPLES: list[tuple[str, dict[str, Any]]] = [
    ("`observability.metrics: admin`", {"observability": {"metrics": "admin"}}),
    ("`metrics: operator`", {"observability": {"metrics": "operator"}}),
    ("`engine.extra_args:\n{generation_config: vllm}`",
     {"engine": {"extra_args": {"generation_config": "vllm"}}}),
    ("`{override_generation_config: {...}}`",
     {"engine": {"extra_args": {"override_generation_config": {"temperature": 0.5}}}}),
    ("`null`: none |", {"server": {"request_timeout_s": None}}),
    ("`priority_passes:\nnull`: strict; `0`: priorities off",
     {"plugins": [{"name": "admission", "config": {"priority_passes": None}}]}),
    ("`0`: priorities off",
     {"plugins": [{"name": "admission", "config": {"priority_passes": 0}}]}),
    ("`semantic.lazy: false`",
     {"plugins": [{"name": "cache", "config": {"semantic": {"lazy": False}}}]}),
    ("(120 s by default, `null`: only when its `timeout_s` ends it)",
     {"plugins": [{"name": "breaker", "config": {"whole_call_s": None}}]}),
    ("`breaker: {window_s, minimum_calls,\nfailure_rate, open_s}`",
     {"plugins": [{"name": "breaker", "config": {"fallback": [
         {"kind": "upstream", "base_url": "http://central-weir:8000/v1", "breaker": {
             "window_s": 30, "minimum_calls": 3, "failure_rate": 0.5, "open_s": 15}}]}}]}),
    ("`exact.max_bytes_per_tenant` and `semantic.max_partitions_per_tenant`",
     {"plugins": [{"name": "cache", "config": {
         "exact": {"max_bytes_per_tenant": 1 << 20},
         "semantic": {"max_partitions_per_tenant": 16}}}]}),
    # The Helm section's scale-out: Redis for the cache and the rate limits.
    ("`cache.config.l2.enabled: true`, `cache.config.redis.url: ${REDIS_URL}`,\n"
     "`rate_limit.config.store: redis` with `rate_limit.config.redis.url: ${REDIS_URL}`",
     {"plugins": [
         {"name": "rate_limit", "config": {"store": "redis",
                                           "redis": {"url": "${REDIS_URL}"}}},
         {"name": "cache", "config": {"l2": {"enabled": True},
                                      "redis": {"url": "${REDIS_URL}"}}}]}),
    ("`cache.config.redis.store_prompts:\ntrue`",
     {"plugins": [{"name": "cache", "config": {"redis": {
         "url": "${REDIS_URL}", "store_prompts": True}}}]}),
    ("`cache.config.redis.url:\nredis://:${REDIS_PASSWORD}@redis.infra:6379/0`",
     {"plugins": [{"name": "cache", "config": {"l2": {"enabled": True}, "redis": {
         "url": "redis://:${REDIS_PASSWORD}@redis.infra:6379/0"}}}]}),
    ("`trust_incoming: false` makes each\nrequest a trace of its own",
     {"tracing": {"trust_incoming": False}}),
]


@pytest.mark.parametrize(("text", "doc"), INLINE_EXAMPLES, ids=[t for t, _ in INLINE_EXAMPLES])
def test_inline_config_examples_load(text: str, doc: dict[str, Any]) -> None:
    """Each config example the README gives in its prose is there as written and loads
    (the YAML blocks are read above)."""
    assert text in README, "README no longer says this; update the example"
    _loads(doc)


def test_the_cors_origins_the_readme_refuses_are_refused() -> None:
    """An origin is read as a browser sends it; `null`, a `*.` pattern, a path and `*`
    with `allow_credentials` are refused at load, as the README's CORS section says."""
    assert "`HTTPS://App.example.com:443` is `https://app.example.com`" in README
    settings = _loads({"server": {"cors": {"allow_origins": ["HTTPS://App.example.com:443"]}}})
    assert settings.server.cors.allow_origins == ["https://app.example.com"]
    for cors in ({"allow_origins": ["null"]}, {"allow_origins": ["https://*.example.com"]},
                 {"allow_origins": ["https://app.example.com/"]},
                 {"allow_origins": ["*"], "allow_credentials": True}):
        with pytest.raises(ValueError):
            _loads({"server": {"cors": cors}})


def test_the_sanitizer_limits_the_readme_bounds_are_refused_past_them() -> None:
    """`max_n` at most 128, `max_stop` at most 4 and `max_stop_chars` at most 1024: a
    config past one is refused when it is read, naming the key."""
    assert "`max_n` at most\n128, `max_stop` at most 4" in README
    _loads({"plugins": [{"name": "sanitizer", "config": {"limits": {
        "max_n": 128, "max_stop": 4, "max_stop_chars": 1024}}}]})
    for key, value in (("max_n", 129), ("max_stop", 5), ("max_stop_chars", 1025)):
        with pytest.raises(ConfigError, match=key):
            _loads({"plugins": [{"name": "sanitizer",
                                 "config": {"limits": {key: value}}}]})


def test_the_plugin_order_the_readme_gives_is_enforced() -> None:
    """The sanitizer before the cache, the breaker and admission last (breaker outside
    admission): another order is refused at load."""
    assert "the sanitizer first (before the cache), the breaker and\nadmission last" in README
    _loads({"plugins": [{"name": n} for n in (
        "sanitizer", "rate_limit", "cache", "breaker", "admission")]})
    for order in (("cache", "sanitizer"), ("admission", "breaker"), ("breaker", "cache")):
        with pytest.raises(ConfigError):
            _loads({"plugins": [{"name": n} for n in order]})
