"""What a decoding failure says, in words a person can act on: the field and what was wrong.

`spec.values.gpus: expected a list, got null` rather than msgspec's
"Expected `array`, got `null` - at `$.spec.values.gpus`". Messages name fields and types, never
values, so they are safe to log and to return.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable
from typing import Any, TypeVar, cast

import msgspec

T = TypeVar("T")


NOT_JSON = "not valid JSON"
TOO_DEEP = "nested too deeply"


class BadRequest(ValueError):
    """The request itself is unusable: answered 400, nothing is written."""


class Undecodable(ValueError):
    """Bytes that do not decode into the type asked for; `str()` is the problem, safe to show."""


class Unreadable(Exception):
    """An input of a hook could not be read (API error, timeout); `str()` says why, safe to show
    to anyone."""


@functools.cache
def _decoder(type_: Hashable) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(type_)


def decoder_for(type_: type[T]) -> msgspec.json.Decoder[T]:
    """One decoder per type for the life of the process (building one costs more than a small
    decode)."""
    decoder: msgspec.json.Decoder[T] = _decoder(cast(Hashable, type_))
    return decoder


def decoded(decoder: msgspec.json.Decoder[T], data: bytes | msgspec.Raw, at: str = "") -> T:
    """The one place a msgspec failure becomes words: every decode of input goes through here.
    `at` is where `data` sits in what it was cut from (`spec.values`), for the message's path."""
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as error:
        raise Undecodable(decode_problem(error, at)) from None


def decode_request(decoder: msgspec.json.Decoder[T], body: bytes, what: str) -> T:
    """A request body, or BadRequest: about the body when it is not JSON at all, else naming
    `what` did not fit and where."""
    try:
        return decoded(decoder, body)
    except Undecodable as error:
        problem = str(error)
        if problem in (NOT_JSON, TOO_DEEP):
            raise BadRequest(f"request body is {problem}") from None
        raise BadRequest(f"invalid {what}: {problem}") from None


_TYPE_WORDS = {
    "array": "a list",
    "object": "a map",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
}
_BACKTICKED = re.compile(r"`([^`]*)`")


def _words(type_text: str) -> str:
    return " or ".join(_TYPE_WORDS.get(part.strip(), part.strip()) for part in type_text.split("|"))


def decode_problem(error: msgspec.DecodeError | RecursionError, at: str = "") -> str:
    """Why a sub-object did not decode: the field and what was wrong, invalid JSON (a Raw field's
    UTF-8 is checked only when it is decoded), or nesting too deep for the decoder."""
    if isinstance(error, msgspec.ValidationError):
        return field_problem(error, at)
    if isinstance(error, msgspec.DecodeError):
        return NOT_JSON
    return TOO_DEEP


def field_problem(error: msgspec.ValidationError, at: str = "") -> str:
    """`<field path>: <what was wrong>`, or just what was wrong at the top level."""
    message, _, path = str(error).partition(" - at `$")
    reason = _BACKTICKED.sub(lambda match: _words(match.group(1)), message)
    reason = reason[:1].lower() + reason[1:]
    path = ".".join(part for part in (at, path.rstrip("`").lstrip(".")) if part)
    return f"{path}: {reason}" if path else reason
