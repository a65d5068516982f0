"""The Responses API request, as OpenAI takes it (the subset Weir serves).

`input` is a string or a list of items: messages (with or without `type: "message"`;
content a string or parts: `input_text` in a user's, system's or developer's,
`output_text` / `refusal` in an assistant's), `function_call`
items (a call the model made earlier) and `function_call_output` items (its result).
Tools are function tools in the Responses shape (`name` at the top, not under
`function`). Unknown fields are accepted, as on the chat route; a field Weir cannot
honour (a built-in tool such as `web_search`, an image part) is a 400 naming it.
"""

from __future__ import annotations

from collections import deque
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag, TypeAdapter, model_validator

from ..errors import InvalidRequest, shown
from ..protocol import (
    _FUNCTION_NAME,
    CHAT_ENUMS,
    MAX_GRAMMAR_NODES,
    MAX_SCHEMA_NODES,
    MODERATION,
    CallerFields,
    JsonSchema,
    Metadata,
    MinP,
    RepetitionPenalty,
    Temperature,
    ToolParameters,
    TopK,
    TopLogprobs,
    TopP,
    Unsupported,
    _NullIsDefault,
    _Open,
    _pointed,
    check_enums,
    check_strict,
    check_unique_names,
    check_values,
    inert,
    join_parts,
    json_nodes,
    may_be,
    not_among,
    raw_items,
    refuse_other_tools,
    refuse_unsupported,
    strict_problem,
    subschemas,
    type_of,
    with_subschemas,
)


class InputText(_Open):
    type: Literal["input_text", "output_text"]
    text: str


class CallOutputText(_Open):
    """A text part of a function call's output."""

    type: Literal["input_text"]
    text: str


class InputRefusal(_Open):
    type: Literal["refusal"]
    refusal: str


class UnsupportedPart(_Open):
    """Any other part (an image, a file, a type the API has no part of): parsed so that
    the request can refuse it, naming the parts its place takes (`_refused_part`: which
    those are depends on the message's role, which the part cannot see)."""

    type: str


#: Parts OpenAI's Responses API has that no input message's list names (a message as
#: its Conversations API lists it holds them): not served, in any message.
_UNSERVED_PARTS = frozenset({"computer_screenshot", "summary_text"})


def _refused_part(kind: Any, allowed: tuple[str, ...], served: str, param: str,
                  unserved: frozenset[str] = frozenset()) -> InvalidRequest:
    """The 400 for a part its place does not take (`allowed`: the parts OpenAI takes
    there; `served`: those of them Weir serves, in words). One OpenAI takes there (an
    image, a file; `unserved`: others it has) is not served: it says so and what to
    send. Any other (Chat Completions' `text`, a user's `input_image` in an assistant's
    message) is OpenAI's own 400, "Invalid value: 'x'. Supported values are: ...",
    naming `allowed`."""
    if kind in allowed or kind in unserved:
        return InvalidRequest(f"Invalid value for `{param}`: `{shown(kind)}` parts are not "
                              f"supported; send {served}.", param=param,
                              code="invalid_value")
    return not_among(kind, allowed, param)


def _part_kind(v: Any) -> str:
    """A part's model by its `type`; tags are capitalised so error params leave them out."""
    kind = type_of(v)
    if kind in ("input_text", "output_text"):
        return "Text"
    return "Refusal" if kind == "refusal" else "Unsupported"


def _output_part_kind(v: Any) -> str:
    """A function call output's part by its `type` (`input_text`; any other is refused
    by the request)."""
    return "Text" if type_of(v) == "input_text" else "Unsupported"


CallOutputPart = Annotated[
    Annotated[CallOutputText, Tag("Text")] | Annotated[UnsupportedPart, Tag("Unsupported")],
    Discriminator(_output_part_kind),
]


Part = Annotated[
    Annotated[InputText, Tag("Text")] | Annotated[InputRefusal, Tag("Refusal")]
    | Annotated[UnsupportedPart, Tag("Unsupported")],
    Discriminator(_part_kind),
]


