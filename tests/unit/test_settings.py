from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.settings import ConfigError, Settings, interpolate, load_settings, parse_settings

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_embedded_default() -> None:
    s = Settings()
    assert s.engine.kind == "vllm"
    assert s.engine.model == "builtin:demo"
    assert s.auth.mode == "open"
    assert s.plugins == []


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "config").glob("*.yaml")))
def test_shipped_configs_load(name: str) -> None:
    s = load_settings(ROOT / "config" / name, env={})
    assert s.server.port == 8000


def test_env_interpolation_with_defaults_and_types() -> None:
    text = "auth: {mode: open}\nserver:\n  port: ${PORT:-9000}\n  host: ${HOST}\n"
    s = parse_settings(text, env={"HOST": "0.0.0.0"})
    assert s.server.port == 9000 and s.server.host == "0.0.0.0"
    s = parse_settings(text, env={"HOST": "h", "PORT": "1234"})
    assert s.server.port == 1234


def test_a_default_stands_for_a_variable_set_empty_too() -> None:
    """`${VAR:-default}` took an empty VAR as it was, where a shell (and Compose) take
    the default: `host: ${WEIR_HOST:-127.0.0.1}` (config/weir.yaml, open auth) with
    `WEIR_HOST=` listened on every interface, and `port: ${WEIR_PORT:-8000}` was no
    number. `${VAR}` alone keeps an empty value."""
    text = ("auth: {mode: open}\nserver:\n  host: ${WEIR_HOST:-127.0.0.1}\n"
            "  port: ${WEIR_PORT:-8000}\nengine: {kind: upstream, base_url: "
            "'http://c/v1', api_key: '${KEY}'}\n")
    s = parse_settings(text, env={"WEIR_HOST": "", "WEIR_PORT": "", "KEY": ""})
    assert (s.server.host, s.server.port) == ("127.0.0.1", 8000)
    assert s.engine.api_key == ""  # type: ignore[union-attr]
    assert load_settings(ROOT / "config" / "weir.yaml",
                         env={"WEIR_HOST": "", "WEIR_PORT": ""}).server.host == "127.0.0.1"


def test_an_empty_host_is_refused() -> None:
    """An empty host listened on every interface, IPv4 and IPv6 (asyncio's reading of
    it): `host: ${WEIR_HOST}` with WEIR_HOST set empty exposed the server. Every
    interface is said as 0.0.0.0 (or ::)."""
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\nserver: {host: '${H}'}\n", env={"H": ""})
    (where, message), = e.value.errors
    assert where == "server.host" and "0.0.0.0" in message


def test_missing_env_without_default_names_the_path() -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings("server:\n  host: ${NOPE}\n", env={})
    assert e.value.errors[0][0] == "server.host"
    assert "NOPE" in e.value.errors[0][1]


def test_interpolation_cannot_change_structure() -> None:
    out = interpolate({"a": "${X}"}, env={"X": "{b: 1}\nc: 2"})
    assert out == {"a": "{b: 1}\nc: 2"}


def test_errors_carry_yaml_paths() -> None:
    text = "engine:\n  max_num_seqs: 0\n  bogus: 1\nauth:\n  mode: keys\n  keys:\n    - tenant: a\n"
    with pytest.raises(ConfigError) as e:
        parse_settings(text, env={})
    paths = {p for p, _ in e.value.errors}
    assert "engine.max_num_seqs" in paths
    assert "engine.bogus" in paths
    assert "auth.keys[0]" in paths


def test_keys_mode_needs_keys() -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: keys}\n", env={})
    assert e.value.errors[0][0] == "auth"


