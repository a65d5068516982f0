"""Validate bodies against OpenAI's official schemas (extracted into tests/spec/)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SPEC_DIR = Path(__file__).parent / "spec"
SHARED_SPEC = Path(__file__).resolve().parents[2] / "shared" / "openai" / "openapi.yaml"


@cache
def _schemas() -> dict[str, Any]:
    return json.loads((SPEC_DIR / "openai_schemas.json").read_text())


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": _schemas()}}
    return jsonschema.Draft202012Validator(schema)


def validate(name: str, body: Any) -> None:
    """Raise jsonschema.ValidationError if `body` does not match schema `name`."""
    _validator(name).validate(body)


def validate_completion_chunk(chunk: Any) -> None:
    """A /v1/completions stream chunk against CreateCompletionResponse.

    The spec says streamed and whole completions share one shape, but its
    `finish_reason` enum has no null, while OpenAI's API (and every compatible server)
    sends `finish_reason: null` on chunks before the last. That one field is checked
    here by hand (null or the enum) and the rest against the schema.
    """
    import copy

    relaxed = copy.deepcopy(chunk)
    for c in relaxed.get("choices", []):
        if c.get("finish_reason") is None:
            c["finish_reason"] = "stop"
    validate("CreateCompletionResponse", relaxed)
