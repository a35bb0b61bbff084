"""Is a tool response an error response?  docs/guard.md §Error classification, nothing else.

A dict, or text decoding to a JSON object, is one when it has a truthy
``error``, ``isError`` true, ``success``/``ok`` false, ``status`` in
:data:`ERROR_STATUSES` or a non-zero ``exit_code``.  Edge cases follow the docs'
table (ambiguous shapes are errors): text is read past invisible characters
(:func:`strip_invisible`) and decoded up to ``MAX_DECODE_DEPTH`` times; bytes
as UTF-8 and as ``json`` detects; a repeated watched key, JSON too deep, or an
object followed by more text is an error; arrays, numbers, other text and
nested errors are normal.
"""
from __future__ import annotations

import json
import unicodedata
from typing import Any

from .storage.record import MAX_NESTING

# Enough for every wrapper seen in practice; bounded against hostile input.
MAX_DECODE_DEPTH = 3
# _decode's answer for a JSON object it cannot take at face value (see above).
_UNDECODABLE = object()
_DECODER = json.JSONDecoder()
ERROR_STATUSES = frozenset({"error", "failed", "cancelled", "unknown"})
WATCHED_KEYS = frozenset({"error", "isError", "success", "ok", "status", "exit_code"})
_FALSE_TEXT = frozenset({"false", "0", "no"})
_TRUE_TEXT = frozenset({"true", "1", "yes"})


def is_error_response(response: Any) -> bool:
    """True if ``response`` (any Python value) is an error response; never raises."""
    try:
        if isinstance(response, (bytes, bytearray)):
            return any(_value_is_error(text) for text in _readings(bytes(response)))
        return _value_is_error(response)
    except Exception:  # a dict subclass whose methods raise, and the like
        return True


def _readings(data: bytes) -> list:
    """``data`` as UTF-8 and as the encoding ``json`` detects (each that decodes)."""
    texts = []
    for encoding in ("utf-8", json.detect_encoding(data)):
        try:
            text = data.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            continue
        if text not in texts:
            texts.append(text)
    return texts


def _value_is_error(response: Any) -> bool:
    decoded = _decode(response)
    if decoded is _UNDECODABLE or isinstance(decoded, _RepeatedKeys):
        return True
    return isinstance(decoded, dict) and _dict_is_error(decoded)


def _decode(response: Any) -> Any:
    """Turn text into the JSON value it carries; other values pass."""
    value = response
    for _ in range(MAX_DECODE_DEPTH + 1):
        if not isinstance(value, str):
            return value
        text = strip_invisible(value)
        if not text or text[0] not in '{"':
            return None  # only objects, or strings that may hold one, matter
        try:
            value = json.loads(text, object_pairs_hook=_object)
        except json.JSONDecodeError:
            return _UNDECODABLE if _starts_with_object(text) else None
        except (ValueError, RecursionError):
            return _UNDECODABLE  # JSON too deep or with a too-long integer
        if len(text) > 2 * MAX_NESTING and _nested_too_deep(value):
            return _UNDECODABLE  # Python 3.13+ decodes deeper than 3.11: our limit decides
    return value if not isinstance(value, str) else None


def _nested_too_deep(value: Any) -> bool:
    """Whether ``value`` nests more than ``MAX_NESTING`` deep (no recursion)."""
    level = [value]
    for _ in range(MAX_NESTING):
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, (dict, list))]
        if not level:
            return False
    return True


def _invisible(character: str) -> bool:
    """Whitespace, or a Unicode format character (BOM, zero-width, bidi...)."""
    return character.isspace() or unicodedata.category(character) == "Cf"


# Unseen before JSON: categories C*, Z*, M* (marks nothing) and blank fillers.
_LEADING_CATEGORIES = ("C", "Z", "M")
_BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _unseen_before_json(character: str) -> bool:
    """Whether nobody sees ``character`` before a JSON value (more than :func:`_invisible`)."""
    return (character.isspace() or character in _BLANK_CHARACTERS
            or unicodedata.category(character)[0] in _LEADING_CATEGORIES)


def strip_invisible(text: str) -> str:
    """``text`` without leading unseen and trailing :func:`_invisible` characters."""
    start, end = 0, len(text)
    while start < end and _unseen_before_json(text[start]):
        start += 1
    while end > start and _invisible(text[end - 1]):
        end -= 1
    return text[start:end]


class _RepeatedKeys(dict):
    """A decoded object in which a watched key appears more than once."""


def _object(pairs: list) -> dict:
    """``object_pairs_hook``: a dict, marked when a watched key repeats."""
    result = dict(pairs)
    if len(result) != len(pairs):
        keys = [key for key, _ in pairs]
        if any(keys.count(key) > 1 for key in WATCHED_KEYS):
            return _RepeatedKeys(result)
    return result


def _starts_with_object(text: str) -> bool:
    """Does ``text`` begin with a complete JSON object (followed by more)?"""
    try:
        value, _ = _DECODER.raw_decode(text)
    except RecursionError:
        return True  # an object too deep to read (a shallower one would be): conservative
    except ValueError:
        return False
    return isinstance(value, dict)


def _dict_is_error(response: dict) -> bool:
    status = response.get("status")
    return bool(response.get("error")
                or ("isError" in response and _is_true(response["isError"]))
                or any(key in response and _is_false(response[key]) for key in ("success", "ok"))
                or (isinstance(status, str) and status.strip().lower() in ERROR_STATUSES)
                or ("exit_code" in response and response["exit_code"] is not None
                    and not _is_number_zero(response["exit_code"])))


def _is_true(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _TRUE_TEXT
    return value is True or (isinstance(value, (int, float)) and value == 1)


def _is_false(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _FALSE_TEXT
    return value is False or _is_number_zero(value)


def _is_number_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
