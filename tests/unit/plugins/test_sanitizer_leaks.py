"""Sanitizer: what the stop-48 probe of secrets found (a vendor format it missed, keys
split over lines and messages)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from plugins.sanitizer.config import SanitizerConfig
from plugins.sanitizer.detectors import BUILTIN
from plugins.sanitizer.plugin import SanitizerPlugin
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services
from proxy.context import RequestContext
from proxy.errors import InvalidRequest
from proxy.openai_responses import translate as X
from proxy.openai_responses.models import ResponsesRequest
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics
from proxy.text import normalize
from tests.fakes import FakeEngine


def fires(name: str, text: str) -> bool:
    return bool(list(BUILTIN[name].find(normalize(text))))


@pytest.mark.parametrize("text", [
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # Stripe's webhook signing secret, bare
    "endpoint secret: whsec_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6",
])
def test_a_stripe_webhook_secret_is_a_secret(text: str) -> None:
    assert fires("secret", text)


@pytest.mark.parametrize("text", ["the whsec_ prefix marks Stripe's webhook secrets",
                                  "set whsec_test in the dashboard"])
def test_its_prefix_alone_is_not(text: str) -> None:
    assert not fires("secret", text)


# ------------------------------------------------- a key split over a break

KEY = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7"
LONG = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7Rt" * 4  # 152 characters


def redacted(text: str) -> str:
    """`text` with what the secret detector finds replaced, as a `redact` action does."""
    norm = normalize(text)
    out, at = [], 0
    for a, b in sorted(BUILTIN["secret"].find(norm)):
        if a >= at:
            out += [norm[at:a], "[SECRET]"]
            at = b
        else:
            at = max(at, b)
    return "".join([*out, norm[at:]])


@pytest.mark.parametrize("text", [
    f"{KEY[:18]}\n{KEY[18:]}",  # the Responses API joins a message's parts with a line
    f"my key: {KEY[:20]}\r\n    {KEY[20:]} thanks",
    "\n".join(LONG[i:i + 40] for i in range(0, len(LONG), 40)),  # wrapped at 40
    "token ghp_aB3dE6gH9jK2mN5pQ8\nsT1vW4yZ7bC0eF3hJ6 here",
])
def test_a_key_wrapped_over_lines_is_redacted_whole(text: str) -> None:
    out = redacted(text)
    assert "[SECRET]" in out
    for piece in ("9kLm2nOp5q", "Q7Rt", "sT1vW4yZ7b", "Ab3dEf6hIj"):
        assert piece not in out, out


@pytest.mark.parametrize(("text", "kept"), [
    (f"{KEY}\nThanks for the help", "Thanks for the help"),
    ("see sk-learn\nDocumentation", "Documentation"),
    ("pip install sk-learn-pipeline\nREADMEFILEFORTHEPROJECT", "README"),
    (f"{KEY}\n\n9kLm2nOp5qRs8tUv1wXy4zQ7 is a build id", "9kLm2nOp5q"),  # a blank line
])
def test_the_line_after_a_key_that_is_not_part_of_it_stays(text: str, kept: str) -> None:
    assert kept in redacted(text)


def plugin(**detectors: str) -> SanitizerPlugin:
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
    return SanitizerPlugin(SanitizerConfig.model_validate({"detectors": detectors}), services)


def chat(*messages: tuple[str, str]) -> RequestContext:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": role, "content": text} for role, text in messages]})
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id="r")


class Spy:
    ctx: RequestContext | None = None

    async def __call__(self, ctx: RequestContext) -> Reply:
        self.ctx = ctx
        return Completion({"choices": []})


@pytest.mark.parametrize("messages", [
    [("user", KEY[:18]), ("user", KEY[18:])],
    [("user", f"my key is {KEY[:18]}"), ("assistant", "go on"), ("user", KEY[18:])],
    [("user", f"key {KEY[:18]}"), ("user", KEY[18:30]), ("user", f"{KEY[30:]} ok?")],
])
async def test_a_key_split_over_messages_is_redacted_in_each(
        messages: list[tuple[str, str]]) -> None:
    ctx = chat(*messages)
    spy = Spy()
    await plugin(secret="redact")(ctx, spy)
    assert spy.ctx is not None and "secret" in spy.ctx.flags
    for req in (spy.ctx.request, spy.ctx.key_request):
        said = " ".join(m.text() for m in req.messages)  # type: ignore[union-attr]
        assert "Ab3dEf6hIj" not in said and "9kLm2nOp5q" not in said, said


async def test_a_key_split_over_messages_is_blocked_where_keys_are() -> None:
    ctx = chat(("user", KEY[:18]), ("assistant", "ok"), ("user", KEY[18:]))
    with pytest.raises(InvalidRequest):
        await plugin(secret="block")(ctx, Spy())


async def test_words_after_a_key_prefix_in_the_next_message_pass() -> None:
    ctx = chat(("user", "what is sk-learn"), ("assistant", "A library."),
               ("user", "Documentation please"))
    spy = Spy()
    await plugin(secret="redact")(ctx, spy)
    assert spy.ctx is not None and "secret" not in spy.ctx.flags


# ------------------------------------------------- texts kept aside (no prompt holds them)

def test_a_key_in_a_reasoning_items_encrypted_content_is_stored_redacted() -> None:
    """A replayed reasoning item is listed and stored with the input, screened as its
    summary is: `encrypted_content` too, whatever the client put in it."""
    req = ResponsesRequest.model_validate({"model": "m", "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [
            {"type": "summary_text", "text": f"used {KEY}"}], "encrypted_content": KEY},
        {"role": "user", "content": "go on"}]})
    screen = plugin(secret="redact").screen_aside()
    assert screen is not None
    items = X.screened_reasoning(X.input_items(req), screen)
    assert KEY not in json.dumps(items)
    assert items[1]["encrypted_content"] == "[SECRET]"
    assert items[1]["summary"][0]["text"] == "used [SECRET]"


def test_an_opaque_blob_in_encrypted_content_is_kept_as_sent() -> None:
    blob = "gAAAAABo" + "Zm9vYmFyYmF6cXV4" * 64 + "-_Q=="
    req = ResponsesRequest.model_validate({"model": "m", "input": [
        {"type": "reasoning", "summary": [], "encrypted_content": blob},
        {"role": "user", "content": "go on"}]})
    screen = plugin(secret="redact", email="redact", card="redact").screen_aside()
    assert screen is not None
    assert X.screened_reasoning(X.input_items(req), screen)[0]["encrypted_content"] == blob


async def test_texts_screened_aside_count_in_the_limit_on_what_it_reads() -> None:
    """A Response's reasoning items (and the caller's texts it echoes) are screened
    aside, in no prompt: counted in `max_total_chars` as the prompt is, or 4 MB of them
    held the event loop for seconds."""
    san = SanitizerPlugin(SanitizerConfig.model_validate(
        {"detectors": {"secret": "redact"}, "limits": {"max_total_chars": 1000}}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))
    req = ResponsesRequest.model_validate({"model": "m", "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "x" * 600}],
         "encrypted_content": "y" * 600},
        {"role": "user", "content": "go on"}]})
    assert X.aside_chars(req) == 1200
    ctx = chat(("user", "hi"), ("user", "go on"))
    ctx.aside_chars = X.aside_chars(req)
    with pytest.raises(InvalidRequest):
        san.refuse_ahead(ctx)
    with pytest.raises(InvalidRequest) as e:
        await san(ctx, Spy())
    assert (e.value.status, e.value.param) == (400, "messages")  # (`input`, as Responses)
    assert X.aside_chars(req.model_copy(update={"safety_identifier": "u" * 10, "metadata": {
        "k": "v" * 5}})) == 1216  # (not `user`: the chat request carries it, counted there)



async def test_texts_aside_do_not_count_where_no_detector_reads_them() -> None:
    """With no detector redacting or blocking (flag only, as config/weir.yaml), nothing
    screens a Response's reasoning items or the caller's texts aside: they are not read,
    so they take nothing from `max_total_chars` (a long conversation was refused)."""
    san = SanitizerPlugin(SanitizerConfig.model_validate(
        {"detectors": {"secret": "flag"}, "limits": {"max_total_chars": 1000}}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))
    assert san.screen_aside() is None
    ctx = chat(("user", "hi"), ("user", "go on"))
    ctx.aside_chars = 1200
    ctx.request = ctx.request.model_copy(update={"user": "u" * 1200})
    san.refuse_ahead(ctx)  # (not refused)
    spy = Spy()
    await san(ctx, spy)
    assert spy.ctx is not None

# ------------------------------------------------- what a tool carries beyond its fields

def with_tools(tools: list[dict[str, Any]]) -> RequestContext:
    req = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools})
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id="r")


EXTRA_TOOLS = [{"type": "function", "note": f"tool key {KEY}", "function": {
    "name": "f", "parameters": {"type": "object"}, "x-notes": {KEY: [f"use {KEY}"]}}}]


async def test_a_key_in_a_tools_extra_fields_is_redacted() -> None:
    """The chat template gets the tool definitions whole (`tool_dicts`), the fields the
    protocol does not name included: the sanitizer read only the description and the
    parameters, so a key beside them reached the engine and the cache key."""
    ctx = with_tools(EXTRA_TOOLS)
    spy = Spy()
    await plugin(secret="redact")(ctx, spy)
    assert spy.ctx is not None and "secret" in spy.ctx.flags
    for req in (spy.ctx.request, spy.ctx.key_request):
        assert isinstance(req, ChatCompletionRequest)
        said = json.dumps(req.tool_dicts())
        assert "Ab3dEf6hIj" not in said and said.count("[SECRET]") == 3, said
        assert req.tools is not None and req.tools[0].function.name == "f"


async def test_a_key_in_a_tools_extra_fields_is_blocked_where_keys_are() -> None:
    with pytest.raises(InvalidRequest):
        await plugin(secret="block")(with_tools(EXTRA_TOOLS), Spy())


async def test_tools_without_a_finding_are_passed_on_as_they_came() -> None:
    ctx = with_tools([{"type": "function", "x": 1, "function": {"name": "f", "y": "plain"}}])
    before = ctx.request
    spy = Spy()
    await plugin(secret="redact")(ctx, spy)
    assert spy.ctx is not None
    assert spy.ctx.request.tools[0] is before.tools[0]  # type: ignore[union-attr,index]


# ------------------------------------------------- code that passes a credential along

@pytest.mark.parametrize("text", [
    "        username, password = decoded.split(\":\", 1)",
    "    login, account, password = auth_from_netrc(url.host)",
    "        token = b64encode(userpass).decode()",
    "        return BasicAuth(username=auth[0], password=auth[1])",
    "    username, password = request.url.username, request.url.password",
    "        password = quote(kwargs.pop(\"password\", \"\") or \"\")",
    "            api_key=api_key,\n            admin_api_key=admin_api_key,",
    "    redis://[[username]:[password]]@localhost:6379/0",
    "unix://[username@]/path/to/socket.sock?db=0[&password=password]",
    '        "password": password,\n        "ssl_password": ssl_password,',
    "    .. note:: if the token is *not* stored in thread local storage",
    "    def set_re_auth_token(self, token: TokenInterface):",
    "        self.certificate_password = ssl_password",
    "        token = uuid.uuid4().hex.encode()",
    "    password=self.key_password,",
    "CONFIGFILE_KEY = 'pydantic-mypy'",
    "        token = value_str",
    "    `token=True` is required when you want to use a private model",
    "        raise ValueError(\"No token is defined.\")",
    "        token = {token_id: token for token, token_id in vocab.items()}",
    '    token = tokenizer_json["model"]["vocab"][unk_id][0]',
    "    ENV_GITHUB_TOKEN = \"GITHUB_TOKEN\"",
    "    token = AddedToken(token, rstrip=False)",
    "    experimental: pass to the validator.\n    allow_partial: **Experimental** flag",
])
def test_code_that_passes_a_credential_along_is_none(text: str) -> None:
    """Python read as "password = <value>": the value is code naming or computing the
    credential (a call, an attribute, an item, a variable named for it), not one; with
    `secret: redact` such code reached the model mangled ("api_key=[SECRET]")."""
    assert not fires("secret", text)


@pytest.mark.parametrize("text", [
    "password = hunter2", "password: swordfish", "password=Tr0ub4dor&3",
    "password: john.smith", "password: P4ss(w0rd)", "db_password = s3cret_2024",
    "api_key: a8f5f167f44f4964e6c998dee827110c", "token = 'ghp-abc123XYZ'",
    "client_secret=Zx8Vb7Nm6Lk5Jh4Gf3Ds2Aq1", "password = 'correct_horse'",
    "the wifi password is blue elephant 42", "AWS_SECRET_KEY=wJalrXUtnFEMI/K7MDENG",
])
def test_credentials_written_as_code_still_are(text: str) -> None:
    assert fires("secret", text)


@pytest.mark.parametrize("text", [
    "DB_PASSWORD=my_secret_pass", "export DB_PASSWORD=my_secret_pass",
    "PASSWORD=admin.pass", "SECRET_KEY=super-secret-key",
    "FOO=1 API_KEY=prod_secret_key ./run.sh", "# .env\nDATABASE_PASSWORD=blue_river.stone",
])
def test_a_shell_or_env_assignment_is_its_value(text: str) -> None:
    """NAME=value in a shell line or a .env file: the value is literal there (a variable
    is "$NAME"), so a snake_case, dotted or hyphenated one is the credential itself; the
    code rules read it as a variable named for it or an attribute and let it through."""
    assert fires("secret", text)


@pytest.mark.parametrize("text", [
    "PGPASSWORD=swordfish psql -h db", "PGPASSWORD=my_secret_pass psql",
])
def test_a_name_run_into_its_password_takes_plain_words_as_db_password_does(
        text: str) -> None:
    """"PGPASSWORD=swordfish" went through where "DB_PASSWORD=swordfish" is a secret."""
    assert fires("secret", text)


@pytest.mark.parametrize("text", [
    "PASSWORD=get_password()", "TOKEN=GITHUB_TOKEN", "API_KEY=your_api_key_here",
    "db_password=my_secret_pass", "connect(password=db_password)",
])
def test_an_env_assignment_of_a_call_or_a_name_still_is_none(text: str) -> None:
    assert not fires("secret", text)


# ------------------------------------------------- the caller's texts that go on unread

async def test_the_callers_texts_going_on_with_a_request_are_screened_not_read() -> None:
    """`metadata`, `user`, `safety_identifier`, `prompt_cache_key` go on with the request
    (an upstream engine gets them, and may store them) though no prompt holds them: they
    went unredacted, a blocked value too, while Weir's own store kept them screened.
    They are screened as what a route keeps is, and flag nothing (an app's `user` is
    often its user's address; a `block` detector blocks in `metadata`, not in an
    identifier: test_sanitizer_upstream);
    an identifier that holds what a detector redacts goes on
    as its hash, so two callers stay two (a placeholder made them one user upstream)."""
    req = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"to": "jane@example.com", "ref": "ORD-123456"}, "user": KEY,
        "safety_identifier": "jane@example.com", "prompt_cache_key": f"k-{KEY}"})
    ctx = RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                         request_id="r")
    san = SanitizerPlugin(SanitizerConfig.model_validate({
        "detectors": {"email": "redact", "secret": "redact"},
        "custom": [{"name": "order_id", "pattern": "ORD-\\d{6}", "action": "redact"}]}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))
    spy = Spy()
    await san(ctx, spy)
    assert spy.ctx is not None and not spy.ctx.flags and not spy.ctx.sensitive
    said = spy.ctx.request
    assert isinstance(said, ChatCompletionRequest)
    assert said.metadata == {"to": "[EMAIL]", "ref": "[ORDER_ID]"}
    ids = (said.user, said.safety_identifier, said.prompt_cache_key)
    assert ids == tuple(hashlib.sha256(v.encode()).hexdigest()
                        for v in (KEY, "jane@example.com", f"k-{KEY}"))
    assert not any("jane" in v or KEY in v for v in ids)
    other = await _screened_ids(san, "john@example.com")
    assert other != said.safety_identifier and len(other) == 64  # (OpenAI's bound on it)
    assert await _screened_ids(san, "user-123") == "user-123"  # nothing fires: as sent


async def _screened_ids(san: SanitizerPlugin, safety_identifier: str) -> str:
    req = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "safety_identifier": safety_identifier})
    ctx = RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                         request_id="r")
    spy = Spy()
    await san(ctx, spy)
    assert spy.ctx is not None and isinstance(spy.ctx.request, ChatCompletionRequest)
    got = spy.ctx.request.safety_identifier
    assert got is not None
    return got


async def test_the_callers_texts_count_in_the_limit_on_what_it_reads() -> None:
    san = SanitizerPlugin(SanitizerConfig.model_validate(
        {"detectors": {"secret": "redact"}, "limits": {"max_total_chars": 1000}}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))
    for body in ({"messages": [{"role": "user", "content": "hi"}]}, {"prompt": "hi"}):
        req = (ChatCompletionRequest if "messages" in body else CompletionRequest
               ).model_validate({"model": "m", "user": "u" * 1000, **body})
        ctx = RequestContext(route="chat", request=req,
                             principal=Principal("t", "user", "u"), request_id="r")
        with pytest.raises(InvalidRequest) as e:
            await san(ctx, Spy())
        assert e.value.status == 400


@pytest.mark.parametrize("text", ["PGPASSWORD=s3cr3tPass psql -h db -U app",
                                  "export MYSQLPASSWORD='Xy9$kLm2'"])
def test_a_password_variable_run_into_its_name_is_read_as_one(text: str) -> None:
    """libpq's `PGPASSWORD`, as `DB_PASSWORD=` was: the name runs into its PASSWORD."""
    assert fires("secret", text)


