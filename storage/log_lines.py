"""Every log line the plugin writes is one line, whatever it names
(docs/guard.md §Inside Hermes, Logging).

Names and texts come from models and tools: a line break, ANSI escape, bidi
override or lone surrogate in one could forge an official-looking line in
``agent.log``.  :func:`plugin_logger` attaches a filter that writes every
control, format, line/paragraph separator and lone surrogate in a record's
message and arguments as an escape (``\\n``, ``\\x1b``, ``\\u2028``), a
backslash as ``\\\\``, and indents every line of a traceback.
"""
from __future__ import annotations

import logging
import re
import traceback
import unicodedata
from typing import Any

# Anything but printable ASCII other than the backslash is looked at.
_SUSPECT = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Unicode categories that can break or disguise a line.
_ESCAPED_CATEGORIES = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
# Continuation lines of a traceback start with this (never at column 0).
TRACEBACK_INDENT = "  | "


def escaped(text: str, *, backslash: bool = True) -> str:
    """``text`` with every character that could break or disguise a log line
    escaped.  ``backslash``: double backslashes too (off for a ``repr``)."""
    if _SUSPECT.search(text) is None:
        return text
    return _SUSPECT.sub(_escape if backslash else _escape_keeping_backslash, text)


def _escape_keeping_backslash(match: "re.Match[str]") -> str:
    return match.group(0) if match.group(0) == "\\" else _escape(match)


def _escape(match: "re.Match[str]") -> str:
    character = match.group(0)
    named = _NAMED.get(character)
    if named is not None:
        return named
    code = ord(character)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\x{code:02x}"
    if unicodedata.category(character) in _ESCAPED_CATEGORIES:
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return character


class _Escaping:
    """An argument whose ``%s`` and ``%r`` are escaped."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __str__(self) -> str:
        return escaped(str(self.value))

    def __repr__(self) -> str:
        return escaped(repr(self.value), backslash=False)


def _argument(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value  # %d and %f need the number itself
    return _Escaping(value)


class EscapingFilter(logging.Filter):
    """Escapes a record's message, arguments and traceback (see the module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place; always keep it."""
        if isinstance(record.msg, str):
            record.msg = escaped(record.msg)
        elif record.msg is not None:
            record.msg = _Escaping(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_argument(value) for value in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _argument(value) for key, value in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = indented_traceback(record.exc_info)
        return True


def indented_traceback(exc_info: Any) -> str:
    """A traceback, escaped line by line, each indented by :data:`TRACEBACK_INDENT`."""
    text = "".join(traceback.format_exception(*exc_info)).rstrip("\n")
    return "\n".join(TRACEBACK_INDENT + escaped(line) for line in text.split("\n"))


_FILTER = EscapingFilter()


def plugin_logger(name: str) -> logging.Logger:
    """The logger ``name`` with the escaping filter attached (once)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
