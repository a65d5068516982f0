"""The README's configuration examples are real: each YAML block validates, and the
`check-config` transcript is what the command prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from proxy.auth import Authenticator
from proxy.chain import validate_plugins
from proxy.cli import main
from proxy.settings import Settings, interpolate

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