@pytest.mark.parametrize("text", ["PGPASSWORD=$DB_PASS psql", "NOPASSWORD: ALL",
                                  "set PGPASSWORD=changeme", "PASSWORD=password"])
def test_a_password_variable_holding_no_password_is_none(text: str) -> None:
    assert not fires("secret", text)



# ------------------------------------------------- a key base64-encoded

def b64(raw: str) -> str:
    return base64.b64encode(raw.encode()).decode()


@pytest.mark.parametrize("text", [
    b64(KEY),  # pasted encoded
    '{"auths": {"ghcr.io": {"auth": "' + b64("bob:ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6")
    + '"}}}',  # a Docker config
    "data:\n  aws: " + b64("AKIAIOSFODNN7EXAMPLE"),  # a Kubernetes secret's data
    "token " + b64("xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx") + " ok",
    "data:\n  token: " + b64(KEY + "\n"),  # `echo $KEY | base64`: its line's end with it
    "data:\n  .env: " + b64(f"DEBUG=1\nOPENAI_API_KEY={KEY}\n"),  # a file of lines
])
def test_a_key_base64_encoded_is_a_secret(text: str) -> None:
    out = redacted(text)
    assert "[SECRET]" in out and b64(KEY)[:20] not in out


@pytest.mark.parametrize("text", [
    b64("hello world, this is ordinary text written here"),
    b64("user:hunter2 and the password is swordfish"),  # (a phrase: not when encoded)
    "commit 3f786850e387550fdab836ed7e6dc881de23001b",
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPh"
    "fDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "abcdefghijklmnopqrstuvwxyzABCDEFGH",
])
def test_ordinary_base64_is_none(text: str) -> None:
    assert not fires("secret", text)


