"""Every bad input gets an OpenAI-shaped error with the right status, and the server
keeps serving afterwards."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from tests.conftest import MakeClient
from tests.fakes import FakeEngine
from tests.openai_spec import validate

MSG = [{"role": "user", "content": "hi"}]
CHAT = {"model": "fake-model", "messages": MSG}


async def error_of(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    validate("ErrorResponse", body)
    err: dict[str, Any] = body["error"]
    return err


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "temperature": -1}, "temperature"),
        ({**CHAT, "service_tier": "premium"}, "service_tier"),  # (was let through)
        ({"messages": MSG}, "model"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({**CHAT, "logit_bias": {"abc": 1}}, "logit_bias"),
        ({**CHAT, "logit_bias": {"99999": 1}}, "logit_bias"),
        ({**CHAT, "max_tokens": 10_000}, "max_tokens"),
        ({"model": "fake-model", "messages": [{"role": "user", "content": "x" * 600}]},
         "messages"),
        ({"model": "fake-model", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0].type"),
    ],
)
async def test_bad_chat_params_are_400_naming_the_param(
        make_client: MakeClient, body: dict[str, Any], param: str) -> None:
    client = await make_client()
    err = await error_of(await client.post("/v1/chat/completions", json=body), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


async def test_openai_values_at_the_edges_are_accepted(make_client: MakeClient) -> None:
    """What OpenAI's spec allows is answered: each service tier (checked, not acted on),
    `top_p: 0` (greedy; it was a 400 following vLLM's range)."""
    client = await make_client()
    for extra in ({"service_tier": "priority"}, {"service_tier": "auto"},
                  {"service_tier": None}, {"top_p": 0}, {"top_p": 0, "n": 2}):
        r = await client.post("/v1/chat/completions", json={**CHAT, **extra})
        assert r.status == 200, (extra, await r.text())


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake-model", "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": "fake-model", "prompt": "x", "best_of": 3}, "best_of"),
        ({"model": "fake-model", "prompt": [1] * 600}, "prompt"),
        ({"model": "fake-model", "prompt": "x", "logprobs": 9}, "logprobs"),
    ],
)
async def test_bad_completion_params(make_client: MakeClient, body: dict[str, Any],
                                     param: str) -> None:
    client = await make_client()
    err = await error_of(await client.post("/v1/completions", json=body), 400)
    assert err["param"] == param


@pytest.mark.parametrize(
    ("data", "ctype", "code"),
    [
        (b"{not json", "application/json", "invalid_json"),
        (b'{"model": "\xff"}', "application/json", "invalid_encoding"),
        (b"", "application/json", "invalid_json"),
        (b"[]", "application/json", "invalid_json"),
        (b'{"model": "fake-model"}', "text/plain", "invalid_content_type"),
        (b"model=x", "application/x-www-form-urlencoded", "invalid_content_type"),
    ],
)
async def test_malformed_bodies_are_400(make_client: MakeClient, data: bytes, ctype: str,
                                        code: str) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions", data=data, headers={"Content-Type": ctype})
    err = await error_of(r, 400)
    assert err["code"] == code
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200


def _compressed(coding: str, data: bytes) -> bytes:
    import gzip
    import zlib

    import brotli

    if coding == "zstd":
        from backports import zstd

        return bytes(zstd.compress(data))
    return {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress,
            "identity": bytes}[coding](data)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd", "identity"])
async def test_compressed_bodies_are_read_and_refused_cleanly(make_client: MakeClient,
                                                              coding: str) -> None:
    """A body in a coding aiohttp decodes is served; one its coding cannot decode is a
    400 (it was a 500 for gzip); a decoded body over the limit is a 413 (a small
    compressed body cannot expand past it); the connection keeps serving."""
    client = await make_client(server={"max_body_bytes": 4096})
    raw = json.dumps({**CHAT, "max_tokens": 2}).encode()
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    r = await client.post("/v1/chat/completions", data=_compressed(coding, raw),
                          headers=headers)
    assert r.status == 200, await r.text()
    if coding != "identity":
        r = await client.post("/v1/chat/completions", data=b"\x00 not " + raw,
                              headers=headers)
        err = await error_of(r, 400)
        assert err["code"] == "invalid_body" and coding in err["message"]
    bomb = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 100_000}]})
    r = await client.post("/v1/chat/completions", data=_compressed(coding, bomb.encode()),
                          headers=headers)
    assert (await error_of(r, 413))["code"] == "request_too_large"
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200


