"""Root settings: one YAML file, validated by pydantic, errors named by YAML path.

Longer than most modules on purpose: it is the one schema of every setting (Helm's
values schema is generated from it), and splitting it would scatter that schema.

`${VAR}` and `${VAR:-default}` (the default where VAR is unset or empty, as in a shell)
in string values are replaced from the environment after
the YAML is parsed (so a substituted value can never change the document's structure);
a value that is exactly one reference is then typed by the field (`port: ${PORT:-8000}`
is an int). Plugin configs are validated by each plugin's own schema when the chain is
built (`proxy.chain.validate_plugins`), with paths such as `plugins[1].config.ttl_s`.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from .config_model import ConfigModel


class _Strict(ConfigModel):
    pass


def _http_url(value: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        raise ValueError("not a URL") from None
    if any(c.isspace() for c in value):
        raise ValueError("holds a blank; a URL has none")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host, e.g. "
                         "http://central:8000/v1")
    return value


#: An OpenAI-compatible server's base URL.
HttpUrlText = Annotated[str, AfterValidator(_http_url)]


def check_url_or_key(base_url: str | None, api_key: str | None) -> None:
    """Credentials in the URL (`user:password@`, sent as HTTP Basic) and `api_key` (a
    Bearer key) cannot both go: aiohttp refuses such a request, every one of them."""
    from urllib.parse import urlsplit

    if base_url and api_key and "@" in (urlsplit(base_url).netloc or ""):
        raise ValueError("`base_url` holds credentials (user:password@) and `api_key` is "
                         "set too: only one can be sent; drop one of them")


#: A secret that may be left out; empty (`${VAR:-}` with VAR unset) is left out.
OptionalSecret = Annotated[Annotated[str, Field(min_length=16)] | None,
                           BeforeValidator(lambda v: None if v == "" else v),
                           WithJsonSchema({"anyOf": [{"type": "string", "minLength": 16},
                                                     {"const": ""}, {"type": "null"}]})]


def _listen_host(value: str) -> str:
    if not value.strip():
        raise ValueError("empty: name the address to listen on (0.0.0.0 or :: for every "
                         "interface)")
    return value


#: The response headers a browser's script may read on a cross-origin answer (past the
#: CORS-safelisted ones): the request id, the rate limits, the retry hints the OpenAI SDK
#: reads, and the cache's and breaker's outcome.
CORS_EXPOSED = ["x-request-id", "retry-after", "retry-after-ms", "x-should-retry",
                "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
                "x-weir-cache", "x-weir-fallback"]

#: An HTTP token (RFC 9110 5.6.2): a method's or a header field's name.
HTTP_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _origin(value: str) -> str:
    """An origin as a browser sends it (`scheme://host[:port]`, no path), or `*`."""
    from urllib.parse import urlsplit

    if value == "*":
        return value
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        raise ValueError(f"`{value}` is not an origin, e.g. https://app.example.com") from None
    if value.lower() == "null":
        raise ValueError("`null` is the origin of sandboxed frames and local files, which "
                         "any page can make: it cannot be allowed")
    if not parts.scheme or not parts.hostname or any(c.isspace() for c in value):
        raise ValueError(f"`{value}` is not an origin: scheme://host[:port], e.g. "
                         "https://app.example.com")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"`{value}` is not an origin: scheme://host[:port] alone, no path "
                         "(nor a trailing `/`), query or credentials; a browser sends "
                         "`Origin: https://app.example.com`")
    if "*" in parts.hostname:
        raise ValueError(f"`{value}`: an origin is matched whole, not as a pattern; list "
                         "each origin, or `*` alone for any")
    # As a browser serialises it (RFC 6454 6.1), or it matched no Origin ever sent:
    # scheme and host in lower case, the host in IDNA (`bücher.example`:
    # `xn--bcher-kva.example`), the scheme's default port left out (`https://a.com:443`
    # is `https://a.com`).
    scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"`{value}`: its host is no valid domain name") from None
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def _tokens(values: list[str]) -> list[str]:
    for v in values:
        if v != "*" and not HTTP_TOKEN.fullmatch(v):
            raise ValueError(f"`{v}` is not an HTTP method or header name")
    return values


class CorsSettings(_Strict):
    allow_origins: list[Annotated[str, AfterValidator(_origin)]] = Field(
        [], description="Origins whose pages may call Weir from a browser "
        "(`https://app.example.com`), or `[\"*\"]` for any. Empty (the default): CORS is "
        "off, and no web page can drive Weir (an OPTIONS preflight is a 405).")
    allow_methods: Annotated[list[str], AfterValidator(_tokens)] = Field(
        ["GET", "POST", "DELETE"], description="Methods a preflight allows (`*`: any).")
    allow_headers: Annotated[list[str], AfterValidator(_tokens)] = Field(
        ["*"], description="Request headers a preflight allows (`*`: those it asks for). "
        "`Accept`, `Accept-Language`, `Content-Language` and `Content-Type` always are.")
    allow_credentials: bool = Field(
        False, description="Whether a page may send its cookies or HTTP authentication "
        "(`Access-Control-Allow-Credentials: true`); not needed for a Bearer key.")
    expose_headers: Annotated[list[str], AfterValidator(_tokens)] = Field(
        default_factory=lambda: list(CORS_EXPOSED), description="Response headers a "
        "page's script may read (`Access-Control-Expose-Headers`).")
    allow_private_network: bool = Field(
        False, description="Whether a public web page may call this Weir on a private "
        "network address (a preflight's `Access-Control-Request-Private-Network`, "
        "answered `Access-Control-Allow-Private-Network: true`; Chrome asks it).")
    max_age_s: int = Field(600, ge=0, le=86400, description="How long a browser may "
                           "reuse a preflight's answer (`Access-Control-Max-Age`).")

    @model_validator(mode="after")
    def _no_credentials_to_any_origin(self) -> CorsSettings:
        if "*" in self.allow_origins:
            if len(self.allow_origins) > 1:
                raise ValueError("allow_origins: `*` (any origin) stands alone")
            if self.allow_credentials:
                raise ValueError(
                    "allow_origins `*` with allow_credentials: browsers refuse a "
                    "credentialed answer to any origin; list the origins allowed")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.allow_origins)


class ServerSettings(_Strict):
    host: Annotated[str, AfterValidator(_listen_host)] = Field(
        "127.0.0.1", description="Address to listen on (0.0.0.0 or :: for every interface).")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on (0: any free port).")
    drain_timeout_s: float = Field(
        30.0, ge=0, description="On SIGTERM/SIGINT/SIGHUP, how long in-flight requests may finish."
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024,
        description="Largest request body accepted (413 above): the one body-size limit."
    )
    max_body_bytes_in_flight: int = Field(
        256 * 1024 * 1024, ge=1024, description="The request bodies being received at "
        "once take at most about this much (each counted by the bytes of it read so far, "
        "as they arrive, not by what its Content-Length announces); past it a tenant "
        "holding an even share or more gets a 503 `overloaded`, another's body is still "
        "read (up to twice this). Without it, every connection sending a full body slowly "
        "held it all in memory.")
    write_timeout_s: float = Field(
        30.0, gt=0, description="A client that reads nothing for this long is cut off."
    )
    request_timeout_s: float | None = Field(
        600.0, gt=0, description="Every generation request's deadline (504 `timeout` "
        "past it), whatever the plugins: the admission plugin's own deadline (`deadline_s`, "
        "the `x-weir-timeout-ms` header) applies too, the shorter holding; without "
        "admission, that header still shortens it. None: none (then, without admission, "
        "a hung engine held a request until its client left).")
    keepalive_s: float = Field(
        15.0, gt=0, description="Interval of SSE keep-alive comments while a stream is idle."
    )
    idle_timeout_s: float = Field(
        75.0, gt=0, description="A keep-alive connection with no request for this long is "
        "closed. Keep it above the front proxy's upstream idle timeout (so the proxy, not "
        "Weir, closes idle connections).")
    header_timeout_s: float = Field(
        15.0, gt=0, description="Once a request head starts arriving it must be complete "
        "within this long, or the connection is aborted (slowloris).")
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body must arrive within this long (408 after).")
    max_connections: int | None = Field(
        None, ge=1, description="Open client connections at most. At the cap a new one "
        "replaces the oldest idle one; if none is idle it gets a 503 and is closed. None: "
        "the soft file-descriptor limit less a reserve.")
    max_header_line_bytes: int = Field(
        8190, ge=1024, le=65536, description="Longest request line or header line (400 above).")
    max_headers: int = Field(128, ge=8, le=1024, description="Header fields per request.")
    max_head_bytes: int = Field(
        65536, ge=4096, le=1048576, description="Largest request head (request line and "
        "header fields together; 431 above): the line and field bounds alone allow 1 MiB.")
    max_head_bytes_in_flight: int = Field(
        64 * 1024 * 1024, ge=65536, description="Request heads arriving in pieces, all "
        "connections' together, take at most this many bytes (a head that comes whole "
        "never counts); past it the connection whose head grows gets a 503 `overloaded` "
        "and is closed. Without it, every connection sending a large head slowly held "
        "about 100 KB until `header_timeout_s`.")
    cors: CorsSettings = Field(
        default_factory=CorsSettings, description="Cross-origin calls from browsers: off "
        "unless `allow_origins` lists some.")


#: The models Weir builds itself (`proxy.engine.builtin_models`).
ENGINE_BUILTINS = ("builtin:demo", "builtin:smollm2")


def _known_engine_builtin(value: str) -> str:
    if value.startswith("builtin:") and value not in ENGINE_BUILTINS:
        raise ValueError(f"unknown built-in model {value!r} (one of "
                         f"{', '.join(ENGINE_BUILTINS)}, a Hugging Face id or a folder)")
    return value


class VllmEngineSettings(_Strict):
    kind: Literal["vllm"] = "vllm"
    model: Annotated[str, AfterValidator(_known_engine_builtin)] = Field(
        "builtin:demo",
        description="Local checkpoint folder or Hugging Face id; built here on first use: "
        "`builtin:smollm2` (SmolLM2-135M-Instruct) or `builtin:demo` (tiny, random weights).",
    )
    served_model_name: str | None = Field(
        None, description="Name clients use in `model` (default: the model id)."
    )
    tokenizer: str | None = Field(None, description="Tokenizer id or path (default: model's).")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="Weights dtype (vLLM's choices: check-config refuses others, "
        "which the engine's start refused).")
    quantization: str | None = Field(None, description="awq, gptq, fp8 ... (None: off).")
    kv_cache_dtype: str = Field("auto", description="KV cache dtype: auto, fp8 ...")
    max_num_seqs: int = Field(64, ge=1, description="Sequences batched together at most.")
    max_model_len: int | None = Field(None, ge=16, description="Context length (None: model's).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="GPU memory share.")
    enable_prefix_caching: bool = Field(True, description="Reuse KV cache of shared prefixes.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split across.")
    seed: int = Field(0, description="Engine seed.")
    cpu_kvcache_space_gib: float | None = Field(
        1.0, gt=0, description="CPU builds: KV cache size in GiB, fractions too (vLLM's "
        "kv_cache_memory_bytes; its VLLM_CPU_KVCACHE_SPACE, where set, wins).",
    )
    warmup: bool = Field(True, description="Run one request before reporting ready.")
    structured_output_compact: bool = Field(
        True,
        description="json_object/json_schema answers without free whitespace (compact JSON; "
        "small models cannot loop on blank space inside the grammar).",
    )
    tool_parser: str | None = Field(
        None,
        description="vLLM tool-call parser of the model's syntax (hermes, llama3_json, "
        "mistral, pythonic, ...) for `tool_choice: auto`; None: such requests answer text.",
    )
    owned_by: str = Field("weir", description="`owned_by` in /v1/models.")
    faults: bool = Field(
        False, description="Chaos testing: POST /admin/faults switches injected faults.")
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="Passed to vLLM's AsyncEngineArgs as they are; "
        "each name and value type is checked against them when the config is read."
    )

    @field_validator("extra_args")
    @classmethod
    def _engine_takes_extra_args(cls, extra: dict[str, Any]) -> dict[str, Any]:
        """Each name an argument of vLLM's engine, of its type: found when the config is
        read (`check-config`, `serve`), not when the engine starts minutes later."""
        if not extra:
            return extra
        try:
            with warnings.catch_warnings():  # torch's own import-time deprecations
                warnings.simplefilter("ignore", DeprecationWarning)
                from .engine.vllm import extra_args_errors
        except Exception:  # no vLLM here, or one that fails to import (a missing CUDA
            return extra   # library: an OSError): the engine cannot start, and says so
        errors = extra_args_errors(extra)
        if errors:
            raise ValueError("; ".join(f"`{key}`: {msg}" for key, msg in errors))
        return extra


class UpstreamEngineSettings(_Strict):
    kind: Literal["upstream"] = "upstream"
    base_url: HttpUrlText = Field(
        description="OpenAI-compatible base URL, e.g. http://central:8000/v1.")
    api_key: str | None = Field(None, description="Bearer key sent upstream.")
    models: list[str] = Field(default_factory=list, description="Models served (empty: ask).")
    timeout_s: float = Field(
        600.0, gt=0, description="Total timeout of one upstream request. A whole answer "
        "past it is a 504 the breaker counts (a hung upstream and a long answer look the "
        "same); a stream past it with its bytes still coming (`read_timeout_s`) is cut "
        "with a 504 it does not count: its length is the caller's.")
    read_timeout_s: float = Field(
        120.0, gt=0, description="Longest a stream waits for the upstream's next byte, "
        "its first included (within `timeout_s`): past it the upstream has stalled, a "
        "504 the breaker counts.")
    connect_timeout_s: float = Field(
        5.0, gt=0, description="Connect timeout, with the wait for a free pooled "
        "connection: a request that waited it out for one (all `max_connections` busy) "
        "is shed, a 503 `overloaded` the breaker does not count.")
    max_connections: int = Field(100, ge=1, description="Pooled connections at most.")
    owned_by: str = Field("upstream", description="`owned_by` in /v1/models.")
    on_behalf_of_secret: OptionalSecret = Field(
        None, description="Set (e.g. `${WEIR_CALLER_SECRET}`, the same on "
        "every replica): name the caller of each request upstream in "
        "`x-weir-on-behalf-of`, as digests of its tenant, role and user keyed by this "
        "secret, which never leaves this gateway: a Weir upstream whose key is marked "
        "`on_behalf_of` keeps this gateway's tenants apart. It keys the sanitizer's "
        "digests of identifiers and call ids too. Unset: nothing is sent.")
    cache_salt: bool = Field(
        False, description="Send vLLM's `cache_salt` with each request: a digest of the "
        "caller's tenant (keyed by `on_behalf_of_secret` where it is set, so the upstream "
        "cannot test guesses of tenant names), so that a vLLM upstream's prefix cache is "
        "shared within a tenant only, as the in-process engine's is: a prompt prefix "
        "another tenant sent does not answer faster, which would tell that it was sent. "
        "Off: an OpenAI-compatible server that does not know the field may refuse it "
        "(a Weir upstream does: it salts per caller itself, with `on_behalf_of`).")

    @model_validator(mode="after")
    def _url_or_key(self) -> UpstreamEngineSettings:
        check_url_or_key(self.base_url, self.api_key)
        return self


def _engine_kind(v: Any) -> str:
    kind = v.get("kind", "vllm") if isinstance(v, dict) else getattr(v, "kind", "vllm")
    return str(kind)  # (another than these two: an error naming both)


EngineSettings = Annotated[
    Annotated[VllmEngineSettings, Tag("vllm")] | Annotated[UpstreamEngineSettings, Tag("upstream")],
    Discriminator(_engine_kind),
]


def sha256_hex(key: str) -> str:
    """What an API key is reduced to, configured or presented: it is never kept in clear.
    A presented key is a header's text: bytes that are not UTF-8 reach it as the surrogates
    aiohttp decodes them to, and hash as those bytes (no configured key has them: 401)."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


