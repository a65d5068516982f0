from __future__ import annotations

import base64
from typing import Any

import pytest

from proxy.auth import Authenticator, sha256_hex
from proxy.errors import InvalidRequest, PermissionDenied, Unauthorized
from proxy.settings import AuthSettings


def _h(authorization: str | None) -> dict[str, str]:
    """Request headers carrying `authorization` (none when it is None)."""
    return {} if authorization is None else {"Authorization": authorization}


def auth(tmp_path, monkeypatch) -> Authenticator:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("K_ENV", "env-key")
    f = tmp_path / "k"
    f.write_text("file-key\n")
    return Authenticator(AuthSettings.model_validate({"mode": "keys", "keys": [
        {"key_sha256": sha256_hex("hashed-key"), "tenant": "a", "role": "admin"},
        {"key_env": "K_ENV", "tenant": "b", "user": "bob"},
        {"key_file": str(f), "tenant": "c", "models": ["m1"]},
    ]}))


def test_each_key_source_maps_to_its_principal(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    a = auth(tmp_path, monkeypatch)
    p = a.authenticate(_h("Bearer hashed-key"))
    assert (p.tenant, p.role) == ("a", "admin")
    assert p.user.startswith("key-") and "hashed" not in p.user
    assert a.authenticate(_h("Bearer env-key")).user == "bob"
    c = a.authenticate(_h("bearer file-key"))
    assert c.tenant == "c" and c.may_use("m1") and not c.may_use("m2")
    with pytest.raises(PermissionDenied):
        c.check_model("m2")


def test_is_key_knows_every_configured_key_by_its_hash(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    a = auth(tmp_path, monkeypatch)
    assert all(a.is_key(k) for k in ("hashed-key", "env-key", "file-key"))
    assert not a.is_key("other") and not a.is_key("")
    assert not Authenticator(AuthSettings.model_validate({"mode": "open"})).is_key("x")


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer wrong"])
def test_bad_or_missing_keys_are_401(tmp_path, monkeypatch, header) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Unauthorized) as e:
        auth(tmp_path, monkeypatch).authenticate(_h(header))
    assert e.value.status == 401
    assert e.value.headers["x-should-retry"] == "false"
    # OpenAI's 401: `invalid_request_error` (Weir's own `authentication_error` was no
    # type of OpenAI's), the code naming the key's fault
    err = e.value.to_body()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["code"] in ("invalid_api_key", "missing_api_key")


@pytest.mark.parametrize(("headers", "code"), [
    ({}, "missing_api_key"), (_h(""), "missing_api_key"), (_h("Bearer"), "missing_api_key"),
    (_h("Bearer  "), "missing_api_key"), ({"api-key": " "}, "missing_api_key"),
    (_h("Bearer wrong"), "invalid_api_key"), (_h("Basic abc"), "invalid_api_key"),
    (_h("Basic !!not-base64!!"), "invalid_api_key"),
    (_h("Basic " + base64.b64encode(b"secret-no-colon").decode()), "invalid_api_key"),
    (_h("Basic " + base64.b64encode(b":").decode()), "invalid_api_key"),
    (_h("Token secret-value"), "invalid_api_key"), (_h("secret-value"), "invalid_api_key"),
    ({"x-api-key": "secret-value"}, "invalid_api_key"),
])
def test_a_credential_given_but_unreadable_is_an_invalid_key_not_a_missing_one(
        tmp_path, monkeypatch, headers, code) -> None:  # type: ignore[no-untyped-def]
    """`Token KEY` or a Basic credential holding no key was told "You didn't provide an
    API key": one was given, and it is wrong. Neither message quotes what was sent."""
    with pytest.raises(Unauthorized) as e:
        auth(tmp_path, monkeypatch).authenticate(headers)
    assert e.value.code == code
    assert "secret" not in e.value.message and "wrong" not in e.value.message
    assert ("didn't provide" in e.value.message) == (code == "missing_api_key")


def test_open_mode_is_anonymous_but_honours_known_keys() -> None:
    a = Authenticator(AuthSettings.model_validate(
        {"mode": "open", "keys": [{"key": "k1", "tenant": "t1"}]}))
    assert a.authenticate(_h(None)).tenant == "public"
    assert a.authenticate(_h("Bearer whatever")).tenant == "public"
    assert a.authenticate(_h("Bearer k1")).tenant == "t1"


def test_missing_env_key_is_an_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(ValueError):
        Authenticator(AuthSettings.model_validate(
            {"mode": "keys", "keys": [{"key_env": "NOPE_KEY"}]}))


def test_admin_rights_are_per_tenant_unless_operator() -> None:
    import base64

    a = Authenticator(AuthSettings.model_validate({"mode": "keys", "keys": [
        {"key": "u", "tenant": "t"}, {"key": "adm", "tenant": "t", "role": "admin"},
        {"key": "op", "tenant": "ops", "operator": True}]}))
    assert a.require_role(_h("Bearer adm"), "admin", "x").tenant == "t"
    assert a.require_role(_h("Bearer op"), "admin", "x").operator
    assert a.require_role(_h("Bearer op"), "operator", "x").is_admin
    for header, role in (("Bearer u", "admin"), ("Bearer adm", "operator"),
                         ("Bearer u", "operator")):
        with pytest.raises(PermissionDenied):
            a.require_role(_h(header), role, "x")  # type: ignore[arg-type]
    with pytest.raises(Unauthorized):
        a.require_role(_h(None), "admin", "x")
    basic = "Basic " + base64.b64encode(b"anyone:adm").decode()
    assert a.authenticate(_h(basic)).role == "admin"  # what a browser sends for /dashboard
    as_user = "Basic " + base64.b64encode(b"adm:").decode()  # curl -u KEY:
    assert a.authenticate(_h(as_user)).role == "admin"
    for bad in ("Basic " + base64.b64encode(b"adm").decode(), "Basic !!not-base64!!"):
        with pytest.raises(Unauthorized):  # no password / not base64
            a.authenticate(_h(bad))


@pytest.mark.parametrize("header", [
    "Basic \udcff\udcfe",  # bytes that are not UTF-8, as aiohttp hands them on
    "Basic cl\u00e9",        # UTF-8, but not ASCII: not base64 either
])
def test_a_basic_credential_that_is_not_ascii_is_a_401(tmp_path, monkeypatch, header) -> None:  # type: ignore[no-untyped-def]
    """base64 refuses text that is not ASCII with a ValueError, not binascii.Error: it
    was a 500 for a header any client can send."""
    with pytest.raises(Unauthorized):
        auth(tmp_path, monkeypatch).authenticate(_h(header))


@pytest.mark.parametrize("pairs", [
    [("Authorization", "Bearer hashed-key"), ("Authorization", "Bearer env-key")],
    [("Authorization", "Bearer hashed-key"), ("api-key", "env-key")],
    [("api-key", "hashed-key"), ("x-api-key", "nobody's key")],
    [("x-api-key", "env-key"), ("x-api-key", "hashed-key")],
])
def test_two_different_keys_are_refused(tmp_path, monkeypatch, pairs) -> None:  # type: ignore[no-untyped-def]
    """Which of two keys a proxy on the way (or Weir) reads is anyone's guess: the answer
    could be another tenant's, so neither is taken."""
    from multidict import CIMultiDict

    with pytest.raises(Unauthorized) as e:
        auth(tmp_path, monkeypatch).authenticate(CIMultiDict(pairs))
    assert e.value.status == 401 and e.value.code == "conflicting_api_keys"


def test_the_same_key_sent_twice_is_one_key(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from multidict import CIMultiDict

    a = auth(tmp_path, monkeypatch)
    same = CIMultiDict([("Authorization", "Bearer env-key"), ("api-key", " env-key "),
                        ("authorization", "bearer env-key"), ("x-api-key", "")])
    assert a.authenticate(same).user == "bob"


def test_open_mode_without_keys_reads_no_conflict() -> None:
    from multidict import CIMultiDict

    a = Authenticator(AuthSettings.model_validate({"mode": "open"}))
    headers = CIMultiDict([("Authorization", "Bearer a"), ("api-key", "b")])
    assert a.authenticate(headers).tenant == "public"


def test_a_gateway_key_forwards_for_callers_as_tenants_of_their_own() -> None:
    from proxy.auth import ON_BEHALF_OF, Principal, account, caller_digest

    a = Authenticator(AuthSettings.model_validate({"mode": "keys", "keys": [
        {"key": "gw", "tenant": "edge", "on_behalf_of": True, "operator": True},
        {"key": "gw2", "tenant": "edge", "on_behalf_of": True},
        {"key": "gw-old", "tenant": "edge", "on_behalf_of": True, "user": "eu-edge"},
        {"key": "gw-new", "tenant": "edge", "on_behalf_of": True, "user": "eu-edge"},
        {"key": "plain", "tenant": "p"}]}))
    secret = "edge-own-secret-0123"
    alice = caller_digest(Principal("acme", "user", "alice"), secret)
    bob = caller_digest(Principal("acme", "user", "bob"), secret)
    admin = caller_digest(Principal("acme", "admin", "alice"), secret)
    other = caller_digest(Principal("globex", "user", "alice"), secret)
    assert len({alice, bob, admin, other}) == 4
    assert alice.split(".")[0] == bob.split(".")[0]  # one tenant (and role), two users
    # keyed by the front's own secret, not by anything the upstream holds
    assert caller_digest(Principal("acme", "user", "alice"), "gw") != alice
    assert "acme" not in alice and "alice" not in alice

    gw = a.authenticate({"Authorization": "Bearer gw"})
    p = a.authenticate({"Authorization": "Bearer gw", ON_BEHALF_OF: alice})
    q = a.authenticate({"Authorization": "Bearer gw", ON_BEHALF_OF: bob})
    assert p.tenant == q.tenant == f"edge~{gw.user}~" + alice.split(".")[0]
    assert gw.user == f"key-{gw.key_id}"  # (no `user` set: the key's fingerprint)
    assert p.user != q.user and not p.operator and p.key_id == gw.key_id
    assert gw.tenant == "edge" and gw.operator  # itself, without the header
    # what they store counts against the key's tenant (`proxy.record_store`)
    assert account(p.tenant) == account(q.tenant) == account(gw.tenant) == "edge"
    # another gateway key of the same tenant does not share its callers
    assert a.authenticate({"Authorization": "Bearer gw2", ON_BEHALF_OF: alice}).tenant != p.tenant
    # a key rotated under one gateway name keeps its callers' tenants
    old_key, new_key = ({"Authorization": f"Bearer {k}", ON_BEHALF_OF: alice}
                        for k in ("gw-old", "gw-new"))
    assert a.authenticate(old_key).tenant == a.authenticate(new_key).tenant == (
        "edge~eu-edge~" + alice.split(".")[0])
    # another key's header is the caller's text: not read
    assert a.authenticate({"Authorization": "Bearer plain", ON_BEHALF_OF: alice}).tenant == "p"
    with pytest.raises(InvalidRequest) as e:
        a.authenticate({"Authorization": "Bearer gw", ON_BEHALF_OF: "acme"})
    assert e.value.code == "invalid_on_behalf_of"


def test_a_gateway_request_naming_two_callers_is_refused() -> None:
    """Two `x-weir-on-behalf-of` values (a front that adds its own beside one a client
    slipped in): which one names the tenant is anyone's guess, and the first was taken,
    so the client's could pick another caller's tenant. Refused, as two keys are; the
    same caller named twice is one caller."""
    from multidict import CIMultiDict

    from proxy.auth import ON_BEHALF_OF, Principal, caller_digest

    a = Authenticator(AuthSettings.model_validate({"mode": "keys", "keys": [
        {"key": "gw", "tenant": "edge", "on_behalf_of": True}]}))
    alice, bob = (caller_digest(Principal("acme", "user", u), "s3cret") for u in ("alice", "bob"))
    with pytest.raises(InvalidRequest) as e:
        a.authenticate(CIMultiDict([("Authorization", "Bearer gw"), (ON_BEHALF_OF, bob),
                                    (ON_BEHALF_OF, alice)]))
    assert e.value.code == "invalid_on_behalf_of"
    twice = a.authenticate(CIMultiDict([("Authorization", "Bearer gw"), (ON_BEHALF_OF, alice),
                                        (ON_BEHALF_OF, alice.upper())]))
    assert twice.tenant == a.authenticate({"Authorization": "Bearer gw",
                                           ON_BEHALF_OF: alice}).tenant


@pytest.mark.parametrize("where", ["tenant", "anonymous_tenant"])
def test_a_tenant_name_may_not_hold_the_gateway_separator(where: str) -> None:
    from pydantic import ValidationError

    data: dict[str, Any] = ({"mode": "keys", "keys": [{"key": "k", "tenant": "edge~x"}]}
                            if where == "tenant" else {"mode": "open", where: "a~b"})
    with pytest.raises(ValidationError):
        AuthSettings.model_validate(data)


def test_the_first_authorization_that_carries_a_key_is_read(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from multidict import CIMultiDict

    a = auth(tmp_path, monkeypatch)
    headers = CIMultiDict([("Authorization", "Token x"), ("Authorization", "Bearer env-key")])
    assert a.authenticate(headers).user == "bob"


def warnings_said(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """What `proxy.auth` warns of from now on: (event, fields) each."""
    from proxy import auth as module

    said: list[tuple[str, dict[str, Any]]] = []

    class Spy:
        def warning(self, event: str, **fields: Any) -> None:
            said.append((event, fields))

    monkeypatch.setattr(module, "log", Spy())
    return said


def test_a_gateway_key_naming_no_caller_is_warned_once(monkeypatch: pytest.MonkeyPatch,
                                                       ) -> None:
    """Its callers then share one tenant (the gateway has no secret set): said once per
    key, by its fingerprint only, of a generation (a gateway's model discovery names no
    caller, and is no cause for it); never of a named caller or another key."""
    from proxy.auth import ON_BEHALF_OF, Principal, caller_digest

    said = warnings_said(monkeypatch)
    a = Authenticator(AuthSettings.model_validate({"mode": "keys", "keys": [
        {"key": "gw-secret-key", "tenant": "edge", "on_behalf_of": True},
        {"key": "plain-key", "tenant": "p"}]}))
    gateway = a.authenticate({"Authorization": "Bearer gw-secret-key"})
    assert said == []  # authenticating alone: silent
    named = a.authenticate({"Authorization": "Bearer gw-secret-key", ON_BEHALF_OF:
                            caller_digest(Principal("t", "user", "u"), "s" * 16)})
    for p in (named, a.authenticate({"Authorization": "Bearer plain-key"}),
              gateway, gateway, gateway):
        a.note_unnamed(p)
    assert len(said) == 1 and "naming no caller" in said[0][0]
    assert said[0][1] == {"key_id": gateway.key_id} and "gw-secret-key" not in str(said)


def test_a_caller_named_on_a_key_not_marked_on_behalf_of_is_warned_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A front Weir names its callers (`x-weir-on-behalf-of`) on a key this server did
    not mark `on_behalf_of`: the header is not read (it could be any client's text), so
    every caller of that front shares the key's tenant here, its cache and stored records
    included, and nothing said so. A generation naming a caller on such a key is warned
    of, once per key, by the key's fingerprint; the tenant stays the key's own."""
    from proxy.auth import ON_BEHALF_OF, Principal, caller_digest

    said = warnings_said(monkeypatch)
    a = Authenticator(AuthSettings.model_validate({"mode": "keys", "keys": [
        {"key": "plain-key", "tenant": "p"},
        {"key": "other-key", "tenant": "q"},
        {"key": "gw-secret-key", "tenant": "edge", "on_behalf_of": True}]}))
    caller = caller_digest(Principal("t", "user", "u"), "s" * 16)
    named = {"Authorization": "Bearer plain-key", ON_BEHALF_OF: caller}
    assert a.authenticate(named).tenant == "p" and said == []  # (authenticating: silent)
    for _ in range(3):
        assert a.for_generation(named).tenant == "p"
    a.for_generation({"Authorization": "Bearer other-key"})  # no header: nothing to say
    a.for_generation({"Authorization": "Bearer gw-secret-key", ON_BEHALF_OF: caller})
    assert len(said) == 1 and "not marked on_behalf_of" in said[0][0]
    plain = a.authenticate({"Authorization": "Bearer plain-key"})
    assert said[0][1] == {"key_id": plain.key_id}
    assert "plain-key" not in str(said) and caller not in str(said)


def test_open_mode_without_keys_hashes_no_presented_key(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """With no key configured every caller is the anonymous one: a presented key is
    neither read nor hashed (a per-request SHA-256 for a lookup that always missed)."""
    import proxy.auth

    hashed: list[str] = []
    monkeypatch.setattr(proxy.auth, "sha256_hex", lambda v: hashed.append(v) or "0" * 64)
    a = Authenticator(AuthSettings.model_validate({"mode": "open"}))
    p = a.authenticate({"Authorization": "Bearer sk-something"})
    assert p.tenant == "public" and p.user == "anonymous" and hashed == []