async def test_a_body_its_coding_refused_logs_no_error(make_client: MakeClient,
                                                       logs: Any) -> None:
    """A body its coding refuses is the client's error: no error-level line (those page
    whoever is on call). (aiohttp, when it decoded, logged its failure as an unhandled
    exception; `proxy.body` decodes it now, having read it whole.)"""
    client = await make_client()
    for body in (b"\x00 not gzip", gzip.compress(json.dumps(CHAT).encode())[:-8]):
        r = await client.post("/v1/chat/completions", data=body,
                              headers={"Content-Type": "application/json",
                                       "Content-Encoding": "gzip"})
        assert (await error_of(r, 400))["code"] == "invalid_body"
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if x.startswith("{")]
    assert not [x for x in lines if x["level"] in ("error", "critical")]
    assert "Unhandled exception" not in logs.getvalue()


@pytest.mark.parametrize("coding", ["compress", "x-compress", "gzip, foo", "foo"])
async def test_codings_it_cannot_decode_are_415(make_client: MakeClient, coding: str) -> None:
    """They were passed on undecoded (a body in an unknown coding read as JSON)."""
    client = await make_client()
    r = await client.post("/v1/chat/completions", data=json.dumps(CHAT).encode(),
                          headers={"Content-Type": "application/json",
                                   "Content-Encoding": coding})
    err = await error_of(r, 415)
    assert err["code"] == "unsupported_content_encoding" and err["type"] == (
        "invalid_request_error")
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200


async def test_x_gzip_is_read_as_gzip(make_client: MakeClient) -> None:
    """RFC 9110 8.4.1.3: a recipient should take `x-gzip` as gzip (it was a 415)."""
    client = await make_client()
    raw = json.dumps({**CHAT, "max_tokens": 2}).encode()
    for coding in ("x-gzip", "X-GZIP", "x-gzip, br"):
        data = gzip.compress(raw)
        if coding.endswith("br"):
            data = _brotli_compress(data)
        r = await client.post("/v1/chat/completions", data=data,
                              headers={"Content-Type": "application/json",
                                       "Content-Encoding": coding})
        assert r.status == 200, await r.text()
    r = await client.post("/v1/chat/completions", data=b"\x00 not gzip",
                          headers={"Content-Type": "application/json",
                                   "Content-Encoding": "x-gzip"})
    err = await error_of(r, 400)
    assert err["code"] == "invalid_body" and "gzip" in err["message"]


@pytest.mark.parametrize("codings", [["gzip", "gzip"], ["gzip", "br"], ["zstd", "deflate"],
                                     ["identity", "gzip", "gzip"]])
