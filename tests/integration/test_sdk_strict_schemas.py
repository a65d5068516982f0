"""The strict schemas the OpenAI Python SDK writes for Pydantic models, sent as its
helpers send them (`chat.completions.parse` with `response_format=Model` or with
`pydantic_function_tool(Model)` tools, `responses.parse` with `text_format=Model` or with
a `to_strict_json_schema(Model)` tool): each shape strict mode takes is served, never
refused by Weir's strict check; each shape it refuses (an open map, an untyped `Any`, a
model open to extra keys) is refused as OpenAI refuses it, with its message, param and
code. The bodies are the SDK's own: its client sends them to a transport that keeps them."""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

import openai
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import (
    AnyUrl,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    SecretStr,
    Tag,
    conint,
    conlist,
    constr,
)
from typing_extensions import TypedDict

from tests.conftest import MakeClient

try:  # (the SDK's own HTTP client: httpx2 where it has moved to it)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Optionals(BaseModel):
    a: int | None
    b: str | None = None
    c: int = 3
    d: list[int] = [1]


class Address(BaseModel):
    street: str
    zip: str


class Person(BaseModel):
    name: str
    address: Address
    previous: list[Address]
    tags: list[str]
    maybe: Address | None = Field(None, description="a nested model, described")


class Pair(BaseModel):
    pair: tuple[int, str]  # prefixItems


class Literals(BaseModel):
    mode: Literal["a", "b"]
    one: Literal["x"]
    mixed: Literal[1, "x", True, None]
    colour: Colour
    level: Level


class Cat(BaseModel):
    kind: Literal["cat"]
    meows: bool


class Dog(BaseModel):
    kind: Literal["dog"]
    barks: int


class Unions(BaseModel):
    pet: Cat | Dog
    either: int | str
    tagged: Annotated[Cat | Dog, Field(discriminator="kind")]  # oneOf


class Untagged(BaseModel):
    pet: Cat | Dog  # anyOf
    either: int | str


def kind_of(v: Any) -> str:
    return str(v.get("kind") if isinstance(v, dict) else v.kind)


class Callable_(BaseModel):
    """A discriminator that is a function: a `oneOf` with no mapping."""

    pet: Annotated[Annotated[Cat, Tag("cat")] | Annotated[Dog, Tag("dog")],
                   Discriminator(kind_of)]


class Tree(BaseModel):
    value: int
    children: list[Tree]


class Chain(BaseModel):
    value: int
    next: Chain | None


class Endless(BaseModel):
    """No finite value fits (`next` is required): still a schema OpenAI takes."""

    next: Endless


class Ping(BaseModel):
    pong: Pong | None
    n: int


class Pong(BaseModel):
    pings: list[Ping]


class Formats(BaseModel):
    when: datetime.datetime
    day: datetime.date
    time: datetime.time
    span: datetime.timedelta
    id: uuid.UUID
    email: Annotated[str, Field(pattern=r"^[^@]+@[^@]+$")]
    amount: decimal.Decimal
    raw: bytes


class Bounds(BaseModel):
    code: constr(pattern=r"^[A-Z]{3}$", min_length=3, max_length=3)  # type: ignore[valid-type]
    n: conint(ge=1, le=10)  # type: ignore[valid-type]
    x: Annotated[float, Field(gt=0, lt=1, multiple_of=0.1)]
    few: Annotated[list[int], Field(min_length=1, max_length=5)]
    unique: set[str]
    frozen: frozenset[int]


class Row(TypedDict):
    a: int
    b: str


@dataclasses.dataclass
class Point:
    x: int
    y: list[str]


class Tags(RootModel[list[str]]):
    pass


class Others(BaseModel):
    """A TypedDict, a dataclass, a root model, an enum default (a `$ref` with siblings,
    inlined), a default factory, a secret, a URL, an open tuple, extra schema keys."""

    row: Row
    point: Point
    tags: Tags
    colour: Colour = Colour.RED
    maybe: Colour | None = None
    address: Address = Field(default_factory=lambda: Address(street="s", zip="z"),
                             description="d")
    secret: SecretStr
    url: AnyUrl
    some: conlist(int, min_length=1)  # type: ignore[valid-type]
    n: int | None = Field(None, ge=0)
    many: tuple[int, ...]
    day: datetime.date | None = None
    old: Annotated[str, Field(json_schema_extra={"x-note": 1}, deprecated=True)]
    spaced: str = Field(alias="first name é")


class Described(BaseModel):
    """A documented model."""

    x: Annotated[int, Field(description="the x", title="X", examples=[1])]


class Empty(BaseModel):
    pass


class HoldsEmpty(BaseModel):
    empty: Empty
    empties: list[Empty]