def test_a_reasoning_item_is_kept_with_the_fields_the_api_names_only() -> None:
    """A replayed reasoning item was stored and listed as `model_dump` gave it, the
    fields the API does not name with it (on the item and on its parts): no screen read
    them, so a key there stayed in the store as sent. Kept as every other item kind is:
    its own fields."""
    req = ResponsesRequest.model_validate({"model": "m", "input": [
        {"type": "reasoning", "id": "rs_1", "note": KEY, "summary": [
            {"type": "summary_text", "text": "thought", "x": {KEY: [KEY]}}],
         "content": [{"type": "reasoning_text", "text": "more", "y": KEY}],
         "encrypted_content": "blob", "status": "completed"},
        {"role": "user", "content": "go on"}]})
    items = X.input_items(req)
    assert "Ab3dEf6hIj" not in json.dumps(items)
    assert items[0] == {"type": "reasoning", "id": "rs_1", "status": "completed",
                        "summary": [{"type": "summary_text", "text": "thought"}],
                        "content": [{"type": "reasoning_text", "text": "more"}],
                        "encrypted_content": "blob"}


# ------------------------------------------------- extra fields' keys redacted alike

TWO = {"alice@example.com": "first", "bob@example.org": "second"}


async def test_extra_fields_keys_redacted_alike_stay_apart() -> None:
    """Two keys of a field the protocol does not name (on the request, a message, a
    content part, a call's arguments) that redact alike ("[EMAIL]" both) made one entry,
    every value but the last dropped, as `metadata`'s keys did before stop 49."""
    req = ChatCompletionRequest.model_validate({
        "model": "m", "x-req": dict(TWO), "messages": [
            {"role": "user", "x-msg": dict(TWO), "content": [
                {"type": "text", "text": "hi", "x-part": dict(TWO)}]},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": json.dumps(TWO)}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]})
    ctx = RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                         request_id="r")
    spy = Spy()
    await plugin(email="redact")(ctx, spy)
    assert spy.ctx is not None
    want = {"[EMAIL]": "first", "[EMAIL]#2": "second"}
    for sent in (spy.ctx.request, spy.ctx.key_request):
        assert isinstance(sent, ChatCompletionRequest)
        body = sent.model_dump(exclude_unset=True)
        assert body["x-req"] == want
        assert body["messages"][0]["x-msg"] == want
        assert body["messages"][0]["content"][0]["x-part"] == want
        args = body["messages"][1]["tool_calls"][0]["function"]["arguments"]
        assert json.loads(args) == want


async def test_an_extra_key_redacted_as_another_key_reads_stays_apart() -> None:
    req = ChatCompletionRequest.model_validate({
        "model": "m", "x-req": {"[EMAIL]": "literal", "alice@example.com": "hers"},
        "messages": [{"role": "user", "content": "hi"}]})
    ctx = RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                         request_id="r")
    spy = Spy()
    await plugin(email="redact")(ctx, spy)
    assert spy.ctx is not None
    body = spy.ctx.request.model_dump(exclude_unset=True)
    assert body["x-req"] == {"[EMAIL]": "literal", "[EMAIL]#2": "hers"}


# ------------------------------------------------- a key block split over messages

PEM = ["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
       "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu",
       "NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ"]


@pytest.mark.parametrize("messages", [
    [("user", "-----BEGIN RSA PRIVATE KEY-----\n" + PEM[0]),
     ("user", f"{PEM[1]}\n{PEM[2]}\n-----END RSA PRIVATE KEY-----")],
    [("user", "here it is:\n-----BEGIN PRIVATE KEY-----"),
     ("user", "\n".join(PEM) + "\n-----END PRIVATE KEY-----\nthanks")],
    [("user", "-----BEGIN PRIVATE KEY-----\n" + PEM[0]), ("user", PEM[1]),
     ("user", PEM[2] + "\n-----END PRIVATE KEY-----")],
    [("user", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + PEM[0]), ("assistant", "go on"),
     ("user", f"{PEM[1]}\n{PEM[2]}\n-----END OPENSSH PRIVATE KEY-----")],
])
async def test_a_key_block_split_over_messages_is_redacted_in_each(
        messages: list[tuple[str, str]]) -> None:
    """A private key block whose BEGIN line is in one message and its body or END line
    in the next was redacted in the first alone (a block cut off is still a key), and
    the rest of the key went on as sent."""
    spy = Spy()
    await plugin(secret="redact")(chat(*messages), spy)
    assert spy.ctx is not None
    for req in (spy.ctx.request, spy.ctx.key_request):
        said = json.dumps([m.text() for m in req.messages])  # type: ignore[union-attr]
        assert not any(line[:16] in said for line in PEM), said
    last = spy.ctx.request.messages[-1].text()  # type: ignore[union-attr]
    assert "thanks" in last or "[SECRET]" in last


@pytest.mark.parametrize("messages", [
    [("user", "  tls.key: |\n    -----BEGIN PRIVATE KEY-----\n    " + PEM[0]),  # YAML
     ("user", f"    {PEM[1]}\n    {PEM[2]}\n    -----END PRIVATE KEY-----")],
    [("user", '{"private_key": "-----BEGIN PRIVATE KEY-----\\n' + PEM[0] + "\\n"),
     ("user", f"{PEM[1]}\\n{PEM[2]}\\n-----END PRIVATE KEY-----\\n\"}}")],  # JSON
])
async def test_an_indented_or_json_escaped_key_block_split_over_messages_is_redacted(
        messages: list[tuple[str, str]]) -> None:
    """Its END line indented (YAML, a string literal) was no END line, and its lines
    broken by JSON's written-out "\\n" (a service account's file) no body: the rest of
    the key went on as sent."""
    await test_a_key_block_split_over_messages_is_redacted_in_each(messages)


async def test_text_after_a_key_block_s_end_or_a_closed_block_stays() -> None:
    spy = Spy()
    await plugin(secret="redact")(chat(
        ("user", "-----BEGIN PRIVATE KEY-----\n" + "\n".join(PEM) + "\n-----END PRIVATE KEY-----"),
        ("user", "MIIEvQIBADANBgkq is how such keys start; what does it mean?")), spy)
    assert spy.ctx is not None
    assert spy.ctx.request.messages[1].text().startswith(  # type: ignore[union-attr]
        "MIIEvQIBADANBgkq is how")
    spy = Spy()
    await plugin(secret="redact")(chat(
        ("user", "-----BEGIN PRIVATE KEY-----"),
        ("user", "Sorry, I should not paste that. Help me rotate it")), spy)
    assert spy.ctx is not None
    assert spy.ctx.request.messages[1].text() == (  # type: ignore[union-attr]
        "Sorry, I should not paste that. Help me rotate it")


# ------------------------------------------------- encrypted tokens, Slack refresh tokens

JWE = ("eyJhbGciOiJSU0EtT0FFUCIsImVuYyI6IkEyNTZHQ00ifQ.OKOawDo13gRp2ojaHV7LFpZcgV7T6DVZKTyK"
       ".48V1_ALb6US04U3b.5eym8TW_c8SuK0ltJ3rpYIzOeDQz7TALvtu6UG9oMo4vpzs9tX_EFShS8iB7j6ji"
       ".XFBoMYUZodetZdvTiFvSkQ")
JWE_DIR = ("eyJhbGciOiJkaXIiLCJlbmMiOiJBMjU2R0NNIn0..R7Fz2Kq0Vb8xYt3N.a9Bc8De7Fg6Hi5Jk4Lm3No2"
           "Pq1Rs0Tu9Vw8Xy7Za6Bc5De4Fg3Hi2Jk1Lm0No9.Qx8Wv7Ut6Sr5Qp4On3Ml2K")


@pytest.mark.parametrize("text", [
    JWE, f"Cookie: __Secure-next-auth.session-token={JWE_DIR}", f"here: {JWE_DIR}",
    "xoxe-1-My0xLTEyMzQ1Njc4OTAxMi0xMjM0NTY3ODkwMTIzLTEyMzQ1Njc4OTAx",  # Slack refresh
])
def test_an_encrypted_token_or_a_slack_refresh_token_is_a_secret(text: str) -> None:
    """A JWE (five parts: an encrypted session token, NextAuth's cookie) was no JWT to
    the pattern, which wants a second part that is JSON too; Slack's refresh tokens
    (xoxe-) were no Slack token."""
    said = [normalize(text)[a:b] for a, b in BUILTIN["secret"].find(normalize(text))]
    assert any(text.rpartition("=")[2].rpartition(" ")[2] in s for s in said), said


@pytest.mark.parametrize("text", [
    "eyJ is how a JWT starts: eyJhbGciOi... then a dot",
    "version eyJhbGciOiJIUzI1NiJ9.v1.2.3.4 is no token",
    "the xoxe- prefix is Slack's refresh token",
])
def test_talk_about_tokens_is_none(text: str) -> None:
    assert not fires("secret", text)


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("after", [
    " " * 200_000 + "x",  # a run of blanks two parts of a body line could split
    "Proc-Type: " + " \t" * 100_000 + "\\x",
])
async def test_blanks_after_an_open_key_block_cost_their_length_once(after: str) -> None:
    """A message after an open key block was read for the block's body by a pattern
    whose two runs of blanks around a line's content could split a run of blanks
    between them: 200,000 blanks (not squeezed where `normalize` is off) took minutes
    (64 KB, the default bound of one message: half a minute a message)."""
    san = SanitizerPlugin(SanitizerConfig.model_validate(
        {"normalize": False, "detectors": {"secret": "redact"},
         "limits": {"max_message_chars": 262_144}}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))
    spy = Spy()
    await san(chat(("user", "-----BEGIN PRIVATE KEY-----"), ("user", after)), spy)
    assert spy.ctx is not None
    assert spy.ctx.request.messages[1].text() == after  # type: ignore[union-attr]
