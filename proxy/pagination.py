"""OpenAI's cursor pagination of a list endpoint: `limit`, `order` and `after` in the
query, a `list` object with `first_id`, `last_id` and `has_more` in the answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidRequest


def params(query: Mapping[str, str], order: str) -> tuple[int, str]:
    """(`limit`, `order`) of a list request; `order` the default order."""
    given = query.get("limit", "20")  # digits only: not " 5", "+5" or a full-width 5
    limit = int(given) if given.isascii() and given.isdigit() and len(given) <= 3 else 0
    if not 1 <= limit <= 100:
        raise InvalidRequest("`limit` must be an integer from 1 to 100.", param="limit",
                             code="invalid_value")
    order = query.get("order", order)
    if order not in ("asc", "desc"):
        raise InvalidRequest("`order` must be `asc` or `desc`.", param="order",
                             code="invalid_value")
    return limit, order


def no_such_cursor(what: str) -> InvalidRequest:
    return InvalidRequest(f"`after` names no {what}.", param="after", code="invalid_value")


def listing(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A `list` object of `data`, one page."""
    return {"object": "list", "data": data, "has_more": has_more,
            "first_id": data[0]["id"] if data else "",
            "last_id": data[-1]["id"] if data else ""}


def page(items: list[dict[str, Any]], query: Mapping[str, str], *, order: str,
         what: str) -> dict[str, Any]:
    """`items` oldest first; `order` the default order (`asc` or `desc`); `what` names
    the items in an `after` that names none of them."""
    limit, order = params(query, order)
    items = items[::-1] if order == "desc" else list(items)
    if "after" in query:
        at = next((i for i, item in enumerate(items) if item.get("id") == query["after"]),
                  None)
        if at is None:
            raise no_such_cursor(what)
        items = items[at + 1:]
    return listing(items[:limit], len(items) > limit)
