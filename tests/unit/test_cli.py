from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "config").glob("*.yaml")))
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
        # a dtype vLLM has no such name for: refused here, not at the engine's start
        ("engine: {dtype: float64}\n", ["engine.dtype"]),
        # an engine argument vLLM has no such name for, or of another type
        ("engine: {extra_args: {max_num_batched_tokenz: 1, block_size: x}}\n",
         ["engine.extra_args"]),
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


def test_a_key_given_twice_in_one_mapping_is_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """YAML keeps the last of two equal keys silently: a second `plugins:` block dropped
    the first chain, sanitizer and all."""
    f = tmp_path / "c.yaml"
    f.write_text("plugins: [{name: sanitizer}]\nserver: {port: 1}\nplugins: []\n")
    assert main(["check-config", str(f)]) == 1
    assert "duplicate key `plugins`" in capsys.readouterr().err
    f.write_text("base: &b {host: 127.0.0.1, port: 1}\nserver:\n  <<: *b\n  port: 2\n")
    assert main(["check-config", str(f)]) == 1  # (a merge key may be overridden; the
    assert "duplicate" not in capsys.readouterr().err  # error is the unknown `base`)


def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    f = tmp_path / "c.yaml"
    f.write_text("\n".join(lines) + "\n")  # 9^9 values once expanded
    assert main(["check-config", str(f)]) == 1
    assert "once its aliases are expanded" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["83636", "-5", "x"])