class MessageItem(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return join_parts(p.text if isinstance(p, InputText) else p.refusal
                          for p in self.content if isinstance(p, InputText | InputRefusal))


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(_Open):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=64)  # (OpenAI's bound; a call's has none)
    output: str | list[CallOutputPart]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(
            p.text for p in self.output if isinstance(p, CallOutputText))


class SummaryText(_Open):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Open):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Open):
    """A reasoning model's item, as an app replays a conversation's output (the Agents SDK
    does, and so does one that moved from a reasoning model). It is taken and left out
    of the prompt: this model does not reason, and its template has nowhere to put it
    (vLLM's server hands it to the template as `reasoning`, which such templates drop)."""

    type: Literal["reasoning"]
    summary: list[SummaryText]
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class UnsupportedItem(_Open):
    """Any other input item (a reference to a stored item, a built-in tool's call):
    parsed so that the error can name it."""

    type: str

    @model_validator(mode="after")
    def _refuse(self) -> UnsupportedItem:
        hint = (" (chain turns with `previous_response_id`, or send the items themselves)"
                if self.type == "item_reference" else "")
        raise ValueError(f"`{shown(self.type)}` input items are not supported{hint}; send "
                         "`message`, `function_call` or `function_call_output` items")


def _item_kind(v: Any) -> str:
    """The item's model; tags are capitalised so error params leave them out."""
    kind = type_of(v, "message")
    if kind == "function_call":
        return "FunctionCall"
    if kind == "function_call_output":
        return "FunctionCallOutput"
    if kind == "reasoning":
        return "Reasoning"
    return "Message" if kind == "message" else "Unsupported"  # (a `type` not a string too)


InputItem = Annotated[
    Annotated[MessageItem, Tag("Message")]
    | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")]
    | Annotated[ReasoningItem, Tag("Reasoning")]
    | Annotated[UnsupportedItem, Tag("Unsupported")],
    Discriminator(_item_kind),
]


class FunctionTool(_Open):
    type: Literal["function"]
    name: str = Field(pattern=_FUNCTION_NAME)
    description: str | None = None
    parameters: ToolParameters | None = None
    strict: bool | None = None
    #: The parameters as sent, where they were normalized into strict mode.
    _sent: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _strict_schema(self) -> FunctionTool:
        check_strict(f"function '{shown(self.name)}'", self.parameters, self.strict,
                     "invalid_function_parameters", ".parameters")
        if self.strict is None:  # (OpenAI's default here, unlike Chat Completions')
            normal = None if self.parameters is None else strict_normalized(self.parameters)
            self.strict = self.parameters is None or normal is not None
            if normal is not None:
                self._sent, self.parameters = self.parameters, normal
        return self

    def as_sent(self) -> None:
        """Served non-strict, its parameters as sent (where it was normalized)."""
        if self._sent is not None:
            self.parameters, self.strict, self._sent = self._sent, False, None


def strict_normalized(schema: dict[str, Any]) -> dict[str, Any] | None:
    """A function's `parameters` sent without `strict`, normalized into strict mode as
    OpenAI's Responses API normalizes them: every object says `additionalProperties:
    false` and lists every property in `required` (a copy). None where strict mode
    cannot hold it even so (`strict_problem`: a keyword it refuses, an object open to
    other keys or without properties, an untyped subschema, a schema past its limits;
    or one no value fits, `finite`): the tool is then served non-strict, as given."""

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = with_subschemas(node, walk)
        kind = node.get("type")
        props = node.get("properties")
        if may_be(kind, "object") or isinstance(props, dict):
            out.setdefault("additionalProperties", False)
            if isinstance(props, dict):
                required = out.get("required")
                given = [k for k in required if isinstance(k, str)] \
                    if isinstance(required, list) else []
                listed = set(given)
                out["required"] = [*given, *(k for k in props if k not in listed)]
        return out

    normal = walk(schema)
    if strict_problem(normal) or not finite(normal):
        return None
    return normal  # type: ignore[no-any-return]