class KeywordNames(BaseModel):
    """Properties named like schema keywords: names, not keywords."""

    type: str
    properties: int
    ref: str = Field(alias="$ref")
    items: list[int]
    required: bool
    enum: str
    additionalProperties: str
    anyOf: Address
    allOf: int
    not_: int = Field(alias="not")
    defs: str = Field(alias="$defs")
    const: str
    default: str
    format: str


class Forbidding(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int


class Nested(BaseModel):
    grid: list[list[Address]]
    sparse: list[Address | None] | None
    everything: list[Person | Tree | Untagged]


class Map(BaseModel):
    counts: dict[str, int]


class AnyMap(BaseModel):
    data: dict[str, Any]


class Maps(BaseModel):
    rows: list[dict[str, str]]


class Anything(BaseModel):
    value: object


class AnyList(BaseModel):
    values: list[Any]


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int


for _model in (Tree, Chain, Endless, Ping, Pong):
    _model.model_rebuild()

TAKEN = [Optionals, Address, Person, Pair, Literals, Untagged, Tree, Chain,
         Endless, Ping, Formats, Bounds, Others, Described, Empty, HoldsEmpty, KeywordNames,
         Forbidding, Nested]
#: What strict mode refuses in the SDK's schema: where, and what OpenAI says of it.
MISSING = "object schema missing properties."
REFUSED: dict[type[BaseModel], str] = {
    Map: f"In context=('properties', 'counts'), {MISSING}",
    AnyMap: f"In context=('properties', 'data'), {MISSING}",
    Maps: f"In context=('properties', 'rows', 'items'), {MISSING}",
    Anything: "In context=('properties', 'value'), schema must have a 'type' key.",
    AnyList: "In context=('properties', 'values', 'items'), schema must have a 'type' key.",
    Open: "In context=(), 'additionalProperties' is required to be supplied and to be false.",
    # (a discriminated union: the SDK leaves Pydantic's `oneOf`, which OpenAI refuses)
    Unions: "In context=('properties', 'tagged'), 'oneOf' is not permitted.",
    Callable_: "In context=('properties', 'pet'), 'oneOf' is not permitted.",
}

WAYS: dict[str, Callable[[openai.OpenAI, type[BaseModel]], object]] = {
    "chat response_format": lambda c, m: c.chat.completions.parse(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], response_format=m),
    "chat tools": lambda c, m: c.chat.completions.parse(
        model="fake-model", messages=[{"role": "user", "content": "hi"}],
        tools=[openai.pydantic_function_tool(m)]),
    "responses text.format": lambda c, m: c.responses.parse(
        model="fake-model", input="hi", text_format=m),
    "responses tools": lambda c, m: c.responses.parse(
        model="fake-model", input="hi", tools=[{
            "type": "function", "name": m.__name__, "strict": True,
            "parameters": to_strict_json_schema(m)}]),
}
#: Where each way's refusal points, as OpenAI says it: (what, param, code).
REFUSAL = {
    "chat response_format": ("response_format", "response_format", None),
    "chat tools": ("function", "tools[0].function.parameters", "invalid_function_parameters"),
    "responses text.format": ("response_format", "text.format.schema", "invalid_json_schema"),
    "responses tools": ("function", "tools[0].parameters", "invalid_function_parameters"),
}


def sdk_body(way: str, model: type[BaseModel]) -> tuple[str, dict[str, Any]]:
    """The path and body the SDK sends for `model` the `way` a user asks it."""
    sent: list[httpx.Request] = []

    def keep(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(400, json={"error": {"message": "kept", "type": "x"}})

    client = openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(keep)))
    with client, pytest.raises(openai.BadRequestError):
        WAYS[way](client, model)
    assert len(sent) == 1
    return sent[0].url.path, json.loads(sent[0].content)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("model", TAKEN, ids=lambda m: m.__name__)
async def test_the_sdks_strict_schemas_strict_mode_takes_are_served(
        make_client: MakeClient, model: type[BaseModel], way: str) -> None:
    path, body = sdk_body(way, model)
    client = await make_client()
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("model", REFUSED, ids=lambda m: m.__name__)
async def test_the_sdks_strict_schemas_strict_mode_refuses_are_refused_as_openai_does(
        make_client: MakeClient, model: type[BaseModel], way: str) -> None:
    path, body = sdk_body(way, model)
    client = await make_client()
    resp = await client.post(path, json=body)
    assert resp.status == 400
    what, param, code = REFUSAL[way]
    assert (await resp.json())["error"] == {
        "message": f"Invalid schema for {what} '{model.__name__}': {REFUSED[model]}",
        "type": "invalid_request_error", "param": param, "code": code}
