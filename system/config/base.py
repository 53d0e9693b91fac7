"""The strict base model every config section derives from.

Numbers are strict in every section, here once: a float field refuses ``inf`` and ``nan``
(``allow_inf_nan=False``), an int or float field refuses a boolean (YAML's ``true`` would
otherwise become 1), and an int must fit in 64 bits (seeds and counts reach numpy and torch).
Strings from YAML or dotted overrides (``1e-3``) still convert to numbers as before. A boolean
field takes only a boolean (YAML's ``true``/``false``, ``yes``/``no``, ``on``/``off``): pydantic
would otherwise read ``1``, ``0.0`` or the string ``n`` as one (found by a probe).
"""

import os
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

INT64_MAX = 2**63 - 1

MAX_TIMEOUT_S = 1e6
"""The longest timeout a config takes (about 11.6 days): torch's stores count milliseconds and
``timedelta`` days, and far above this (from ~8e9 s) a broadcast spun or failed at once, and
``timedelta`` overflows; a user wanting no limit in practice writes 1e6."""


def _holds(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """True for one of ``kinds`` and unions / ``Annotated`` wrappers holding one."""
    if annotation in kinds:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        args = typing.get_args(annotation)
        return any(_holds(a, kinds) for a in (args[:1] if origin is typing.Annotated else args))
    return False


def _is_number_type(annotation: Any) -> bool:
    """True for ``int``, ``float`` and unions / ``Annotated`` wrappers holding one (not ``bool``)."""
    return _holds(annotation, (int, float))


class StrictModel(BaseModel):
    """Frozen, unknown keys rejected, attribute docstrings become field descriptions, strict numbers."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
        populate_by_name=True,
        allow_inf_nan=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _bools_and_numbers_apart(cls, data: Any) -> Any:
        # A model-level check: pydantic allows no field "before" validator on a union's ``type``.
        if not isinstance(data, dict):
            return data
        errors = []
        for name, field in cls.model_fields.items():
            for key in {name, field.alias or name}:
                value = data.get(key)
                if isinstance(value, bool) and _is_number_type(field.annotation):
                    errors.append(InitErrorDetails(
                        type=PydanticCustomError("bool_not_number", "expected a number, got the boolean {value}",
                                                 {"value": str(value).lower()}),
                        loc=(key,), input=value,
                    ))
                elif (value is not None and not isinstance(value, bool) and _holds(field.annotation, (bool,))
                      and not _is_number_type(field.annotation)):
                    errors.append(InitErrorDetails(
                        type=PydanticCustomError("number_not_bool", "expected true or false, got {value}",
                                                 {"value": repr(value)}),
                        loc=(key,), input=value,
                    ))
        if errors:  # raised as a ValidationError so that each error sits at its field (supported by pydantic-core)
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: Any) -> Any:
        if type(value) is int and not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise PydanticCustomError("int64_range", "integer out of the signed 64-bit range")
        return value


def expand_home(value: str) -> str:
    """``~`` or ``~user`` at the start of a path expanded (``~/runs/x`` in a preset: the home directory,
    not ``./~``); a ``~user`` with no such user is refused (a probe: ``~nosuchuser/run`` became
    ``./~nosuchuser/run`` without a word). ``~`` with ``HOME`` set but empty is refused too: expanded, it
    named the root directory (``~/runs/x`` became ``/runs/x``)."""
    if (value == "~" or value.startswith("~" + os.sep)) and os.environ.get("HOME") == "":
        raise ValueError(f"{value!r}: HOME is set but empty, so '~' names no directory")
    expanded = os.path.expanduser(value)
    if value.startswith("~") and expanded == value:
        raise ValueError(f"{value.split(os.sep)[0]!r}: no such user's home directory")
    return expanded
