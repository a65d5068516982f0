"""OpenAI request models and the parser that turns a body into one.

Longer than most modules on purpose: it is the OpenAI request surface in one place
(models and the rules on them); splitting it would scatter one schema.

Requests are pydantic models with `extra="allow"`: unknown fields are accepted, as
OpenAI does. Types are strict, as OpenAI's are: `"max_tokens": "5"`, `true` for a number
or `5.0` for an integer are a 400 `invalid_type`, not quietly coerced. Bounds follow
OpenAI's API reference. A validation failure becomes a 400
`invalid_request_error` whose `param` is the dotted path of the first bad field
(`messages[0].content`), which is what the OpenAI SDK shows its users.

Responses are plain JSON-ready dicts built by `proxy.serving`: they are on the hot path
of every cache hit, and validating them is the tests' job (against the official spec).
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar
from urllib.parse import unquote

import orjson
from jsonschema import Draft7Validator
from jsonschema.exceptions import SchemaError
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import InvalidRequest, shown
from .jsonbody import decode_json_object as decode_json_object  # bodies are decoded there

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _NullIsDefault(_Open):
    """A request whose optional parameters read `null` as absent, as OpenAI does
    (`"n": null` is one choice, `"stream": null` no stream), for the fields that have a
    default other than null. `_NULL_STAYS`: fields where null means something else."""

    _NULL_STAYS: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            defaulted = _defaulted(cls)
            # (the body's few fields walked, not the model's many)
            if any(v is None and k in defaulted for k, v in data.items()):
                data = {k: v for k, v in data.items() if not (v is None and k in defaulted)}
        return data


@functools.cache
def _defaulted(cls: type[BaseModel]) -> frozenset[str]:
    stays: frozenset[str] = getattr(cls, "_NULL_STAYS", frozenset())
    return frozenset(f.alias or name for name, f in cls.model_fields.items()
                     if not f.is_required() and f.default is not None and name not in stays)


#: An OpenAI parameter Weir cannot honour: (whether a value asks nothing of it, why not).
Unsupported = Mapping[str, tuple[Callable[[Any], bool], str]]


def inert(*values: Any) -> Callable[[Any], bool]:
    """A value that asks nothing: null or one of `values` (compared by equality)."""
    return lambda v: v is None or any(type(v) is type(x) and v == x for x in values)


def refuse_unsupported(data: Any, table: Unsupported) -> None:
    """A parameter OpenAI defines and Weir cannot honour is a 400 naming it: ignored, the
    answer would claim what was not done. (Unknown fields are still accepted.)"""
    if not isinstance(data, dict) or table.keys().isdisjoint(data):
        return  # (most requests: none of them sent, nothing to walk)
    for name, (asks_nothing, why) in table.items():
        if name in data and not asks_nothing(data[name]):
            raise InvalidRequest(f"Unsupported parameter: `{name}`: {why}", param=name,
                                 code="unsupported_parameter")


#: OpenAI's enum-valued parameters that no model field here declares (those refused as
#: unsupported, and those an upstream gets as sent): the values its spec lists, by path
#: (`[]`: each item of an array). A value outside them is a 400 `invalid_value` naming
#: it, as OpenAI answers, checked before anything is refused as unsupported: a misspelt
#: value is the caller's mistake whichever engine serves the request. (Declared fields
#: are `Literal`s, which the parser checks the same way.)
CHAT_ENUMS: dict[str, tuple[str, ...]] = {
    "reasoning_effort": ("none", "minimal", "low", "medium", "high", "xhigh", "max"),
    "verbosity": ("low", "medium", "high"),
    "modalities[]": ("text", "audio"),
    "audio.format": ("wav", "aac", "mp3", "flac", "opus", "pcm16"),
    "web_search_options.search_context_size": ("low", "medium", "high"),
    "web_search_options.user_location.type": ("approximate",),
    "function_call": ("none", "auto"),  # (or an object: `ENUM_OR_OBJECT`)
}
#: Paths of `CHAT_ENUMS` that take an object too (a named function).
ENUM_OR_OBJECT = frozenset({"function_call"})


def check_enums(data: Any, table: Mapping[str, tuple[str, ...]]) -> None:
    """Each value at a path of `table` is a string among its values (null: absent), else
    a 400 naming it (`invalid_type` for another JSON type, `invalid_value` for another
    string), in OpenAI's words."""
    if not isinstance(data, dict):
        return
    for path, values in table.items():
        if _head(path) not in data:  # (most requests send none of them: no walk)
            continue
        if path.endswith("[]"):  # (an array of them: another JSON type is its own error)
            for param, v in _at_path(data, path[:-2]):
                if v is not None and not isinstance(v, list):
                    raise InvalidRequest(f"Invalid type for `{param}`: expected an array, "
                                         f"but got {_json_type(v)} instead.", param=param,
                                         code="invalid_type")
        for param, v in _at_path(data, path):
            if v is None or (isinstance(v, dict) and path in ENUM_OR_OBJECT):
                continue
            if not isinstance(v, str) or v not in values:
                raise not_among(v, values, param)


def check_values(data: Any, table: Mapping[str, TypeAdapter[Any]]) -> None:
    """Each value at a path of `table` (as `check_enums` reads it; null: absent) is one its
    type takes (a number in its range: `top_logprobs` 0 to 20), else the 400 the parser
    gives a field of that type, naming it (`integer_above_max_value`, `invalid_type`):
    for the parameters no model field declares (those refused as unsupported), checked
    before anything is refused, as `check_enums` checks enums."""
    if not isinstance(data, dict):
        return
    for path, adapter in table.items():
        if _head(path) not in data:
            continue
        for param, v in _at_path(data, path):
            if v is None:
                continue
            try:
                adapter.validate_python(v, strict=True)
            except ValidationError as e:
                raise _described(e.errors(include_url=False)[0], param) from None


def not_among(value: Any, values: Iterable[str], param: str) -> InvalidRequest:
    """The one error for a value outside an enum's `values`, in OpenAI's words: "Invalid
    value: 'x'. Supported values are: 'a', 'b', and 'c'." (`invalid_value`), or for
    another JSON type than a string, "Invalid type for `param`: expected one of ..."
    (`invalid_type`). Every such list (the enum table, the parser's `Literal`s, a
    misplaced content part, the Responses API's) is worded by it."""
    listed = _listed(tuple(values))
    if not isinstance(value, str):
        return InvalidRequest(f"Invalid type for `{param}`: expected one of {listed}, but got "
                              f"{_json_type(value)} instead.", param=param, code="invalid_type")
    return InvalidRequest(f"Invalid value: {shown(value)!r}. Supported values are: {listed}.",
                          param=param, code="invalid_value")


@functools.cache
def _head(path: str) -> str:
    """The field a `_at_path` path starts at (`a` of `a.b`, `a[]`): where the request has
    none, the path finds nothing."""
    return path.split(".", 1)[0].removesuffix("[]")