def test_one_key_twice_is_refused_whatever_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Else the last entry wins: a key meant for one tenant's user serves another's admin."""
    import hashlib

    from proxy.auth import Authenticator

    digest = hashlib.sha256(b"sk-dup").hexdigest().upper()
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: keys, keys: [{key: sk-dup, tenant: a}, "
                       f"{{key_sha256: {digest}, tenant: b, role: admin}}]}}\n", env={})
    assert e.value.errors[0][0] == "auth" and "keys[0] and keys[1]" in e.value.errors[0][1]
    assert "sk-dup" not in e.value.errors[0][1]
    monkeypatch.setenv("K1", "sk-same")
    monkeypatch.setenv("K2", "sk-same")
    env_keys = parse_settings("auth: {mode: keys, keys: [{key_env: K1, tenant: a}, "
                              "{key_env: K2, tenant: b}]}\n", env={})
    with pytest.raises(ValueError, match=r"keys\[0\] and keys\[1\]"):
        Authenticator(env_keys.auth)


def test_invalid_yaml_is_reported_with_position() -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings("server: [\n", env={})
    assert "line" in e.value.errors[0][1]


def test_top_level_must_be_mapping() -> None:
    with pytest.raises(ConfigError):
        parse_settings("- a\n- b\n", env={})


def test_engine_kind_upstream_selects_its_schema() -> None:
    s = parse_settings("auth: {mode: open}\nengine: {kind: upstream, base_url: 'http://x/v1'}\n",
                       env={})
    assert s.engine.kind == "upstream"
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\nengine: {kind: upstream}\n", env={})
    assert e.value.errors[0][0] == "engine.base_url"


def test_a_file_that_says_nothing_of_auth_fails_closed() -> None:
    """`Settings()` in code is open; a config file must choose (it served everyone as
    the anonymous principal, with only a warning in the log)."""
    with pytest.raises(ConfigError) as e:
        parse_settings("server: {port: 0}\n", env={})
    assert e.value.errors == [("auth", e.value.errors[0][1])]
    assert "mode: open" in e.value.errors[0][1]
    assert parse_settings("auth: {mode: open}\n", env={}).auth.mode == "open"


def test_yaml_nested_too_deeply_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\nserver: " + "[" * 5000 + "]" * 5000 + "\n",
                       env={})
    assert e.value.errors == [("", "nested too deeply")]


def test_a_caller_secret_left_empty_is_unset_and_a_short_one_refused() -> None:
    up = "auth: {mode: open}\nengine: {kind: upstream, base_url: 'http://x/v1', "
    s = parse_settings(up + "on_behalf_of_secret: '${S:-}'}\n", env={})
    assert s.engine.kind == "upstream" and s.engine.on_behalf_of_secret is None
    with pytest.raises(ConfigError) as e:
        parse_settings(up + "on_behalf_of_secret: short}\n", env={})
    assert e.value.errors[0][0] == "engine.on_behalf_of_secret"


@pytest.mark.parametrize("url", ["not a url", "ftp://x/v1", "", "http://:80/v1",
                                 "http://h:abc/v1"])
def test_an_upstream_base_url_must_be_http_with_a_host(url: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings(f"auth: {{mode: open}}\nengine: {{kind: upstream, base_url: '{url}'}}\n",
                       env={})
    assert e.value.errors[0][0] == "engine.base_url"
    from pydantic import ValidationError

    from plugins.breaker.config import Fallback

    with pytest.raises(ValidationError):
        Fallback.model_validate({"kind": "upstream", "base_url": url})


def test_an_upstream_url_holding_credentials_beside_an_api_key_is_refused() -> None:
    """aiohttp refuses to send both (a ValueError on every request: each one a 500, the
    fallback's too); the config is refused where it is read, naming both fields. Either
    alone loads."""
    from pydantic import ValidationError

    from plugins.breaker.config import Fallback

    both = "base_url: 'http://u:pw@x/v1', api_key: k"
    with pytest.raises(ConfigError) as e:
        parse_settings(f"auth: {{mode: open}}\nengine: {{kind: upstream, {both}}}\n", env={})
    assert e.value.errors[0][0] == "engine" and "api_key" in e.value.errors[0][1]
    assert "pw" not in str(e.value)  # (the password is not quoted back)
    with pytest.raises(ValidationError):
        Fallback.model_validate({"kind": "upstream", "base_url": "http://u:pw@x/v1",
                                 "api_key": "k"})
    for alone in ("base_url: 'http://u:pw@x/v1'", "base_url: 'http://x/v1', api_key: k"):
        parse_settings(f"auth: {{mode: open}}\nengine: {{kind: upstream, {alone}}}\n", env={})
    Fallback.model_validate({"kind": "upstream", "base_url": "http://u:pw@x/v1"})


def test_an_unknown_builtin_embedding_model_is_a_config_error() -> None:
    from proxy.embed_models import BUILTINS

    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\nembeddings: {model: 'builtin:nope'}\n", env={})
    assert e.value.errors[0][0] == "embeddings.model"
    for name in BUILTINS:  # every one it builds is known here
        parse_settings(f"auth: {{mode: open}}\nembeddings: {{model: '{name}'}}\n", env={})


def test_a_key_in_clear_is_read_without_its_outer_blanks() -> None:
    from proxy.auth import Authenticator

    s = parse_settings("auth: {mode: keys, keys: [{key: ' padded '}]}\n", env={})
    assert Authenticator(s.auth).authenticate({"Authorization": "Bearer padded"})


def test_an_unknown_engine_kind_names_the_known_ones() -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\nengine: {kind: tgi}\n", env={})
    assert e.value.errors == [("engine.kind", "unknown kind `tgi` (one of 'vllm', 'upstream')")]


def test_an_unknown_builtin_engine_model_is_a_config_error() -> None:
    from proxy.engine.builtin_models import BUILTINS
    from proxy.settings import ENGINE_BUILTINS

    assert set(ENGINE_BUILTINS) == set(BUILTINS)  # every one it builds is known here
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\nengine: {model: 'builtin:nope'}\n", env={})
    assert e.value.errors[0][0] == "engine.model" and "builtin:smollm2" in e.value.errors[0][1]


@pytest.mark.parametrize(("text", "path"), [
    ("engine: {kind: 1}", "engine.kind"),
    ("engine: {kind: upstream, base_url: 'http://a b/v1'}", "engine.base_url"),
])
def test_other_config_slips_name_their_path(text: str, path: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\n" + text + "\n", env={})
    assert e.value.errors[0][0] == path


@pytest.mark.parametrize(("text", "path"), [
    ("server: {port: true}", "server.port"),
    ("server: {write_timeout_s: .inf}", "server.write_timeout_s"),
    ("server: {drain_timeout_s: .nan}", "server.drain_timeout_s"),
])
def test_a_number_is_never_true_false_or_infinite(text: str, path: str) -> None:
    """pydantic's lax mode read `port: true` as port 1 and `.inf` as a timeout."""
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\n" + text + "\n", env={})
    assert e.value.errors[0][0] == path


def test_a_plugin_config_number_is_never_true_or_infinite() -> None:
    from plugins.cache.config import CacheConfig
    from plugins.rate_limit.config import RateLimitConfig

    for bad in ({"exact": {"ttl_s": True}}, {"exact": {"ttl_s": float("inf")}},
                {"per_user_max_entries": False}):
        with pytest.raises(ValueError):
            CacheConfig.model_validate(bad)
    with pytest.raises(ValueError):
        RateLimitConfig.model_validate({"rules": [{"per": "key", "rpm": True}]})
    # booleans stay booleans, and a `${VAR}` string still types as its number
    assert CacheConfig.model_validate({"exact": {"enabled": False}}).exact.enabled is False
    assert parse_settings("auth: {mode: open}\nserver: {port: '${P}'}\n",
                          env={"P": "9000"}).server.port == 9000


@pytest.mark.parametrize("url", ["redis://:ZQXpa/ss:wordSECRET@127.0.0.1:6379/0",
                                 "redis://user:ZQXSECRETPW#x@redis:abc/0",
                                 "http://ZQXSECRET@host/0"])
@pytest.mark.parametrize("plugin", ["cache", "rate_limit"])
def test_a_bad_redis_url_is_named_without_quoting_it(plugin: str, url: str) -> None:
    """redis-py's parser quotes what follows the URL's last `:` (a port that is not a
    number), often the password: the error names the field and says what is wrong, and
    holds no part of the URL."""
    config = {"cache": {"redis": {"url": url}},
              "rate_limit": {"store": "redis", "redis": {"url": url},
                             "rules": [{"per": "key", "rpm": 1}]}}[plugin]
    import json

    from proxy.chain import validate_plugins

    settings = parse_settings(json.dumps({"auth": {"mode": "open"}, "plugins": [
        {"name": plugin, "config": config}]}), env={})
    with pytest.raises(ConfigError) as e:
        validate_plugins(settings.plugins)
    text = str(e.value) + repr(e.value.errors)
    assert "ZQX" not in text and "SECRET" not in text
    assert [p for p, _ in e.value.errors] == ["plugins[0].config.redis.url"]
    assert "not a Redis URL" in text


def test_a_doubled_dollar_writes_the_reference_itself() -> None:
    """A static fallback's text or a sanitizer pattern holding `${NAME}` could not be
    written: it was substituted, or refused when NAME was unset. `$${NAME}` is the text."""
    out = interpolate({"a": "say $${NAME} and $${X:-d}", "b": "${X}", "c": "$$${X}"},
                      env={"X": "x"})
    assert out == {"a": "say ${NAME} and ${X:-d}", "b": "x", "c": "$${X}"}


@pytest.mark.parametrize(("extra", "named"), [
    ("{max_num_batched_tokenz: 4096}", "`max_num_batched_tokenz`: not an argument"),
    ("{block_size: sixteen}", "`block_size`: "),
    ("{enforce_eager: true, max_num_batched_tokens: lots}", "`max_num_batched_tokens`: "),
    ("{block_size: true}", "`block_size`: `true` is not a valid value"),
    ("{max_num_seqs: 4}", "`max_num_seqs`: set by Weir from `engine.max_num_seqs`"),
])
def test_engine_extra_args_are_checked_when_the_config_is_read(extra: str, named: str) -> None:
    """An unknown name or a wrong type in `engine.extra_args` failed only when the engine
    started (after the config was read and the model converted): refused here, naming
    the key."""
    with pytest.raises(ConfigError) as e:
        parse_settings(f"engine: {{extra_args: {extra}}}\nauth: {{mode: open}}\n", env={})
    assert [(p, named in m) for p, m in e.value.errors] == [("engine.extra_args", True)]


def test_engine_extra_args_of_the_right_names_and_types_pass() -> None:
    s = parse_settings("engine: {extra_args: {enforce_eager: true, block_size: 16, "
                       "max_num_batched_tokens: 4096, compilation_config: {level: 0}}}\n"
                       "auth: {mode: open}\n", env={})
    assert s.engine.extra_args["block_size"] == 16  # type: ignore[union-attr]


def test_engine_extra_args_pass_unchecked_where_vllm_fails_to_import(monkeypatch: Any) -> None:
    """A vLLM that fails to import with something other than ImportError (a missing CUDA
    library: an OSError) leaves the check to the engine's start, which says so; reading
    the config is no traceback."""
    import builtins

    real = builtins.__import__

    def broken(name: str, *a: Any, **k: Any) -> Any:
        if name.endswith("engine.vllm"):  # (`from .engine.vllm import ...`)
            raise OSError("libcudart.so.12: cannot open shared object file")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", broken)
    s = parse_settings("engine: {extra_args: {max_num_batched_tokenz: 1}}\n"
                       "auth: {mode: open}\n", env={})
    assert s.engine.extra_args == {"max_num_batched_tokenz": 1}  # type: ignore[union-attr]


def test_a_background_poll_must_renew_the_lease_in_time() -> None:
    """A run renews its lease at its first poll past a third of it: a `poll_s` near
    `lease_s` let the lease lapse between polls, and a run still going read as `failed`
    (its server said gone) until its next renewal."""
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\n"
                       "responses: {background: {poll_s: 30, lease_s: 20}}\n", env={})
    (where, message), = e.value.errors
    assert where == "responses.background" and "lease_s" in message
    ok = parse_settings("auth: {mode: open}\n"
                        "responses: {background: {poll_s: 5, lease_s: 15}}\n", env={})
    assert ok.responses.background.poll_s == 5


