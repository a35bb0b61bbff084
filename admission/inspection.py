"""The model's two read-only inspection tools and the worker's status report
(docs/guard.md §Inspection tools).  Each takes the profile's :class:`gate.Gate`
and writes nothing; what a model gets (:mod:`reports.chat`) names no path, pid
or command that changes the journal.
"""
from __future__ import annotations

import json
from typing import Any

from ..reports.chat import chat_status, chat_verify
from ..reports.status import GATE_CLOSED, status_report as journal_status_report
from ..storage.errors import AdmissionRefused, JournalError
from .settings import with_attention


def status_report(gate: Any) -> dict:
    """The ``status`` document (docs/cli.md §status) with this worker's own
    refusals (``poisoned``, ``isolation_problem``), which close its gate."""
    settings = with_attention({**gate.settings().to_json(), **gate.tool_names_view()})
    try:
        journal = gate.journal()
    except JournalError as exc:
        return {"ok": False, "integrity": exc.code, "gate": GATE_CLOSED,
                "error": exc.to_json(), "unresolved": [], "settings": settings}
    result = journal_status_report(journal, journal.data_dir)
    result["settings"] = settings
    if gate.poisoned:
        result.update(ok=False, gate=GATE_CLOSED, poisoned=gate.poisoned)
    if gate.isolation_problem:
        result.update(ok=False, gate=GATE_CLOSED, isolation_problem=gate.isolation_problem)
    return result


def verify_report(gate: Any, checkpoint: Any = None) -> dict:
    """A full verification (against an ancestor ``checkpoint`` dict if given):
    ``{"ok", "integrity", "checkpoint", "unresolved_count",
    "external_checkpoint"}`` or ``{"ok": False, "integrity", "error"}``."""
    try:
        journal = gate.journal()
        journal.status()  # this worker's own gate first (e.g. wal_missing): one verdict
        # A fresh connection: the worker's may cache pages edited behind SQLite's back.
        with gate.journal_class(journal.data_dir, readonly=True) as fresh:
            status = fresh.verify(checkpoint)
    except AdmissionRefused as exc:  # a malformed checkpoint; the journal verified
        return {"ok": False, "integrity": "ok", "error": exc.to_json()}
    except JournalError as exc:
        return {"ok": False, "integrity": exc.code, "error": exc.to_json()}
    return {"ok": True, "integrity": "ok", "checkpoint": status.checkpoint,
            "unresolved_count": len(status.unresolved),
            "external_checkpoint": "ancestor" if checkpoint is not None else None}


def _answer(document: Any) -> str:
    return json.dumps(document, sort_keys=True, default=str)


def _internal_error(exc: Exception) -> str:
    return _answer({"ok": False, "error": {"code": "internal_error",
                                           "message": type(exc).__name__}})


def status_tool(gate: Any) -> str:
    """Handler of ``crash_recovery_status``: JSON text; never raises."""
    try:
        return _answer(chat_status(status_report(gate), gate.prefix()))
    except Exception as exc:
        return _internal_error(exc)


def verify_tool(gate: Any, args: Any) -> str:
    """Handler of ``crash_recovery_verify``: ``args`` is ``{}`` or
    ``{"checkpoint": {...}}``; JSON text; never raises."""
    try:
        checkpoint = args.get("checkpoint") if isinstance(args, dict) else None
        return _answer(chat_verify(verify_report(gate, checkpoint)))
    except Exception as exc:
        return _internal_error(exc)
