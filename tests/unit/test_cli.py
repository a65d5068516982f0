from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["weir.yaml", "production.yaml"])
def test_check_config_accepts_shipped_configs(name: str, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    assert main(["check-config", str(ROOT / "config" / name)]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "paths"),
    [
        ("server: {port: 99999}\n", ["server.port"]),
        ("plugins: [{name: sanitizer, config: {}}, {name: sanitizer}]\n", ["plugins[1].name"]),
        ("auth: {mode: keys, keys: [{tenant: a}]}\n", ["auth.keys[0]"]),
        ("server: [\n", ["<root>"]),
    ],
)
def test_check_config_reports_each_error_path(tmp_path: Path, text: str, paths: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    assert main(["check-config", str(f)]) == 1
    err = capsys.readouterr().err
    for p in paths:
        assert f": {p}: " in err


def test_check_config_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "/nonexistent/weir.yaml"]) == 2
