"""Admission config: engine concurrency, the wait queue, priorities, deadlines."""

from __future__ import annotations

from pydantic import Field, field_validator

from proxy.chain import PluginConfig
from proxy.settings import HTTP_TOKEN

from .queue import DEFAULT_PRIORITY_PASSES


class AdmissionConfig(PluginConfig):
    max_concurrent: int = Field(
        64, ge=1, description="Sequences in the engine at once: a request takes one per "
        "choice of each prompt (`n` x prompts), all of them at most.")
    max_queue: int = Field(128, ge=0, description="Requests waiting at most (503 beyond).")
    max_queue_wait_s: float = Field(30, gt=0, description="Longest wait for an engine slot.")
    priorities: dict[str, int] = Field(
        default_factory=lambda: {"admin": 0, "user": 10},
        description="Role -> priority; lower goes first among its tenant's requests "
        "(tenants take turns first; at one turn, lower goes first).")
    default_priority: int = Field(10, description="Priority of roles not listed.")
    priority_passes: int | None = Field(
        DEFAULT_PRIORITY_PASSES, ge=0, description="Weighted priority within a tenant: "
        "a request is passed by at most this many of its tenant's later requests per "
        "point of priority between them (admin 0 and user 10: by 10 x this), so the "
        "tenant's admin traffic cannot starve its own users; 0: no priority, plain "
        "arrival order (tenants still take turns); null: strict priority.")
    deadline_s: float | None = Field(
        300, gt=0, description="Default per-request deadline (None: none).")
    deadline_header: str = Field(
        "x-weir-timeout-ms", description="Header that may shorten the deadline (ms; a "
        "value that is no positive number is a 400 naming it); its name in any case, as "
        "HTTP reads it.")
    retry_after_s: float = Field(1, gt=0, description="Retry-After on a shed request.")

    @field_validator("deadline_header")
    @classmethod
    def _a_header_name(cls, value: str) -> str:
        """Request headers are read by lower-cased name (`RequestContext.headers`): a name
        written `X-Request-Timeout-Ms` matched no request and was ignored without a word."""
        name = value.strip().lower()
        if not HTTP_TOKEN.fullmatch(name):
            raise ValueError(f"`{value}` is no HTTP header name")
        return name

