"""Breaker config: the sliding window and thresholds, and the fallback list."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator
from pydantic.config import JsonDict

from proxy.chain import PluginConfig
from proxy.config_model import ConfigModel
from proxy.settings import HttpUrlText, OptionalSecret, check_url_or_key


class FallbackBreaker(ConfigModel):
    """An upstream fallback's own breaker: its thresholds are its own, not the engine's
    (it is asked only while the engine is open, shedding or failing: far fewer calls,
    and a dead one should be skipped after a few, not after the engine's
    `minimum_calls`). One trial at a time; a trial is judged stuck only past the
    fallback's `timeout_s` (or the breaker's `half_open_max_wait_s`, if longer)."""

    window_s: float = Field(30, gt=0, description="Sliding window of its outcomes.")
    minimum_calls: int = Field(3, ge=1, description="Outcomes needed before it may open.")
    failure_rate: float = Field(0.5, gt=0, le=1, description="Failure share that opens it.")
    open_s: float = Field(15, gt=0, description="How long it stays open (skipped).")


def _kind_is(kinds: list[JsonValue]) -> JsonDict:
    return {"properties": {"kind": {"enum": kinds}}, "required": ["kind"]}


class Fallback(ConfigModel):
    # What `_upstream_needs_url` checks, in the JSON schema too (the Helm chart's values
    # schema: `helm install` took a static fallback with a `breaker`, or an upstream with
    # no `base_url`, and the pod then refused its config). (A `kind` given as `${VAR}`
    # is Weir's to check.)
    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"if": _kind_is(["upstream"]), "then": {"required": ["base_url"]}},
        {"if": _kind_is(["stale", "static", "error"]),
         "then": {"not": {"required": ["breaker"]}}}]})

    kind: Literal["stale", "upstream", "static", "error"] = Field(
        description="stale: an expired cache entry in its grace window; upstream: another "
        "OpenAI-compatible server; static: a fixed answer; error: no fallback after it, a "
        "clean error (503 `circuit_open` while open; a shed or failed request keeps its own).")
    base_url: HttpUrlText | None = Field(None, description="upstream: its base URL (…/v1).")
    api_key: str | None = Field(None, description="upstream: its key.")
    timeout_s: float = Field(60, gt=0, description="upstream: total timeout.")
    on_behalf_of_secret: OptionalSecret = Field(
        None, description="upstream: name each caller in "
        "`x-weir-on-behalf-of`, keyed by this secret (as `engine.on_behalf_of_secret`, "
        "which the sanitizer's digests take first where it is set).")
    cache_salt: bool = Field(
        False, description="upstream: send vLLM's `cache_salt` (a digest of the caller's "
        "tenant, keyed by this fallback's `on_behalf_of_secret` where set), as "
        "`engine.cache_salt` does: a vLLM fallback's prefix cache is then shared within a "
        "tenant only. Off: a server that does not know the field (a Weir) may refuse it.")
    content: str = Field("The service is busy right now; please try again shortly.",
                         description="static: the answer's text.")
    breaker: FallbackBreaker = Field(
        default_factory=FallbackBreaker, description="upstream: its own breaker, which "
        "skips it while it is down (its thresholds, not the engine's).")

    @model_validator(mode="after")
    def _upstream_needs_url(self) -> Fallback:
        if self.kind == "upstream" and not self.base_url:
            raise ValueError("an upstream fallback needs base_url")
        if self.kind != "upstream" and "breaker" in self.model_fields_set:
            raise ValueError("only an upstream fallback has a breaker of its own")
        if self.kind != "upstream" and self.cache_salt:
            raise ValueError("only an upstream fallback sends a cache_salt")
        check_url_or_key(self.base_url, self.api_key)
        return self


class BreakerConfig(PluginConfig):
    window_s: float = Field(30, gt=0, description="Sliding window of engine outcomes.")
    minimum_calls: int = Field(10, ge=1, description="Outcomes needed before it may open.")
    failure_rate: float = Field(0.5, gt=0, le=1, description="Failure share that opens it.")
    slow_call_s: float = Field(10, gt=0, description="Time to first token counted as slow.")
    slow_call_rate: float = Field(0.8, gt=0, le=1, description="Slow share that opens it.")
    whole_call_s: float | None = Field(
        120, gt=0, description="A whole (non-streamed) answer from an engine that tells no "
        "first token (an upstream's) is slow once it has run this long while the engine "
        "answered nothing for as long (no whole answer, no stream's first chunk or end): "
        "counted as it passes, while still in flight (a hung upstream, which answers "
        "nothing, opens the breaker then, not when its `timeout_s` or the request's "
        "deadline ends the call), and not while the engine answers others (an answer's "
        "length is the caller's). Well above `slow_call_s`; null: such an answer is never "
        "slow.")
    open_s: float = Field(15, gt=0, description="How long it stays open.")
    half_open_calls: int = Field(2, ge=1, description="Trial calls that must succeed.")
    half_open_max_wait_s: float = Field(
        30, gt=0, description="A trial silent this long counts as failed: no first token, "
        "or (where the engine tells its progress) no new token since its last. An "
        "upstream's whole answer, which tells nothing until its end, is judged by "
        "`whole_call_s` instead (where that is set).")
    fallback: list[Fallback] = Field(
        default_factory=list, description="Tried in order when open, shed or failing.")
