"""CORS (`server.cors`): off by default (no web page can drive Weir, a local open one
included); opted in, preflights of allowed origins are answered and every answer to
them (whole, streamed, an error of a handler, a plugin or the router) says so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.settings import ConfigError, interpolate, parse_settings
from tests.conftest import MakeClient
from tests.openai_spec import validate

APP = "https://app.example.com"
EVIL = "https://evil.example.net"
KEY = "sk-cors-test-key-0123456789"
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4}
CORS = {"cors": {"allow_origins": [APP]}}
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
PREFLIGHT = {"Origin": APP, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}


def keyed(**server: Any) -> dict[str, Any]:
    return {"server": server, "auth": {"mode": "keys", "keys": [
        {"key": KEY, "tenant": "t", "user": "u"}]}}


async def test_off_by_default_a_preflight_is_a_405_and_answers_name_no_origin(
        make_client: MakeClient) -> None:
    client = await make_client()
    r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert r.status == 405
    assert "Access-Control-Allow-Origin" not in r.headers
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP})
    assert r.status == 200
    assert not any(h.lower().startswith("access-control-") for h in r.headers)
    assert "Vary" not in r.headers


async def test_a_preflight_of_an_allowed_origin_is_a_204_without_a_key(
        make_client: MakeClient) -> None:
    client = await make_client(**keyed(**CORS))
    r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert r.status == 204, await r.text()
    assert r.headers["Access-Control-Allow-Origin"] == APP
    # (`allow_methods` as far as the path serves them: no DELETE)
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert r.headers["Access-Control-Allow-Headers"] == PREFLIGHT[
        "Access-Control-Request-Headers"]
    assert r.headers["Access-Control-Max-Age"] == "600"
    assert "Access-Control-Allow-Credentials" not in r.headers
    assert "Origin" in r.headers.getall("Vary")
    # Without the preflight's headers an OPTIONS is what it was: a 405.
    assert (await client.options("/v1/chat/completions", headers={"Origin": APP})).status == 405
    # A path no route serves is a 404 still.
    assert (await client.options("/v1/nope", headers=PREFLIGHT)).status == 404


@pytest.mark.parametrize(("headers", "says"), [
    ({**PREFLIGHT, "Origin": EVIL}, "Origin"),
    ({**PREFLIGHT, "Origin": "null"}, "Origin"),
    ({**PREFLIGHT, "Origin": APP + ".evil.net"}, "Origin"),
    ({**PREFLIGHT, "Access-Control-Request-Method": "PUT"}, "Method `PUT`"),
    # (names that are no HTTP tokens: not echoed back as allowed, `*` allowing any name)
    ({**PREFLIGHT, "Access-Control-Request-Headers": "x a, b;c"}, "no HTTP header name"),
    ({**PREFLIGHT, "Access-Control-Request-Method": "PO ST"}, "no HTTP method name"),
])
async def test_a_preflight_not_allowed_is_a_403_granting_nothing(
        make_client: MakeClient, headers: dict[str, str], says: str) -> None:
    client = await make_client(**keyed(**CORS))
    r = await client.options("/v1/chat/completions", headers=headers)
    assert r.status == 403
    body = await r.json()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "cors_not_allowed" and says in body["error"]["message"]
    assert "Access-Control-Allow-Methods" not in r.headers
    if headers["Origin"] != APP:
        assert "Access-Control-Allow-Origin" not in r.headers


@pytest.mark.parametrize("methods", [["GET", "POST", "DELETE"], ["*"]])
@pytest.mark.parametrize(("path", "method", "allowed"), [
    ("/v1/chat/completions", "DELETE", "GET, HEAD, POST"),
    ("/v1/responses", "DELETE", "POST"),
    ("/v1/models", "POST", "GET, HEAD"),
    ("/v1/models/fake-model", "DELETE", "GET, HEAD"),
    ("/v1/models", "get", "GET, HEAD"),  # (methods are case-sensitive, as routed)
])
async def test_a_preflight_for_a_method_the_path_does_not_serve_is_a_403(
        make_client: MakeClient, methods: list[str], path: str, method: str,
        allowed: str) -> None:
    """A preflight asking for a method its path does not serve was a 204 (allowed by
    `allow_methods`, which lists methods, not routes): the browser then sent the request
    for the router's 405. It is refused, naming what the path serves, as the 405 does;
    a method it serves is granted, and only those are listed."""
    client = await make_client(**keyed(cors={"allow_origins": [APP],
                                             "allow_methods": methods}))
    r = await client.options(path, headers={**PREFLIGHT, "Access-Control-Request-Method":
                                            method})
    assert r.status == 403
    err = (await r.json())["error"]
    assert err["code"] == "cors_not_allowed" and f"allowed: {allowed}." in err["message"]
    assert "Access-Control-Allow-Methods" not in r.headers
    served = "GET" if "GET" in allowed else "POST"
    r = await client.options(path, headers={**PREFLIGHT, "Access-Control-Request-Method":
                                            served})
    assert r.status == 204, await r.text()
    assert r.headers["Access-Control-Allow-Methods"] == (
        served if methods == ["*"] else ", ".join(
            m for m in methods if m in allowed.split(", ")))


async def test_a_header_list_allows_those_and_the_safelisted_alone(
        make_client: MakeClient) -> None:
    client = await make_client(**keyed(cors={"allow_origins": [APP],
                                             "allow_headers": ["Authorization"]}))
    ok = {**PREFLIGHT, "Access-Control-Request-Headers": "authorization,content-type"}
    assert (await client.options("/v1/chat/completions", headers=ok)).status == 204
    r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert r.status == 403
    assert "x-stainless-os" in (await r.json())["error"]["message"]


async def test_answers_to_an_allowed_origin_say_so_and_expose_the_sdks_headers(
        make_client: MakeClient) -> None:
    client = await make_client(**keyed(**CORS))
    auth = {"Authorization": f"Bearer {KEY}", "Origin": APP}
    r = await client.post("/v1/chat/completions", json=CHAT, headers=auth)
    assert r.status == 200
    assert r.headers["Access-Control-Allow-Origin"] == APP
    assert "Origin" in r.headers.getall("Vary")
    exposed = {h.strip() for h in r.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"x-request-id", "retry-after", "x-ratelimit-remaining-requests"} <= exposed
    # A stream's head, sent from inside its handler, says so too.
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth)
    assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == APP
    assert (await r.text()).rstrip().endswith("data: [DONE]")
    # Another origin's answer grants nothing, and says it depends on the origin.
    r = await client.get("/v1/models", headers={**auth, "Origin": EVIL})
    assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
    assert "Origin" in r.headers.getall("Vary")


async def test_errors_to_an_allowed_origin_say_so(make_client: MakeClient) -> None:
    """A browser's script reads an error's body (and Retry-After) only if it carries
    the origin: a 401, the router's 404 and 405, a 413, a plugin's 429."""
    client = await make_client(**keyed(max_body_bytes=1024, **CORS), plugins=[
        {"name": "rate_limit", "config": {"rules": [{"per": "key", "rpm": 1}]}}])
    auth = {"Authorization": f"Bearer {KEY}", "Origin": APP}
    answers = [
        await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP}),
        await client.get("/v1/nope", headers=auth),
        await client.put("/v1/chat/completions", headers=auth),
        await client.post("/v1/chat/completions", headers=auth,
                          json={**CHAT, "messages": [{"role": "user", "content": "x" * 2048}]}),
        await client.post("/v1/chat/completions", json=CHAT, headers=auth),
        await client.post("/v1/chat/completions", json=CHAT, headers=auth),
    ]
    assert [r.status for r in answers] == [401, 404, 405, 413, 200, 429]
    for r in answers:
        assert r.headers["Access-Control-Allow-Origin"] == APP, r.status
        assert "x-request-id" in r.headers["Access-Control-Expose-Headers"]


async def test_any_origin_is_a_star_and_credentials_are_granted_where_set(
        make_client: MakeClient) -> None:
    client = await make_client(server={"cors": {"allow_origins": ["*"]}})
    r = await client.options("/v1/models", headers={**PREFLIGHT, "Origin": EVIL,
                                                    "Access-Control-Request-Method": "GET"})
    assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "*"
    r = await client.get("/v1/models", headers={"Origin": EVIL})
    assert r.headers["Access-Control-Allow-Origin"] == "*" and "Vary" not in r.headers
    client = await make_client(server={"cors": {"allow_origins": [APP],
                                                "allow_credentials": True,
                                                "allow_methods": ["*"]}})
    r = await client.options("/v1/models", headers={
        "Origin": APP, "Access-Control-Request-Method": "HEAD"})
    assert r.status == 204
    assert r.headers["Access-Control-Allow-Methods"] == "HEAD"
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    r = await client.get("/v1/models", headers={"Origin": APP})
    assert r.headers["Access-Control-Allow-Credentials"] == "true"


@pytest.mark.parametrize("cors", [{"allow_origins": [APP]}, {"allow_origins": ["*"]}])
async def test_a_cached_answer_names_no_other_origin(make_client: MakeClient,
                                                     cors: dict[str, Any]) -> None:
    """An HTTP cache between browsers and Weir keys an answer by what its `Vary` names:
    every answer, a hit of Weir's cache (`x-weir-cache`) or none, to an allowed origin,
    another or no origin, either says it depends on the origin or is the same for all
    (`*`), so no cache serves one origin's grant to another, nor an answer without one
    to a page. A hit is as its miss was (the cache holds no CORS header)."""
    client = await make_client(server={"cors": cors}, plugins=[{"name": "cache", "config": {
        "store_truncated": True, "semantic": {"enabled": False}}}])
    ask = {**CHAT, "temperature": 0}
    grants: list[str | None] = []
    for origin in (APP, EVIL, None, APP):
        r = await client.post("/v1/chat/completions", json=ask,
                              headers={"Origin": origin} if origin else {})
        assert r.status == 200, await r.text()
        grant = r.headers.get("Access-Control-Allow-Origin")
        grants.append(grant)
        assert grant == "*" or "Origin" in r.headers.getall("Vary", ()), origin
    assert grants == (["*"] * 4 if cors["allow_origins"] == ["*"] else [APP, None, None, APP])
    assert r.headers["x-weir-cache"] != "miss"


@pytest.mark.parametrize("allowed", [False, True])
async def test_a_private_network_preflight_is_granted_only_where_set(
        make_client: MakeClient, allowed: bool) -> None:
    """Chrome asks a preflight `Access-Control-Request-Private-Network: true` of a public
    page calling a private address (a Weir on a LAN or localhost): granted only with
    `allow_private_network`."""
    client = await make_client(server={"cors": {"allow_origins": [APP],
                                                "allow_private_network": allowed}})
    r = await client.options("/v1/chat/completions", headers={
        **PREFLIGHT, "Access-Control-Request-Private-Network": "true"})
    assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == APP
    assert r.headers.get("Access-Control-Allow-Private-Network") == ("true" if allowed
                                                                     else None)
    r = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert "Access-Control-Allow-Private-Network" not in r.headers


@pytest.mark.parametrize(("cors", "says"), [
    ("{allow_origins: ['*'], allow_credentials: true}", "browsers refuse"),
    ("{allow_origins: ['*', 'https://a.example']}", "stands alone"),
    ("{allow_origins: ['https://app.example.com/']}", "no path"),
    ("{allow_origins: ['app.example.com']}", "scheme://host"),
    ("{allow_origins: ['null']}", "cannot be allowed"),
    ("{allow_origins: ['https://*.example.com']}", "not as a pattern"),
    ("{allow_origins: ['https://a.example'], allow_methods: ['GET POST']}", "HTTP method"),
    # (a trailing line break, as a YAML block scalar leaves one, went into the header:
    # every answer to the origin then failed to be written)
    ('{allow_origins: ["https://a.example"], allow_methods: ["GET\\n"]}', "HTTP method"),
    ('{allow_origins: ["https://a.example"], expose_headers: ["x-a\\n"]}', "header name"),
    ("{max_age_s: -1}", "greater than or equal"),
])
def test_a_bad_cors_config_is_refused_naming_its_path(cors: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings(f"auth: {{mode: open}}\nserver:\n  cors: {cors}\n", env={})
    (path, message), = e.value.errors
    assert path.startswith("server.cors") and says in message, (path, message)


@pytest.mark.parametrize(("listed", "sent"), [
    ("https://App.Example.COM:443", "https://app.example.com"),
    ("HTTP://app.example.com:80", "http://app.example.com"),
    ("http://app.example.com:8080", "http://app.example.com:8080"),
    ("https://bücher.example", "https://xn--bcher-kva.example"),
    ("http://[::1]:80", "http://[::1]"),
])
async def test_an_origin_is_listed_as_a_browser_sends_it(
        make_client: MakeClient, listed: str, sent: str) -> None:
    """A browser serialises its origin (RFC 6454 6.1): scheme and host in lower case, the
    host in IDNA, the scheme's default port left out. An origin listed otherwise
    (`https://app.example.com:443`) matched no Origin ever sent, and its pages were
    refused, in silence: it is read as the browser sends it."""
    client = await make_client(server={"cors": {"allow_origins": [listed]}})
    r = await client.options("/v1/models", headers={
        "Origin": sent, "Access-Control-Request-Method": "GET"})
    assert r.status == 204, await r.text()
    assert r.headers["Access-Control-Allow-Origin"] == sent
    other = "https://app.example.com:444" if sent.startswith("https") else EVIL
    r = await client.options("/v1/models", headers={
        "Origin": other, "Access-Control-Request-Method": "GET"})
    assert r.status == 403


async def test_the_readmes_cors_example_serves_its_origins(
        make_client: MakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    block, = [b for b in re.findall(r"```yaml\n(.*?)```", README, re.S)
              if "\n  cors:\n" in b]
    monkeypatch.setenv("WEIR_KEY_APP", KEY)
    data = interpolate(yaml.safe_load(block))
    client = await make_client(**data)
    for origin in (APP, "http://localhost:5173"):
        r = await client.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": origin})
        assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == origin
    r = await client.get("/v1/models", headers={"Origin": APP, "Authorization": f"Bearer {KEY}"})
    assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == APP
    assert (await client.options("/v1/models", headers={**PREFLIGHT, "Origin": EVIL})).status == 403
