"""A Responses function tool sent without `strict`: normalized into OpenAI's strict mode
where it can hold the schema, served non-strict (`strict: false`, the schema as sent)
where OpenAI would fall back or the normalized schema would do harm."""
from __future__ import annotations

from typing import Any

import pytest

from proxy.openai_responses.models import FunctionTool, ResponsesRequest
from proxy.protocol import json_nodes, schema_nodes


def served(parameters: dict[str, Any]) -> FunctionTool:
    return FunctionTool.model_validate(
        {"type": "function", "name": "f", "parameters": parameters}, strict=True)


def test_an_optional_self_reference_made_required_falls_back() -> None:
    """Every property made required, an optional property referring to its own schema
    (`#`, or a definition through `$defs`) leaves no finite value the schema takes: a
    forced call would never end. Served non-strict, as sent."""
    for schema in (
            {"type": "object", "properties": {"v": {"type": "integer"},
                                              "next": {"$ref": "#"}}},
            {"type": "object", "properties": {"head": {"$ref": "#/$defs/node"}},
             "$defs": {"node": {"type": "object", "properties": {
                 "v": {"type": "string"}, "next": {"$ref": "#/$defs/node"}}}}},
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {
                "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}},
                "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}}}},
            {"properties": {"v": {"type": "integer"}, "next": {"$ref": "#"}}},
            {"type": "object", "properties": {"list": {
                "type": "array", "minItems": 1, "items": {"$ref": "#"}}}}):
        tool = served(schema)
        assert tool.strict is False, schema
        assert tool.parameters == schema


def test_a_recursion_with_a_way_out_stays_strict() -> None:
    """A recursive property that can end (nullable, an `anyOf` with a branch not
    recursive, an array that may be empty) is normalized and strict."""
    for schema in (
            {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"},
                                                                 {"type": "null"}]}}},
            {"type": "object", "properties": {"kids": {"type": "array",
                                                       "items": {"$ref": "#"}}}},
            {"type": "object", "properties": {"head": {"$ref": "#/$defs/node"}},
             "$defs": {"node": {"type": ["object", "null"], "properties": {
                 "next": {"$ref": "#/$defs/node"}}}}},
            {"type": "object", "properties": {"next": {"anyOf": [
                {"$ref": "#"}, {"type": "string"}]}}}):
        tool = served(schema)
        assert tool.strict is True, schema
        assert tool.parameters != schema