def _at_path(data: dict[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """(param, value) at a dotted `path` of `data` (`a.b`, `a[]`: each item of the array
    at `a`); nothing where a step is missing or of another type (a whole value of the
    wrong type is its own field's error)."""
    found: list[tuple[str, Any]] = [("", data)]
    for step in path.split("."):
        each = step.endswith("[]")
        name = step.removesuffix("[]")
        nxt: list[tuple[str, Any]] = []
        for where, node in found:
            if not isinstance(node, dict) or name not in node:
                continue
            param, v = f"{where}.{name}" if where else name, node[name]
            if each and isinstance(v, list):
                nxt.extend((f"{param}[{i}]", x) for i, x in enumerate(v))
            elif not each:
                nxt.append((param, v))
        found = nxt
    return iter(found)


def _listed(values: tuple[str, ...]) -> str:
    """'a', 'b', and 'c' (OpenAI's list of supported values)."""
    quoted = [repr(v) for v in values]
    if len(quoted) < 3:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


#: Moderated completions (OpenAI runs a moderation model on the input and the output,
#: and answers with its results): on Chat Completions and the Responses API alike.
MODERATION = (inert(), "moderated completions are not supported here: no moderation "
              "model runs on the input or the output.")

CHAT_UNSUPPORTED: Unsupported = {
    "functions": (inert([]), "the legacy form of `tools`; send `tools` and `tool_choice`."),
    "function_call": (inert(), "the legacy form of `tool_choice`; send `tools` and "
                      "`tool_choice`."),
    "audio": (inert(), "this model answers text only."),
    "modalities": (inert(["text"]), "this model answers text only."),
    "web_search_options": (inert(), "this server does not search the web."),
    "moderation": MODERATION,
    "verbosity": (inert("medium"), "this model has no verbosity setting; ask for a length "
                  "in the prompt."),
}
#: The types OpenAI's spec gives the parameters of `CHAT_UNSUPPORTED` that `CHAT_ENUMS`
#: does not check: another JSON type is a 400 `invalid_type` naming it, told before the
#: parameter is refused as unsupported (`audio: "alloy"` was "this model answers text
#: only"), as OpenAI checks a parameter's type before anything else.
CHAT_VALUES: dict[str, TypeAdapter[Any]] = {
    "functions": TypeAdapter(list[Any]),
    "audio": TypeAdapter(dict[str, Any]),
    "web_search_options": TypeAdapter(dict[str, Any]),
    "moderation": TypeAdapter(dict[str, Any]),
}
#: Chat Completions' names sent to /v1/completions, which takes other ones (or has no
#: such thing): ignored, the answer would run to the default 16 tokens, come without
#: logprobs, or be text where tools were offered (and a call forced).
_NO_TOOLS = ("/v1/completions answers text and calls no tools; send tools to "
             "/v1/chat/completions.")
COMPLETION_UNSUPPORTED: Unsupported = {
    "tools": (inert([]), _NO_TOOLS),
    "tool_choice": (inert("none"), _NO_TOOLS),
    "parallel_tool_calls": (inert(), _NO_TOOLS),
    "max_completion_tokens": (inert(), "/v1/completions takes `max_tokens` (Chat "
                              "Completions' `max_completion_tokens` is its newer name)."),
    "top_logprobs": (inert(), "/v1/completions takes `logprobs`, the number of likeliest "
                     "tokens to return (0 to 5)."),
}
#: What the in-process engine cannot honour (an upstream engine may: it is passed on).
LOCAL_UNSUPPORTED: Unsupported = {
    "reasoning_effort": (inert("none"), "this model does not reason."),
}

# vLLM's own request extensions (its server's `CompletionRequest` and
# `ChatCompletionRequest`) that the in-process engine does not honour: accepted and
# ignored, each answered what was not asked (an unconstrained answer for
# `structured_outputs`, the whole prompt for `truncate_prompt_tokens`). Refused locally
# when they ask for something; an upstream (a vLLM server) gets them as sent. The ones
# Weir honours are fields of the models below; `tests/unit/test_vllm_extensions.py`
# holds every field vLLM declares to one of the three (or to its list of no-ops).
_NO_REASONING = "this model does not reason."
_TEXT_ONLY = "this model takes text only."
#: vLLM's former guided-decoding fields: its server no longer declares them and ignores
#: them (a warning in its log), answering unconstrained what a client asked to be held to
#: a schema, a regex, a choice or a grammar, so a client written for an older vLLM got
#: free text, silently. Refused where they ask something (OpenAI refuses an argument it
#: does not know); an upstream gets them as sent (an older vLLM honours them).
_FORMER = "vLLM's former guided-decoding field, which its server now ignores"
VLLM_FORMER: Unsupported = {
    "guided_json": (inert(), f"{_FORMER}; send `response_format` of type `json_schema`."),
    "guided_regex": (inert(), f"{_FORMER}; output held to a regex is not supported here "
                     "(`response_format` holds it to a JSON schema)."),
    "guided_choice": (inert(), f"{_FORMER}; send `response_format` of type `json_schema` "
                      "with an `enum` of the choices."),
    "guided_grammar": (inert(), f"{_FORMER}; output held to a grammar is not supported "
                       "here (`response_format` holds it to a JSON schema)."),
}
VLLM_UNSUPPORTED: Unsupported = {
    **VLLM_FORMER,
    "use_beam_search": (inert(False), "beam search is not supported here."),
    "length_penalty": (inert(1.0, 1), "it applies to beam search, which is not supported "
                       "here."),
    "watermarking": (inert(False), "this server does not watermark its answers."),
    "truncate_prompt_tokens": (inert(), "prompts are never truncated here: a prompt past "
                               "the context is refused; shorten it."),
    "truncation_side": (inert(), "prompts are never truncated here."),
    "prompt_logprobs": (inert(), "send `echo` with `logprobs` to /v1/completions for the "
                        "prompt's logprobs."),
    "logprob_token_ids": (inert([]), "ask for `logprobs` (`top_logprobs` in chat), or "
                          "`logit_bias` / `allowed_token_ids` to steer tokens."),
    "return_tokens_as_token_ids": (inert(False), "logprob tokens are returned as text "
                                   "(with their `bytes`)."),
    "return_token_ids": (inert(False), "answers carry text, not token ids."),
    "routed_experts_prompt_start": (inert(0), "routed-expert data is not returned here."),
    "structured_outputs": (inert(), "send `response_format` (`json_schema` or "
                           "`json_object`) for structured output."),
    "priority": (inert(0), "requests are ordered by the caller's role here, not by the "
                 "request."),
    "cache_salt": (inert(), "this server salts the prefix cache per tenant itself."),
    "kv_transfer_params": (inert({}), "disaggregated serving is not configured here."),
    "ec_transfer_params": (inert({}), "disaggregated serving is not configured here."),
    "vllm_xargs": (inert({}), "no custom engine extensions are enabled here."),
    "repetition_detection": (inert(), "not supported here; `max_tokens`, "
                             "`frequency_penalty` or `repetition_penalty` bound a loop."),
    "thinking_token_budget": (inert(-1), _NO_REASONING),
    "stream_interval": (inert(), "streams are sent as the engine steps; it is not "
                        "adjustable per request."),
}
VLLM_CHAT_UNSUPPORTED: Unsupported = {
    **VLLM_UNSUPPORTED,
    "echo": (inert(False), "the answer is the new message alone."),
    "add_special_tokens": (inert(False), "the chat template adds the model's special "
                           "tokens; no others are added."),
    "documents": (inert([]), "documents are not passed to the chat template here; put "
                  "them in the messages."),
    "chat_template": (inert(), "a client's chat template is code: this server renders "
                      "with the model's own template."),
    "chat_template_kwargs": (inert({}), "the chat template's variables are this server's."),
    "media_io_kwargs": (inert({}), _TEXT_ONLY),
    "mm_processor_kwargs": (inert({}), _TEXT_ONLY),
    "return_prompt_text": (inert(False), "the rendered prompt is not returned here."),
}
VLLM_COMPLETION_UNSUPPORTED: Unsupported = {
    **VLLM_UNSUPPORTED,
    "add_special_tokens": (inert(True), "the model's special tokens are always added to "
                           "a text prompt; send token ids for a prompt without them."),
    "prompt_embeds": (inert(), "send the prompt as text or token ids."),
}
#: vLLM's fields that ask nothing of a generation endpoint, accepted as no-ops (each a
#: reason): vLLM's own server ignores them there too, or Weir answers them its own way.
VLLM_NO_OPS: dict[str, str] = {
    "request_id": "Weir names its own requests (its `x-request-id` header is the id).",
    "session_id": "a routing hint for a pool of engines; this is one engine.",
    "return_token_offsets": "vLLM reads it on its /render endpoints only.",
    "mm_payload": "vLLM reads it on its /render endpoints only.",
    "return_mm_kwargs": "vLLM reads it on its /render endpoints only.",
    "include_reasoning": "this model does not reason: there is no reasoning to include "
                         "or leave out.",
}


def raw_items(data: dict[str, Any], name: str) -> list[Any]:
    """The items of the array at `data[name]` in a body not parsed yet; none where it is
    absent or no array (`"tools": true` is the parser's `invalid_type` to tell, not a
    TypeError in a check that runs before it)."""
    value = data.get(name)
    return value if isinstance(value, list) else []


def refuse_other_tools(data: Any) -> None:
    """A tool, or a `tool_choice`, of a kind OpenAI defines besides `function` (its own
    built-in tools, `custom` tools, `allowed_tools`): a 400 `unsupported_parameter`
    naming it, not a type error that says only what was expected."""
    if not isinstance(data, dict):
        return
    for i, tool in enumerate(raw_items(data, "tools")):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise InvalidRequest(
                f"Unsupported tool type `{shown(kind)}` at `tools[{i}]`: only `function` tools "
                "are supported here (OpenAI's built-in and custom tools run on OpenAI's "
                "side).", param=f"tools[{i}].type", code="unsupported_parameter")
    choice = data.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(kind, str) and kind != "function":
        raise InvalidRequest(
            f"Unsupported `tool_choice` type `{shown(kind)}`: send `none`, `auto`, `required` "
            "or a named function.", param="tool_choice.type", code="unsupported_parameter")


class TextPart(_Open):
    type: Literal["text"]
    text: str


# ------------------------------------------------------------------------------ tools
# Function tools as OpenAI takes them. A function's `parameters` must be a JSON schema
# (checked against the metaschema, so a typo is a 400 naming the tool, not a 500 later
# in the grammar compiler); a named `tool_choice` must name one of `tools`.

_FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


def check_json_schema(v: dict[str, Any]) -> dict[str, Any]:
    """A schema from the request (a tool's `parameters`, a response format's `schema`):
    checked against the JSON-schema metaschema (draft 7's: the 2020-12 metaschema's
    dynamic references cost five times as much per node, and either catches what the
    check is for, a schema the grammar compiler would choke on), with `$ref`s inside it
    only. Apps send the same tools with every request, so a schema that passed is
    remembered."""
    try:
        key = orjson.dumps(v, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what orjson refuses (an integer past 64 bits): no memo
        key = None
    if key is None or key not in _VALID_SCHEMAS:
        try:
            Draft7Validator.check_schema(v)
        except SchemaError as e:
            raise ValueError(f"not a valid JSON schema ({shown(e.message, 256)})") from None
        except RecursionError:  # pydantic would not turn it into a 400
            raise ValueError("the JSON schema nests too deeply") from None
        _local_refs_only(v)
        if key is not None:
            if len(_VALID_SCHEMAS) >= 1024:
                _VALID_SCHEMAS.pop(next(iter(_VALID_SCHEMAS)))
            _VALID_SCHEMAS[key] = None
    return v


#: A JSON schema a request carries, checked as it is parsed (`check_json_schema`).
JsonSchema = Annotated[dict[str, Any], AfterValidator(check_json_schema)]


def _object_schema(v: dict[str, Any]) -> dict[str, Any]:
    """A function's arguments are an object: its `parameters` say so, or say no type."""
    kind = v.get("type", "object")
    if not may_be(kind, "object"):
        raise InvalidFunctionParameters(f"the function's parameters must be a JSON schema "
                                        f"of type `object`, not `{shown(kind)}`")
    return v


class InvalidFunctionParameters(ValueError):
    """OpenAI's code for it: `invalid_function_parameters`."""


class StrictSchemaRefused(ValueError):
    """`strict: true` on a schema strict mode refuses, answered as OpenAI answers it: its
    message whole, the param it names (`param`, or the validator's own with `suffix`)
    and its code."""

    def __init__(self, message: str, code: str | None, suffix: str = "",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.suffix, self.param = message, code, suffix, param

    def at(self, param: str) -> InvalidRequest:
        return InvalidRequest(self.message, param=self.param or param + self.suffix,
                              code=self.code)


#: OpenAI's limits on a schema in strict mode (Structured Outputs, "Supported
#: schemas"): object properties in all, levels of objects, enum values in all, the
#: characters of a string enum's values where it has over 250, the characters of
#: property and definition names, enum and const values in all.
STRICT_LIMITS = {"properties": 5000, "depth": 10, "enum values": 1000,
                 "long enum chars": 15_000, "chars": 120_000}
#: What types a subschema in strict mode (one of them must be there; a `oneOf` is
#: then refused as a keyword, as OpenAI says it).
_TYPED = ("type", "anyOf", "oneOf", "$ref", "enum", "const")


def may_be(kind: Any, name: str) -> bool:
    """Whether a schema's `type` (a name, or a list of names) is or takes `name`."""
    return kind == name or (isinstance(kind, list) and name in kind)


def _context(where: tuple[str, ...]) -> str:
    """Where a subschema stands, as OpenAI's message says it (`In context=('properties',
    'a')`): written only where refused (at each of thousands of subschemas under a long
    property name it cost the name's length)."""
    return f"In context={shown(where, 256)}"


def _object_problem(node: dict[str, Any], props: Any) -> str | None:
    """What strict mode refuses in an object's schema (`props`: its `properties`), in
    OpenAI's words after the context, in the order OpenAI says them; None: nothing."""
    if not isinstance(props, dict):  # (OpenAI says this first: `{"type": "object"}`)
        return "object schema missing properties."
    if node.get("additionalProperties") is not False:
        return "'additionalProperties' is required to be supplied and to be false."
    required = node.get("required")
    listed = {k for k in required if isinstance(k, str)} if isinstance(
        required, list) else set()
    missing = [k for k in props if k not in listed]
    if missing:
        return ("'required' is required to be supplied and to be an array including every "
                f"key in properties. Missing '{shown(missing[0])}'.")
    extra = [k for k in required if isinstance(k, str) and k not in props
             ] if isinstance(required, list) else []
    if extra:
        return ("'required' is required to be supplied and to be an array including every "
                f"key in properties. Extra required key '{shown(extra[0])}' supplied.")
    return None


def strict_problem(schema: dict[str, Any], format_: bool = False) -> str | None:
    """What OpenAI's strict mode (`"strict": true`) refuses in a schema, in its words, or
    None: every object must say `additionalProperties: false`, have `properties` and list
    every one in `required`, and only those (the grammar then holds the answer to exactly
    that shape); the root is an object; every subschema says what it holds (a `type`, an
    `anyOf`, a `$ref`, an `enum` or a `const`: `{}` and `true` are any value; an array
    its `items`); no keyword the grammar cannot hold (`STRICT_REFUSED`: accepted, it
    would be dropped, and the answer could break the schema it promised); and the schema
    is within its documented limits (`STRICT_LIMITS`). The parameters themselves may say
    no type: `{}` is a function of no arguments, as absent `parameters` are; a format's
    schema (`format_`) may not: OpenAI's root is an object, said."""
    root = schema.get("type")
    if root is None and (format_ or any(k in schema for k in ("anyOf", "oneOf", "allOf"))):
        # (OpenAI: the root must be an object, not an `anyOf`)
        return "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"None\"'."
    if root is not None and root != "object":
        got = shown(orjson.dumps(root).decode())
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: {got}'."
    limits = STRICT_LIMITS
    properties = enum_values = text = 0
    stack: list[tuple[Any, tuple[str, ...]]] = [(schema, ())]  # (a subschema, where)
    while stack:
        node, where = stack.pop()
        if node is False:  # (no value: allowed where a schema stands)
            continue
        if not isinstance(node, dict) or (node is not schema and not any(
                k in node for k in _TYPED)):
            return f"{_context(where)}, schema must have a 'type' key."
        refused = next((k for k in node if k in STRICT_REFUSED), None)
        if refused is not None:
            return f"{_context(where)}, '{refused}' is not permitted."
        kind = node.get("type")
        if may_be(kind, "array") and not any(
                k in node for k in ("items", "prefixItems")):  # (any items at all)
            return f"{_context(where)}, array schema missing items."
        props = node.get("properties")
        if (may_be(kind, "object") or isinstance(props, dict)) and (
                problem := _object_problem(node, props)) is not None:
            return f"{_context(where)}, {problem}"
        if isinstance(props, dict):
            properties += len(props)
        for key in ("$defs", "definitions", "properties"):
            names = node.get(key)
            text += sum(map(len, names)) if isinstance(names, dict) else 0
        values = node.get("enum")
        if isinstance(values, list):
            enum_values += len(values)
            strings = sum(len(v) for v in values if isinstance(v, str))
            text += strings
            if len(values) > 250 and strings > limits["long enum chars"]:
                return (f"{_context(where)}, {strings} characters of enum values exceeds limit "
                        f"of {limits['long enum chars']} for an enum of more than 250 values.")
        if isinstance(node.get("const"), str):
            text += len(node["const"])
        stack.extend((sub, (*where, *at)) for at, sub in subschemas(node))
    # (the totals, counted over the whole schema, in OpenAI's words as clients quote
    # them: "6 levels of nesting exceeds limit of 5.", "144 parameters exceed the limit
    # of 100."; the enum and character limits' words are not known, said alike)
    depth = _nesting(schema)
    for count, what, limit in (
            (depth, "levels of nesting exceeds limit of", limits["depth"]),
            (properties, "parameters exceed the limit of", limits["properties"]),
            (enum_values, "enum values exceeds limit of", limits["enum values"]),
            (text, "characters of property names, definition names, enum and const values "
             "exceeds limit of", limits["chars"])):
        if count > limit:
            return f"{count} {what} {limit}."
    return None


def _nesting(schema: dict[str, Any]) -> int:
    """How many objects deep a schema nests, through its `$ref`s as through its
    subschemas (a chain of models in `$defs` nests as deep as the same models inline).
    A recursion (schemas that lead back to one another through `$ref`s, which strict
    mode takes) adds nothing: a `$ref` to a schema that leads back to it counts nothing,
    however many schemas take part (a union of a dozen node kinds, each holding a node,
    nests as deep as one of them), while what hangs off a recursion without leading
    back counts in full. The recursions are the strongly connected components of
    subschemas and references (Tarjan's, iterative); without the references inside
    them what is left has no cycle, and the deepest path through it is found once per
    subschema: linear in the schema and its references however they branch and meet
    again, and the same whatever order the walk meets them in."""
    edges: dict[int, tuple[list[dict[str, Any]], dict[str, Any] | None]] = {}

    def read(node: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        # (its subschemas, and what its `$ref` points at), read once
        if id(node) not in edges:
            ref = node.get("$ref")
            target = _pointed(schema, ref) if isinstance(ref, str) else None
            edges[id(node)] = ([sub for _, sub in subschemas(node) if isinstance(sub, dict)],
                               target if isinstance(target, dict) else None)
        return edges[id(node)]

    # the recursions: each subschema's component (Tarjan's, iterative)
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    component: dict[int, int] = {}
    held: list[dict[str, Any]] = []  # (Tarjan's stack)
    walk: list[tuple[dict[str, Any], Iterator[dict[str, Any]]]] = []

    def visit(node: dict[str, Any]) -> None:
        index[id(node)] = low[id(node)] = len(index)
        held.append(node)
        subs, target = read(node)
        walk.append((node, iter([*subs, *([target] if target is not None else [])])))

    visit(schema)
    while walk:
        node, nexts = walk[-1]
        sub = next(nexts, None)
        if sub is not None:
            if id(sub) not in index:
                visit(sub)
            elif id(sub) not in component:  # (held: in this walk's component)
                low[id(node)] = min(low[id(node)], index[id(sub)])
            continue
        walk.pop()
        if walk:
            up = id(walk[-1][0])
            low[up] = min(low[up], low[id(node)])
        if low[id(node)] == index[id(node)]:
            while True:
                member = held.pop()
                component[id(member)] = index[id(node)]
                if member is node:
                    break

    # the deepest path, a `$ref` within its recursion left out (iterative, kept)
    height: dict[int, int] = {}
    inside: set[int] = set()  # (a schema holding itself, which JSON cannot say: no loop)
    frames: list[tuple[dict[str, Any], list[dict[str, Any]], Iterator[dict[str, Any]]]] = []

    def enter(node: dict[str, Any]) -> None:
        inside.add(id(node))
        subs, target = read(node)
        if target is not None and component[id(target)] != component[id(node)]:
            subs = [*subs, target]
        frames.append((node, subs, iter(subs)))

    enter(schema)
    while frames:
        node, subs, nexts = frames[-1]
        sub = next(nexts, None)
        if sub is not None:
            if id(sub) not in height and id(sub) not in inside:
                enter(sub)
            continue
        frames.pop()
        inside.discard(id(node))
        height[id(node)] = may_be(node.get("type"), "object") + max(
            (height.get(id(sub), 0) for sub in subs), default=0)
    return height[id(schema)]


def check_strict(what: str, schema: dict[str, Any] | None, strict: bool | None,
                 code: str | None, suffix: str = "", param: str | None = None,
                 format_: bool = False) -> None:
    """`strict: true` on a schema strict mode refuses: a 400 saying why, in OpenAI's
    words, naming the param and with the code it names (`StrictSchemaRefused`); a
    format's schema (`format_`, not a function's parameters) says its root's type."""
    if strict and schema is not None and (problem := strict_problem(schema, format_)):
        raise StrictSchemaRefused(f"Invalid schema for {what}: {problem}", code, suffix,
                                  param)


#: A function tool's `parameters`: a JSON schema (`check_json_schema`) of an object.
ToolParameters = Annotated[dict[str, Any], AfterValidator(check_json_schema),
                           AfterValidator(_object_schema)]


class FunctionDef(_Open):
    name: str = Field(pattern=_FUNCTION_NAME)
    description: str | None = None
    parameters: ToolParameters | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _strict_schema(self) -> FunctionDef:
        check_strict(f"function '{shown(self.name)}'", self.parameters, self.strict,
                     "invalid_function_parameters", ".parameters")
        return self


_VALID_SCHEMAS: dict[bytes, None] = {}  # insertion-ordered: the oldest goes first


SCHEMA_DATA = frozenset({"default", "const", "enum", "examples"})  # values, not schemas
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                         "dependentSchemas", "dependencies"})  # names -> schemas (a name is
# no keyword; draft 7's `dependencies` may also map a name to a list of names)
#: Keywords whose value is one subschema, or (`items` too) a list of them.
SUBSCHEMA = frozenset({"items", "additionalProperties", "not", "if", "then", "else",
                       "contains", "propertyNames", "unevaluatedProperties",
                       "unevaluatedItems", "additionalItems"})
SUBSCHEMAS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems", "items"})
#: What OpenAI's strict mode refuses ("'not' is not permitted."): its documented list of
#: keywords not supported, draft 7's `dependencies`, dynamic references, and `oneOf`
#: (not in its list of supported types, which names `anyOf`; refused in its words,
#: "'oneOf' is not permitted.", for the discriminated unions Pydantic and Zod write:
#: an `anyOf` of the same branches is taken). Not
#: `uniqueItems`: a Pydantic `set` field says it, which the OpenAI SDK's strict helpers
#: send, and the set takes a repeated item as it is.
STRICT_REFUSED = frozenset({
    "allOf", "oneOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "dependencies", "patternProperties", "unevaluatedProperties", "propertyNames",
    "minProperties", "maxProperties", "unevaluatedItems", "contains", "minContains",
    "maxContains", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
    "$recursiveAnchor"})


def schema_nodes(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object where a schema stands (iterative): not in data (`enum`, `default`,
    ...), and the keys of a map of names (`properties`, `$defs`, ...) are names, so a
    property named like a keyword is no keyword."""
    stack: list[tuple[Any, bool]] = [(schema, False)]  # (node, a map of name -> schema)
    while stack:
        x, named = stack.pop()
        if isinstance(x, dict) and named:
            stack.extend((v, False) for v in x.values())
        elif isinstance(x, dict):
            yield x
            stack.extend((v, k in SCHEMA_MAPS) for k, v in x.items()
                         if k not in SCHEMA_DATA)
        elif isinstance(x, list):
            stack.extend((v, False) for v in x)


def rewritten(node: Any, rewrite: Callable[[dict[str, Any]], dict[str, Any]],
              named: bool = False) -> Any:
    """A copy of a schema with `rewrite` of every object where a schema stands, as
    `schema_nodes` reads them (data such as `enum` as it is, a map's names as names),
    each rewritten before what is under it."""
    if isinstance(node, list):
        return [rewritten(v, rewrite) for v in node]
    if not isinstance(node, dict):
        return node
    if named:  # names -> schemas
        return {k: rewritten(v, rewrite) for k, v in node.items()}
    return {k: v if k in SCHEMA_DATA else rewritten(v, rewrite, k in SCHEMA_MAPS)
            for k, v in rewrite(node).items()}


def subschemas(node: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """The subschemas right under a schema, each with where it stands under it
    (`("properties", "a")`, `("anyOf", "0")`, `("items",)`): a map of names' values
    (`properties`, `$defs`, ...), a list's items (`anyOf`, `prefixItems`, ...), a
    keyword's one subschema (`items`, `not`, ...; `true` and `false` too). Not data
    (`enum`, `default`), nor what no keyword of a schema holds (`x-meta`)."""
    for key, sub in node.items():
        if key in SCHEMA_MAPS and isinstance(sub, dict):
            for name, v in sub.items():
                yield (key, name), v
        elif (key in SUBSCHEMAS or key in SUBSCHEMA) and isinstance(sub, list):
            for i, v in enumerate(sub):
                yield (key, str(i)), v
        elif key in SUBSCHEMA and isinstance(sub, dict | bool):
            yield (key,), sub


def with_subschemas(node: dict[str, Any], f: Callable[[Any], Any]) -> dict[str, Any]:
    """A copy of `node` with `f` of each subschema right under it (`subschemas`') in
    its place, the rest as it is."""
    out: dict[str, Any] = {}
    for key, sub in node.items():
        if key in SCHEMA_MAPS and isinstance(sub, dict):
            out[key] = {name: f(v) for name, v in sub.items()}
        elif (key in SUBSCHEMAS or key in SUBSCHEMA) and isinstance(sub, list):
            out[key] = [f(v) for v in sub]
        elif key in SUBSCHEMA and isinstance(sub, dict | bool):
            out[key] = f(sub)
        else:
            out[key] = sub
    return out


def schema_refs(schema: dict[str, Any]) -> Iterator[str]:
    """Every `$ref` where a schema stands."""
    for node in schema_nodes(schema):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref


_ESCAPE = re.compile(r"~[01]|%[0-9A-Fa-f]{2}")


def _local_refs_only(schema: dict[str, Any]) -> None:
    """Every `$ref` is a JSON pointer into the schema (`#/...`), at something: nothing is
    fetched, and the grammar compiler would otherwise drop the reference silently
    (printing it), as it drops an anchor's (`#name`)."""
    refs = set(schema_refs(schema))
    if any(not ref.startswith("#") for ref in refs):
        raise ValueError("a `$ref` may only point inside the schema (`#/...`)")
    for ref in sorted(refs):  # (the grammar compiler's error would name Weir's rewrite)
        if not (ref in ("#", "#/") or ref.startswith("#/")):
            # an anchor (`#name`): the grammar compiler drops the reference (any value
            # there), so the answer would not follow the schema
            raise ValueError(f"`$ref` {shown(ref)!r} names an anchor, which the grammar "
                             "compiler cannot follow: point at the schema with a JSON "
                             "pointer (`#/$defs/Name`)")
        if _ESCAPE.search(ref):  # the compiler reads the pointer's parts unescaped
            raise ValueError(f"`$ref` `{shown(ref)}` names a definition by an escaped name (`~0`, "
                             "`~1`, `%xx`), which the grammar compiler cannot follow: "
                             "name it with letters, digits, `_` and `-`")
        if _pointed(schema, ref, arrays=False) is None:
            if _pointed(schema, ref) is not None:
                raise ValueError(f"`$ref` `{shown(ref)}` points into an array, which the grammar "
                                 "compiler cannot follow: move that schema into `$defs` "
                                 "and point at it there")
            raise ValueError(f"`$ref` `{shown(ref)}` points at nothing in the schema")
    _no_ref_loops(schema)


_ANNOTATIONS = frozenset({"$ref", "title", "description", "$comment", "default", "examples",
                          "deprecated", "readOnly", "writeOnly"})


def _pointed(schema: dict[str, Any], ref: str, arrays: bool = True) -> Any:
    """What a local `$ref` (`#/$defs/a`) points at; None where it points at nothing (or
    is no JSON pointer: an anchor, `#name`; or, `arrays` False, passes an array's item)."""
    if ref not in ("#", "#/") and not ref.startswith("#/"):
        return None
    node: Any = schema
    for part in ref[2:].split("/") if ref not in ("#", "#/") else []:
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(key)
        elif arrays and isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _no_ref_loops(schema: dict[str, Any]) -> None:
    """No `$ref` leads, through references only, back to itself (`{"$ref": "#"}`, a
    `$defs` pair naming each other): no value matches such a schema, and the engine's
    grammar fails on it mid-answer, as if the engine had failed. Each reference is
    followed once (a chain of thousands is read in one pass, not once per link)."""
    step: dict[str, str | None] = {}  # a ref -> the ref its target is nothing but
    for name in set(schema_refs(schema)):
        node = _pointed(schema, name)
        pure = (isinstance(node, dict) and isinstance(node.get("$ref"), str)
                and set(node) <= _ANNOTATIONS)
        step[name] = node["$ref"] if pure else None  # type: ignore[index]
    done: set[str] = set()  # refs known to lead out
    for start in step:
        path: list[str] = []
        on_path: set[str] = set()
        ref: str | None = start
        while ref is not None and ref not in done:
            if ref in on_path:
                raise ValueError(f"the `$ref` {shown(ref)!r} refers back to itself through "
                                 "references only: no value can match it")
            path.append(ref)
            on_path.add(ref)
            ref = step.get(ref)
        done.update(path)

# What a request's JSON schemas may hold, in objects and arrays. The metaschema check
# costs ~0.1 ms a node on the event loop, before any limit or admission sees the request,
# and the engine's grammar compiler grows much faster than the schema (measured on CPU:
# a 1,000-property object 1.1 s, 2,000 properties 10.7 s, 20,000 past 15 GB of memory).
MAX_SCHEMA_NODES = 4096  # every schema of a request together
MAX_GRAMMAR_NODES = 1024  # what the engine compiles: the response format, forced tools
# And in what it compiles, the characters of its regexes (`pattern`, `patternProperties`
# names) and of its literal strings (`enum`, `const`, property names): each regex grows
# the grammar with its length, and the engine compiles one grammar at a time, so one
# tenant's 250 KB pattern held every tenant's structured output for seconds (measured
# on CPU: an 80,000-character pattern 0.5 s alone; 8,192, about 40 ms).
MAX_GRAMMAR_REGEX_CHARS = 8192
MAX_GRAMMAR_TEXT_CHARS = 65536
# A counted repeat (`{m,n}`, blanks allowed inside) is written out by the compiler, and
# its cost grows faster than the count and with the class: `[a-z]{0,1000}` 0.08 s,
# `{0,2000}` 0.4 s, `{5000,9999}` 8 s (16 characters), `.{1000}` 0.4 s, `.{256}` 45 ms.
# So the atoms that counted repeats add, nested ones multiplied, are bounded too.
MAX_GRAMMAR_REPEATS = 256
_COUNT = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")
# A string `format` the compiler knows is a built-in regex: about 0.3 ms each compiled
# (`date`, `uuid`), up to 3 ms (`ipv6`), more past a few hundred (1,000 `uri-reference`
# properties took 4.7 s). Each weighs 1, the heavy ones 4, and they are bounded.
MAX_GRAMMAR_FORMATS = 128
_HEAVY_FORMATS = frozenset({"ipv6", "uri", "uri-reference", "uri-template", "duration",
                            "email", "idn-email", "iri", "iri-reference"})


def regex_repeats(regex: str, limit: int) -> int:
    """How many atoms the counted repeats of `regex` add when written out (nested ones
    multiplied; alternatives summed, an upper bound), counting stops just past `limit`.
    A scan, not a parse: escapes and character classes are one atom each."""
    frames: list[list[int]] = [[0, 0]]  # per open group: [its atoms, its last item's]
    added, i, n = 0, 0, len(regex)
    while i < n and added <= limit:
        c = regex[i]
        last = 1
        if c == "\\":
            i += 2
        elif c == "[":  # a class: to its closing bracket (escapes skipped; `[]` and `[^]`
            j = i + 1   # take a `]` first as a member)
            if j < n and regex[j] == "^":
                j += 1
            if j < n and regex[j] == "]":
                j += 1
            while j < n and regex[j] != "]":
                j += 2 if regex[j] == "\\" else 1
            i = j + 1
        elif c == "(":
            frames.append([0, 0])
            i += 1
            continue
        elif c == ")" and len(frames) > 1:
            last = frames.pop()[0]
            i += 1
        elif c == "{" and (m := _COUNT.match(regex, i)):
            low, comma, high = m.groups()
            count = int(high) if high else int(low) if not comma else int(low) + 1
            frame = frames[-1]
            more = frame[1] * max(count - 1, 0)
            frame[0] += more
            frame[1] += more
            added += more
            i = m.end()
            continue
        else:
            if c in "*+?|":
                i += 1
                continue
            i += 1
        frames[-1][0] += last
        frames[-1][1] = last
    return added


def json_nodes(v: Any, limit: int | None = None) -> int:
    """Objects and arrays in `v` (iterative), what the schemas' limits count; counting
    stops just past `limit` where one is given."""
    limit = sys.maxsize if limit is None else limit
    n, stack = 0, [v]
    while stack and n <= limit:
        x = stack.pop()
        if isinstance(x, dict):
            n += 1
            stack.extend(x.values())
        elif isinstance(x, list):
            n += 1
            stack.extend(x)
    return n


def _grammar_chars(schema: Any) -> tuple[int, int, int, int]:
    """(characters of regexes, atoms their counted repeats add, characters of literal
    strings and names: in `enum` and `const` values, nested ones too, the weight of its
    string formats) a schema compiles into."""
    regex = repeats = text = formats = 0
    for node in schema_nodes(schema):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                regex += len(value)
                repeats += regex_repeats(value, MAX_GRAMMAR_REPEATS)
            elif key in ("enum", "const"):
                text += _text_chars(value)
            elif key == "format" and isinstance(value, str):
                formats += 4 if value in _HEAVY_FORMATS else 1
            elif key == "patternProperties" and isinstance(value, dict):  # names: regexes
                regex += sum(map(len, value))
                repeats += sum(regex_repeats(k, MAX_GRAMMAR_REPEATS) for k in value)
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                text += sum(map(len, value))
    return regex, repeats, text, formats


def _text_chars(value: Any) -> int:
    """Characters of the strings in JSON data (values and keys, however nested)."""
    total, stack = 0, [value]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x)
        elif isinstance(x, dict):
            total += sum(len(k) for k in x if isinstance(k, str))
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return total


def _get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def check_schema_budget(data: dict[str, Any]) -> None:
    """Refuse a body whose schemas are past MAX_SCHEMA_NODES, or whose compiled ones
    are past MAX_GRAMMAR_NODES: on the raw body, before any schema is checked."""
    if "tools" not in data and "response_format" not in data and "text" not in data:
        return  # most requests: no schema at all
    tools = data.get("tools")
    schemas: list[tuple[str, Any, str | None]] = []  # (param, schema, tool name)
    if isinstance(tools, list):
        for i, t in enumerate(tools[:MAX_SCHEMA_NODES]):
            if isinstance(_get(t, "function"), dict):  # chat: {"function": {...}}
                schemas.append((f"tools[{i}].function.parameters",
                                _get(t, "function", "parameters"), _get(t, "function", "name")))
            elif isinstance(t, dict):  # responses: {"name", "parameters"}
                schemas.append((f"tools[{i}].parameters", t.get("parameters"), t.get("name")))
    choice = data.get("tool_choice")
    forced = (_get(choice, "function", "name") or _get(choice, "name")
              if isinstance(choice, dict) else None)
    compiled = [(p, s) for p, s, name in schemas
                if choice == "required" or (forced is not None and name == forced)]
    for path in (("response_format", "json_schema", "schema"), ("text", "format", "schema")):
        fmt = _get(data, *path)
        if fmt is not None:
            param = ".".join(path)
            schemas.append((param, fmt, None))
            compiled.append((param, fmt))
    total = 0
    for param, schema, _ in schemas:
        total += json_nodes(schema, MAX_SCHEMA_NODES - total)
        if total > MAX_SCHEMA_NODES:
            raise InvalidRequest(
                f"The request's JSON schemas are too large: at most {MAX_SCHEMA_NODES} "
                f"objects and arrays in all (past it at `{param}`).", param=param,
                code="invalid_value")
    grammar = regex = repeats = text = formats = 0
    for param, schema in compiled:
        grammar += json_nodes(schema, MAX_GRAMMAR_NODES - grammar)
        if grammar > MAX_GRAMMAR_NODES:
            raise InvalidRequest(
                f"The schemas the output must follow (the response format, and tools a "
                f"`tool_choice` forces) may hold at most {MAX_GRAMMAR_NODES} objects and "
                f"arrays in all (past it at `{param}`); use `tool_choice: auto` or a "
                "smaller schema.", param=param, code="invalid_value")
        more_regex, more_repeats, more_text, more_formats = _grammar_chars(schema)
        regex, repeats = regex + more_regex, repeats + more_repeats
        text, formats = text + more_text, formats + more_formats
        past = ("characters of regexes (`pattern`, `patternProperties`)",
                MAX_GRAMMAR_REGEX_CHARS) if regex > MAX_GRAMMAR_REGEX_CHARS else (
            "atoms that their regexes' counted repeats (`{m,n}`) add, nested ones "
            "multiplied,", MAX_GRAMMAR_REPEATS) if repeats > MAX_GRAMMAR_REPEATS else (
            "characters of `enum` and `const` strings and property names",
            MAX_GRAMMAR_TEXT_CHARS) if text > MAX_GRAMMAR_TEXT_CHARS else (
            "weight of string `format`s (each weighs 1, the costliest to compile 4: "
            "`uri`, `uri-reference`, `email`, `ipv6`, ...)", MAX_GRAMMAR_FORMATS
        ) if formats > MAX_GRAMMAR_FORMATS else None
        if past is not None:
            raise InvalidRequest(
                f"The schemas the output must follow (the response format, and tools a "
                f"`tool_choice` forces) may hold at most {past[1]} {past[0]} in all (past "
                f"it at `{param}`).", param=param, code="invalid_value")


class ChatTool(_Open):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Open):
    name: str
    arguments: str


class ToolCall(_Open):
    """A call an assistant made earlier in the conversation (sent back as history)."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


def check_unique_names(names: Iterable[str], param: Callable[[int], str]) -> None:
    """Each function tool has a name of its own: a call names its function, so with two
    of one name the caller cannot tell which was called, nor which schema a named
    `tool_choice` (or `required`) holds the arguments to. A 400 naming the second, in
    the words OpenAI uses for a repeated value; `param(i)`: the i-th tool's name."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise InvalidRequest(
                f"Invalid parameter: Duplicate value for 'name' of '{shown(name)}' in `tools`: "
                "each function tool needs a name of its own.", param=param(i),
                code="invalid_value")
        seen.add(name)


def check_tool_choice(tools: list[ChatTool] | None, choice: ToolChoice | None) -> None:
    """A `tool_choice` needs `tools`, and a named one must name a tool among them."""
    if choice is None:
        return
    if not tools:
        raise InvalidRequest("Invalid value for `tool_choice`: `tool_choice` is only allowed "
                             "when `tools` are specified.", param="tool_choice",
                             code="invalid_value")
    if isinstance(choice, NamedToolChoice):
        names = {t.function.name for t in tools}
        if choice.function.name not in names:
            raise InvalidRequest(
                f"Invalid value for `tool_choice`: no function named "
                f"`{shown(choice.function.name)}` is among `tools`.",
                param="tool_choice.function.name", code="invalid_value")


class RefusalPart(_Open):
    """An assistant's earlier refusal, sent back as history (OpenAI accepts it)."""

    type: Literal["refusal"]
    refusal: str


class OtherPart(_Open):
    """Non-text parts (images, audio, files) are parsed so the error can name them."""

    type: str


def type_of(v: Any, default: Any = None) -> Any:
    """The `type` of a part or item, raw (a dict) or validated (a model), for the
    discriminators that pick its model."""
    return v.get("type", default) if isinstance(v, dict) else getattr(v, "type", default)


def _part_kind(v: Any) -> str:
    """A part's model by its `type`, so a text part with a bad `text` is told so (and not
    taken for an unsupported kind); tags are capitalised so error params leave them out."""
    kind = type_of(v)
    if kind == "text":
        return "Text"
    return "Refusal" if kind == "refusal" else "Other"  # (any other value, a list even)


Part = Annotated[
    Annotated[TextPart, Tag("Text")] | Annotated[RefusalPart, Tag("Refusal")]
    | Annotated[OtherPart, Tag("Other")],
    Discriminator(_part_kind),
]


def join_parts(texts: Iterable[str], separator: str = "\n") -> str:
    """A message's text parts as one text: one part a line by default, as vLLM's chat
    renderer joins them for most templates (its `"\\n".join`): "Hello" and "world" are
    two lines to the model, not the word "Helloworld". (The engine names the separator
    its template reads: `Engine.part_separator`.)"""
    return separator.join(texts)


class ChatMessage(_Open):
    role: Role
    content: str | Annotated[list[Part], Field(min_length=1)] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None
    tool_call_id: str | None = None
    #: An assistant's earlier refusal as OpenAI answered it (`content: null` beside it):
    #: its words, read as the turn's text as a `refusal` part is.
    refusal: str | None = None

    def text(self, separator: str = "\n") -> str:
        """The message's text, its parts joined by `separator` (`join_parts`): what the
        cache and the sanitizer see, and with the engine's separator its prompt (an
        assistant's refusal without content: the refusal)."""
        if self.content is None:
            return self.refusal or "" if self.role == "assistant" else ""
        if isinstance(self.content, str):
            return self.content
        return join_parts((p.text if isinstance(p, TextPart) else p.refusal
                           for p in self.content if isinstance(p, TextPart | RefusalPart)),
                          separator)


def _may_lack_content(m: ChatMessage) -> bool:
    """An assistant turn that made calls (`tool_calls`, or the legacy `function_call`) or
    refused (`refusal`, as OpenAI's answer carries it), and a legacy `function` result,
    may go without content, as OpenAI allows."""
    if m.role == "function":
        return True
    return m.role == "assistant" and bool(
        m.tool_calls or m.refusal or (m.model_extra or {}).get("function_call"))


class StreamOptions(_NullIsDefault):
    """(A null option is its default, as a null parameter of the request is.)"""

    include_usage: bool = False
    #: OpenAI's padding of deltas against size side channels: none is added here.
    include_obfuscation: bool = True
    #: vLLM's extension: with `include_usage`, every chunk carries the usage so far.
    continuous_usage_stats: bool = False


def continuous_usage(req: Any) -> bool:
    """Whether a request's stream carries the usage so far in every chunk: vLLM's
    `stream_options.continuous_usage_stats`, which counts only beside `include_usage`
    (as vLLM's server reads it)."""
    return bool(req.include_usage and req.stream_options.continuous_usage_stats)


class JsonSchemaFormat(_Open):
    name: str = Field(pattern=_FUNCTION_NAME)  # OpenAI requires it, and checks it so
    description: str | None = None
    schema_: JsonSchema | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _strict_schema(self) -> JsonSchemaFormat:
        # (OpenAI names `response_format`, with no code)
        check_strict(f"response_format '{shown(self.name)}'", self.schema_, self.strict,
                     None, param="response_format", format_=True)
        return self


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise InvalidRequest(
                "`response_format.json_schema` is required when type is `json_schema`.",
                param="response_format.json_schema", code="missing_required_parameter")
        return self


class Prediction(_Open):
    """OpenAI's Predicted Outputs: text the answer is expected to repeat, a way to answer
    faster, never a change to the answer (unused here)."""

    type: Literal["content"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]


class PromptCacheOptions(_Open):
    """OpenAI's prompt-cache options (`PromptCacheOptionsParam`): how long, and whether
    implicitly, OpenAI keeps a prompt's prefix; the answer is the same either way."""

    ttl: Literal["30m"] | None = None
    mode: Literal["implicit", "explicit"] | None = None


class CallerFields(_Open):
    """OpenAI's fields on who asks and its prompt cache (Chat Completions' and the
    Responses API's): they change no answer and no engine here reads them (an upstream
    gets them), but they are checked as OpenAI checks them. As fields of the request,
    not unknown ones, they are no part of a cache key (`plugins/cache/keys.py`)."""

    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None


# Bounds: OpenAI's documented ones where it has them, otherwise the engine's real limits
# (vLLM's `SamplingParams._verify_args` and its transport), so that no value the engine
# would refuse, or could not even carry, gets past the parser. Every number is finite:
# Python's JSON reader accepts `NaN` and `Infinity`.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Counts and token ids: the engine keeps them in 32-bit tensors.
INT32_MAX = 2**31 - 1
#: The engine's `_SAMPLING_EPS`: a temperature below it is greedy sampling. (vLLM first
#: lifts a temperature above 0 but below its `_MAX_TEMP`, 0.01, to 0.01 and samples
#: there: such a request, `greedy` here, goes to the engine as temperature 0.)
GREEDY_BELOW = 1e-5
MAX_STOP_CHARS = 1024  # vLLM scans every stop string at each step; OpenAI sets no bound
MAX_LOGIT_BIAS = 1024  # entries; each one is applied at every step
MAX_STOP_TOKEN_IDS = 1024  # like `logit_bias`: each is checked at every step
#: vLLM's own bound is 128 after tokenization (`VLLM_MAX_NUM_BAD_WORDS`), which a word
#: with a space-prefixed form counts twice; each is matched at every step.
MAX_BAD_WORDS = 64
#: Written once into the request's vocabulary mask (the mask, not the list, is applied
#: at each step), so a larger bound: a third of a 50k vocabulary.
MAX_ALLOWED_TOKEN_IDS = 16384

Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast"]
#: OpenAI's range, 0 included (vLLM's excludes 0: `top_p: 0` is greedy decoding, the
#: nucleus holding only the likeliest token: `preparing._options` and the upstream's
#: body say so).
TopP = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
#: OpenAI's `StopConfiguration`: "Up to 4 sequences" (`maxItems: 4`; more is its 400).
MAX_STOPS = 4
#: Choices a request may ask for (`n`): vLLM's server takes any; one request's choices
#: share its engine slot, so a bound.
MAX_N = 128
Stop = StopText | Annotated[list[StopText], Field(max_length=MAX_STOPS)]
#: OpenAI's `top_logprobs` (Chat Completions' and the Responses API's): 0 to 20.
TopLogprobs = Annotated[int, Field(ge=0, le=20)]
#: vLLM's extension: a positive count of candidates, or 0 / -1 for all of them.
TopK = Annotated[int, Field(ge=-1, le=INT32_MAX)]
#: vLLM's extensions, within vLLM's own bounds.
MinP = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)]
#: OpenAI's `seed` is an int64 (the engine's transport carries nothing wider).
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
OutputTokens = Annotated[int, Field(ge=1, le=INT32_MAX)]
#: OpenAI's `Metadata`: at most 16 pairs, keys up to 64 characters, values up to 512.
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)],
                          Annotated[str, Field(max_length=512)]], Field(max_length=16)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class _SamplingFields(_NullIsDefault):
    model: str = Field(min_length=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: Stop | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: Annotated[dict[str, Bias], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extensions that benchmarks and power users rely on.
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] = 0
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    # vLLM's token-level extensions, with its semantics (`SamplingParams`): honoured by
    # the in-process engine, passed on as sent to an upstream.
    #: Token ids that end the answer (`finish_reason: "stop"`), as the end-of-turn does.
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)
                              ] | None = None
    #: The stop string (or stop token) that ended the answer is kept at its end.
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    #: Only these tokens may be generated (vLLM refuses an empty list).
    allowed_token_ids: Annotated[list[TokenId], Field(
        min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS)] | None = None
    #: Words never generated (as a word's start or inside text: with and without a space).
    bad_words: Annotated[list[StopText], Field(max_length=MAX_BAD_WORDS)] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k in v or {}:
            if not (k.isascii() and k.isdigit() and len(k) <= 10 and int(k) <= INT32_MAX):
                raise InvalidRequest(
                    f"Invalid token id `{shown(k)}` in `logit_bias`: keys must be token ids "
                    f"(integers from 0 to {INT32_MAX}).", param="logit_bias",
                    code="invalid_value")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> _SamplingFields:
        limit = self.output_limit
        if limit is not None and self.min_tokens > limit:
            raise InvalidRequest(
                f"`min_tokens` ({self.min_tokens}) may not exceed the output limit ({limit}).",
                param="min_tokens", code="invalid_value")
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest(
                "`stream_options` is only allowed when `stream` is true.", param="stream_options",
                code="invalid_value")
        return self

    @property
    def output_limit(self) -> int | None:
        """The most tokens the answer may have, when the request sets it."""
        return None

    @property
    def output_limit_param(self) -> str:
        """The parameter that sets `output_limit` (the one an error about it names)."""
        return "max_tokens"

    @property
    def sequences(self) -> int:
        """The choices this request answers with (`n` per prompt)."""
        return self.n

    @property
    def greedy(self) -> bool:
        """Decoded greedily: a temperature below `GREEDY_BELOW`, or `top_p: 0` (a nucleus
        of the likeliest token alone). The engine is sent temperature 0 for it
        (`preparing.sampling`, the upstream's body), so it is one answer whatever its
        `top_p`, `top_k`, `min_p` or `seed` (vLLM's greedy decoding reads none of them)."""
        return (self.temperature is not None and self.temperature < GREEDY_BELOW
                ) or self.top_p == 0

    @property
    def greedy_anywhere(self) -> bool:
        """`greedy` on every engine, an upstream's too: there a temperature above 0 but
        below `GREEDY_BELOW` with `n` > 1 goes as sent (vLLM refuses `n` > 1 at
        temperature 0), and vLLM samples it at 0.01, each choice its own, reading `seed`,
        `top_p`, `top_k` and `min_p`. What the cache keys and keeps as greedy."""
        return self.greedy and (self.n == 1 or self.temperature == 0 or self.top_p == 0)

    @property
    def engine_sequences(self) -> int:
        """The sequences the engine runs for it: one per prompt where it is greedy (its
        `n` choices are one answer, handed out `n` times: `serving.engine_outputs`)."""
        return self.sequences // self.n if self.greedy else self.sequences

    @property
    def stops(self) -> list[str]:
        """`stop` as a list, whichever form it was sent in."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


def _unanswered(calls: dict[str, int]) -> None:
    """OpenAI's refusal of an assistant turn whose calls were not all answered."""
    i = next(iter(calls.values()))
    raise InvalidRequest(  # OpenAI's words, which clients match
        "An assistant message with 'tool_calls' must be followed by tool messages "
        "responding to each 'tool_call_id'. The following tool_call_ids did not have "
        f"response messages: {', '.join(map(shown, calls))}", param=f"messages[{i}].tool_calls",
        code="invalid_value")