async def test_a_body_in_two_codings_is_decoded_in_turn(make_client: MakeClient,
                                                        codings: list[str]) -> None:
    """`Content-Encoding: gzip, br` is a body gzipped, then compressed in br (RFC 9110
    8.4: codings listed in the order applied); it was a 415. Up to two (identity is
    none) are decoded, last first, each within `max_body_bytes`: a bomb in two layers
    is the 413 of one. Two header lines are one list."""
    from multidict import CIMultiDict

    encoders = {"gzip": gzip.compress, "br": _brotli_compress, "zstd": _zstd_compress,
                "deflate": _zlib_compress, "identity": lambda b: b}
    client = await make_client(server={"max_body_bytes": 4096})

    def coded(raw: bytes) -> bytes:
        for coding in codings:
            raw = encoders[coding](raw)
        return raw

    raw = json.dumps({**CHAT, "max_tokens": 2}).encode()
    for headers in (
            CIMultiDict([("Content-Type", "application/json"),
                         ("Content-Encoding", ", ".join(codings))]),
            CIMultiDict([("Content-Type", "application/json"),
                         *(("Content-Encoding", c) for c in codings)])):
        r = await client.post("/v1/chat/completions", data=coded(raw), headers=headers)
        assert r.status == 200, await r.text()
    headers = CIMultiDict([("Content-Type", "application/json"),
                           ("Content-Encoding", ", ".join(codings))])
    bomb = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 1_000_000}]})
    r = await client.post("/v1/chat/completions", data=coded(bomb.encode()), headers=headers)
    assert (await error_of(r, 413))["code"] == "request_too_large"
    r = await client.post("/v1/chat/completions", data=gzip.compress(raw), headers=headers)
    assert (await error_of(r, 400))["code"] == "invalid_body"  # (one layer of two)


async def test_a_body_in_more_than_two_codings_is_a_415(make_client: MakeClient) -> None:
    """Each layer decoded costs a pass within the size limit: past two, refused, saying
    so (a 415, as a coding Weir does not decode)."""
    client = await make_client()
    body = gzip.compress(gzip.compress(gzip.compress(json.dumps(CHAT).encode())))
    r = await client.post("/v1/chat/completions", data=body,
                          headers={"Content-Type": "application/json",
                                   "Content-Encoding": "gzip, gzip, gzip"})
    err = await error_of(r, 415)
    assert err["code"] == "unsupported_content_encoding" and "at most 2" in err["message"]


def _brotli_compress(data: bytes) -> bytes:
    import brotli
    return bytes(brotli.compress(data))


def _zstd_compress(data: bytes) -> bytes:
    from backports.zstd import compress
    return bytes(compress(data))


def _zlib_compress(data: bytes) -> bytes:
    import zlib
    return zlib.compress(data)


async def test_body_too_large_is_413(make_client: MakeClient) -> None:
    client = await make_client(server={"max_body_bytes": 2048})
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    err = await error_of(await client.post("/v1/chat/completions", json=big), 413)
    assert err["code"] == "request_too_large"

    async def chunked() -> Any:  # no Content-Length: the limit must hold while reading
        yield b'{"model": "fake-model", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    r = await client.post("/v1/chat/completions", data=chunked(),
                          headers={"Content-Type": "application/json"})
    await error_of(r, 413)


