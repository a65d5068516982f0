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
        ("plugins: [{name: cache, config: {l2: {enabled: true}, redis: {url: notaurl}}}]\n",
         ["plugins[0].config.redis.url"]),
        ("plugins: [{name: rate_limit, config: {store: redis, redis: {url: 'localhost:6379'}}}]"
         "\n", ["plugins[0].config.redis.url"]),
        ("auth: {mode: keys, keys: [{key: sk-1, tenant: a}, {key: sk-1, tenant: b, "
         "role: admin}]}\n", ["auth"]),
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


def test_check_config_and_serve_refuse_a_file_that_is_not_utf8_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "c.yaml"
    f.write_bytes(b"\xff\xfeserver: {}\n")
    assert main(["check-config", str(f)]) == 1
    with pytest.raises(SystemExit) as e:
        main(["serve", "--config", str(f)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.count("not UTF-8") == 2 and "Traceback" not in err