#: The content parts OpenAI's spec gives a role besides the assistant (`text` alone
#: where it is not named here): a `refusal` is an assistant's alone.
_ROLE_PARTS = {"user": ("text", "image_url", "input_audio", "file")}


def refuse_misplaced_refusals(role: str, content: Any, where: str,
                              allowed: tuple[str, ...]) -> None:
    """A `refusal` part outside an assistant message is a 400 naming it, as OpenAI
    answers (read as text, it was that role's own words to the model). `where`: the
    message's param; `allowed`: the part types its role takes, as the error lists them.
    (Chat Completions' messages; the Responses API's input messages hold each text part
    to its role, `ResponsesRequest._parts_of_its_role`.)"""
    if role == "assistant" or not isinstance(content, list):
        return
    for j, part in enumerate(content):
        if getattr(part, "type", None) == "refusal":
            raise not_among("refusal", allowed, f"{where}.content[{j}].type")


def _parts_of_its_role(m: ChatMessage, i: int) -> None:
    refuse_misplaced_refusals(m.role, m.content, f"messages[{i}]",
                              _ROLE_PARTS.get(m.role, ("text",)))


class ChatCompletionRequest(_SamplingFields, CallerFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    # vLLM's chat-template controls, with its semantics.
    #: The template's opening of the assistant's turn ends the prompt.
    add_generation_prompt: bool = True
    #: The final (assistant) message is left open and the answer continues it: a prefill.
    continue_final_message: bool = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        check_enums(data, CHAT_ENUMS)
        check_values(data, CHAT_VALUES)  # (before it is refused as unsupported)
        refuse_unsupported(data, CHAT_UNSUPPORTED)
        refuse_other_tools(data)
        return data
    max_tokens: OutputTokens | None = None
    max_completion_tokens: OutputTokens | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ChatTool], Field(min_length=1)] | None = None  # (OpenAI: 400)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: Metadata | None = None
    #: Kept for the caller to list and retrieve (`proxy.stored_chat`).
    store: bool | None = None
    #: OpenAI's processing tiers: one engine serves every request alike, so the value is
    #: only checked (a value outside OpenAI's list was let through, unread).
    service_tier: ServiceTier | None = None
    #: Checked only: a prediction speeds an answer up, it never changes it.
    prediction: Prediction | None = None

    @model_validator(mode="after")
    def _contents_given(self) -> ChatCompletionRequest:
        """Only turns `_may_lack_content` names may go without content, a `tool` message
        answers a call of the assistant turn just before it, and every call of an
        assistant turn is answered before the next turn (OpenAI's rules)."""
        calls: set[str] = set()  # the calls a `tool` message here may answer
        unanswered: dict[str, int] = {}  # those not answered yet: their message's index
        answered: dict[str, int] = {}  # those answered: the answer's index
        for i, m in enumerate(self.messages):
            if unanswered and m.role != "tool":
                _unanswered(unanswered)
            _parts_of_its_role(m, i)
            if m.role == "assistant" and (m.model_extra or {}).get("audio") is not None:
                raise InvalidRequest(  # (else "missing content", or the audio dropped)
                    f"Unsupported parameter: `messages[{i}].audio`: an earlier audio answer "
                    "cannot be referred to here (this model answers text only); send its "
                    "transcript as the message's `content`.", param=f"messages[{i}].audio",
                    code="unsupported_parameter")
            if m.content is None and not _may_lack_content(m):
                raise InvalidRequest(
                    f"Missing required parameter: `messages[{i}].content` (only an assistant "
                    "message that made calls, or a `function` result, may leave it out).",
                    param=f"messages[{i}].content", code="missing_required_parameter")
            if m.role == "tool" and not m.tool_call_id:
                raise InvalidRequest(
                    f"Missing required parameter: `messages[{i}].tool_call_id` (a `tool` "
                    "message answers the call with that id).",
                    param=f"messages[{i}].tool_call_id", code="missing_required_parameter")
            if m.role == "assistant":
                ids = [c.id for c in m.tool_calls or ()]
                calls, answered = set(ids), {}
                if len(calls) < len(ids):
                    twice = next(c for c in ids if ids.count(c) > 1)
                    raise InvalidRequest(
                        f"Invalid parameter: Duplicate value for 'id' of '{shown(twice)}' in "
                        f"messages[{i}].tool_calls: each call needs an id of its own.",
                        param=f"messages[{i}].tool_calls", code="invalid_value")
                unanswered = {c: i for c in ids}  # (in their order)
            elif m.role == "tool" and m.tool_call_id in answered:
                raise InvalidRequest(  # OpenAI's words
                    f"Invalid parameter: Duplicate value for 'tool_call_id' of "
                    f"'{shown(m.tool_call_id)}', in messages[{answered[m.tool_call_id]}] and "
                    f"messages[{i}].", param=f"messages[{i}].tool_call_id",
                    code="invalid_value")
            elif m.role == "tool" and m.tool_call_id not in calls:
                raise InvalidRequest(
                    f"Invalid parameter: `messages[{i}]` has role `tool` but answers no call "
                    "of the assistant message before it (a `tool` message must follow an "
                    "assistant message with `tool_calls`, and its `tool_call_id` must be "
                    "one of their ids).", param=f"messages[{i}].tool_call_id",
                    code="invalid_value")
            elif m.role != "tool":
                calls, answered = set(), {}
            else:
                unanswered.pop(m.tool_call_id or "", None)
                answered[m.tool_call_id or ""] = i
        if unanswered:
            _unanswered(unanswered)
        return self

    @model_validator(mode="after")
    def _json_mode_is_asked_for(self) -> ChatCompletionRequest:
        """OpenAI's rule: JSON mode needs the word "json" in the messages (told nothing
        of JSON, a model held to it may write whitespace until the limit)."""
        if self.response_format is not None and self.response_format.type == "json_object" \
                and not any("json" in m.text().lower() for m in self.messages):
            raise InvalidRequest(
                "`messages` must contain the word 'json' in some form, to use "
                "`response_format` of type `json_object`.", param="messages",
                code="invalid_value")
        return self

    @model_validator(mode="after")
    def _final_message_continued(self) -> ChatCompletionRequest:
        """vLLM's rules: the template either opens a new turn or leaves the last one open
        (not both: `add_generation_prompt` is true unless sent false), and what is left
        open is an assistant's text (the answer continues it)."""
        if not self.continue_final_message:
            return self
        if self.add_generation_prompt:
            raise InvalidRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to "
                "true (`add_generation_prompt` is true unless sent false): send "
                "`add_generation_prompt: false` to continue the final message.",
                param="add_generation_prompt", code="invalid_value")
        last = self.messages[-1]
        if last.role != "assistant" or last.content is None:
            raise InvalidRequest(
                "`continue_final_message` continues the final message, which must be an "
                f"assistant message with content (it is a `{last.role}` message"
                f"{'' if last.content is not None else ' without content'}).",
                param=f"messages[{len(self.messages) - 1}]", code="invalid_value")
        return self

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest(
                "`top_logprobs` requires `logprobs` to be true.", param="top_logprobs",
                code="invalid_value")
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ChatCompletionRequest:
        check_unique_names((t.function.name for t in self.tools or ()),
                           lambda i: f"tools[{i}].function.name")
        check_tool_choice(self.tools, self.tool_choice)
        if self.parallel_tool_calls is not None and not self.tools:  # (OpenAI's 400)
            raise InvalidRequest("Invalid value for `parallel_tool_calls`: "
                                 "`parallel_tool_calls` is only allowed when `tools` are "
                                 "specified.", param="parallel_tool_calls",
                                 code="invalid_value")
        return self

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template and the cache see them (None: no tools)."""
        if not self.tools:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def output_limit_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"


TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(_SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[
        list[TokenIds], Field(min_length=1)
    ]

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        refuse_unsupported(data, COMPLETION_UNSUPPORTED)
        return data

    #: 0 only with `echo`: the prompt back, nothing generated (with `logprobs`, the
    #: prompt's: how lm-evaluation-harness scores a text).
    #: Null is the default 16, as OpenAI and vLLM read it (not the rest of the context).
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=20)] | None = None
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _best_of_is_at_least_n(self) -> CompletionRequest:
        """`best_of` candidates, of which `n` are returned: fewer is a contradiction on
        any server (OpenAI's rule; vLLM's, while it took `best_of`), not a parameter this
        one lacks."""
        if self.best_of is not None and self.best_of < self.n:
            raise InvalidRequest(
                f"Invalid value for `best_of`: `best_of` ({self.best_of}) must be greater "
                f"than or equal to `n` ({self.n}): it is the number of candidates, of which "
                "`n` are returned.", param="best_of", code="invalid_value")
        return self

    @model_validator(mode="after")
    def _zero_only_echoes(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequest(  # (as every bound is said: `_out_of_range`)
                "Invalid `max_tokens`: integer below minimum value. Expected a value >= 1 "
                "(0 only with `echo`, which returns the prompt alone), but got 0 instead.",
                param="max_tokens", code="integer_below_min_value")
        return self

    @property
    def echo_only(self) -> bool:
        """The prompt back and nothing generated (`max_tokens: 0` with `echo`)."""
        return self.echo and self.max_tokens == 0

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def sequences(self) -> int:
        """As `prompts()` counts them, from the prompt's first item alone (a list is all
        token ids or all prompts, as validated): it is read on every request, and a
        token-id prompt of 32k scanned and copied whole took 2 ms."""
        p = self.prompt
        one = isinstance(p, str) or not p or isinstance(p[0], int)
        return self.n * (1 if one else len(p))

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


NonEmptyText = Annotated[str, Field(min_length=1)]  # OpenAI: "cannot be an empty string"


class EmbeddingRequest(_NullIsDefault):
    model: str = Field(min_length=1)
    input: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1, max_length=2048)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_token_ids(cls, data: Any) -> Any:
        """Token ids (OpenAI's API takes them) name tokens of the client's tokenizer,
        usually tiktoken's, which mean nothing to this embedding model: refused in words
        that say what to send instead, not embedded as other tokens."""
        inp = data.get("input") if isinstance(data, dict) else None
        if isinstance(inp, list) and inp and all(
                (isinstance(x, int) and not isinstance(x, bool))
                or (isinstance(x, list) and x and all(isinstance(y, int) for y in x))
                for x in inp):
            raise InvalidRequest(
                "Token-id input is not supported by this embedding model: send the text "
                "(a string or an array of strings). LangChain's OpenAIEmbeddings sends "
                "token ids unless `check_embedding_ctx_length=False`.", param="input",
                code="unsupported_value")
        return data


# Pydantic names union members in an error's location ('TextPart', 'list[str]',
# 'constrained-str', 'function-after[...]'); they are not fields and never part of a param.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
#: Maps keyed by the caller's own keys: OpenAI names the field, not the key.
_KEYED_FIELDS = frozenset({"logit_bias", "metadata"})


def _loc_to_param(loc: tuple[int | str, ...]) -> str:
    """('messages', 0, 'content') -> 'messages[0].content' (union tags dropped;
    ('logit_bias', '12345') -> 'logit_bias', as OpenAI names it)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and (part[0].isupper() or "[" in part or part in _TYPE_TAGS
                       or part.startswith("constrained-")):
            continue
        else:
            out += f".{part}" if out else part
        if out in _KEYED_FIELDS:
            break
    return out


#: The order OpenAI's API checks fields in (its spec's property order): with several bad
#: fields, the error names the first of them in this order, as OpenAI's does.
OPENAI_ORDER: dict[str, tuple[str, ...]] = {
    "ChatCompletionRequest": (
        "metadata", "top_logprobs", "temperature", "top_p", "user", "safety_identifier",
        "prompt_cache_key", "prompt_cache_retention", "messages", "model",
        "max_completion_tokens", "frequency_penalty", "presence_penalty", "response_format",
        "store", "stream", "stop", "logit_bias", "logprobs", "max_tokens", "n", "seed",
        "stream_options", "tools", "tool_choice", "parallel_tool_calls"),
    "CompletionRequest": (
        "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
        "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options",
        "suffix", "temperature", "top_p", "user"),
    "ResponsesRequest": (
        "metadata", "temperature", "top_p", "user", "safety_identifier", "prompt_cache_key",
        "prompt_cache_retention", "previous_response_id", "model", "text",
        "tools", "tool_choice", "input", "parallel_tool_calls", "store", "instructions",
        "stream", "max_output_tokens"),
}


def validation_error(exc: ValidationError, order: tuple[str, ...] = ()) -> InvalidRequest:
    errors = exc.errors(include_url=False)
    # With several bad fields, the first in OpenAI's order is named (fields it does not
    # list come after, in declaration order). For a union (`stop: str | list[str]`) the
    # first error of that field is usually "not a string"; the member that got further
    # (a list that is too long) says more.
    rank = {name: i for i, name in enumerate(order)}
    first = min(errors, key=lambda e: rank.get(str(e["loc"][0]) if e["loc"] else "", len(rank)))
    field_errors = [e for e in errors if e["loc"][:1] == first["loc"][:1]]
    # (a `Literal` member given no string is a wrong type too: `tool_choice` as an object
    # is told what is wrong inside it, not that it is not 'none', 'auto' or 'required')
    specific = [e for e in field_errors if not e["type"].endswith("_type") and not (
        e["type"] == "literal_error" and not isinstance(e["input"], str))]
    # The union member that got furthest into the value names the real fault
    # (`content[0].text` is a number, not "`content` is not a string";
    # `tool_choice.function` is missing, not "`tool_choice` is not 'auto'").
    err = max(specific or field_errors, key=lambda e: len(e["loc"]))
    return _described(err, _loc_to_param(tuple(err["loc"])))


def _described(err: Any, param: str) -> InvalidRequest:
    """Pydantic's error `err` about `param`, in OpenAI's words and codes."""
    where = f" for `{param}`" if param else ""
    expected = _EXPECTED.get(err["type"])
    if expected is not None:  # a wrong JSON type, said as OpenAI says it
        return InvalidRequest(
            f"Invalid type{where}: expected {expected}, but got {_json_type(err['input'])} "
            "instead.", param=param or None, code="invalid_type")
    if err["type"] == "literal_error":  # a `Literal`'s values, as the enum table's
        expected = str((err.get("ctx") or {}).get("expected", ""))
        values = _LITERAL.findall(expected)
        if values and not re.sub(r", |\bor\b| ", "", _LITERAL.sub("", expected)):
            return not_among(err["input"], values, param)
    if err["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: `{param}`.", param=param or None,
                              code="missing_required_parameter")
    bound = _out_of_range(err, param)
    if bound is not None:
        return bound
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, StrictSchemaRefused):  # (OpenAI's message whole, its param)
        return cause.at(param)
    end = "" if msg.endswith((".", "!", "?")) else "."  # (a check's own message may end one)
    return InvalidRequest(f"Invalid value{where}: {msg}{end}", param=param or None,
                          code=("invalid_function_parameters"
                                if isinstance(cause, InvalidFunctionParameters)
                                else "invalid_value"))