#: How many subschemas `finite` may read per node and edge of a schema.
_FINITE_WORK = 16


def finite(schema: dict[str, Any]) -> bool:
    """Whether some finite value fits `schema`, every property it names required (as
    strict mode makes them): a required property that refers back to its own object
    (`{"next": {"$ref": "#"}}`) with no way out (`null`, an `anyOf` branch that is not
    recursive, an array that may be empty) has none, and a call forced to it would
    never end. A least fixed point over the schema's nodes (each judged on what is
    known of its subschemas), children before their parents, a node judged again only
    when one it rests on (a subschema, the target of its `$ref`) is found to fit: each
    is judged a few times at most, however the references chain. A node is judged
    again for each of its subschemas found to fit, so a wide node at the end of long
    chains could be judged as often as it has subschemas, each time reading them: the
    subschemas read are counted, and past `_FINITE_WORK` times the nodes and edges
    (never on a schema a caller writes by hand) it is judged to have none, served
    non-strict as sent, so the work stays linear in the schema."""
    nodes: list[dict[str, Any]] = []
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            nodes.append(node)
            stack.extend(sub for _, sub in subschemas(node))
    nodes.reverse()
    resting: dict[int, list[dict[str, Any]]] = {}  # a node -> the nodes resting on it
    pointed: dict[int, Any] = {}  # a node -> what its `$ref` points at (read once)
    for node in nodes:
        ref = node.get("$ref")
        if isinstance(ref, str):
            pointed[id(node)] = _pointed(schema, ref)
        for sub in [*(sub for _, sub in subschemas(node)), pointed.get(id(node))]:
            if isinstance(sub, dict):
                resting.setdefault(id(sub), []).append(node)
    fits: set[int] = set()
    work = [_FINITE_WORK * (len(nodes) + sum(map(len, resting.values())))]

    def ok(sub: Any) -> bool:
        work[0] -= 1
        return sub is not False and (not isinstance(sub, dict) or id(sub) in fits)

    def fitting(node: dict[str, Any]) -> bool:
        if id(node) in pointed and not ok(pointed[id(node)]):
            return False
        branches = [bs for k in ("anyOf", "oneOf") if isinstance(bs := node.get(k), list)]
        if any(not any(ok(b) for b in bs) for bs in branches):
            return False
        if "enum" in node and not (isinstance(node["enum"], list) and node["enum"]):
            return False  # (none listed)
        if "const" in node or "enum" in node:
            return True  # (a value listed)
        kinds = node.get("type")
        if kinds is None and isinstance(node.get("properties"), dict):
            kinds = "object"  # (as the normalization reads it)
        if kinds is None:
            return True
        for kind in [kinds] if isinstance(kinds, str) else kinds:
            if kind == "object":
                props = node.get("properties")
                props = props if isinstance(props, dict) else {}
                required = node.get("required")
                if all(ok(props.get(k, True)) for k in required or ()
                       if isinstance(k, str)):
                    return True
            elif kind == "array":
                if not _within(node, "minItems", "maxItems"):
                    continue
                least = node.get("minItems", 0)
                items, prefix = node.get("items", True), node.get("prefixItems")
                firsts = prefix if isinstance(prefix, list) else items \
                    if isinstance(items, list) else []
                rest = True if isinstance(items, list) else items
                least = least if isinstance(least, int) else 0
                if all(ok(s) for s in firsts[:least]) and (
                        least <= len(firsts) or ok(rest)):
                    return True
            elif kind == "string":
                if _within(node, "minLength", "maxLength"):
                    return True
            elif kind in ("number", "integer"):
                if _within(node, "minimum", "maximum") and _within(
                        node, "exclusiveMinimum", "exclusiveMaximum", open_=True) and _within(
                        node, "minimum", "exclusiveMaximum", open_=True) and _within(
                        node, "exclusiveMinimum", "maximum", open_=True):
                    return True
            elif kind in ("boolean", "null"):
                return True
        return False

    todo = deque(nodes)
    queued = {id(node) for node in nodes}
    while todo and id(schema) not in fits and work[0] > 0:
        node = todo.popleft()
        queued.discard(id(node))
        if id(node) not in fits and fitting(node):
            fits.add(id(node))
            for up in resting.get(id(node), ()):
                if id(up) not in fits and id(up) not in queued:
                    todo.append(up)
                    queued.add(id(up))
    return id(schema) in fits


