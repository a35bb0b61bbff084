"""Is a tool response an error response?  docs/guard.md §Error classification, nothing else.

A dict -- or text that decodes to a JSON object -- is an error response when it
has a truthy ``error``; ``isError`` true; ``success`` false; ``ok`` false;
``status`` equal to ``error``, ``failed``, ``cancelled`` or ``unknown``; or an
``exit_code`` other than 0.  Anything else is a normal response.

The edge shapes below are decided deliberately; when a shape is ambiguous the
conservative answer (error, so the operation becomes ``uncertain``) wins:

* ``status`` is compared case-insensitively after trimming (``"FAILED"`` is an error).
* ``exit_code``: success only for a number equal to 0 (``0`` or ``0.0``) or null;
  ``true``, ``"0"``, ``"1"``, ``1.0`` and every other value are errors.
* ``success``/``ok``: false, 0, or the text ``"false"``/``"0"``/``"no"`` (any case)
  are errors.  ``isError``: true, 1 or the text ``"true"`` are errors.
* ``error``: truthy by Python's rules, so null, ``""``, 0, false, [] and {} are
  not errors.
* Text: every leading run of characters nobody sees -- whitespace, byte-order
  marks, every control, format, private-use, unassigned or separator
  character, combining marks (on nothing) and blank fillers, in any order and
  number -- is ignored, and so is every trailing run of whitespace and format
  characters; bytes are read as a JSON decoder reads them (UTF-8, or UTF-16/32
  by their shape); text that decodes to
  a JSON *string* is decoded again (double-encoded JSON), up to
  ``MAX_DECODE_DEPTH`` times.  ``NaN`` inside the text is tolerated by the decoder.
* An object in which a watched key (``error``, ``isError``, ``success``, ``ok``,
  ``status``, ``exit_code``) appears more than once is an error: readers
  disagree about which value counts (Python keeps the last, others the first).
* bytes are read as UTF-8 and as the encoding ``json`` detects (UTF-16/32):
  an error in either reading is an error; undecodable bytes are not JSON (normal).
* Text that *is* JSON but is not read here -- nesting deeper than
  ``MAX_NESTING`` arrays and objects (the canonical encoding's limit, the same
  on every Python whatever its recursion limit), an integer longer than
  Python's int-conversion limit -- is an error: it may well be ``{"error": ...}``.  So is text that starts with a JSON
  object and goes on (JSON Lines, a trailing NUL, ``{"error": "x"} (request 7)``):
  ambiguous.  Other syntax errors mean plain text (normal).
* An object whose own methods raise while it is inspected is an error.
* Arrays, numbers, null and non-JSON text are normal responses ("anything
  else"), as are objects whose error sits only in a nested field.
"""
from __future__ import annotations

import json
import unicodedata
from typing import Any

from .storage.record import MAX_NESTING

# Double-encoded JSON is decoded at most this many times: deep enough for every
# wrapper seen in practice, bounded so hostile input cannot loop.
MAX_DECODE_DEPTH = 3
# _decode's answer for a JSON object it cannot take at face value (see above).
_UNDECODABLE = object()
_DECODER = json.JSONDecoder()
ERROR_STATUSES = frozenset({"error", "failed", "cancelled", "unknown"})
WATCHED_KEYS = frozenset({"error", "isError", "success", "ok", "status", "exit_code"})
_FALSE_TEXT = frozenset({"false", "0", "no"})
_TRUE_TEXT = frozenset({"true", "1", "yes"})


def is_error_response(response: Any) -> bool:
    """True if ``response`` (any Python value) is an error response (docs/guard.md §Error classification).

    Never raises for any input shape.
    """
    try:
        if isinstance(response, (bytes, bytearray)):
            return any(_value_is_error(text) for text in _readings(bytes(response)))
        return _value_is_error(response)
    except Exception:  # a dict subclass whose methods raise, and the like
        return True


def _readings(data: bytes) -> list:
    """The texts ``data`` can be: UTF-8 (what a person's terminal shows) and
    the encoding a JSON decoder detects (UTF-16/32 by BOM or NUL pattern);
    none when it decodes as neither (plain bytes: normal)."""
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
    if not isinstance(decoded, dict):
        return False
    return _dict_is_error(decoded)


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
    """Whether decoded JSON holds arrays and objects more than
    ``MAX_NESTING`` deep; level by level, no recursion."""
    level = [value]
    for _ in range(MAX_NESTING):
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, (dict, list))]
        if not level:
            return False
    return True


def _invisible(character: str) -> bool:
    """Whitespace, or a Unicode format character (byte-order mark, zero-width
    space/joiner, word joiner, bidi marks, soft hyphen, ...)."""
    return character.isspace() or unicodedata.category(character) == "Cf"


# Before the JSON, a character nobody sees counts as nothing: every "other"
# (C*: controls such as NUL, format characters, surrogates, private-use and
# unassigned code points), every separator (Z*), every combining mark (M*:
# with nothing before it, it marks nothing; variation selectors too), and the
# letters and symbols that are blank by design (Hangul fillers, braille blank).
_LEADING_CATEGORIES = ("C", "Z", "M")
_BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _unseen_before_json(character: str) -> bool:
    """Whether a person or a JSON decoder would see nothing of ``character``
    in front of a JSON value (a superset of :func:`_invisible`)."""
    return (character.isspace() or character in _BLANK_CHARACTERS
            or unicodedata.category(character)[0] in _LEADING_CATEGORIES)


def strip_invisible(text: str) -> str:
    """``text`` without leading characters nobody sees (:func:`_unseen_before_json`)
    and without trailing whitespace and format characters (:func:`_invisible`;
    anything else after a JSON object makes it ambiguous, hence an error)."""
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
    if response.get("error"):
        return True
    if "isError" in response and _is_true(response["isError"]):
        return True
    for key in ("success", "ok"):
        if key in response and _is_false(response[key]):
            return True
    status = response.get("status")
    if isinstance(status, str) and status.strip().lower() in ERROR_STATUSES:
        return True
    if "exit_code" in response and not _is_zero_exit(response["exit_code"]):
        return True
    return False


def _is_true(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _TRUE_TEXT
    return value is True or (isinstance(value, (int, float)) and value == 1)


def _is_false(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _FALSE_TEXT
    return value is False or (isinstance(value, (int, float)) and not isinstance(value, bool)
                              and value == 0)


def _is_zero_exit(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