#: The values in a `literal_error`'s `expected` ("'a', 'b' or 'c'": pydantic's reprs).
_LITERAL = re.compile(r"'([^'\\]*)'")
#: Pydantic's bound errors: (the bound's key in the error's context, OpenAI's wording).
_BOUNDS = {"greater_than_equal": ("ge", ">=", "below_min_value"),
           "greater_than": ("gt", ">", "below_min_value"),
           "less_than_equal": ("le", "<=", "above_max_value"),
           "less_than": ("lt", "<", "above_max_value")}
_LENGTHS = {"too_short": "min_length", "too_long": "max_length",
            "string_too_short": "min_length", "string_too_long": "max_length"}


def _out_of_range(err: Any, param: str) -> InvalidRequest | None:
    """A number, a length or a count of properties out of its bounds, in OpenAI's words
    and codes (`integer_below_min_value`, `decimal_above_max_value`,
    `array_above_max_length`, `empty_string`, `object_above_max_properties`, ...); None
    for any other error."""
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if err["type"] in _LENGTHS and isinstance(value, str | list | dict):
        key = _LENGTHS[err["type"]]
        return None if key not in ctx else _bad_length(param, value, ctx[key], key)
    if err["type"] not in _BOUNDS or not isinstance(value, int | float) or isinstance(
            value, bool):
        return None
    key, op, code = _BOUNDS[err["type"]]
    if key not in ctx:
        return None
    # (the field's kind, told by its bound: `temperature: 3` is a decimal past 2.0)
    kind = "integer" if isinstance(value, int) and isinstance(ctx.get(key), int) else "decimal"
    what = code.replace("_", " ").replace("min", "minimum").replace("max", "maximum")
    bound = ctx[key]
    if isinstance(bound, float) and bound.is_integer() and abs(bound) < 1e15:
        bound = int(bound)  # ("<= 2", as OpenAI writes it)
    return InvalidRequest(
        f"Invalid `{param}`: {kind} {what}. Expected a value {op} {bound}, but got {value} "
        "instead.", param=param or None, code=f"{kind}_{code}")