def _within(node: dict[str, Any], low: str, high: str, open_: bool = False) -> bool:
    """Whether a node's bounds `low` and `high` (numbers, either left out) leave some
    value between them (`open_`: one of them excludes its own)."""
    lo, hi = node.get(low), node.get(high)
    if not (isinstance(lo, int | float) and isinstance(hi, int | float)) or isinstance(
            lo, bool) or isinstance(hi, bool):
        return True
    return bool(lo < hi if open_ else lo <= hi)


class ToolChoiceFunction(_Open):
    type: Literal["function"]
    name: str


class TextFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=_FUNCTION_NAME)
    schema_: JsonSchema | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type != "json_schema":
            return self
        # (OpenAI's words, `response_format`, as on Chat Completions; its code)
        check_strict(f"response_format '{shown(self.name)}'", self.schema_, self.strict,
                     "invalid_json_schema", ".schema", format_=True)
        if self.schema_ is None:
            raise InvalidRequest("Missing required parameter: `text.format.schema`.",
                                 param="text.format.schema", code="missing_required_parameter")
        if self.name is None:
            raise InvalidRequest("Missing required parameter: `text.format.name`.",
                                 param="text.format.name", code="missing_required_parameter")
        return self


class TextConfig(_Open):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="after")
    def _verbosity_asks_nothing(self) -> TextConfig:
        if self.verbosity not in (None, "medium"):
            raise InvalidRequest("Unsupported parameter: `text.verbosity`: this model has no "
                                 "verbosity setting; ask for a length in the input.",
                                 param="text.verbosity", code="unsupported_parameter")
        return self


def _asks_no_reasoning(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(
        x is None or (k == "effort" and x == "none") for k, x in v.items()))


RESPONSES_UNSUPPORTED: Unsupported = {
    "conversation": (inert(), "conversations are not kept here; chain turns with "
                     "`previous_response_id`."),
    "prompt": (inert(), "stored prompt templates are not supported; send `instructions` "
               "and `input`."),
    "include": (inert([]), "none of the extra output it names is available here."),
    "top_logprobs": (inert(0), "log probabilities are not available on the Responses API "
                     "here (they are on /v1/chat/completions)."),
    "max_tool_calls": (inert(), "a cap on the number of tool calls is not supported."),
    "truncation": (inert("disabled"), "`auto` truncation is not supported; the input must "
                   "fit the model's context."),
    "reasoning": (_asks_no_reasoning, "this model does not reason."),
    "context_management": (inert([]), "compaction is not supported; the input must fit "
                           "the model's context."),
    "moderation": MODERATION,
    # Chat Completions' names, which the Responses API does not take: ignored, a
    # `max_tokens` would leave the answer uncapped and a `response_format` unenforced.
    **{name: (inert(), f"in the Responses API, this parameter has moved to `{to}`.")
       for name, to in (("max_tokens", "max_output_tokens"),
                        ("max_completion_tokens", "max_output_tokens"),
                        ("response_format", "text.format"), ("messages", "input"),
                        ("functions", "tools"), ("function_call", "tool_choice"))},
    "reasoning_effort": (inert("none"), "this model does not reason (and the Responses "
                         "API takes `reasoning.effort`)."),
    "verbosity": (inert("medium"), "this model has no verbosity setting (and the Responses "
                  "API takes `text.verbosity`); ask for a length in the input."),
    **{name: (inert(), "the Responses API has no such parameter (it is Chat "
              "Completions'); use /v1/chat/completions for it.")
       for name in ("n", "logprobs", "modalities", "audio", "web_search_options",
                    "prediction")},
    # vLLM's own, for its Responses API's conversation state
    "enable_response_messages": (inert(False), "the response's messages are its "
                                 "`output` items here."),
    "previous_input_messages": (inert(), "chain turns with `previous_response_id`, or "
                                "send the conversation as `input`."),
}
#: What vLLM's Responses API takes besides OpenAI's (`seed`, `stop`, the penalties,
#: `logit_bias`, and vLLM's token extensions: `translate.VLLM_PASSED`) goes into the chat
#: request the answer is generated from, under the chat route's rules: honoured, or
#: refused by the in-process engine and sent on to an upstream as given.


