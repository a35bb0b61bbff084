"""The exception family of crash-recovery (docs/cli.md §Verdict codes).

Every failure of the journal is a :class:`JournalError` carrying a short
machine-readable ``code`` (the verdict code people, models and monitoring see)
and a JSON-safe ``details`` dict.  The subclasses say what kind of failure it is:

* :class:`IntegrityError` -- the journal, the checkpoint or the marker failed
  verification; protected calls are refused until a person investigates;
* :class:`JournalUnavailable` -- the journal cannot be used right now (locked,
  unwritable, absent); nothing was changed;
* :class:`AdmissionRefused` -- the request is valid but the journal's state
  refuses it (an operation is open, an unknown operation id, ...);
* :class:`EncodingError` -- a value has no canonical JSON form.

This module imports nothing of ours: every other module may raise these.
"""
from __future__ import annotations

from typing import Any


def short(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (plus ``...``) for messages."""
    return text if len(text) <= limit else text[:limit] + "..."


class JournalError(Exception):
    """Any failure of the journal.  ``code`` is a short machine-readable label,
    ``message`` a sentence for people, ``details`` JSON-safe extra facts."""

    def __init__(self, code: str, message: str, **details: Any):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details

    def to_json(self) -> dict:
        """The error as a JSON-safe dict ``{"code", "message", **details}``."""
        return {"code": self.code, "message": self.message, **self.details}


class IntegrityError(JournalError):
    """The journal, the checkpoint or the marker failed verification
    (docs/format.md §Verification; codes in docs/cli.md §Verdict codes)."""


class JournalUnavailable(JournalError):
    """The journal cannot be used right now; nothing was changed.

    Codes: ``database_locked``, ``storage_unavailable``, ``wal_unavailable``,
    ``database_error``, ``journal_absent``, ``read_access_only``.
    """


class AdmissionRefused(JournalError):
    """The request is valid but the journal's state refuses it.

    Codes: ``unresolved_operations`` (``details["operations"]`` lists them),
    ``unknown_operation``, ``operation_not_open``, ``operation_not_pending``,
    ``nothing_to_acknowledge``, ``invalid_request``, ``invalid_checkpoint``,
    ``archive_refused``.
    """


class EncodingError(JournalError, ValueError):
    """A value has no canonical JSON form (docs/format.md §Canonical encoding):
    NaN, infinities, non-JSON types, lone surrogates, non-string keys, or
    nesting too deep.  Code ``non_canonical_value``."""