def _bad_length(param: str, value: str | list[Any] | dict[str, Any], bound: int,
                key: str) -> InvalidRequest:
    """A string, an array or an object (its properties counted) longer or shorter than
    its bound, as OpenAI says it: "string too long. Expected a string with maximum length
    512, but got a string with length 513 instead." (`string_above_max_length`), "too
    many properties. Expected an object with at most 16 properties, ..."
    (`object_above_max_properties`), "empty string. ..." (`empty_string`)."""
    n, most = len(value), key == "max_length"
    if isinstance(value, dict):
        text = (f"too {'many' if most else 'few'} properties. Expected an object with at "
                f"{'most' if most else 'least'} {bound} properties, but got an object with "
                f"{n} properties instead.")
        code = f"object_{'above_max' if most else 'below_min'}_properties"
    else:
        kind, a = ("string", "a") if isinstance(value, str) else ("array", "an")
        limit = f"Expected {a} {kind} with {'maximum' if most else 'minimum'} length {bound}"
        if n == 0:
            text, code = f"empty {kind}. {limit}, but got an empty {kind} instead.", \
                f"empty_{kind}"
        else:
            text = (f"{kind} too {'long' if most else 'short'}. {limit}, but got {a} {kind} "
                    f"with length {n} instead.")
            code = f"{kind}_{'above_max' if most else 'below_min'}_length"
    return InvalidRequest(f"Invalid `{param}`: {text}", param=param or None, code=code)