def _refuse_tool_features(data: dict[str, Any]) -> None:
    """A function tool that asks for what only OpenAI's tool search (`defer_loading`) or
    programmatic calls (`allowed_callers` without `direct`) give: a 400 naming it. Taken
    as a plain tool, the model would be offered, and call, what the client kept from it."""
    for i, tool in enumerate(raw_items(data, "tools")):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        if tool.get("defer_loading") not in (None, False):
            raise InvalidRequest(
                f"Unsupported parameter: `tools[{i}].defer_loading`: there is no tool search "
                "here; every tool is offered to the model with the request.",
                param=f"tools[{i}].defer_loading", code="unsupported_parameter")
        callers = tool.get("allowed_callers")
        if callers is not None and not (isinstance(callers, list) and "direct" in callers):
            raise InvalidRequest(
                f"Unsupported parameter: `tools[{i}].allowed_callers`: tools are called by the "
                "model itself here (`direct`), never programmatically.",
                param=f"tools[{i}].allowed_callers", code="unsupported_parameter")


class StreamOptions(_Open):
    #: (Weir adds no obfuscation field to its events: nothing to turn off.)
    include_obfuscation: bool | None = None


#: The content parts OpenAI's spec gives an input message of a role besides the
#: assistant's (its `InputContent`): a `refusal` is an assistant's alone.
_INPUT_PARTS = ("input_text", "input_image", "input_file")
#: The content parts OpenAI takes in an assistant's input message (what its output
#: messages hold): `input_text` there is refused ("Supported values are: 'output_text'
#: and 'refusal'.").
_OUTPUT_PARTS = ("output_text", "refusal")
#: What a message of another role than the assistant's is told to send for a part Weir
#: does not serve (an image, a file).
_INPUT_SERVED = "`input_text` parts (an assistant's: `output_text` or `refusal`)"


#: OpenAI's `Reasoning.summary` (and its deprecated `generate_summary`).
_SUMMARIES = ("auto", "concise", "detailed")
#: The Responses API's enum-valued parameters no field here declares (`CHAT_ENUMS`):
#: checked before `reasoning`, `include` or `truncation: auto` is refused as unsupported.
RESPONSES_ENUMS: dict[str, tuple[str, ...]] = {
    "truncation": ("auto", "disabled"),
    "reasoning.effort": CHAT_ENUMS["reasoning_effort"],
    "reasoning.summary": _SUMMARIES,
    "reasoning.generate_summary": _SUMMARIES,
    "reasoning.context": ("auto", "current_turn", "all_turns"),
    "include[]": ("file_search_call.results", "web_search_call.results",
                  "web_search_call.action.sources", "message.input_image.image_url",
                  "computer_call_output.output.image_url", "code_interpreter_call.outputs",
                  "reasoning.encrypted_content", "message.output_text.logprobs"),
}


