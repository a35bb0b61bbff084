"""The gate as a document: open, busy or closed; the verified status report
(docs/cli.md §status, docs/guard.md §Inspection tools) and its Prometheus
gauges.  Reads the journal and the owner lock; never writes.
"""
from __future__ import annotations

from typing import Any, Optional

from ..storage.errors import JournalError
from ..storage.owner import OWNER_RUNNING, probe_lock
from .messages import operation_view

# Gate states (docs/cli.md §status).
GATE_OPEN, GATE_BUSY, GATE_CLOSED = "open", "busy", "closed"



def gate_of(ok: bool, unresolved: list, in_flight: Optional[dict]) -> str:
    """``closed`` (an integrity failure, or an outcome nobody knows: an open
    operation whose worker is not running it), ``busy`` (a call is running
    now: its worker holds the owner lock) or ``open``.  ``unresolved``:
    :func:`operation_view` dicts."""
    if not ok or any(operation_waits_for_a_person(view) for view in unresolved):
        return GATE_CLOSED
    return GATE_BUSY if unresolved or in_flight else GATE_OPEN


def operation_waits_for_a_person(view: dict) -> bool:
    """An open operation that is not a call running right now."""
    return not (view.get("state") == "pending" and view.get("owner") == OWNER_RUNNING)


def status_report(journal: Any, data_dir: str, *, now_ns: Optional[int] = None) -> dict:
    """Verified status (docs/guard.md §Inspection tools, docs/cli.md §status).

    ``{"ok", "integrity": "ok" | code, "data_dir", "gate", "checkpoint",
    "unresolved": [operation_view...], "attention": [...], "in_flight"}``, plus
    ``"error": {code, message, ...}`` when not ok.  Never raises
    :class:`JournalError`.
    """
    in_flight = probe_lock(data_dir)
    try:
        status = journal.status()
    except JournalError as exc:
        return {"ok": False, "integrity": exc.code, "data_dir": data_dir, "gate": GATE_CLOSED,
                "checkpoint": None, "unresolved": [], "attention": [], "in_flight": in_flight,
                "error": exc.to_json()}
    unresolved = [operation_view(operation, data_dir, now_ns=now_ns)
                  for operation in status.unresolved]
    return {"ok": True, "integrity": "ok", "data_dir": data_dir,
            "gate": gate_of(True, unresolved, in_flight), "checkpoint": status.checkpoint,
            "unresolved": unresolved,
            "attention": [operation_view(operation, data_dir, now_ns=now_ns, with_owner=False)
                          for operation in status.attention],
            "in_flight": in_flight}


def prometheus_text(result: dict, *, now_ns: Optional[int] = None) -> str:
    """``status`` as gauges in the node-exporter textfile format (docs/cli.md
    §status --format prometheus)."""
    label = '{data_dir="%s"}' % str(result.get("data_dir", "")).replace("\\", "\\\\").replace(
        '"', '\\"').replace("\n", "\\n")
    unresolved = result.get("unresolved") or []
    checkpoint = result.get("checkpoint") or {}
    gauges = (
        ("unresolved_operations", "Operations whose outcome is unknown (pending or uncertain).",
         len(unresolved)),
        ("oldest_unresolved_age_seconds", "Age of the oldest unresolved operation (0 if none).",
         max((operation["age_seconds"] for operation in unresolved), default=0)),
        ("late_outcomes_unacknowledged", "Resolved operations whose late outcome awaits an "
         "operator's acknowledgement.", len(result.get("attention") or [])),
        ("events", "Events in the live journal segment.", checkpoint.get("count", 0)),
        ("last_verification_ok", "1 if the journal verified, 0 if not.",
         1 if result.get("ok") else 0),
        ("gate_open", "1 if protected calls may run now, 0 if not.",
         1 if result.get("gate") == GATE_OPEN else 0),
        ("gate_closed", "1 if protected calls are refused until a person acts (an unknown "
         "outcome or an integrity failure), 0 if open or busy with a running call.",
         1 if result.get("gate") not in (GATE_OPEN, GATE_BUSY) else 0),
    )
    lines = []
    for name, help_text, value in gauges:
        lines += [f"# HELP crash_recovery_{name} {help_text}",
                  f"# TYPE crash_recovery_{name} gauge", f"crash_recovery_{name}{label} {value}"]
    return "\n".join(lines)