async def test_unknown_model_is_404(make_client: MakeClient) -> None:
    client = await make_client()
    err = await error_of(await client.post("/v1/chat/completions",
                                           json={**CHAT, "model": "nope"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"


async def test_unknown_route_404_and_wrong_method_405(make_client: MakeClient) -> None:
    client = await make_client()
    err = await error_of(await client.get("/v1/nope"), 404)
    assert err["code"] == "unknown_url"
    await error_of(await client.put("/v1/chat/completions"), 405)


async def test_auth_errors(make_client: MakeClient) -> None:
    client = await make_client(auth={"mode": "keys", "keys": [
        {"key": "good", "tenant": "a", "models": ["other-model"]}]})
    err = await error_of(await client.post("/v1/chat/completions", json=CHAT), 401)
    assert err["code"] == "missing_api_key"
    r = await client.post("/v1/chat/completions", json=CHAT,
                          headers={"Authorization": "Bearer wrong"})
    assert (await error_of(r, 401))["code"] == "invalid_api_key"
    assert r.headers["x-should-retry"] == "false"
    r = await client.post("/v1/chat/completions", json=CHAT,
                          headers={"Authorization": "Bearer good"})
    assert (await error_of(r, 403))["param"] == "model"


@pytest.mark.parametrize("headers", [
    {"api-key": "good"}, {"x-api-key": "good"}, {"Api-Key": " good "},
    {"Authorization": "Token good", "api-key": "good"},  # a scheme Weir does not read
])
async def test_a_key_in_an_api_key_header_is_read(make_client: MakeClient,
                                                  headers: dict[str, str]) -> None:
    """Azure OpenAI's SDK sends its key as `api-key`, Anthropic's as `x-api-key`: read as
    a bearer key when no `Authorization` carries one; a wrong one is a 401 as ever."""
    client = await make_client(auth={"mode": "keys", "keys": [{"key": "good", "tenant": "a"}]})
    r = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status == 200, await r.text()
    wrong = {k: "bad" if v.strip() == "good" else v for k, v in headers.items()}
    r = await client.post("/v1/chat/completions", json=CHAT, headers=wrong)
    assert (await error_of(r, 401))["code"] == "invalid_api_key"
    # Two different keys: neither is taken (which one a proxy on the way read is unknown).
    r = await client.post("/v1/chat/completions", json=CHAT,
                          headers={"Authorization": "Bearer good", "x-api-key": "bad"})
    assert (await error_of(r, 401))["code"] == "conflicting_api_keys"
    r = await client.post("/v1/chat/completions", json=CHAT,
                          headers={"Authorization": "Bearer good", "x-api-key": "good"})
    assert r.status == 200


async def test_not_ready_is_503_with_retry_after(make_client: MakeClient,
                                                 fake_engine: FakeEngine) -> None:
    fake_engine.set_ready(False)
    client = await make_client()
    r = await client.post("/v1/chat/completions", json=CHAT)
    err = await error_of(r, 503)
    assert err["code"] == "not_ready" and int(r.headers["Retry-After"]) >= 1
    ready = await client.get("/health/ready")
    assert ready.status == 503 and "Retry-After" in ready.headers
    assert (await client.get("/health/live")).status == 200


async def test_engine_failure_is_generic_and_in_band_mid_stream(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client()
    fake_engine.fail_after = 0
    err = await error_of(await client.post("/v1/chat/completions", json=CHAT), 502)
    assert "injected" not in err["message"]
    fake_engine.fail_after = 2
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 5})
    assert r.status == 200
    text = await r.text()
    assert '"error"' in text and text.endswith("data: [DONE]\n\n")
    fake_engine.fail_after = None
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200


async def test_a_bug_is_a_generic_500(make_client: MakeClient, fake_engine: FakeEngine,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(fake_engine, "render_chat", broken)
    client = await make_client()
    err = await error_of(await client.post("/v1/chat/completions", json=CHAT), 500)
    assert "secret" not in err["message"] and err["type"] == "server_error"


@pytest.mark.parametrize("metadata", [
    {"k": "v" * 513}, {"k" * 65: "v"}, {f"k{i}": "v" for i in range(17)}, {"k": 1}])
@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", CHAT),
    ("/v1/responses", {"model": "fake-model", "input": "hi"})])
async def test_metadata_past_openais_bounds_is_400(make_client: MakeClient, path: str,
                                                   body: dict[str, Any],
                                                   metadata: dict[str, Any]) -> None:
    """OpenAI's `Metadata`: at most 16 pairs, keys up to 64 characters, values up to 512
    (chat accepted anything; the Responses API bounded only the count)."""
    client = await make_client()
    err = await error_of(await client.post(path, json={**body, "metadata": metadata}), 400)
    assert err["param"] == "metadata"
    ok = {f"k{i}"[:64]: "v" * 512 for i in range(16)}
    assert (await client.post(path, json={**body, "metadata": ok})).status == 200


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
     "response_format.json_schema.name"),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "text": {"format": {
        "type": "json_schema", "schema": {"type": "object"}}}}, "text.format.name"),
])
async def test_a_json_schema_format_without_a_name_is_400(make_client: MakeClient, path: str,
                                                          body: dict[str, Any],
                                                          param: str) -> None:
    """OpenAI requires the format's `name`; the Responses API echoed the nameless format
    in a `Response` its own spec refuses."""
    client = await make_client()
    err = await error_of(await client.post(path, json=body), 400)
    assert err["param"] == param and err["code"] == "missing_required_parameter"