@pytest.mark.parametrize(("protocol", "endpoint"), [
    ("grpc", "grpcs://collector:4317"), ("grpc", "grpc://collector:4317"),
    ("grpc", "dns://collector:4317"), ("http", "collector:4318/v1/traces"),
    ("http", "grpc://collector:4318")])
def test_an_otlp_endpoint_its_protocol_cannot_use_is_refused(protocol: str,
                                                             endpoint: str) -> None:
    """The exporters took any text and exported nothing with it (a warning, repeated for
    good): gRPC's dropped an unknown scheme, `grpcs://` (TLS meant) going plaintext to a
    TLS port; HTTP's cannot send without `http://` or `https://`."""
    with pytest.raises(ConfigError) as e:
        parse_settings(json.dumps({"auth": {"mode": "open"}, "tracing": {
            "exporter": "otlp", "protocol": protocol, "endpoint": endpoint}}))
    assert "tracing" in str(e.value) and "endpoint" in str(e.value)


@pytest.mark.parametrize(("protocol", "endpoint"), [
    ("grpc", "collector:4317"), ("grpc", "10.0.0.7:4317"), ("grpc", "http://c:4317"),
    ("grpc", "HTTPS://c:4317"), ("http", "http://c:4318/v1/traces"),
    ("http", "https://c/v1/traces"), ("http", None), ("grpc", None)])
def test_the_otlp_endpoints_the_readme_shows_are_taken(protocol: str,
                                                       endpoint: str | None) -> None:
    parse_settings(json.dumps({"auth": {"mode": "open"}, "tracing": {
        "exporter": "otlp", "protocol": protocol, "endpoint": endpoint}}))
