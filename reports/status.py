"""The gate as a document: open, busy or closed; the verified status report
(docs/cli.md §status, docs/guard.md §Inspection tools) and its Prometheus
gauges.  Reads the journal and the call locks; never writes.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

from ..storage.database import DEFAULT_BUSY_TIMEOUT_SECONDS
from ..storage.errors import JournalError, JournalUnavailable
from ..storage.call_lock import held_calls
from ..storage.durable import file_state
from ..storage.lock_holders import wal_writer_pids
from ..storage.platform_support import platform_problem
from ..storage.record import WAL_SUFFIX
from .messages import operation_view, operation_waits_for_a_person

# Gate states (docs/cli.md §status).
GATE_OPEN, GATE_BUSY, GATE_CLOSED = "open", "busy", "closed"
# Rounds of "probe the owners, read the journal again" before open operations
# are reported as they were last seen (a stopped worker settles in two).
SETTLE_ATTEMPTS = 50
# Seconds between two looks at a process that holds the journal's writer lock.
OWNER_POLL_SECONDS = 0.01


def gate_of(ok: bool, unresolved: list, in_flight: Optional[dict]) -> str:
    """``closed`` (an integrity failure, or an open operation whose worker is
    not running it), ``busy`` (a call is running now) or ``open``.
    ``unresolved``: :func:`operation_view` dicts."""
    if not ok or any(operation_waits_for_a_person(view) for view in unresolved):
        return GATE_CLOSED
    return GATE_BUSY if unresolved or in_flight else GATE_OPEN


def settled_views(operations: Sequence[Any], read_open: Callable[[], Sequence[Any]],
                  data_dir: str, *, now_ns: Optional[int] = None) -> list:
    """:func:`operation_view` of the open operations (``operations``: the first
    read, :class:`Operation` or dicts), read so that a call running or just
    finished is never shown as waiting for a person.  A worker holds its call
    lock until its outcome is committed, so a ``pending`` operation whose
    owner is not running is read again (``read_open()``, which may raise):
    still pending, its worker died; gone, it finished and is left out."""
    confirmed: set = set()
    views: list = []
    for _ in range(SETTLE_ATTEMPTS):
        views = [operation_view(operation, data_dir, now_ns=now_ns) for operation in operations]
        doubtful = {view["operation_id"] for view in views
                    if operation_waits_for_a_person(view) and view["state"] == "pending"
                    and view["operation_id"] not in confirmed}
        if not doubtful:
            break
        operations = read_open()
        again = [operation_view(operation, data_dir, now_ns=now_ns, with_owner=False)
                 for operation in operations]
        confirmed |= {view["operation_id"] for view in again
                      if view["state"] == "pending" and view["operation_id"] in doubtful}
    return views


def status_report(journal: Any, data_dir: str, *, now_ns: Optional[int] = None) -> dict:
    """Verified status (docs/cli.md §status, docs/guard.md §Inspection tools):
    ``{"ok", "integrity": "ok" | code, "data_dir", "gate", "checkpoint",
    "unresolved": [operation_view...], "attention": [...], "in_flight",
    "resolved_running": [...]}``, plus ``"error"`` when not ok.  Open
    operations are read with :func:`settled_views`.  Never raises
    :class:`JournalError`."""
    held = held_calls(data_dir)
    in_flight = None
    latest: list = []

    def read_open() -> tuple:
        latest[:] = [journal.status()]
        return latest[0].unresolved

    try:
        unresolved = settled_views(read_open(), read_open, data_dir, now_ns=now_ns)
        status = latest[0]
        pending = {view["operation_id"] for view in unresolved if view["state"] == "pending"}
        in_flight = next((call for call in held if call["operation_id"] in pending), None)
        resolved_running = [call for call in held if call["operation_id"] not in pending
                            and call["operation_id"] is not None  # a tag that says not whose
                            and journal.resolved_while_running(call["operation_id"])]
        busy_timeout = getattr(journal, "busy_timeout", DEFAULT_BUSY_TIMEOUT_SECONDS)
        stuck = stuck_writer(journal.database_path, busy_timeout)
        if stuck is not None:  # every protected call waits for it, then is refused
            raise JournalUnavailable(
                "database_locked", f"process {stuck} has held the journal's writer lock longer "
                f"than the busy timeout without committing: every protected call is refused "
                f"(database_locked) until it lets go. Find out what it is (ps -p {stuck}) and "
                "stop it if it is not a worker finishing a long write", writer_pid=stuck)
    except JournalError as exc:
        return {"ok": False, "integrity": exc.code, "data_dir": data_dir, "gate": GATE_CLOSED,
                "checkpoint": None, "unresolved": [], "attention": [], "in_flight": in_flight,
                "error": exc.to_json()}
    return {"ok": True, "integrity": "ok", "data_dir": data_dir,
            "gate": gate_of(True, unresolved, in_flight), "checkpoint": status.checkpoint,
            "unresolved": unresolved,
            "attention": [operation_view(operation, data_dir, now_ns=now_ns, with_owner=False)
                          for operation in status.attention],
            "in_flight": in_flight, "resolved_running": resolved_running}


def stuck_writer(database_path: str, wait_seconds: float) -> Optional[int]:
    """The pid of a process holding SQLite's writer lock on the journal for
    ``wait_seconds`` (the busy timeout) with no commit meanwhile; None when
    nobody does, writers make progress, or nobody can tell
    (storage/lock_holders.py)."""
    holders = wal_writer_pids(database_path)
    if not holders:
        return None
    progress = (file_state(database_path), file_state(database_path + WAL_SUFFIX))
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        time.sleep(OWNER_POLL_SECONDS)
        try:
            moved = progress != (file_state(database_path),
                                 file_state(database_path + WAL_SUFFIX))
        except OSError:
            return None
        if moved or wal_writer_pids(database_path) != holders:
            return None
    return holders[0]


def absent_journal_status(data_dir: str) -> dict:
    """``status`` of a Hermes profile whose first protected call has not come
    yet (docs/cli.md §status): no journal, the gate open.  Only for the
    profile's own data directory (a typed ``--data-dir`` stays
    ``journal_absent``)."""
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "journal": "absent",
            "gate": GATE_OPEN, "checkpoint": None, "unresolved": [], "attention": [],
            "in_flight": None}


def note_platform_problem(result: dict, data_dir: str) -> dict:
    """Add ``platform_problem`` to a ``status`` document and close its gate
    where this platform cannot give the journal's guarantees (docs/guard.md
    §Platforms).  Returns ``result``."""
    problem = platform_problem(data_dir)
    if problem is not None:
        result["platform_problem"] = problem
        result["gate"] = GATE_CLOSED
    return result


# Exit codes of `status --check` (docs/cli.md §Output).
CHECK_OK, CHECK_ERROR, CHECK_NEEDS_A_PERSON = 0, 1, 3


def check_reasons(result: dict) -> list:
    """Why ``status --check`` does not exit 0 for a ``status`` document:
    ``[{"code", "message"}]``, [] when nothing needs a person (the codes:
    docs/cli.md §status, ``check``).  Every surface shows these sentences."""
    reasons = []
    error = result.get("error") or {}
    if error.get("code"):
        reasons.append({"code": error["code"], "message": str(error.get("message") or "")})
    for key, code in (("poisoned", "guard_poisoned"), ("isolation_problem",
                                                       "isolation_unsupported")):
        if result.get(key):
            reasons.append({"code": code, "message": f"this worker refuses every protected "
                            f"call: {result[key]}"})
    if result.get("platform_problem"):
        reasons.append({"code": "platform_unsupported", "message": "every protected call is "
                        f"refused on this platform: {result['platform_problem']}"})
    waiting = [view for view in result.get("unresolved") or []
               if operation_waits_for_a_person(view)]
    if result.get("ok") and result.get("gate") == GATE_CLOSED and waiting:
        # No age here: the same state reads the same on every surface and every run.
        calls = "; ".join(f"{view['operation_id']} ({view.get('tool')}, {view.get('state')}, "
                          + (f"started {view['started_at']})" if view.get("started_at")
                             else "start time unknown)") for view in waiting[:5])
        reasons.append({"code": "unresolved_operations", "message": f"{len(waiting)} protected "
                        f"call(s) with an unknown outcome block every protected call in this "
                        f"profile: {calls}. Check the real service, then resolve each"})
    for view in result.get("attention") or []:
        reasons.append({"code": "late_outcome", "message": f"operation {view['operation_id']} "
                        f"({view.get('tool')}) ended ({view.get('late_reason')}) after it was "
                        f"resolved as {view.get('outcome')}: compare the two, "
                        "fix the real world if they disagree, then acknowledge it"})
    shown = result.get("settings") or {}
    if shown.get("needs_attention"):
        if shown.get("problem"):
            reasons.append({"code": "settings_problem", "message": "the settings could not be "
                            f"read exactly, so every tool is protected: {shown['problem']}"})
        if shown.get("unmatched_tools") and shown.get("mode") == "protected_tools":
            names = ", ".join(map(str, shown["unmatched_tools"]))
            reasons.append({"code": "unmatched_tools", "message": f"{shown.get('mode')} names "
                            f"{names}, but no tool of this host has that name: it protects "
                            "nothing (a typo leaves the real tool unprotected). Fix the "
                            "spelling, then restart the workers"})
    return reasons


def check_view(result: dict) -> dict:
    """The ``check`` field of a ``status`` document: ``{"exit_code", "reasons":
    check_reasons(result)}``; the exit code 1 when the command failed, 3 when
    it verified but something needs a person, else 0."""
    reasons = check_reasons(result)
    exit_code = (CHECK_ERROR if not result.get("ok") else
                 CHECK_NEEDS_A_PERSON if reasons else CHECK_OK)
    return {"exit_code": exit_code, "reasons": reasons}


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
    shown = result.get("settings")
    if shown:  # inside Hermes, where the profile's settings are known
        gauges += (
            ("settings_problem", "1 if the plugin's settings could not be read exactly (every "
             "tool is then protected), 0 if not.", 1 if shown.get("problem") else 0),
            ("unmatched_tools", "Listed tool names that match no tool the host registered "
             "(-1: the host's tool list is unknown); in protected_tools mode each protects "
             "nothing.", -1 if shown.get("unmatched_tools") is None
             else len(shown["unmatched_tools"])),
            ("settings_attention", "1 if the settings need a person (a problem, or a protected "
             "tool name matching no tool), as status --check says; 0 if not.",
             1 if shown.get("needs_attention") else 0),
            ("agent_reaches_journal", "Tools the settings let run while the gate is closed that "
             "are not known to be read-only (each may change the journal and the settings); 0 "
             "when only read-only tools run then.", len(shown.get("agent_reaches_journal") or [])),
        )
    lines = []
    for name, help_text, value in gauges:
        lines += [f"# HELP crash_recovery_{name} {help_text}",
                  f"# TYPE crash_recovery_{name} gauge", f"crash_recovery_{name}{label} {value}"]
    return "\n".join(lines)


