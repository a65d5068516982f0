"""The WeirError tree: every error a client can see, in OpenAI's shape.

Each subclass fixes the HTTP status and OpenAI `type`; instances carry the message,
the offending `param` and a machine-readable `code`. `to_body()` is the only place that
builds an error body, so every error the gateway sends has the same keys
(`message`, `type`, `param`, `code`), in JSON or in-band in an SSE stream.
"""

from __future__ import annotations

import math
from typing import Any

#: The most of a caller's value (a model name, an id, a `$ref`, a header) an error
#: message quotes: a 50 KB model name is not sent back as a 50 KB message.
SHOWN_CHARS = 64


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`value` (the caller's) as an error message quotes it: at most `limit` characters,
    a cut one ending in "..."."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def retry_headers(wait_ms: float) -> dict[str, str]:
    """`Retry-After` and `retry-after-ms` (the OpenAI SDK reads it first) for a wait of
    `wait_ms`: the one place either is formed. Rounded up (2.5 s said as 2 had a client
    that honours it come back early, beside a `retry-after-ms` of 2500), and never
    under 1 s and 1 ms: a `Retry-After: 0` has a client retry at once, in a loop."""
    ms = max(1, math.ceil(round(wait_ms, 6)))  # (0.3 s is 300 ms, not 301)
    return {"retry-after": str(max(1, math.ceil(ms / 1000))), "retry-after-ms": str(ms)}


class WeirError(Exception):
    status: int = 500
    type: str = "server_error"
    default_code: str | None = None
    #: The client's own fault, which a retry cannot change: answered with
    #: `x-should-retry: false` (the OpenAI SDKs retry a 408, 409, 429 and 5xx otherwise).
    not_retried: bool = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers: dict[str, str] = dict(headers or {})
        if self.not_retried:
            self.headers.setdefault("x-should-retry", "false")

    def to_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(WeirError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(WeirError):
    """A key missing or wrong: OpenAI's 401 is an `invalid_request_error` whose code
    names the fault (`invalid_api_key`); its SDKs map the error by status."""

    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"

    def __init__(self, message: str = "Incorrect API key provided.", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.headers.setdefault("www-authenticate", 'Bearer realm="weir"')
        self.headers.setdefault("x-should-retry", "false")


class PermissionDenied(WeirError):
    status = 403
    type = "permission_error"
    default_code = "permission_denied"


class NotFound(WeirError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"

    def __init__(self, model: str, *, param: str | None = "model") -> None:
        super().__init__(
            f"The model `{shown(model)}` does not exist or you do not have access to it.",
            param=param,
        )


class ModelNotSupported(NotFound):
    """A model served here, asked of a route that does not serve it (the chat model's
    embeddings, the embedding model's chat): a 404 naming `model`, as OpenAI answers
    ("This is not a chat model and thus not supported in the v1/chat/completions
    endpoint"), with a code of its own where OpenAI's is null."""
    default_code = "model_not_supported"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model")


class MethodNotAllowed(WeirError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


class ExpectationFailed(WeirError):
    """An `Expect` header the server cannot meet (417)."""

    status = 417
    type = "invalid_request_error"
    default_code = "expectation_failed"


class RequestTimeout(WeirError):
    """The client took too long to send its request (408)."""

    status = 408
    type = "invalid_request_error"
    default_code = "request_timeout"


class PayloadTooLarge(WeirError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class RecordTooLarge(PayloadTooLarge):
    """A record to keep (`store: true`) larger than all its tenant may store."""

    default_code = "stored_record_too_large"


class UnsupportedMediaType(WeirError):
    status = 415
    type = "invalid_request_error"
    default_code = "unsupported_content_encoding"


class MethodNotImplemented(WeirError):
    """A method the server knows nothing of (RFC 9110 9.1: 501): the request's fault, so
    not to be retried."""

    status = 501
    type = "invalid_request_error"
    default_code = "method_not_implemented"
    not_retried = True


class UnsupportedTransferCoding(WeirError):
    """A transfer coding besides `chunked` (RFC 9112: 501): the request's fault, so not
    to be retried."""

    status = 501
    type = "invalid_request_error"
    default_code = "unsupported_transfer_encoding"
    not_retried = True


class VersionNotSupported(WeirError):
    """A request line naming an HTTP version other than 1.0 and 1.1 (RFC 9110: 505, as
    nginx answers `HTTP/2.0` sent over HTTP/1): the request's fault, not to be retried."""

    status = 505
    type = "invalid_request_error"
    default_code = "http_version_not_supported"
    not_retried = True


class RateLimited(WeirError):
    """OpenAI's 429 has the limit's kind as its type: `requests` (a request rate, or
    requests at once) or `tokens`, with code `rate_limit_exceeded`."""

    status = 429
    type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, kind: str = "requests", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.type = kind


class ServerError(WeirError):
    """A bug or an unexpected engine failure. The message sent is always generic."""

    status = 500
    type = "server_error"

    def __init__(self, message: str = "The server had an error while processing your request.",
                 **kw: Any) -> None:
        super().__init__(message, **kw)


class GatewayFault(ServerError):
    """Weir itself failed on a request before the engine saw it (a bug that some input
    reaches). A 500 like any other to the caller, but never the engine's failure: no
    input one tenant can send may open the circuit breaker for every tenant."""


class EngineError(ServerError):
    """The engine failed while generating (the engine is the one at fault, not Weir)."""

    status = 502
    default_code = "engine_error"


class Unavailable(WeirError):
    status = 503
    type = "server_error"
    default_code = "service_unavailable"

    def __init__(self, message: str, *, retry_after: float | None = 1.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        if retry_after is not None:
            for name, value in retry_headers(retry_after * 1000).items():
                self.headers.setdefault(name, value)


class Timeout(WeirError):
    status = 504
    type = "timeout_error"
    default_code = "timeout"


class DeadlineExceeded(Timeout):
    """The request's own deadline passed (the client's `x-weir-timeout-ms`, or the
    operator's `deadline_s`). Not an engine fault: the breaker never counts it. Raised
    as this class itself only for that deadline; a subclass is another limit answered
    the same way (an upstream's `timeout_s`, an only-if-cached miss)."""


class NotCached(DeadlineExceeded):
    """No cached answer for a request that asked for one only (`Cache-Control:
    only-if-cached`): the client's own choice, which a retry cannot change (the OpenAI
    SDKs retry a 504 unless told not to)."""

    default_code = "not_cached"
    not_retried = True