class ApiKey(_Strict):
    """One API key and who it stands for. Exactly one of the key sources must be set."""

    key_sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$",
                                   description="Hex sha256 of the key.")
    key_env: str | None = Field(None, description="Environment variable holding the key.")
    key_file: Path | None = Field(None, description="File holding the key.")
    key: Annotated[str, AfterValidator(str.strip)] | None = Field(
        None, description="The key in clear (for tests only; outer blanks are not part of "
        "it, as for `key_env` and `key_file`).")
    tenant: str = Field("default", min_length=1, pattern=r"^[^~]+$",
                        description="Tenant of the caller (`~` is reserved: it joins a "
                        "gateway's tenant to the callers it forwards for).")
    role: str = Field("user", min_length=1, description="Role: user, admin, ... ")
    operator: bool = Field(
        False, description="Operator (global) key: admin rights over every tenant (cache "
        "purge and stats across tenants, fault injection). An `admin` role alone is an "
        "admin of its own tenant only.")
    user: str | None = Field(None, description="User id (default: derived from the key).")
    models: list[str] | None = Field(None, description="Models this key may use (None: all).")
    on_behalf_of: bool = Field(
        False, description="This key is a gateway in front (another Weir, `engine.kind: "
        "upstream`) that names the caller it forwards for in `x-weir-on-behalf-of` (an "
        "opaque digest): each such caller is a tenant of its own under this key's tenant, "
        "so caches, stored records and the engine's prefix cache keep the front's "
        "tenants apart (it keeps this key's role; never operator rights).")

    def configured_digest(self) -> str | None:
        """The key's sha256 when the config itself holds it (`key_sha256`, `key`); None
        for keys read at start (`key_env`, `key_file`)."""
        if self.key_sha256:
            return self.key_sha256.lower()
        return sha256_hex(self.key) if self.key else None

    @model_validator(mode="after")
    def _one_source(self) -> ApiKey:
        given = [k for k in ("key_sha256", "key_env", "key_file", "key") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of key_sha256, key_env, key_file, key"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


class AuthSettings(_Strict):
    mode: Literal["open", "keys"] = Field(
        "keys", description="`open`: anyone is the anonymous principal (development only)."
    )
    keys: list[ApiKey] = Field(default_factory=list, description="Accepted API keys.")
    anonymous_tenant: str = Field("public", pattern=r"^[^~]+$",
                                  description="Tenant of callers in open mode.")
    anonymous_role: str = Field("user", description="Role of callers in open mode.")

    @model_validator(mode="after")
    def _keys_needed(self) -> AuthSettings:
        if self.mode == "keys" and not self.keys:
            raise ValueError("mode `keys` needs at least one entry in `keys`")
        seen: dict[str, int] = {}  # keys given here (env and file ones: at start)
        for i, k in enumerate(self.keys):
            digest = k.configured_digest()
            if digest is not None and seen.setdefault(digest, i) != i:
                raise ValueError(f"keys[{seen[digest]}] and keys[{i}] hold the same key: it "
                                 "would stand for only one of them")
        return self


class LoggingSettings(_Strict):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Level.")
    format: Literal["json", "console"] = Field("json", description="Output format.")
    include_prompts: bool = Field(
        False, description="Add the prompt text to the request line (debug only), as the "
        "sanitizer passed it on (redacted; none for a request it refused).")
    access_log: bool = Field(True, description="One line per request.")


#: The embedding models Weir builds itself (`proxy.embed_models`).
EMBEDDING_BUILTINS = ("builtin:minilm", "builtin:minilm-fp32", "builtin:minilm-static",
                      "builtin:minilm-torch")


def _known_builtin(value: str) -> str:
    if value.startswith("builtin:") and value not in EMBEDDING_BUILTINS:
        raise ValueError(f"unknown built-in embedding model {value!r} (one of "
                         f"{', '.join(EMBEDDING_BUILTINS)}, or a model folder)")
    return value


class EmbeddingSettings(_Strict):
    enabled: bool = Field(True, description="Load the embedding model (and /v1/embeddings).")
    model: Annotated[str, AfterValidator(_known_builtin)] = Field(
        "builtin:minilm",
        description="`builtin:minilm` (MiniLM, int8, on onnxruntime), `builtin:minilm-fp32`, "
                    "`builtin:minilm-static` (model2vec), `builtin:minilm-torch`, or a local "
                    "sentence-transformers model dir (torch).")
    served_model_name: str = Field("all-MiniLM-L6-v2", description="Name in /v1/embeddings.")
    batch_max: int = Field(32, ge=1, le=512, description="Texts per forward pass at most.")
    batch_wait_ms: float = Field(
        0.0, ge=0, description="Extra wait for company; 0: batch what queued meanwhile.")
    max_input_tokens: int = Field(
        256, ge=8, description="The most tokens a text is embedded with. A longer input to "
        "/v1/embeddings is a 400 `context_length_exceeded`; the semantic cache's lookups "
        "read a longer question's first ones.")
    threads: int = Field(1, ge=1, description="Intra-op threads of the embedding runtime.")
    nice: int = Field(
        10, ge=0, le=19, description="Scheduling niceness of the embedding thread (Linux): "
        "when the CPU is short, the event loop and an engine on the same cores go first, "
        "and a semantic lookup that then runs past its deadline is a miss. 0: equal share.")


class TracingSettings(_Strict):
    exporter: Literal["none", "console", "otlp"] = Field(
        "none", description="Where spans go: none, console (stderr), or an OTLP collector.")
    endpoint: str | None = Field(
        None, description="OTLP endpoint, e.g. http://otel:4318/v1/traces or otel:4317.")
    protocol: Literal["http", "grpc"] = Field("http", description="OTLP transport.")
    service_name: str = Field("weir", description="service.name of the spans.")
    sample_ratio: float = Field(1.0, ge=0, le=1, description="Share of new traces kept.")
    trust_incoming: bool = Field(
        True, description="A request's W3C `traceparent` (and `tracestate`) parents its "
        "server span, and passes on upstream: a mesh or front proxy that starts traces "
        "joins them up. Its caller then decides whether the trace is kept (the sampled "
        "flag overrides `sample_ratio`) and what `tracestate` the span holds: false where "
        "callers are not trusted, each request a new trace sampled by `sample_ratio`.")

    @model_validator(mode="after")
    def _endpoint_fits_protocol(self) -> TracingSettings:
        # (an exporter given another scheme exported nothing, saying so only in a warning
        # repeated for good: the gRPC one dropped `grpcs://`, TLS meant, for plaintext;
        # the HTTP one cannot send to `otel:4318` at all)
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", self.endpoint or "")
        named = scheme.group(1).lower() if scheme else None
        if self.endpoint and self.protocol == "http" and named not in ("http", "https"):
            raise ValueError("an OTLP endpoint over HTTP is a URL, "
                             "http://HOST:4318/v1/traces (https:// for TLS)")
        if self.protocol == "grpc" and named is not None and named not in ("http", "https"):
            raise ValueError(f"a gRPC OTLP endpoint is HOST:4317 or http://HOST:4317 "
                             f"(plaintext), https://HOST:4317 (TLS); not {named}://")
        return self


#: What one tenant's stored records of a kind may take in Redis by default: hundreds of
#: large conversations a day for a week, a small part of a Redis sized for several tenants.
DEFAULT_MAX_BYTES_PER_TENANT = 256 * 1024 * 1024


class BackgroundSettings(_Strict):
    """Background responses (`background: true`): runs detached from their request."""

    max_runs: int = Field(
        64, ge=1, description="Background responses running at once in this process; "
        "one more is a 503 `background_capacity` (retry, or on another replica) for a "
        "tenant running an even share of them or more; another tenant's still starts, "
        "up to twice this.")
    max_event_bytes: int = Field(
        1024 * 1024, ge=64 * 1024, description="The most a run's events kept in "
        "memory (for its stream and `GET ...?stream=true&starting_after=`) may take, in "
        "bytes of JSON; past it the oldest go (resuming before them is a 400).")
    keep_finished: int = Field(
        32, ge=0, description="Ended runs whose events are still kept for a resumed "
        "stream on this replica (the oldest go first). Events held at most: "
        "`(2 * max_runs + keep_finished) * max_event_bytes`.")
    poll_s: float = Field(
        1.0, gt=0, le=60, description="How often a run looks for a cancel sent to "
        "another replica (with a Redis store) and renews its lease (at most a third of "
        "`lease_s`).")
    lease_s: float = Field(
        60.0, ge=5, description="How long a run's `queued`/`in_progress` record stays "
        "so without its replica renewing it: past it (the replica died) it reads as "
        "`failed`.")

    @model_validator(mode="after")
    def _renewed_in_time(self) -> BackgroundSettings:
        # (a run renews its lease at its first poll past a third of it: a poll longer
        # than that let the lease lapse, and a run still going read as `failed`)
        if self.poll_s > self.lease_s / 3:
            raise ValueError(f"`poll_s` ({self.poll_s:g}) must be at most a third of "
                             f"`lease_s` ({self.lease_s:g}): a run renews its lease at "
                             "its polls, and it would lapse between them")
        return self


class ResponsesSettings(_Strict):
    """Stored responses of the Responses API (`store: true`, `previous_response_id`)."""

    ttl_s: float = Field(7 * 86400.0, gt=0, description="How long a stored response is kept.")
    max_in_memory: int = Field(
        10000, ge=1, description="Stored responses kept at most when held in memory; "
        "when full, the tenant holding the most loses its oldest (one tenant cannot push "
        "out another's). With the cache's Redis they go there instead.")
    max_bytes_in_memory: int = Field(
        DEFAULT_MAX_BYTES_PER_TENANT, ge=1024 * 1024, description="When held in memory: "
        "the most all tenants' stored responses may take together (their JSON, in bytes), "
        "and as much again their stored chat completions; past it the tenant holding the "
        "most loses its oldest. (`max_bytes_per_tenant` bounds each tenant: alone, ten "
        "tenants could hold ten times it in this process.)")
    redis: bool = Field(
        True, description="Keep them in the cache plugin's Redis when it has one.")
    max_bytes_per_tenant: int = Field(
        DEFAULT_MAX_BYTES_PER_TENANT, ge=1024 * 1024, description="The most one tenant's "
        "stored responses may take, in Redis or in memory (their JSON, in bytes), and "
        "as much again its stored chat completions. A put past it drops that tenant's "
        "oldest records (never another tenant's), so one tenant cannot fill the Redis "
        "that every tenant's cache shares. The callers a gateway key forwards for "
        "(`on_behalf_of`) count as that key's tenant. A record larger than all of it is "
        "not stored: a response whose input alone is, is a 413 `stored_record_too_large`; one its "
        "output takes past goes out with `store: false`; a chat completion goes out "
        "unstored. Size Redis's `maxmemory` for the tenants' bounds besides the cache.")
    background: BackgroundSettings = Field(default_factory=BackgroundSettings)


#: `admin`: any admin key, a tenant's admin too (the figures are every tenant's, in
#: aggregate); `operator`: operator keys only.
Exposure = Literal["open", "admin", "operator"]


class ObservabilitySettings(_Strict):
    """Who may read the operational endpoints. The probes stay open: `/health/live` and
    the status (and status code) of `/health/ready`. With `auth.mode: open` (development)
    everything here is open."""

    metrics: Exposure = Field(
        "open", description="`/metrics`: `open` for Prometheus scrapers (keep the port "
        "internal: a NetworkPolicy or a separate Service), or `admin` (scrape with "
        "`authorization: Bearer <admin key>`). Metrics carry no tenant, key or prompt.")
    health_details: Exposure = Field(
        "admin", description="The details of `/health/ready` (engine queue, plugins, "
        "in-flight count); without an admin key the body holds only the status. "
        "`operator`: where tenants' admins should not see the whole server's figures.")
    dashboard: Literal["open", "admin", "operator", "off"] = Field(
        "admin", description="`/dashboard`: a browser sends the admin key as HTTP Basic "
        "(any user name, the key as password); `off` removes the page.")


class PluginSpec(_Strict):
    name: str = Field(description="Registered plugin name (sanitizer, cache, ...).")
    enabled: bool = Field(True, description="Set false to keep the entry but skip it.")
    config: dict[str, Any] = Field(default_factory=dict, description="The plugin's own config.")


class Settings(_Strict):
    server: ServerSettings = Field(default_factory=ServerSettings)
    engine: EngineSettings = Field(default_factory=VllmEngineSettings)
    auth: AuthSettings = Field(
        default_factory=lambda: AuthSettings.model_validate({"mode": "open"}))
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    observability: ObservabilitySettings = Field(
        default_factory=ObservabilitySettings)
    plugins: list[PluginSpec] = Field(default_factory=list, description="Outermost first.")


class ConfigError(Exception):
    """Configuration errors, each with its YAML path."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("\n".join(f"{p}: {m}" if p else m for p, m in errors))


def yaml_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("vllm", "upstream") and out.endswith("engine"):
            continue  # the discriminated union's tag
        else:
            out += f".{part}" if out else str(part)
    return out


def errors_from_validation(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for e in exc.errors(include_url=False):
        msg, loc = e["msg"].removeprefix("Value error, "), tuple(e["loc"])
        if e["type"] == "union_tag_invalid":  # (pydantic's words name the function)
            ctx = e.get("ctx") or {}
            msg, loc = (f"unknown kind `{ctx.get('tag')}` (one of "
                        f"{ctx.get('expected_tags')})"), (*loc, "kind")
        out.append((yaml_path(loc, prefix), msg))
    return out


#: `${VAR}`, `${VAR:-default}`; `$${VAR}` is the text `${VAR}` (as Compose writes it)
_REF = re.compile(r"(\$?)\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def interpolate(value: Any, env: dict[str, str] | None = None, path: str = "") -> Any:
    """Replace ${VAR} / ${VAR:-default} in every string of a parsed YAML document; a
    ConfigError names every variable unset with no default."""
    unset: list[tuple[str, str]] = []
    out = _interpolate(value, os.environ if env is None else env, path, unset)
    if unset:
        raise ConfigError(unset)
    return out


def _interpolate(value: Any, env: Mapping[str, str], path: str,
                 unset: list[tuple[str, str]]) -> Any:
    """`interpolate`, each unset variable (no default) added to `unset` by its YAML path
    and read as empty text, so the rest of the document is still read."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env, f"{path}.{k}" if path else str(k), unset)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, f"{path}[{i}]", unset) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(1):  # `$${VAR}`: the text itself
            return m.group(0)[1:]
        name, default = m.group(2), m.group(3)
        value = env.get(name)
        # As in a shell: the default stands for a variable unset or set empty (an empty
        # WEIR_HOST made `${WEIR_HOST:-127.0.0.1}` listen on every interface).
        if value is not None and (value or default is None):
            return value
        if default is not None:
            return default
        unset.append((path, f"environment variable {name} is not set and has no default"))
        return ""

    return _REF.sub(sub, value)


def load_settings(path: str | Path, env: dict[str, str] | None = None) -> Settings:
    return parse_settings(read_config_text(path), env=env)


def read_config_text(path: str | Path) -> str:
    """The config file's text; FileNotFoundError when there is none, a ConfigError (one
    line, no traceback) when it cannot be read as UTF-8 text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError as e:
        raise ConfigError([("", f"not UTF-8 text (byte {e.start})")]) from None
    except OSError as e:
        raise ConfigError([("", f"cannot be read: {e.strerror or type(e).__name__}")],
                          ) from None


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML would keep the
    last silently: a second `plugins:` block dropped the first chain, sanitizer and all)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: overridable
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the mapping's own error says so
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key `{str(key)[:64]}`", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


#: The most values a config may hold once its aliases are expanded: a few anchors that
#: name each other ("billion laughs") expand past memory.
_MAX_EXPANDED = 100_000


def _expanded_size(value: Any, memo: dict[int, int]) -> int:
    """How many values `value` holds with every alias expanded, counted once per shared
    object (so an alias bomb costs as little to measure as its text)."""
    if not isinstance(value, dict | list):
        return 1
    got = memo.get(id(value))
    if got is None:
        memo[id(value)] = _MAX_EXPANDED + 1  # (a cycle counts as too large)
        items = value.values() if isinstance(value, dict) else value
        got = 1
        for v in items:
            got += _expanded_size(v, memo)
            if got > _MAX_EXPANDED:
                break
        memo[id(value)] = got
    return got


def _load_yaml(text: str) -> Any:
    try:
        raw = yaml.load(text, Loader=_ConfigLoader)  # (a safe loader: SafeLoader's own)
    except RecursionError:  # (nesting thousands deep: the parser's own recursion)
        raise ConfigError([("", "nested too deeply")]) from None
    if _expanded_size(raw, {}) > _MAX_EXPANDED:
        raise ConfigError([("", f"more than {_MAX_EXPANDED:,} values once its aliases are "
                                "expanded")])
    return raw


def parse_settings(text: str, env: dict[str, str] | None = None) -> Settings:
    try:
        raw = _load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError([("", f"not valid YAML{where}: {getattr(e, 'problem', e)}")]) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([("", "the top level must be a mapping")])
    unset: list[tuple[str, str]] = []
    raw = _interpolate(raw, os.environ if env is None else env, "", unset)
    # A file that says nothing of auth fails closed, naming the choice, rather than
    # serving every caller as anonymous (`Settings()` in code keeps open mode).
    unsaid = unset + ([] if "auth" in raw else [("auth", _AUTH_REQUIRED)])
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as e:
        # (a field an unset variable left empty is told as that, not as its empty text)
        told = {p for p, _ in unset}
        raise ConfigError(unsaid + [(p, m) for p, m in errors_from_validation(e)
                                    if p not in told]) from None
    except RecursionError:
        raise ConfigError([("", "nested too deeply")]) from None
    if unsaid:
        raise ConfigError(unsaid)
    return settings


_AUTH_REQUIRED = ("required: API keys (`mode: keys` with `keys`), or `mode: open`, where "
                  "every caller is the anonymous principal (development only)")


def collect_errors(text: str, env: dict[str, str] | None = None,
                   ) -> tuple[list[tuple[str, str]], list[PluginSpec] | None]:
    """All root errors of a config file, and its plugin list as far as it is valid.

    When the root has errors elsewhere, the `plugins` list is still read on its own, so
    `check-config` can report plugin errors in the same run. An entry the root's errors
    name outside its `config` (no `name`, an unset variable in it) stands in the list as
    an entry turned off, so the others, and their order, are still checked where they
    stand; one with an unset variable in its `config` stands as read (the field that
    variable left empty is told already: the caller tells no path twice).
    """
    try:
        return [], parse_settings(text, env=env).plugins
    except ConfigError as e:
        errors = list(e.errors)
    try:
        # (the root's unset variables are told already)
        raw = _interpolate(_load_yaml(text) or {}, os.environ if env is None else env, "", [])
        if not isinstance(raw, dict):
            return errors, None
        entries = raw.get("plugins", [])
        if not isinstance(entries, list) or any(
                p == "plugins" for p, _ in errors):
            return errors, None
        told = [p for p, _ in errors]
        specs = []
        for i, entry in enumerate(entries):
            at = f"plugins[{i}]"
            named = [p for p in told if p == at or p.startswith((at + ".", at + "["))]
            spec: PluginSpec | None = None
            if all(p.startswith(f"{at}.config.") for p in named):
                try:
                    spec = PluginSpec.model_validate(entry)
                except ValidationError:
                    spec = None
            specs.append(spec if spec is not None
                         else PluginSpec(name="(told)", enabled=False))
        return errors, specs
    except (yaml.YAMLError, ConfigError, ValidationError, RecursionError):
        pass
    return errors, None
    try:
        # (the root's unset variables are told already; the plugins have none)
        raw = _interpolate(_load_yaml(text) or {}, os.environ if env is None else env, "", [])
        if isinstance(raw, dict):
            return errors, Settings.model_validate({"plugins": raw.get("plugins", [])}).plugins
    except (yaml.YAMLError, ConfigError, ValidationError, RecursionError):
        pass
    return errors, None
