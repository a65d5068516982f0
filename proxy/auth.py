"""API keys -> Principal(tenant, role, user, models, operator), and admin checks.

Keys are never kept in clear: each configured key (given as a sha256, or read from an
env var or a file) is reduced to its sha256 at start. A presented key is hashed and
looked up; the final comparison is `hmac.compare_digest`, so the time taken does not
depend on how much of a key matched. The user id defaults to a short fingerprint of the
key hash: stable, and useless to an attacker.

Admin rights are per tenant: a key with role `admin` administers its own tenant only
(the cache admin API acts within that tenant). A key marked `operator: true` is a
global admin (every tenant, fault injection). `Authenticator.require_role` is the one
check every admin route makes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from .errors import InvalidRequest, PermissionDenied, Unauthorized, shown
from .settings import ApiKey, AuthSettings, ConfigError, sha256_hex
from .telemetry import get_logger

AdminRole = Literal["admin", "operator"]
log = get_logger("weir.auth")


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    role: str
    user: str
    models: frozenset[str] | None = None  # None: every model
    key_id: str = "anonymous"  # fingerprint of the key, safe to log
    operator: bool = False  # a global admin: every tenant

    @property
    def is_admin(self) -> bool:
        return self.operator or self.role == "admin"

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    def check_model(self, model: str) -> None:
        if not self.may_use(model):
            raise PermissionDenied(
                f"This API key may not use the model `{shown(model)}`.",
                param="model",
                code="model_not_allowed",
            )


class KeyConfigError(ValueError):
    """A configured key that cannot be read; `config_error()` names its entry's field,
    and every other entry's that cannot be read either (`errors`)."""

    def __init__(self, where: str, message: str,
                 more: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.where = where
        self.errors = [(where, message), *more]

    def config_error(self) -> ConfigError:
        return ConfigError(list(self.errors))


def _key_hash(spec: ApiKey, i: int) -> str:
    """The key's digest; a KeyConfigError naming the entry's field when its environment
    variable or file holds none."""
    import os

    if (digest := spec.configured_digest()) is not None:
        return digest
    if spec.key_env:
        value = os.environ.get(spec.key_env)
        if not value or not value.strip():
            raise KeyConfigError(f"auth.keys[{i}].key_env", f"environment variable "
                                 f"{spec.key_env} is empty or unset")
        return sha256_hex(value.strip())
    assert spec.key_file is not None
    try:
        value = Path(spec.key_file).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise KeyConfigError(f"auth.keys[{i}].key_file", f"cannot be read: "
                             f"{e.strerror or type(e).__name__}") from None
    except UnicodeDecodeError:
        raise KeyConfigError(f"auth.keys[{i}].key_file", "not UTF-8 text") from None
    if not value:
        raise KeyConfigError(f"auth.keys[{i}].key_file", "the file holds no key")
    return sha256_hex(value)


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self.open = settings.mode == "open"
        self._anonymous = Principal(
            tenant=settings.anonymous_tenant, role=settings.anonymous_role, user="anonymous"
        )
        self._by_hash: dict[str, tuple[str, Principal]] = {}
        self._gateways: set[str] = set()  # digests of keys marked `on_behalf_of`
        self._gateway_ids: set[str] = set()  # their fingerprints (`Principal.key_id`)
        self._by_fingerprint: set[str] = set()  # every key's (not the anonymous caller's)
        self._unnamed: set[str] = set()  # gateway keys seen without the header (warned)
        self._unmarked: set[str] = set()  # other keys seen naming a caller (warned)
        digests: list[str] = []
        unreadable: list[tuple[str, str]] = []  # each entry's, not only the first's
        for i, spec in enumerate(settings.keys):
            try:
                digests.append(_key_hash(spec, i))
            except KeyConfigError as e:
                unreadable.append((e.where, str(e)))
        if unreadable:
            raise KeyConfigError(*unreadable[0], more=tuple(unreadable[1:]))
        first: dict[str, int] = {}
        for i, (spec, digest) in enumerate(zip(settings.keys, digests, strict=True)):
            if first.setdefault(digest, i) != i:  # (env vars and files hold keys too)
                raise KeyConfigError("auth.keys", f"keys[{first[digest]}] and keys[{i}] hold "
                                     "the same key: it would stand for only one of them")
            fingerprint = digest[:12]
            self._by_fingerprint.add(fingerprint)
            self._by_hash[digest] = (digest, Principal(
                tenant=spec.tenant,
                role=spec.role,
                user=spec.user or f"key-{fingerprint}",
                models=frozenset(spec.models) if spec.models is not None else None,
                key_id=fingerprint,
                operator=spec.operator,
            ))
            if spec.on_behalf_of:
                self._gateways.add(digest)
                self._gateway_ids.add(fingerprint)

    def is_key(self, value: str) -> bool:
        """Whether `value` is one of the configured keys (by its hash, as a key is looked
        up): a caller that sends its key where a log line would hold it (`x-request-id`)
        must not find it there, whatever its shape."""
        return bool(self._by_hash) and sha256_hex(value) in self._by_hash

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The caller that a request's headers present (see `credentials`): 401 without a
        valid key unless auth is open."""
        if not self._by_hash and self.open:
            # No key configured: every caller is the anonymous one, whatever it presents
            # (its key was read and hashed per request, for a lookup that always missed).
            return self._anonymous
        token = _bearer(credentials(headers) if self._by_hash else _first(headers))
        if token is not None:
            # The lookup is by the key's hash, so its timing says nothing about the key;
            # the final check is constant-time all the same.
            digest = sha256_hex(token)
            hit = self._by_hash.get(digest)
            if hit is not None and hmac.compare_digest(hit[0], digest):
                if digest in self._gateways:
                    return self._on_behalf_of(hit[1], _values(headers, ON_BEHALF_OF))
                return hit[1]
        if self.open:
            return self._anonymous
        if token is not None:
            raise Unauthorized()
        if _presented(headers):  # a credential, but none Weir can read a key from
            raise Unauthorized(
                "The API key provided could not be read. Send it as `Authorization: "
                "Bearer YOUR_KEY`.")
        raise Unauthorized(
            "You didn't provide an API key. Send it as `Authorization: Bearer YOUR_KEY`.",
            code="missing_api_key",
        )

    def _on_behalf_of(self, gateway: Principal, headers: list[str]) -> Principal:
        """The caller a gateway's key forwards for: a tenant of its own under the key's
        tenant and the gateway (`TENANT~GATEWAY~DIGEST`, GATEWAY the key's `user`: set
        it, the same on the old and the new key, to keep the callers' tenants across a
        key's rotation; by default the key's fingerprint), never an operator; the key
        itself without the header (`note_unnamed` warns of a generation that way).

        Two different callers named (a front that adds its header beside one its client
        slipped in) are refused, as two keys are: which one a proxy on the way, or Weir,
        would take is anyone's guess, and the answer could be another caller's tenant."""
        values = {h.strip().lower() for h in headers}
        if not values:
            return gateway
        value = values.pop()
        if values:
            raise InvalidRequest(f"`{ON_BEHALF_OF}` is sent more than once, naming "
                                 "different callers; send it once.",
                                 code="invalid_on_behalf_of")
        if not _CALLER.match(value):
            raise InvalidRequest(f"`{ON_BEHALF_OF}` must be two 32-digit hex digests "
                                 "joined by a dot, as a Weir in front sends it.",
                                 code="invalid_on_behalf_of")
        tenant, user = value.split(".")
        return replace(gateway, tenant=f"{gateway.tenant}~{gateway.user}~{tenant}",
                       user=user, operator=False)

    def for_generation(self, headers: Mapping[str, str]) -> Principal:
        """`authenticate`, for a generation route: a gateway key naming no caller is
        warned of (`note_unnamed`)."""
        principal = self.authenticate(headers)
        self.note_unnamed(principal)
        if _values(headers, ON_BEHALF_OF):
            self.note_unmarked(principal)
        return principal

    def note_unmarked(self, principal: Principal) -> None:
        """A generation naming a caller (`x-weir-on-behalf-of`) on a key not marked
        `on_behalf_of`: the header is not read (on such a key it is the client's text), so
        if the key is a Weir gateway's, all of its callers share this key's tenant (its
        cache and stored records too). Warned once per key, by its fingerprint only."""
        key = principal.key_id
        if (key in self._by_fingerprint and key not in self._gateway_ids
                and key not in self._unmarked):
            self._unmarked.add(key)
            log.warning("a key not marked on_behalf_of named a caller in "
                        f"{ON_BEHALF_OF}: not read, its callers share the key's tenant; "
                        "if the key is a Weir gateway's, mark it on_behalf_of", key_id=key)

    def note_unnamed(self, principal: Principal) -> None:
        """A generation on a gateway's key (`on_behalf_of`) naming no caller: its callers
        then share one tenant (the gateway has no secret set). Warned once per key (its
        model discovery, naming none, is no generation)."""
        key = principal.key_id
        if key in self._gateway_ids and "~" not in principal.tenant and key not in self._unnamed:
            self._unnamed.add(key)
            log.warning("a gateway key (on_behalf_of) asked for a generation naming no "
                        "caller: its callers share one tenant; set the gateway's "
                        "engine.on_behalf_of_secret", key_id=key)

    def require_role(self, headers: Mapping[str, str], role: AdminRole, what: str) -> Principal:
        """The caller, if it may use an admin route: 401 without a valid key, else 403.

        `admin`: a tenant admin (acting on its own tenant) or an operator; `operator`:
        an operator key only. In open mode the anonymous principal is checked the same
        way (its role is `auth.anonymous_role`).
        """
        principal = self.authenticate(headers)
        if role == "operator" and not principal.operator:
            raise PermissionDenied(f"{what} needs an operator API key (`operator: true`).")
        if not principal.is_admin:
            raise PermissionDenied(f"{what} needs an API key with role `admin`.")
        return principal


_KEY_HEADERS = ("Authorization", "api-key", "x-api-key")

#: Where a gateway in front names the caller it forwards for (`caller_digest`); read only
#: from keys marked `on_behalf_of`.
ON_BEHALF_OF = "x-weir-on-behalf-of"
_CALLER = re.compile(r"[0-9a-f]{32}\.[0-9a-f]{32}\Z")


def account(tenant: str) -> str:
    """The configured tenant a tenant's resources count against: itself, or for a caller
    a gateway's key forwards for (`TENANT~GATEWAY~DIGEST`, see `_on_behalf_of`) that
    key's tenant. A gateway names as many callers as it likes; what they store together
    is bounded as one tenant's (`proxy.record_store`)."""
    return tenant.partition("~")[0]


_SEPARATORS = {ord(c): f"%{ord(c):02X}" for c in "%/;=:"}


@functools.lru_cache(maxsize=4096)
def key_part(name: str) -> str:
    """A tenant, role or user name as one part of a joined key (a cache scope
    `t=TENANT;u=USER`, a rate-limit bucket `TENANT/USER`): the separators in it escaped
    (`%2F` for `/`, and `;`, `=`, `:`, `%` alike), so tenant `a/b` with user `c` and
    tenant `a` with user `b/c` are two keys, not one shared bucket or cache. A name
    without them (`acme`, `alice@example.com`) reads as it is."""
    return name.translate(_SEPARATORS)


def caller_digest(principal: Principal, secret: str) -> str:
    """`principal` as a Weir in front names it upstream: `TENANT.USER`, each the first 128
    bits of an HMAC keyed by `secret` (the front's own: it never leaves the front), so
    the upstream, or anyone on the way, can tell callers apart but cannot test guesses
    of their names. TENANT covers the tenant and role (a front's role-scoped cache stays
    apart behind it), USER those and the user."""
    key = secret.encode()
    who = f"t={principal.tenant}\x00r={principal.role}"

    def mac(text: str) -> str:
        return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]

    return mac(who) + "." + mac(f"{who}\x00u={principal.user}")


def tenant_salt(tenant: str, secret: str | None = None) -> str:
    """The engine's prefix-cache salt for `tenant` (vLLM's `cache_salt`): one tenant's
    cached prefix never speeds up, and so never reveals itself to, another tenant's
    request. Keyed by `secret` where given (sent to an upstream: it cannot test guesses
    of tenant names), a plain digest otherwise (the in-process engine's)."""
    text = f"weir-tenant:{tenant}".encode()
    if secret is None:
        return hashlib.sha256(text).hexdigest()[:32]
    return hmac.new(secret.encode(), text, hashlib.sha256).hexdigest()[:32]


def keyed_digest(text: str, secret: str | None, purpose: str) -> str:
    """`text`'s digest where Weir sends a caller's string on hashed (an identifier, a
    call id a detector fired on), 64 hex digits: an HMAC-SHA256 keyed by `secret` (the
    gateway's, `Services.gateway_secret`: never sent, the same on every replica), so an
    upstream cannot test guesses of a low-entropy value (an address from a known list);
    `purpose` keeps one kind's digests from another's. With no secret, its plain
    SHA-256."""
    data = text.encode(errors="surrogatepass")
    if secret is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(secret.encode(), f"weir-{purpose}:".encode() + data,
                    hashlib.sha256).hexdigest()


def _first(headers: Mapping[str, str]) -> str | None:
    """`credentials` without the conflict check (open mode with no keys configured
    refuses no request for it): the first `Authorization` that carries a key, else the
    first key header's."""
    for value in _values(headers, "Authorization"):
        if _bearer(value) is not None:
            return str(value)
    authorization = headers.get("Authorization")
    for name in ("api-key", "x-api-key"):
        key = headers.get(name, "").strip()
        if key:
            return f"Bearer {key}"
    return authorization


def credentials(headers: Mapping[str, str]) -> str | None:
    """What a request presents as its key, as an `Authorization` value: that header when
    it carries a key (Bearer or Basic), else an `api-key` header (what Azure OpenAI's SDK
    sends) or `x-api-key` (Anthropic's), read as a bearer key.

    Two different keys (two `Authorization` headers, or an `api-key` naming another key
    than `Authorization`'s) are a 401 `conflicting_api_keys`: which one a proxy on the
    way, or Weir, would take is anyone's guess, and the answer could be another tenant's.
    The same key sent twice is one key."""
    if _key_count(headers) > 1:
        raise Unauthorized("The request carries more than one API key; send one, in one "
                           "header.", code="conflicting_api_keys")
    return _first(headers)


def _key_count(headers: Mapping[str, str]) -> int:
    """How many different keys the key headers carry, each header sent once or more."""
    keys: set[str] = set()
    for name in _KEY_HEADERS:
        for value in _values(headers, name):
            key = _bearer(value) if name == "Authorization" else value.strip() or None
            if key is not None:
                keys.add(key)
    return len(keys)


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of header `name`, sent once or more (a plain mapping holds one)."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, ()))
    return [headers[name]] if name in headers else []


def _presented(headers: Mapping[str, str]) -> bool:
    """Whether a key header carries anything: a credential in a scheme Weir does not
    take (`Token KEY`, a bare `KEY`), or Basic that holds no key, is a wrong key (401
    `invalid_api_key`), not a missing one; an empty header, or a scheme alone
    (`Bearer`), presents nothing."""
    for name in _KEY_HEADERS:
        for value in _values(headers, name):
            scheme, _, rest = value.strip().partition(" ")
            if rest.strip() or (scheme and (name != "Authorization"
                                            or scheme.lower() not in ("bearer", "basic"))):
                return True
    return False


def _bearer(header: str | None) -> str | None:
    """The key from `Bearer KEY`, or from HTTP Basic's password (what a browser sends) or,
    with no password, its user."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if not token:
        return None
    if scheme.lower() == "bearer":
        return token
    if scheme.lower() == "basic":
        try:
            user, colon, password = base64.b64decode(token, validate=True).decode().partition(":")
        except ValueError:  # (binascii.Error, UnicodeDecodeError, and the ValueError
            return None     # base64 raises for text that is not ASCII: not a key)
        # the key as the password (a browser's prompt), or as the user with no password
        # (`curl -u KEY:`, as Stripe's API takes it)
        return password.strip() or (colon and user.strip()) or None
    return None
