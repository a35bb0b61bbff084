"""The exception family of crash-recovery (docs/cli.md §Verdict codes): a
:class:`JournalError` with a machine-readable ``code`` and JSON-safe
``details``; the subclasses say the kind.  Imports nothing of ours.
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
    """The journal, checkpoint or marker failed verification: protected calls
    stay refused until a person acts (docs/format.md §Verification)."""


class JournalUnavailable(JournalError):
    """The journal cannot be used right now; nothing was changed.  Codes:
    ``database_locked``, ``storage_unavailable``, ``wal_unavailable``,
    ``database_error``, ``journal_absent``, ``read_access_only``."""


class AdmissionRefused(JournalError):
    """The request is valid but the journal's state refuses it.  Codes:
    ``unresolved_operations`` (``details["operations"]``), ``unknown_operation``,
    ``operation_not_open``, ``operation_not_pending``, ``nothing_to_acknowledge``,
    ``invalid_request``, ``invalid_checkpoint``, ``archive_refused``."""


class EncodingError(JournalError, ValueError):
    """A value has no canonical JSON form (docs/format.md §Canonical encoding):
    NaN, infinities, non-JSON types, lone surrogates, non-string keys, or
    nesting too deep.  Code ``non_canonical_value``."""
