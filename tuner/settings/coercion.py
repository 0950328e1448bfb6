"""A setting's value as its type: what a YAML file or the command line gives, read by the setting's type hint."""

from __future__ import annotations

from functools import cache
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import ConfigDict, TypeAdapter, ValidationError

from tuner.errors import UserError


def coerce(name: str, value: Any, hint: Any) -> Any:
    """A YAML or command-line value as the setting's type, by its type hint (pydantic's lax conversion:
    "3" for an int, "1e-4" for a float, yes/no for a bool, a list for a tuple; Optional, Literal and
    unions alike); never a non-finite float."""
    try:
        return _adapter(hint).validate_python(value)
    except ValidationError as e:
        kinds = {error["type"] for error in e.errors()}
        if value is None:
            raise UserError(f"Setting {name} needs a value.") from None
        if kinds & {"finite_number"}:
            raise UserError(f"Setting {name} must be a finite number, not {value!r}.") from None
        raise UserError(f"Setting {name} must be {kind_in_words(hint)}, not {value!r}.") from None


@cache
def _adapter(hint: Any) -> TypeAdapter:
    config = ConfigDict(coerce_numbers_to_str=True, allow_inf_nan=False, arbitrary_types_allowed=True)
    return TypeAdapter(hint, config=config)


def kind_in_words(hint: Any) -> str:
    """A type hint in words, for a sentence: an int, a float or None, one of 'a', 'b', ..."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (Union, UnionType):  # None, where allowed, means "the default": not worth a word
        return " or ".join(kind_in_words(a) for a in args if a is not NoneType)
    if hint is NoneType:
        return "None"
    if origin in (tuple, list):
        return f"a list of {', '.join(getattr(a, '__name__', str(a)) for a in args if a is not Ellipsis)} values"
    name = getattr(hint, "__name__", str(hint))
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