def test_a_port_out_of_range_is_a_usage_error(port: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """It was taken modulo 65536 (83636 listened on 18100)."""
    with pytest.raises(SystemExit) as e:
        main(["serve", "--port", port])
    assert e.value.code == 2 and "is not a port" in capsys.readouterr().err


def test_check_config_warns_of_a_key_serve_cannot_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The file is valid (a deployment's secrets are often not where it is checked), so
    OK, with a warning naming the entry `serve` would refuse."""
    monkeypatch.delenv("WEIR_TEST_NO_KEY", raising=False)
    f = tmp_path / "c.yaml"
    f.write_text("auth: {mode: keys, keys: [{key: sk-a, tenant: a}, "
                 "{key_env: WEIR_TEST_NO_KEY, tenant: b}]}\n")
    assert main(["check-config", str(f)]) == 0
    err = capsys.readouterr().err
    assert "warning: auth.keys[1].key_env: environment variable WEIR_TEST_NO_KEY" in err
    f.write_text(f"auth: {{mode: keys, keys: [{{key_file: {tmp_path / 'none'}, tenant: b}}]}}\n")
    assert main(["check-config", str(f)]) == 0
    assert "warning: auth.keys[0].key_file: cannot be read" in capsys.readouterr().err


def test_check_config_warns_of_every_key_serve_cannot_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """config/production.yaml names three keys held elsewhere (two environment variables
    and a file); `check-config` warned of the first only, so each fix showed the next.
    Each is named, as `serve`'s refusal names each."""
    from proxy.auth import Authenticator, KeyConfigError
    from proxy.settings import load_settings

    monkeypatch.delenv("WEIR_TEST_NO_KEY_A", raising=False)
    monkeypatch.delenv("WEIR_TEST_NO_KEY_B", raising=False)
    f = tmp_path / "c.yaml"
    f.write_text("auth: {mode: keys, keys: [{key_env: WEIR_TEST_NO_KEY_A}, {key: sk-a}, "
                 "{key_env: WEIR_TEST_NO_KEY_B}, "
                 f"{{key_file: {tmp_path / 'none'}}}]}}\n")
    assert main(["check-config", str(f)]) == 0
    warned = [ln.split(": ")[2] for ln in capsys.readouterr().err.splitlines()
              if ": warning: " in ln]
    assert warned == ["auth.keys[0].key_env", "auth.keys[2].key_env", "auth.keys[3].key_file"]
    with pytest.raises(KeyConfigError) as e:
        Authenticator(load_settings(f).auth)
    assert [w for w, _ in e.value.config_error().errors] == warned


@pytest.mark.parametrize(("text", "where"), [
    ("auth: {mode: open}\nembeddings: {enabled: false}\n"
     "plugins: [{name: cache, config: {ttl: 1}}]\n",
     "plugins[0].config.ttl"),
    ("auth: {mode: keys, keys: [{key_env: WEIR_TEST_UNSET_KEY_VAR}]}\n", "auth.keys[0].key_env"),
])
def test_serve_names_the_file_of_a_refusal_found_as_it_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str) -> None:
    """A plugin's config or a key `serve` cannot read is found as the app is built: each
    line said `config: ...` where every other refusal (and `check-config`) names the
    file, as `FILE: path: message`."""
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(SystemExit) as e:
        main(["serve", "--config", str(f)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{f}: {where}: ") and "Traceback" not in err


def test_check_config_names_every_unset_variable_and_the_other_errors_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first `${VAR}` that was unset (with no default) ended the check: the file's
    other unset variables, and its other errors, came one run at a time."""
    for name in ("WEIR_T_PORT", "WEIR_T_URL", "WEIR_T_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    f = tmp_path / "c.yaml"
    f.write_text("auth: {mode: open}\n"
                 "server: {port: '${WEIR_T_PORT}', drain_timeout_s: -1}\n"
                 "engine: {kind: upstream, base_url: '${WEIR_T_URL}/v1'}\n"
                 "logging: {level: '${WEIR_T_LEVEL}', format: xml}\n")
    assert main(["check-config", str(f)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert f"{f}: server.port: environment variable WEIR_T_PORT is not set and has no " \
           "default" in err
    assert any(": engine.base_url: environment variable WEIR_T_URL " in e for e in err)
    assert any(": logging.level: environment variable WEIR_T_LEVEL " in e for e in err)
    assert any(": server.drain_timeout_s: " in e for e in err)
    assert any(": logging.format: " in e for e in err)
    # where a variable is unset, the field's own complaint of the empty text is not told
    assert [e for e in err if ": server.port: " in e] == [
        f"{f}: server.port: environment variable WEIR_T_PORT is not set and has no default"]
    assert len(err) == 5, err


def test_check_config_tells_every_plugin_error_beside_an_entry_it_cannot_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin entry with an unset `${VAR}` of its own (or no `name`) ended the plugin
    list's check: the other entries' errors, and the order, came only once it was
    fixed. Each is told in one run, the unset variable's field as that only."""
    monkeypatch.delenv("WEIR_T_REDIS", raising=False)
    f = tmp_path / "c.yaml"
    for bad in ("{name: rate_limit, config: {store: redis, redis: {url: '${WEIR_T_REDIS}'}}}",
                "{config: {}}", "{name: '${WEIR_T_REDIS}'}"):
        f.write_text("auth: {mode: open}\nplugins:\n"
                     f"  - {bad}\n"
                     "  - {name: nope}\n"
                     "  - {name: cache, config: {l2: {enabled: true}, redis: {url: notaurl}}}\n"
                     "  - {name: sanitizer}\n")
        assert main(["check-config", str(f)]) == 1
        err = capsys.readouterr().err.splitlines()
        assert len([e for e in err if ": plugins[0]" in e]) == 1, err
        assert any(": plugins[1].name: unknown plugin `nope`" in e for e in err), err
        assert any(": plugins[2].config.redis.url: " in e for e in err), err
        # (the cache's config is bad, its place in the order still counts)
        assert any(": plugins[3]: `sanitizer` must come before" in e for e in err), err
        assert len(err) == 4, err


@pytest.mark.parametrize(("plugins", "line"), [
    ("[{name: cache}, {name: sanitizer}]", "`sanitizer` must come before every other plugin"),
    ("[{name: breaker}, {name: sanitizer}]", "`sanitizer` must come before every other plugin"),
    ("[{name: breaker}, {name: cache}]",
     "`cache` must come before `breaker`, which has to sit next to the engine"),
])
def test_a_plugin_out_of_place_is_told_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], plugins: str, line: str) -> None:
    """The sanitizer after the cache broke two rules (first of all, before the cache),
    and each was told: two lines for one misplaced entry."""
    f = tmp_path / "c.yaml"
    f.write_text(f"auth: {{mode: open}}\nplugins: {plugins}\n")
    assert main(["check-config", str(f)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"{f}: plugins[1]: {line}"]


def test_check_config_warns_of_a_model_folder_that_is_not_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model given as a folder (`/models/...`, `./m`) that does not exist passed
    `check-config` in silence; `weir serve` then failed once the
    engine started loading, taking the path for a malformed Hugging Face id. Like a key held
    elsewhere, it is a warning (the folder may be where the server runs)."""
    f = tmp_path / "c.yaml"
    f.write_text(f"auth: {{mode: open}}\n"
                 f"engine: {{model: {tmp_path / 'nope'}, tokenizer: ./no-such-tokenizer}}\n"
                 f"embeddings: {{enabled: true, model: {tmp_path / 'no-embedder'}}}\n")
    assert main(["check-config", str(f)]) == 0
    err = capsys.readouterr().err
    assert f"warning: engine.model: no such folder here ({tmp_path / 'nope'})" in err
    assert "warning: engine.tokenizer: no such folder here (./no-such-tokenizer)" in err
    assert f"warning: embeddings.model: no such folder here ({tmp_path / 'no-embedder'})" in err
    # a Hugging Face id, a built-in, or a folder that is there: nothing to say
    (tmp_path / "there").mkdir()
    f.write_text(f"auth: {{mode: open}}\nengine: {{model: {tmp_path / 'there'}, "
                 "tokenizer: Qwen/Qwen2.5-0.5B-Instruct}\n")
    assert main(["check-config", str(f)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_check_config_warns_of_an_embedding_model_only_where_serve_loads_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`embeddings.model` takes a built-in or a folder, never a Hugging Face id (nothing
    is fetched: `serve` fails on `sentence-transformers/all-MiniLM-L6-v2` or a relative
    `models/minilm` that is not there), and with `embeddings.enabled: false` nothing is
    loaded, so nothing is to be said of it."""
    f = tmp_path / "c.yaml"
    for model in ("sentence-transformers/all-MiniLM-L6-v2", "models/minilm"):
        f.write_text(f"auth: {{mode: open}}\nembeddings: {{model: {model}}}\n")
        assert main(["check-config", str(f)]) == 0
        assert f"warning: embeddings.model: no such folder here ({model})" in (
            capsys.readouterr().err)
    f.write_text(f"auth: {{mode: open}}\n"
                 f"embeddings: {{enabled: false, model: {tmp_path / 'no-embedder'}}}\n")
    assert main(["check-config", str(f)]) == 0
    assert "warning" not in capsys.readouterr().err
    # the embedded default
    f.write_text("auth: {mode: open}\n")
    assert main(["check-config", str(f)]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(("deadlines", "warned"), [
    ("plugins: [{name: breaker}, {name: admission, config: {deadline_s: 5}}]",
     ["plugins[0].config.slow_call_s", "plugins[0].config.half_open_max_wait_s"]),
    ("server: {request_timeout_s: 20}\nplugins: [{name: breaker}]",
     ["plugins[0].config.half_open_max_wait_s"]),
    ("plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4}}, "
     "{name: admission, config: {deadline_s: 5}}]", []),
    ("plugins: [{name: admission, config: {deadline_s: 5}}]", []),
    # an upstream fallback's own breaker counts a hung one only at its `timeout_s`
    ("plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4, "
     "fallback: [{kind: static}, {kind: upstream, base_url: 'http://a/v1'}, "
     "{kind: upstream, base_url: 'http://b/v1', timeout_s: 4}]}}, "
     "{name: admission, config: {deadline_s: 5}}]",
     ["plugins[0].config.fallback[1].timeout_s"]),
    # an upstream engine's whole answer is slow only past `whole_call_s`, failed at its
    # `timeout_s`: a hung one counts only if one of them comes before the deadline
    ("engine: {kind: upstream, base_url: 'http://a/v1'}\n"
     "plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4}}, "
     "{name: admission, config: {deadline_s: 60}}]",
     ["plugins[0].config.whole_call_s", "engine.read_timeout_s"]),
    ("engine: {kind: upstream, base_url: 'http://a/v1'}\n"
     "plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4, "
     "whole_call_s: null}}, {name: admission, config: {deadline_s: 200}}]",
     ["engine.timeout_s"]),
    ("engine: {kind: upstream, base_url: 'http://a/v1', timeout_s: 30, read_timeout_s: 20}\n"
     "plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4}}, "
     "{name: admission, config: {deadline_s: 60}}]", []),
    ("engine: {kind: upstream, base_url: 'http://a/v1', read_timeout_s: 30}\n"
     "plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4, "
     "whole_call_s: 50}}, {name: admission, config: {deadline_s: 60}}]", []),
    # an upstream's stream stalled once begun fails only at its `read_timeout_s`
    ("engine: {kind: upstream, base_url: 'http://a/v1', read_timeout_s: 90}\n"
     "plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4, "
     "whole_call_s: 30}}, {name: admission, config: {deadline_s: 60}}]",
     ["engine.read_timeout_s"]),
    # ... or at its `timeout_s`, where that comes first: a stream cut there with its
    # bytes still coming is a long answer, which the breaker does not count (a stall
    # that ran into it too, with `read_timeout_s` not below it)
    ("engine: {kind: upstream, base_url: 'http://a/v1', timeout_s: 30}\n"
     "plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4}}, "
     "{name: admission, config: {deadline_s: 60}}]", ["engine.read_timeout_s"]),
    ("engine: {kind: upstream, base_url: 'http://a/v1', timeout_s: 30, read_timeout_s: 30}\n"
     "plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4, "
     "whole_call_s: 20}}, {name: admission, config: {deadline_s: 300}}]",
     ["engine.read_timeout_s"]),
    # (the in-process engine tells its first token: `whole_call_s` judges none of it)
    ("plugins: [{name: breaker, config: {slow_call_s: 2, half_open_max_wait_s: 4}}, "
     "{name: admission, config: {deadline_s: 60}}]", []),
])
def test_check_config_warns_of_breaker_thresholds_past_the_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], deadlines: str,
        warned: list[str]) -> None:
    """With admission's `deadline_s` below the breaker's `slow_call_s`, every call a hung
    engine holds is cut at its deadline before it counts as slow (a deadline cut is no
    failure: a caller's own short deadline must not open the circuit), so the breaker
    never opened; the config stays valid, and each such threshold is warned of."""
    from proxy.chain import deadline_warnings
    from proxy.settings import load_settings

    f = tmp_path / "c.yaml"
    f.write_text("auth: {mode: open}\n" + deadlines + "\n")
    assert main(["check-config", str(f)]) == 0
    got = [ln.split(": ")[2] for ln in capsys.readouterr().err.splitlines()
           if ": warning: " in ln]
    assert got == warned
    assert [w for w, _ in deadline_warnings(load_settings(f))] == warned