#: The Responses API's numeric parameters no field here declares (those refused as
#: unsupported), each with its type and range in OpenAI's spec: a value outside it is the
#: 400 a declared field's is (`top_logprobs: 50`, `integer_above_max_value`), checked
#: before it is refused as unsupported.
RESPONSES_VALUES: dict[str, TypeAdapter[Any]] = {
    "top_logprobs": TypeAdapter(TopLogprobs),
    "max_tool_calls": TypeAdapter(int),
    # (and each refused parameter's own JSON type: `reasoning: "high"` was told "this
    # model does not reason", not its type)
    "reasoning": TypeAdapter(dict[str, Any]),
    "conversation": TypeAdapter(str | dict[str, Any]),
    "prompt": TypeAdapter(dict[str, Any]),
    "moderation": TypeAdapter(dict[str, Any]),
    "context_management": TypeAdapter(list[Any]),
    "context_management[].compact_threshold": TypeAdapter(Annotated[int, Field(ge=1000)]),
}


class ResponsesRequest(_NullIsDefault, CallerFields):
    model: str = Field(min_length=1)
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=16)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    # vLLM's extensions, as its own Responses API takes them
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    store: bool = True
    background: bool = False
    previous_response_id: Annotated[str, Field(min_length=1)] | None = None
    metadata: Metadata | None = None
    user: str | None = None
    service_tier: Literal[  # only checked: one engine serves every request alike
        "auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        check_enums(data, RESPONSES_ENUMS)  # (before `auto` is refused as unsupported)
        check_values(data, RESPONSES_VALUES)  # (before it is refused as unsupported)
        refuse_unsupported(data, RESPONSES_UNSUPPORTED)
        refuse_other_tools(data)
        if isinstance(data, dict):
            _refuse_tool_features(data)
        return data

    @model_validator(mode="after")
    def _background_is_stored(self) -> ResponsesRequest:
        if self.background and not self.store:  # (it is retrieved from the store)
            raise InvalidRequest("Background responses require `store` to be true.",
                                 param="background", code="invalid_value")
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> ResponsesRequest:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("`stream_options` is only allowed when `stream` is true.",
                                 param="stream_options", code="invalid_value")
        return self

    @model_validator(mode="after")
    def _parts_of_its_role(self) -> ResponsesRequest:
        """Each part of a message's content is one its role takes, as OpenAI holds
        them: an assistant's `output_text` and `refusal`, another role's `input_text`
        (`input_image`, `input_file`). The other's (`output_text` or a `refusal` in a
        user's message, `input_text` in an assistant's) is a 400 naming the part, in
        OpenAI's words (its `param` the part, not its `type`: the type is one the API
        knows, in the wrong message). A type the API has no part of (`text`, Chat
        Completions' name) is refused so too: OpenAI's "Invalid value: 'text'. Supported
        values are: ..." (it was read to the model in any role)."""
        if isinstance(self.input, str):
            return self
        for i, item in enumerate(self.input):
            if isinstance(item, FunctionCallOutputItem) and not isinstance(item.output, str):
                for j, given in enumerate(item.output):  # (its parts are `input_text`)
                    if isinstance(given, UnsupportedPart):
                        raise _refused_part(given.type, _INPUT_PARTS, "`input_text` parts",
                                            f"input[{i}].output[{j}]")
            if not isinstance(item, MessageItem) or isinstance(item.content, str):
                continue
            allowed, served = ((_OUTPUT_PARTS, "`output_text` or `refusal` parts")
                               if item.role == "assistant" else (_INPUT_PARTS, _INPUT_SERVED))
            for j, part in enumerate(item.content):
                kind = getattr(part, "type", None)
                if kind not in allowed or isinstance(part, UnsupportedPart):
                    raise _refused_part(kind, allowed, served, f"input[{i}].content[{j}]",
                                        _UNSERVED_PARTS)
        return self

    @model_validator(mode="after")
    def _each_id_once(self) -> ResponsesRequest:
        """Two input items of one id are one item sent twice: the model would read it
        twice (and it would be listed twice). OpenAI's answer, in its words; items sent
        without an id never clash."""
        seen: set[str] = set()
        for item in self.given():
            given = given_id(item)
            if given is None:
                continue
            if given in seen:
                raise InvalidRequest(f"Duplicate item found with id {shown(given)}. Remove "
                                     "duplicate items from your input and try again.",
                                     param="input", code=None)  # (OpenAI's has none)
            seen.add(given)
        return self

    @model_validator(mode="after")
    def _something_to_answer(self) -> ResponsesRequest:
        if not self.items():
            raise InvalidRequest(
                "`input` holds only reasoning items, which are not put in this model's "
                "prompt: send a message (or a function call's output) to answer.",
                param="input", code="invalid_value")
        return self

    @model_validator(mode="after")
    def _normalized_within_budget(self) -> ResponsesRequest:
        """A tool sent without `strict` is never refused for its normalized schema's size
        (a `required` list on every object: past the schemas' limits where its schema as
        sent was within them): normalized ones are served non-strict as sent, the one
        that grew most first, until the request is within them; for the compiled
        schemas' limit, only of the tools compiled (those a `tool_choice` forces). Each
        schema is counted once: the work is linear in the request, whatever its tools."""
        tools = self.tools or []
        if not any(t._sent is not None for t in tools):
            return self
        choice = self.tool_choice
        forced = choice.name if isinstance(choice, ToolChoiceFunction) else None
        fmt = self.text.format if self.text else None
        text = json_nodes(fmt.schema_) if fmt is not None and fmt.schema_ is not None else 0
        sizes = {id(t): json_nodes(t.parameters) for t in tools}
        compiled = {id(t) for t in tools if choice == "required" or t.name == forced}
        # (the schemas normalized, the one that grew most first)
        grown = sorted((t for t in tools if t._sent is not None),
                       key=lambda t: json_nodes(t._sent) - sizes[id(t)])
        total = text + sum(sizes.values())
        grammar = text + sum(sizes[id(t)] for t in tools if id(t) in compiled)
        for t in grown:  # (compiled ones, within the compiled schemas' limit)
            if grammar <= MAX_GRAMMAR_NODES:
                break
            if id(t) in compiled:
                t.as_sent()
                less = sizes[id(t)] - json_nodes(t.parameters)
                total, grammar = total - less, grammar - less
        for t in grown:  # (any, within the request's limit)
            if total <= MAX_SCHEMA_NODES:
                break
            if t._sent is not None:
                t.as_sent()
                total -= sizes[id(t)] - json_nodes(t.parameters)
        return self

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ResponsesRequest:
        check_unique_names((t.name for t in self.tools or ()), lambda i: f"tools[{i}].name")
        choice = self.tool_choice
        if choice == "required" and not self.tools:
            raise InvalidRequest("Invalid value for `tool_choice`: `required` needs `tools`.",
                                 param="tool_choice", code="invalid_value")
        if isinstance(choice, ToolChoiceFunction) and choice.name not in {
                t.name for t in self.tools or []}:
            raise InvalidRequest(f"Invalid value for `tool_choice`: no function named "
                                 f"`{shown(choice.name)}` is among `tools`.",
                                 param="tool_choice.name",
                                 code="invalid_value")
        return self

    def given(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem
                            | ReasoningItem]:
        """Every input item, as sent."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        # (an UnsupportedItem never validates: it is in the union to be named)
        return [i for i in self.input if not isinstance(i, UnsupportedItem)]

    def items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem]:
        """The input items the prompt is made of: all but reasoning items."""
        return [i for i in self.given() if not isinstance(i, ReasoningItem)]


def given_id(item: MessageItem | FunctionCallItem | FunctionCallOutputItem
             | ReasoningItem) -> str | None:
    """The id the client sent with `item` (None: none, or not a string)."""
    given = (item.model_extra or {}).get("id") if not isinstance(
        item, FunctionCallItem | ReasoningItem) else item.id
    return given if isinstance(given, str) and given else None