async def test_two_content_encoding_headers_are_two_codings(make_client: MakeClient) -> None:
    """aiohttp would decode by the last header alone: both are read, and together they
    are codings it does not decode (415), whichever comes last."""
    from multidict import CIMultiDict

    client = await make_client()
    for order in (("foo", "gzip"), ("gzip", "foo")):
        headers = CIMultiDict([("Content-Type", "application/json"),
                               *(("Content-Encoding", c) for c in order)])
        r = await client.post("/v1/chat/completions", data=json.dumps(CHAT).encode(),
                              headers=headers)
        assert (await error_of(r, 415))["code"] == "unsupported_content_encoding"


@pytest.mark.parametrize(("prompt", "param"), [
    ("", "prompt"), ([5, 1000], "prompt[1]"), (["x", ""], "prompt[1]"),
    ([[5], [7, 2000]], "prompt[1][1]")])
async def test_a_prompt_the_engine_cannot_start_from_names_the_prompt(
        make_client: MakeClient, prompt: Any, param: str) -> None:
    """Empty once tokenized (a tokenizer without a start token), or token ids past the
    vocabulary (1,000 here): vLLM refused them with no `param`."""
    engine = FakeEngine()
    engine.encode = lambda text: [ord(c) % 997 + 2 for c in text]  # type: ignore[method-assign]
    client = await make_client(engine=engine)
    r = await client.post("/v1/completions", json={"model": "fake-model", "prompt": prompt,
                                                   "max_tokens": 2})
    err = await error_of(r, 400)
    assert err["param"] == param  # (the member at fault, as the parser names it)
    assert not engine.calls


@pytest.mark.parametrize("ceiling", [None, 50])
async def test_min_tokens_past_what_the_answer_may_have_names_min_tokens(
        make_client: MakeClient, ceiling: int | None) -> None:
    """No `max_tokens` named: the room the context leaves (512 here), or the sanitizer's
    output ceiling, bounds the answer. `min_tokens` past it was vLLM's 400 naming a
    `max_tokens` the client never sent, with no param."""
    plugins = ([{"name": "sanitizer", "config": {"limits": {"max_tokens": ceiling}}}]
               if ceiling else [])
    client = await make_client(plugins=plugins)
    r = await client.post("/v1/chat/completions",
                          json={**CHAT, "min_tokens": 100 if ceiling else 600})
    err = await error_of(r, 400)
    assert (err["param"], err["code"]) == ("min_tokens", "invalid_value")
    ok = await client.post("/v1/chat/completions", json={**CHAT, "min_tokens": 3,
                                                          "max_tokens": 5})
    assert ok.status == 200


@pytest.mark.parametrize("tools", [True, 1, 1.5, 10**20])
@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", CHAT),
    ("/v1/responses", {"model": "fake-model", "input": "hi"})])
async def test_tools_that_are_no_array_are_400_naming_tools(make_client: MakeClient, path: str,
                                                           body: dict[str, Any],
                                                           tools: Any) -> None:
    """`tools` given a number or `true` was walked as an array by the check that refuses
    other tool kinds, before its type was checked: a TypeError and a 500."""
    client = await make_client()
    err = await error_of(await client.post(path, json={**body, "tools": tools}), 400)
    assert err["param"] == "tools" and err["code"] == "invalid_type"
    assert (await client.post(path, json=body)).status == 200