def test_a_free_form_object_falls_back_rather_than_closed() -> None:
    """An object schema with no `properties` takes any keys; closed with
    `additionalProperties: false` it would take `{}` alone. OpenAI's strict mode wants
    properties on every object: the tool is served non-strict, as sent."""
    for schema in (
            {"type": "object"},
            {"type": "object", "properties": {"meta": {"type": "object"}}},
            {"type": "object", "properties": {"meta": {"type": ["object", "null"]}}},
            {"type": "object", "properties": {"rows": {"type": "array",
                                                       "items": {"type": "object"}}}},
            {"type": "object", "properties": {"tags": {
                "type": "object", "additionalProperties": {"type": "object"}}}},
            {"type": "object", "properties": {"pick": {"type": "object", "anyOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}}]}}},
            {"type": "object", "properties": {"x": {"$ref": "#/$defs/free"}},
             "$defs": {"free": {"type": "object"}}}):
        tool = served(schema)
        assert tool.strict is False, schema
        assert tool.parameters == schema


def test_an_object_with_properties_none_given_is_strict() -> None:
    """`properties: {}` says the object has no keys: closed, it is strict."""
    tool = served({"type": "object", "properties": {"empty": {
        "type": "object", "properties": {}}}})
    assert tool.strict is True
    assert tool.parameters == {
        "type": "object", "additionalProperties": False, "required": ["empty"],
        "properties": {"empty": {"type": "object", "properties": {},
                                 "additionalProperties": False, "required": []}}}


def test_an_untyped_subschema_falls_back() -> None:
    """OpenAI's strict mode wants each subschema typed (`type`, `anyOf`, `$ref`, `enum`
    or `const`); `{}`, `true` or a description alone takes any value: served
    non-strict, as sent."""
    for sub in ({}, True, {"description": "anything"},
                {"type": "array", "items": {}}, {"type": "array", "items": True},
                {"anyOf": [{"type": "string"}, {}]}, {"$ref": "#/$defs/any"}):
        schema: dict[str, Any] = {"type": "object", "properties": {"x": sub}}
        if sub == {"$ref": "#/$defs/any"}:
            schema["$defs"] = {"any": {}}
        tool = served(schema)
        assert tool.strict is False, sub
        assert tool.parameters == schema


def test_typed_subschemas_and_empty_parameters_stay_strict() -> None:
    """Subschemas typed by `enum`, `const`, `anyOf` or `$ref` are strict; so are no
    parameters, absent or `{}`, which both mean a function of no arguments (an empty
    object), as OpenAI reads an absent `parameters`."""
    schema = {"type": "object", "properties": {
        "unit": {"enum": ["C", "F"]}, "v": {"const": 1},
        "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "s": {"$ref": "#/$defs/s"}},
        "$defs": {"s": {"type": "string"}}}
    assert served(schema).strict is True
    assert served({}).strict is True and served({}).parameters == {}
    absent = FunctionTool.model_validate({"type": "function", "name": "f"}, strict=True)
    assert absent.strict is True and absent.parameters is None


def nested(levels: int) -> dict[str, Any]:
    """An object schema `levels` objects deep."""
    schema: dict[str, Any] = {"type": "object", "properties": {"v": {"type": "string"}}}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"in": schema}}
    return schema


def test_a_schema_past_openais_strict_limits_falls_back() -> None:
    """OpenAI's strict mode takes a schema within its documented limits ("Supported
    schemas"): 5,000 object properties in all, 10 levels of objects, 1,000 enum values
    in all, 15,000 characters in one string enum of over 250 values, 120,000 characters
    of property and definition names, enum and const values. Past one, the tool is
    served non-strict, as sent; at each, strict."""
    def props(n: int) -> dict[str, Any]:
        return {"type": "object",
                "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}

    def enums(n: int, width: int = 1) -> dict[str, Any]:
        return {"type": "object", "properties": {"e": {"type": "string", "enum": [
            f"{i:0{width}d}" for i in range(n)]}}}

    def chars(n: int) -> dict[str, Any]:
        return {"type": "object", "properties": {"k" * (n - 5): {"const": "abcde"}}}

    for within, past in ((props(5000), props(5001)), (nested(10), nested(11)),
                         (enums(1000), enums(1001)), (enums(250, 60), enums(251, 60)),
                         (enums(300, 50), enums(300, 51)), (chars(120_000), chars(120_001))):
        assert served(within).strict is True
        tool = served(past)
        assert tool.strict is False
        assert tool.parameters == past


def reversed_chain(links: int) -> dict[str, Any]:
    """An object whose every property refers to a definition at the head of a chain of
    `anyOf`s, ordered so that the object is judged again as each link is found to fit."""
    defs: dict[str, Any] = {f"d{links - 1}": {"type": "string"}}
    for i in range(links - 1):
        defs[f"d{i}"] = {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}]}
    names = [f"p{i}" for i in reversed(range(links))]
    return {"type": "object", "$defs": defs, "required": names, "properties": {
        name: {"$ref": f"#/$defs/d{name[1:]}"} for name in names}}


def test_judging_recursion_is_linear_in_the_schema() -> None:
    """`finite` judges a node again as its subschemas are found to fit: a wide object at
    the end of long chains of references (within the request's 4,096 objects and
    arrays) was read over and over, work quadratic in the body. The subschemas it reads
    are bounded by a multiple of the schema's size; past it the tool is non-strict."""
    import sys
    from types import FrameType

    from proxy.openai_responses.models import finite

    def reads(schema: dict[str, Any]) -> tuple[bool, int]:
        count = 0

        def profile(frame: FrameType, event: str, _: Any) -> None:
            nonlocal count
            if event == "call" and frame.f_code.co_name == "ok":
                count += 1
        sys.setprofile(profile)
        try:
            return finite(schema), count
        finally:
            sys.setprofile(None)

    assert served(reversed_chain(20)).strict is True
    hostile = reversed_chain(1000)
    size = sum(1 for _ in schema_nodes(hostile))
    assert size < 4096
    fits, count = reads(hostile)
    assert not fits
    assert count < 64 * size, count  # (quadratic: over 500,000)
    tool = served(hostile)
    assert tool.strict is False and tool.parameters == hostile


def objects(n: int) -> dict[str, Any]:
    """An object schema of `n` object properties: 2 + 3n objects and arrays as sent,
    3 + 4n normalized (a `required` list on each object)."""
    return {"type": "object", "properties": {
        f"p{i}": {"type": "object", "properties": {"a": {"type": "string"}}}
        for i in range(n)}}


def request(tools: list[dict[str, Any]], choice: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({
        "model": "m", "input": "hi", "tool_choice": choice,
        "tools": [{"type": "function", **t} for t in tools]}, strict=True)


def test_a_tool_not_compiled_stays_strict_beside_a_forced_one_past_the_limit() -> None:
    """Past the compiled schemas' limit once normalized, only a tool the `tool_choice`
    forces is served non-strict as sent: one that grew more but is not compiled (and
    within the request's limit) stays strict."""
    req = request([{"name": "other", "parameters": objects(600)},
                   {"name": "big", "parameters": objects(300)}],
                  {"type": "function", "name": "big"})
    strict = {t.name: t.strict for t in req.tools or ()}
    assert strict == {"other": True, "big": False}


def test_bringing_tools_within_the_limit_counts_each_schema_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Many small forced tools past the compiled schemas' limit once normalized: each
    served non-strict in turn recounted every schema of the request, work quadratic in
    the tools. The objects and arrays counted stay a small multiple of the request's."""
    import proxy.openai_responses.models as models
    counted = 0

    def counting(v: Any, limit: int | None = None) -> int:
        nonlocal counted
        n = json_nodes(v, limit)
        counted += n
        return n
    monkeypatch.setattr(models, "json_nodes", counting)
    tiny = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    tools = [{"name": f"t{i}", "parameters": tiny} for i in range(250)]  # 1,000 as sent
    req = request(tools, "required")
    served_as_sent = [t for t in req.tools or () if not t.strict]
    assert served_as_sent and all(t.parameters == tiny for t in served_as_sent)
    assert sum(json_nodes(t.parameters) for t in req.tools or ()) <= 1024
    assert counted <= 4 * 6 * 250, counted


def test_a_reference_is_followed_once_however_often_its_node_is_judged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`finite` judges a node again as its subschemas are found to fit, and followed its
    `$ref` (a pointer as long as the body allows) each time: each is followed once."""
    import proxy.openai_responses.models as models
    followed = 0
    pointed = models._pointed

    def counting(schema: dict[str, Any], ref: str) -> Any:
        nonlocal followed
        followed += 1
        return pointed(schema, ref)
    monkeypatch.setattr(models, "_pointed", counting)
    hostile = reversed_chain(300)
    refs = sum(1 for node in schema_nodes(hostile) if "$ref" in node)
    models.finite(hostile)
    assert followed <= refs, (followed, refs)


def test_an_optional_property_no_value_fits_made_required_falls_back() -> None:
    """An optional property that no value fits (`enum: []`, bounds that leave nothing
    between them) is harmless as sent (left out), but made required by the
    normalization no value fits the schema: it was made strict, and a call forced to it
    could never end. Served non-strict, as sent; with a way out (a type beside it that
    fits, bounds that meet) it stays strict."""
    for prop in ({"type": "string", "enum": []}, {"enum": []},
                 {"type": "integer", "minimum": 5, "maximum": 1},
                 {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
                 {"type": "number", "minimum": 1, "exclusiveMaximum": 1},
                 {"type": "string", "minLength": 3, "maxLength": 2},
                 {"type": "array", "items": {"type": "string"}, "minItems": 2,
                  "maxItems": 1}):
        schema = {"type": "object", "properties": {"a": {"type": "string"}, "x": prop}}
        tool = served(schema)
        assert tool.strict is False, prop
        assert tool.parameters == schema
    for prop in ({"type": ["integer", "null"], "minimum": 5, "maximum": 1},
                 {"type": "integer", "minimum": 1, "maximum": 1},
                 {"type": "string", "minLength": 2, "maxLength": 2},
                 {"type": "string", "enum": ["a"]}):
        tool = served({"type": "object", "properties": {"x": prop}})
        assert tool.strict is True, prop
