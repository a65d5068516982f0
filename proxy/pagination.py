"""OpenAI's cursor pagination of a list endpoint: `limit`, `order` and `after` in the
query, a `list` object with `first_id`, `last_id` and `has_more` in the answer."""

from __future__ import annotations

from typing import Any

from multidict import MultiMapping

from .errors import InvalidRequest


def one(query: MultiMapping[str], name: str) -> str | None:
    """The value of the query parameter `name` (None: not given); given more than once,
    a 400 naming it (which one was meant is not known: the first was read)."""
    given = query.getall(name, [])
    if len(given) > 1:
        raise InvalidRequest(f"`{name}` is given {len(given)} times; give it once.",
                             param=name, code="invalid_value")
    return given[0] if given else None


def flag(query: MultiMapping[str], name: str) -> bool:
    """The boolean query parameter `name`: `true`/`false` or `1`/`0`, in any case (not
    given: false); anything else (`yes`, empty) is a 400 naming it, not read as true."""
    given = one(query, name)
    if given is None:
        return False
    if given.lower() in ("true", "1"):
        return True
    if given.lower() in ("false", "0"):
        return False
    raise InvalidRequest(f"Invalid value for `{name}`: a boolean (`true` or `false`) is "
                         "expected.", param=name, code="invalid_value")


def params(query: MultiMapping[str], order: str) -> tuple[int, str]:
    """(`limit`, `order`) of a list request; `order` the default order."""
    # (`is None`, not `or`: an empty `limit=` or `order=` is a 400, not the default)
    given = one(query, "limit")
    given = "20" if given is None else given  # digits only: not " 5", "+5", a full-width 5
    limit = int(given) if given.isascii() and given.isdigit() and len(given) <= 3 else 0
    if not 1 <= limit <= 100:
        raise InvalidRequest("`limit` must be an integer from 1 to 100.", param="limit",
                             code="invalid_value")
    given = one(query, "order")
    order = order if given is None else given
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


def page(items: list[dict[str, Any]], query: MultiMapping[str], *, order: str,
         what: str) -> dict[str, Any]:
    """`items` oldest first; `order` the default order (`asc` or `desc`); `what` names
    the items in an `after` that names none of them."""
    limit, order = params(query, order)
    items = items[::-1] if order == "desc" else list(items)
    if (after := one(query, "after")) is not None:
        at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
        if at is None:
            raise no_such_cursor(what)
        items = items[at + 1:]
    return listing(items[:limit], len(items) > limit)
