"""The journal ``restart-journal`` starts, built complete in its staging
folder (docs/format.md §Restarted journals): what it replaced, the operations
still open, the one a crash may have lost, and the archives it continues.
"""
from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Optional

from ..storage.database import DEFAULT_BUSY_TIMEOUT_SECONDS
from ..storage.errors import JournalUnavailable
from ..storage.record import (DATABASE_NAME, KIND_ARCHIVED, LOST_TOOL, WAL_SUFFIX, value_hash)
from ..storage.snapshot import DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS
from ..storage.store import JournalStore

# The tool name of the bookkeeping operation that records a restart.
RESTART_TOOL = "crash-recovery.restart-journal"
NO_HASH = value_hash(None)
# The call fields of an operation no tool call started (docs/format.md §Restarted journals).
NO_CALL = {"fingerprint": NO_HASH, "args_hash": NO_HASH, "session_id": None, "tool_call_id": None}


def build_new_journal(staging: str, record: dict, state: dict, *, evidence: str,
                      operator: dict, anchor: Optional[dict], lost: Optional[str],
                      window: dict) -> dict:
    """Write the new journal in ``staging`` in one transaction and fold its
    WAL into the database file, so that it moves as one file; returns its
    checkpoint.  ``record``: the ``restarted_from`` field; ``state``: the old
    journal's last verified state; ``anchor``: the archive its event 1
    continues; ``lost``: the id of the operation that stands for events that
    may be lost, ``window`` its ``lost_window``.  Raises
    :class:`JournalError` and ``OSError``."""
    store = JournalStore(staging, busy_timeout=DEFAULT_BUSY_TIMEOUT_SECONDS, readonly=False,
                         create=True, full_verification=False,
                         full_verification_interval=DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS)
    try:
        bookkeeping = str(uuid.uuid4())
        with store.writing("started") as chain:
            if anchor is not None:
                store.append(chain, {"kind": KIND_ARCHIVED, "archive": anchor})
            store.append(chain, {"kind": "started", "operation_id": bookkeeping,
                                 "tool": RESTART_TOOL, **NO_CALL, "restarted_from": record})
            store.append(chain, {"kind": "resolved", "operation_id": bookkeeping,
                                 "outcome": "completed", "evidence": evidence,
                                 "forced": False, "operator": operator})
            for operation_id, started, old_state, reason, seq in state["open"]:
                fields = {key: started[key] for key in (
                    "tool", "fingerprint", "args_hash", "session_id", "tool_call_id",
                    "timestamp_ns")}
                store.append(chain, {"kind": "started", "operation_id": operation_id, **fields,
                                     "carried_over": {"journal_id": state["journal_id"],
                                                      "started_seq": seq, "state": old_state}})
                if old_state != "pending":
                    store.append(chain, {"kind": "uncertain", "operation_id": operation_id,
                                         "result_hash": NO_HASH, "reason": reason})
            if lost is not None:
                store.append(chain, {"kind": "started", "operation_id": lost, "tool": LOST_TOOL,
                                     **NO_CALL, "lost_in_crash": state["checkpoint"],
                                     "lost_window": window})
                store.append(chain, {"kind": "uncertain", "operation_id": lost,
                                     "result_hash": NO_HASH, "reason": "lost_in_crash"})
            after = chain.checkpoint()
    finally:
        store.close()
    try:
        connection = sqlite3.connect(os.path.join(staging, DATABASE_NAME), isolation_level=None)
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise JournalUnavailable("storage_unavailable", f"folding the new journal's WAL: "
                                 f"{exc}") from None
    if os.path.lexists(os.path.join(staging, DATABASE_NAME + WAL_SUFFIX)):
        raise JournalUnavailable("storage_unavailable", "the new journal's WAL was not folded "
                                 "into its database; nothing was switched")
    return after