@pytest.mark.parametrize("charset", ["latin-1", "ISO-8859-1", "utf-16", "\"utf-7\"", "cp1252"])
async def test_a_body_in_another_charset_than_utf8_is_400_naming_it(
        make_client: MakeClient, charset: str) -> None:
    """A JSON body is UTF-8 (RFC 8259 8.1): one declared in another charset was read as
    UTF-8 all the same, so a Latin-1 `"Ã©"` (two bytes that are `é` in UTF-8) reached the
    model as `é`, in silence. It is a 400 naming the charset, not read by it: a body
    transcoded would be text that no UTF-8 reader in front of Weir (a WAF, a logging
    proxy) saw."""
    client = await make_client()
    data = json.dumps({**CHAT, "messages": [{"role": "user", "content": "Ã©"}]},
                      ensure_ascii=False).encode("latin-1")
    r = await client.post("/v1/chat/completions", data=data,
                          headers={"Content-Type": f"application/json; charset={charset}"})
    err = await error_of(r, 400)
    assert err["code"] == "invalid_content_type"
    assert charset.strip('"') in err["message"] and "UTF-8" in err["message"]


@pytest.mark.parametrize("ctype", [
    "application/json; charset=utf-8", "application/json; charset=UTF-8",
    "application/json;charset=\"utf-8\"", "application/json; charset=utf8",
    "application/json; charset=us-ascii", "application/json; charset=",
    "application/json; Charset=Utf-8 ",
])
async def test_a_body_declared_utf8_is_read(make_client: MakeClient, ctype: str) -> None:
    client = await make_client()
    data = json.dumps({**CHAT, "messages": [{"role": "user", "content": "café"}]}).encode()
    r = await client.post("/v1/chat/completions", data=data, headers={"Content-Type": ctype})
    assert r.status == 200, await r.text()


@pytest.mark.parametrize("charset", ["cp65001", "CP65001", "\"cp65001\"", "u8", "UTF_8",
                                     "utf"])
async def test_a_body_declared_in_another_name_of_utf8_is_read_as_utf8(
        make_client: MakeClient, charset: str) -> None:
    """`cp65001` (Windows' name for UTF-8, which .NET and PowerShell clients send) and the
    other names Python's codecs know UTF-8 by were judged as some charset over ASCII: a
    body with bytes outside ASCII was a 400 (`ambiguous`), though it is UTF-8 by its own
    declaration. It is read as UTF-8."""
    engine = FakeEngine()
    client = await make_client(engine=engine)
    data = json.dumps({**CHAT, "messages": [{"role": "user", "content": "café"}]},
                      ensure_ascii=False).encode()
    assert not data.isascii()
    r = await client.post("/v1/chat/completions", data=data,
                          headers={"Content-Type": f"application/json; charset={charset}"})
    assert r.status == 200, await r.text()
    (prompt, _, _), = engine.calls
    assert "café" in engine.decode(prompt)


@pytest.mark.parametrize("charset", ["utf-8-sig", "windows-65000", "utf-8-x"])
async def test_a_charset_named_near_utf8_that_is_not_utf8_is_still_refused(
        make_client: MakeClient, charset: str) -> None:
    """Only UTF-8's own names are read as UTF-8: `utf-8-sig` (another codec, a BOM),
    `windows-65000` (UTF-7) and a name Python does not know stay a 400."""
    client = await make_client()
    data = json.dumps({**CHAT, "messages": [{"role": "user", "content": "café"}]},
                      ensure_ascii=False).encode()
    r = await client.post("/v1/chat/completions", data=data,
                          headers={"Content-Type": f"application/json; charset={charset}"})
    err = await error_of(r, 400)
    assert err["code"] == "invalid_content_type"


