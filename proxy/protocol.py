"""OpenAI request models and the parser that turns a body into one.

Requests are pydantic models with `extra="allow"`: unknown fields are accepted, as
OpenAI does. Bounds follow OpenAI's API reference. A validation failure becomes a 400
`invalid_request_error` whose `param` is the dotted path of the first bad field
(`messages[0].content`), which is what the OpenAI SDK shows its users.

Responses are plain JSON-ready dicts built by `proxy.serving`: they are on the hot path
of every cache hit, and validating them is the tests' job (against the official spec).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import InvalidRequest
from .jsonbody import decode_json_object as decode_json_object  # bodies are decoded there

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"]
    text: str


class OtherPart(_Open):
    """Non-text parts (images, audio, files) are parsed so the error can name them."""

    type: str


class ChatMessage(_Open):
    role: Role
    content: str | list[TextPart | OtherPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text, parts concatenated (the form the cache and sanitizer see)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class StreamOptions(_Open):
    include_usage: bool = False


class JsonSchemaFormat(_Open):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise InvalidRequest(
                "`response_format.json_schema` is required when type is `json_schema`.",
                param="response_format.json_schema",
            )
        return self


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Stop = str | Annotated[list[str], Field(max_length=16)]


class _SamplingFields(_Open):
    model: str = Field(min_length=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stop: Stop | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extensions that benchmarks and power users rely on.
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    top_k: int | None = None

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest(
                "`stream_options` is only allowed when `stream` is true.", param="stream_options"
            )
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest(
                "`top_logprobs` requires `logprobs` to be true.", param="top_logprobs"
            )
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[
        list[TokenIds], Field(min_length=1)
    ]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=20)] | None = None
    response_format: ResponseFormat | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class EmbeddingRequest(_Open):
    model: str = Field(min_length=1)
    input: str | Annotated[list[str], Field(min_length=1, max_length=2048)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


def _loc_to_param(loc: tuple[int | str, ...]) -> str:
    """('messages', 0, 'content') -> 'messages[0].content' (pydantic's union tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and (part[0].isupper() or "[" in part or part.startswith(("str", "list"))):
            continue  # union member names such as 'TextPart' or 'list[str]'
        else:
            out += f".{part}" if out else part
    return out


def validation_error(exc: ValidationError) -> InvalidRequest:
    errors = exc.errors(include_url=False)
    # For a union (`stop: str | list[str]`) the first error is usually "not a string";
    # the member that got further (a list that is too long) says more.
    specific = [e for e in errors if not e["type"].endswith("_type")]
    err = (specific or errors)[0]
    param = _loc_to_param(tuple(err["loc"]))
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    where = f" for `{param}`" if param else ""
    code = "missing_required_parameter" if err["type"] == "missing" else "invalid_value"
    return InvalidRequest(f"Invalid value{where}: {msg}.", param=param or None, code=code)


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