#: Pydantic's type errors, as the JSON type that was expected.
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean",
             "string_type": "a string", "list_type": "an array", "dict_type": "an object",
             "model_type": "an object", "model_attributes_type": "an object"}


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a decimal number"
    if isinstance(v, str):
        return "a string"
    return "an array" if isinstance(v, list) else "an object"


M = TypeVar("M", bound=BaseModel)

#: What a model's generation config may set for a request that leaves it unset, each
#: within the bounds a request's own value has (vLLM's `get_diff_sampling_param`; its
#: `max_tokens`, the config's `max_new_tokens`, is read where the output limit is).
_MODEL_DEFAULTS: dict[str, Callable[[Any], bool]] = {
    "temperature": lambda v: 0 <= v <= 2, "top_p": lambda v: 0 <= v <= 1,
    "top_k": lambda v: isinstance(v, int) and -1 <= v <= INT32_MAX,
    "min_p": lambda v: 0 <= v <= 1, "repetition_penalty": lambda v: 0 < v <= 1e6,
    "presence_penalty": lambda v: -2 <= v <= 2, "frequency_penalty": lambda v: -2 <= v <= 2,
    "max_tokens": lambda v: isinstance(v, int) and 1 <= v <= INT32_MAX}


def model_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """A model's sampling defaults as vLLM reads its generation config, less any value
    out of a request's own bounds (a config can hold anything)."""
    out = {}
    for name, ok in _MODEL_DEFAULTS.items():
        v = config.get(name)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and ok(v):
            out[name] = v
    return out


def with_model_defaults(req: M, defaults: Mapping[str, Any]) -> M:
    """`req` with the model's sampling defaults where it leaves a parameter unset, as
    vLLM's server applies them: before the chain, so the cache keys and judges the
    sampling the engine will do (a model that defaults to greedy decoding answers a
    request without `temperature` deterministically)."""
    if not defaults:  # (most models: nothing to fill, nothing to walk)
        return req
    fill = {k: v for k, v in defaults.items()
            if k != "max_tokens" and k in type(req).model_fields and getattr(req, k) is None}
    return req.model_copy(update=fill) if fill else req


def parse_model(model: type[M], data: dict[str, Any]) -> M:
    check_schema_budget(data)
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        raise validation_error(e, OPENAI_ORDER.get(model.__name__, ())) from None
