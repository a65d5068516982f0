"""An ended background response's events, made again from its stored record.

A run's own events are kept in memory by the replica that ran it, for a while
(`background.Runner`): after a restart, on another replica, or once they are gone, a
stream of an ended response (`GET /v1/responses/{id}?stream=true`, no
`starting_after`) is its record told as events, in the order and shape a live run's
take: `response.created` and `response.queued` (the response `queued`, no output),
`response.in_progress` (where it had output), each output item added, its text (or a
call's arguments) in one delta and done, and the event the run ended with (`response.completed`,
`response.incomplete`, or `error` and `response.failed`; a cancelled one ends
`response.incomplete`, as its live streams did). Numbered from 0: these are not the
run's own numbers (it had a delta a token), so a `starting_after` naming one of those
cannot be resumed from here.
"""

from __future__ import annotations

import copy
from typing import Any

from . import translate as X

#: How the record's status ends the events (a cancelled one: `response.incomplete`).
_ENDS = {"completed": "response.completed", "incomplete": "response.incomplete",
         "failed": "response.failed", "cancelled": "response.incomplete"}


def can_replay(response: dict[str, Any]) -> bool:
    """Whether `response` has ended as a run ends (its events then are all known)."""
    return response.get("status") in _ENDS


def replayed(response: dict[str, Any], said: Any = None) -> list[dict[str, Any]]:
    """`response`'s events (`can_replay`), numbered from 0. `said`: what a failed one's
    `error` event said (its record's `said`: its `code` and `param`; the Response's
    `error.code` is one of a closed list, `server_error` for an engine's failure); left
    out, or not that shape (another version's record), its `error`'s code."""
    events: list[dict[str, Any]] = []

    def add(type_: str, **fields: Any) -> None:
        events.append({"type": type_, "sequence_number": len(events), **fields})

    def at(status: str) -> dict[str, Any]:
        head = copy.deepcopy(response)
        head.update(status=status, output=[], error=None, incomplete_details=None,
                    completed_at=None)
        head.pop("usage", None)  # (not nullable: absent until known, as a run's)
        return head

    add("response.created", response=at("queued"))
    add("response.queued", response=at("queued"))
    if response.get("output"):  # (a run goes `in_progress` with its first output)
        add("response.in_progress", response=at("in_progress"))
    # An item a failure or a cancel cut (or a run whose replica died left under way) is
    # done as the run did it: `output_item.done` alone (its text's `.done` would say it
    # is whole).
    cut = response["status"] in ("failed", "cancelled")
    for n, item in enumerate(response.get("output") or []):
        whole = not (cut and item.get("status") != "completed")
        if item.get("type") == "message":
            add("response.output_item.added", output_index=n,
                item={**copy.deepcopy(item), "status": "in_progress", "content": []})
            for k, part in enumerate(item.get("content") or []):
                _part(add, item["id"], n, k, part, whole)
        elif item.get("type") == "function_call":
            add("response.output_item.added", output_index=n,
                item={**copy.deepcopy(item), "status": "in_progress", "arguments": ""})
            if item.get("arguments"):
                add("response.function_call_arguments.delta", item_id=item["id"],
                    output_index=n, delta=item["arguments"])
            if whole:
                add("response.function_call_arguments.done", item_id=item["id"],
                    output_index=n, name=item["name"], arguments=item["arguments"])
        else:  # (what the run never streams piecewise)
            add("response.output_item.added", output_index=n, item=copy.deepcopy(item))
        add("response.output_item.done", output_index=n, item=copy.deepcopy(item))
    if response["status"] == "failed":
        error = response.get("error") or {}
        code, param = error.get("code"), None
        if isinstance(said, dict) and all(
                isinstance(said.get(k), str | None) for k in ("code", "param")):
            code, param = said.get("code"), said.get("param")
        add("error", code=code, message=error.get("message", ""), param=param)
    add(_ENDS[response["status"]], response=copy.deepcopy(response))
    return events


def _part(add: Any, item_id: str, n: int, k: int, part: dict[str, Any], whole: bool,
          ) -> None:
    """A message's content part `k`: added empty, its text in one delta, done."""
    if part.get("type") != "output_text":  # (a refusal: added and done as it is)
        add("response.content_part.added", item_id=item_id, output_index=n,
            content_index=k, part=copy.deepcopy(part))
        if whole:
            add("response.content_part.done", item_id=item_id, output_index=n,
                content_index=k, part=copy.deepcopy(part))
        return
    add("response.content_part.added", item_id=item_id, output_index=n, content_index=k,
        part=X.text_part(""))
    if part.get("text"):
        add("response.output_text.delta", item_id=item_id, output_index=n, content_index=k,
            delta=part["text"], logprobs=[])
    if whole:
        add("response.output_text.done", item_id=item_id, output_index=n, content_index=k,
            text=part.get("text", ""), logprobs=[])
        add("response.content_part.done", item_id=item_id, output_index=n, content_index=k,
            part=copy.deepcopy(part))
