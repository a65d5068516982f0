"""RequestContext: everything one request carries through the chain.

Plugins keep per-request state here (`ctx.state[plugin_name]`), never on themselves:
a plugin instance serves every request at once.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .auth import Principal
from .errors import DeadlineExceeded, InvalidRequest, shown
from .protocol import ChatCompletionRequest, CompletionRequest

Route = Literal["chat", "completion", "embeddings"]


class Screen(Protocol):
    def __call__(self, texts: list[str], *, json: bool = False,
                 speakers: list[str] | None = None) -> list[str]: ...


def screened_values(values: dict[str, str], screen: Screen | None) -> dict[str, str]:
    """`values` (a request's `metadata`) with each key and value screened by the
    sanitizer's `screen` (None: as given): kept and listed beside the request's redacted
    texts, they are in no prompt, so the chain never read them. (A key is the caller's
    text as a value is: a key in it went on as sent. Keys are what listings filter by:
    one that held nothing to redact stays as it came; ones redacted alike stay apart.)"""
    if screen is None or not values:
        return values
    keys = list(values)
    said = screen([*keys, *(values[k] for k in keys)])
    out: dict[str, str] = {}
    for key, screened, value in zip(keys, said[:len(keys)], said[len(keys):], strict=True):
        out[key_apart(screened, key, out, values)] = value
    return out


def key_apart(screened: str, key: str, taken: Container[str], keys: Container[str]) -> str:
    """A mapping's key `key`, screened as `screened`, as a key of the screened mapping
    whose keys so far are `taken` (`keys`: the mapping's own): two keys redacted alike
    ("alice@x.com" and "bob@y.com" both "[EMAIL]"), or one redacted as another key
    reads, stay two entries, "[EMAIL]" and "[EMAIL]#2" (one entry dropped a value)."""
    n, name = 1, screened
    while name in taken or (name != key and name in keys):
        n += 1
        name = f"{screened}#{n}"
    return name


@dataclass(slots=True)
class RequestContext:
    route: Route
    #: For `embeddings`, a completion-shaped view of the request (its inputs as prompts,
    #: one output token): what the traffic plugins that serve that route need to see.
    request: ChatCompletionRequest | CompletionRequest
    principal: Principal
    request_id: str
    #: Monotonic deadline (time.monotonic()) or None for no deadline.
    deadline: float | None = None
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased request headers
    #: Headers plugins want on the response (x-weir-cache, x-ratelimit-*, ...).
    response_headers: dict[str, str] = field(default_factory=dict)
    #: Set by the sanitizer (or a cache regex): the request must not touch the cache.
    sensitive: bool = False
    #: Names of detectors that fired (no matched text, ever).
    flags: set[str] = field(default_factory=set)
    state: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    #: Filled by the terminal step: prompt tokens, for rate limiters and logs.
    prompt_tokens: int | None = None
    #: Left by the terminal step when the request is cut (client gone, deadline) after the
    #: engine had it, before an answer came back: the usage spent until the cut (prompt
    #: tokens and the tokens generated), which the rate limiter charges. A stream cut after
    #: its first chunk carries its own (`Stream.usage`).
    usage_so_far: dict[str, Any] | None = None
    #: Left instead by a terminal step that cannot tell what a cut request spent (an
    #: upstream's whole answer, whose usage comes only at its end): the rate limiter
    #: charges the request's reservation.
    spent_unknown: bool = False
    #: The request as the cache should key it (normalized, redacted); None: `request`.
    key_request: ChatCompletionRequest | CompletionRequest | None = None
    #: The request as the caller sent it, where a plugin passes another on as `request`
    #: (the sanitizer: normalized, redacted); None: `request` is it. A completion's
    #: `echo` gives back its prompts (`proxy.preparing.echoed_prompts`).
    sent: ChatCompletionRequest | CompletionRequest | None = None
    #: Set by the sanitizer where it redacted something: texts of this request, in order,
    #: as it passes them on (read as one conversation: a card split between two is
    #: found; with `json=True`, each a JSON text whose strings are read, as call
    #: arguments are). For what a route keeps of the request in its own form (a stored
    #: Response's input items).
    screen: Screen | None = None
    #: Set by the sanitizer wherever a detector of its redacts, whether or not one fired:
    #: the same screen, for texts a route keeps that no request of the chain carries (a
    #: Response's reasoning items: stored and listed, in no prompt).
    screen_aside: Screen | None = None
    #: Characters of the texts a route screens aside (`screen_aside`): the sanitizer
    #: counts them in its limit on what it reads (`limits.max_total_chars`), as it does
    #: the prompt's.
    aside_chars: int = 0
    #: What a route keeps (and echoes) beside a request that no request of the chain
    #: carries (a Response's `metadata`): the sanitizer reads it once, as the request's
    #: own metadata (a `block` detector firing there refuses it, as in a prompt), and
    #: leaves it screened as kept in `aside_said`.
    aside_metadata: dict[str, str] | None = None
    #: `aside_metadata` as the sanitizer screened it (None: not screened).
    aside_said: dict[str, str] | None = None
    #: Size of the HTTP body, for plugins that enforce their own limit.
    body_bytes: int = 0
    #: The most tokens a request that names no output limit may generate (the
    #: sanitizer's `limits.max_tokens`); None: up to the model's context.
    output_ceiling: int | None = None
    #: When the terminal step handed the request to its engine (monotonic; None: it
    #: never did: refused, shed, or cut while queued), and how long the engine took to
    #: its first token (None: not yet, or not known). What the breaker times a call by:
    #: a queue's wait and an answer's length (which the caller sets) are no engine's.
    engine_started: float | None = None
    engine_ttft_s: float | None = None
    #: The request as the terminal prepared it ahead (`Terminal.prepare`: its request,
    #: and what the terminal made of it), taken by the terminal's call; None: none was.
    prepared: tuple[Any, Any] | None = None
    #: The engine tells its first token even for a whole answer (the in-process one), or
    #: for a stream (an upstream's: its first chunk).
    engine_timed: bool = False
    #: ... and as it comes (a stream; a whole answer's comes with its end): a call it
    #: has had past the breaker's `slow_call_s` with none is slow already.
    engine_live: bool = False
    #: ... or, for a whole answer, how many tokens it has generated so far, where the
    #: engine can say (the in-process one): none past `slow_call_s` is slow already too.
    engine_progress: Callable[[], int | None] | None = None
    #: Set by admission (its `enter`): counts a request its own deadline cut where
    #: admission never had it (a coalesced follower waiting on its leader's answer, a
    #: breaker's fallback), as it counts those it cuts itself.
    deadline_cut: Callable[[], None] | None = None
    #: Set by a route that answers before the engine does (a background response's
    #: `queued` answer): told once (`waiting`) when the request starts to wait (for an
    #: engine slot, the engine, an identical request's answer), what the plugins decide
    #: before that (and their `response_headers`) being decided.
    on_waiting: Callable[[], None] | None = None

    def cut_at_deadline(self) -> None:
        """This request's own deadline cut it outside admission (see `deadline_cut`)."""
        if self.deadline_cut is not None:
            self.deadline_cut()

    def waiting(self) -> None:
        """The request starts to wait (see `on_waiting`)."""
        told, self.on_waiting = self.on_waiting, None
        if told is not None:
            told()

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def stream(self) -> bool:
        return self.request.stream

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()


#: The header a caller shortens its request's deadline by (milliseconds), unless the
#: admission plugin names another (its `deadline_header`).
TIMEOUT_HEADER = "x-weir-timeout-ms"


def asked_limit(raw: str | None, limit: float | None,
                name: str = TIMEOUT_HEADER) -> float | None:
    """`limit` (seconds; None: none), shortened by a timeout header's value `raw` (ms),
    the header `name`: sent twice (a list), the shorter holds. A value that is no
    positive number of milliseconds (`0`, `-1`, `abc`, empty) is the client's 400 naming
    the header: ignored, the client would think it had set a deadline it had not."""
    if raw is None:
        return limit
    values = [v.strip() for v in raw.split(",")]
    for value in [v for v in values if v] or [""]:  # (an empty list element is none)
        try:
            asked = float(value) / 1000 if _MS.fullmatch(value) else math.nan
        except ValueError:
            asked = math.nan
        if not (asked > 0 and math.isfinite(asked)):
            raise InvalidRequest(
                f"Invalid value for the `{name}` header: {shown(raw)!r}; expected a "
                "positive number of milliseconds.", code="invalid_value")
        limit = asked if limit is None else min(limit, asked)
    return limit


#: A timeout header's value: a number of milliseconds, a fraction or an exponent allowed
#: (`1500`, `1500.5`, `1e3`), no sign, no `inf` or `nan`, no `_` (what float() takes).
_MS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def loop_time(deadline: float | None) -> float | None:
    """A time.monotonic() instant on the running loop's clock (uvloop keeps its own)."""
    if deadline is None:
        return None
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())


class Within:
    """`asyncio.timeout_at` on a request's deadline (a `time.monotonic()` instant, or None
    for none), whose expiry is the request's own 504 (`DeadlineExceeded`). A TimeoutError
    this scope did not raise (an inner timeout's) passes through as it is.

        async with Within(ctx.deadline):
            reply = await call_next(ctx)
    """

    __slots__ = ("_message", "_scope")

    def __init__(self, deadline: float | None,
                 message: str = "The request did not finish within its deadline.") -> None:
        self._scope = asyncio.timeout_at(loop_time(deadline))
        self._message = message

    def expired(self) -> bool:
        return self._scope.expired()

    async def __aenter__(self) -> Within:
        await self._scope.__aenter__()
        return self

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: Any) -> None:
        try:
            await self._scope.__aexit__(et, exc, tb)
        except TimeoutError:
            if self._scope.expired():
                raise DeadlineExceeded(self._message) from None
            raise


def header_map(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Request headers by lower-cased name, for `RequestContext.headers`. A header sent on
    several lines is one comma-separated list, as HTTP reads it (RFC 9110 5.3):
    `Cache-Control: no-store` and `Cache-Control: max-age=60` are both heard."""
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out
