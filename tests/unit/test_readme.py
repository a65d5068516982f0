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