@pytest.mark.parametrize("ctype", [
    "application/json; charset=utf-8; charset=latin1",
    "application/json; charset=\"utf-8\"; charset=\"latin1\"",
    "application/json; charset=latin1; charset=utf-8",
    "application/json; charset=utf-8; CHARSET=utf-7",
])
async def test_a_body_declared_in_two_charsets_is_read_as_the_other_one_would_be(
        make_client: MakeClient, ctype: str) -> None:
    """`charset` given twice (one UTF-8, one not) was read by the first alone: a body of
    UTF-8 bytes outside ASCII under `charset=utf-8; charset=latin1` was read as UTF-8,
    where a reader in front of Weir that takes the last (a WAF, a logging proxy) saw
    Latin-1 text. Each charset declared is judged: the body is read only as every one of
    them reads it alike (its bytes ASCII, in charsets over ASCII), else a 400."""
    client = await make_client()
    data = json.dumps({**CHAT, "messages": [{"role": "user", "content": "café"}]},
                      ensure_ascii=False).encode()
    r = await client.post("/v1/chat/completions", data=data, headers={"Content-Type": ctype})
    err = await error_of(r, 400)
    assert err["code"] == "invalid_content_type"
    ascii_data = json.dumps({**CHAT, "messages": [{"role": "user", "content": "café"}]}).encode()
    r = await client.post("/v1/chat/completions", data=ascii_data,
                          headers={"Content-Type": ctype})
    assert r.status == (400 if "utf-7" in ctype else 200), await r.text()


@pytest.mark.parametrize("charset", [
    "ISO-8859-1", "latin1", "windows-1252", "cp1252", "\"iso-8859-15\"", "koi8-r",
    "Shift_JIS", "euc-jp", "gb18030", "windows-874",
])
@pytest.mark.parametrize("coding", ["", "gzip"])
async def test_an_ascii_body_is_read_whatever_ascii_superset_it_is_declared_in(
        make_client: MakeClient, charset: str, coding: str) -> None:
    """Some HTTP clients declare `charset=ISO-8859-1` (or windows-1252) by default for a
    JSON body that is ASCII, and OpenAI and vLLM ignore the charset: such a body was a
    400. Bytes all ASCII are the same text in any charset over ASCII as in UTF-8 (`\\u`
    escapes included), so it is read; counted after its Content-Encoding is undone."""
    engine = FakeEngine()
    client = await make_client(engine=engine)
    data = json.dumps({**CHAT, "messages": [{"role": "user", "content": "café"}]}).encode()
    assert data.isascii()
    headers = {"Content-Type": f"application/json; charset={charset}"}
    if coding:
        data, headers = gzip.compress(data), {**headers, "Content-Encoding": coding}
    r = await client.post("/v1/chat/completions", data=data, headers=headers)
    assert r.status == 200, await r.text()
    (prompt, _, _), = engine.calls
    assert "café" in engine.decode(prompt)


@pytest.mark.parametrize(("charset", "data"), [
    ("utf-7", b'{"model": "fake-model", "messages": [{"role": "user", '
              b'"content": "+ADw-script+AD4-"}]}'),  # (`<script>` to a UTF-7 reader)
    ("UTF-7", b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'),
    ("utf-16", b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'),
    ("utf-16le", b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'),
    ("utf-32", b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'),
    ("hz-gb-2312", b'{"model": "fake-model", "messages": [{"role": "user", '
                   b'"content": "~{<:Ky2;S{#,~}"}]}'),  # (Chinese to an HZ reader)
    ("iso-2022-jp", b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'),
    ("cp037", b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'),
    ("unicode-escape", b'{"model": "fake-model", "messages": [{"role": "user", '
                       b'"content": "\\\\u003c"}]}'),
    ("x-unknown", b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'),
])
async def test_a_charset_that_reads_ascii_bytes_as_other_text_is_refused_always(
        make_client: MakeClient, charset: str, data: bytes) -> None:
    """UTF-7, HZ and ISO-2022 read other text from ASCII bytes (UTF-7's `+ADw-` is `<`:
    a filter reading UTF-8 saw none), UTF-16/32 and EBCDIC are not over ASCII at all,
    and an unknown charset may be either: a body declared in one is a 400 naming it,
    whatever its bytes."""
    assert data.isascii()
    client = await make_client()
    r = await client.post("/v1/chat/completions", data=data,
                          headers={"Content-Type": f"application/json; charset={charset}"})
    err = await error_of(r, 400)
    assert err["code"] == "invalid_content_type"
    assert f"Unsupported charset `{charset}`" in err["message"]
