"""The base of every configuration schema (settings, plugin configs, admin bodies).

Strict where YAML is loose: unknown keys are errors, a number is never `.inf` or
`.nan`, and `true`/`false` never stand for a number (pydantic's lax mode reads
`port: true` as port 1). Strings still become numbers where a field is one, so a
`${VAR}` reference is typed by its field.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def takes_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold `true`/`false` (as itself)."""
    if annotation is bool or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Annotated:
        return takes_bool(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(takes_bool(arg) for arg in get_args(annotation))
    if origin is Literal:
        return any(isinstance(arg, bool) for arg in get_args(annotation))
    return False


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not takes_bool(field.annotation):
                raise ValueError(f"`{str(value).lower()}` is not a valid value here")
        return value
