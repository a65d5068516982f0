"""Extract the OpenAI schemas Weir's responses must validate against.

Run: python tests/spec/extract.py ../shared/openai/openapi.yaml > tests/spec/openai_schemas.json
The spec is 3.1 with leftover 3.0 `nullable`; `nullable: true` is rewritten into a
union with null so jsonschema (draft 2020-12) reads it as OpenAI means it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

ROOTS = [
    "CreateChatCompletionRequest",
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "ListModelsResponse",
    "Model",
    "ErrorResponse",
    "CreateEmbeddingResponse",
    "Response",
    "ResponseStreamEvent",
    "ResponseItemList",
    "ChatCompletionList",
    "ChatCompletionMessageList",
    "ChatCompletionDeleted",
]


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            out.add(ref.rsplit("/", 1)[1])
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)


def _fix_nullable(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _fix_nullable(v) for k, v in node.items() if not k.startswith("x-")}
        if node.pop("nullable", False):
            return {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_fix_nullable(v) for v in node]
    return node


def extract(spec: dict[str, Any]) -> dict[str, Any]:
    schemas = spec["components"]["schemas"]
    todo, seen = list(ROOTS), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found: set[str] = set()
        _refs(schemas[name], found)
        todo.extend(found - seen)
    return {name: _fix_nullable(schemas[name]) for name in sorted(seen)}


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    json.dump(extract(spec), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
