"""Helpers shared by the reliability tests (crash matrix, tamper, bad input,
fail-closed, concurrency).  Not a test module."""
from __future__ import annotations

from support import reference


def logical_snapshot(case, data_dir=None):
    """What a refusal must not change: every file's bytes except SQLite's own
    (``journal.sqlite3`` is compared by content -- a later process may
    checkpoint the WAL into it, which rewrites bytes but not rows), the event
    rows and the metadata rows."""
    data_dir = data_dir or case.data_dir
    state = case.snapshot(data_dir)
    state["files"].pop("journal.sqlite3", None)
    if "rows" in state and not isinstance(state["rows"], str):
        try:
            state["metadata"] = sorted(reference.read_rows(data_dir).get("metadata", []))
        except Exception as exc:  # noqa: BLE001 - an unreadable database is a state too
            state["metadata"] = f"unreadable: {type(exc).__name__}"
    return state


import os
import tempfile

from support import JournalTestCase

# tmpfs makes fsync free.  A SIGKILL leaves the page cache intact, so every
# process-crash verdict is the same on tmpfs as on a disk; only power loss
# differs, which no test here simulates.  CRASH_RECOVERY_TEST_TMP overrides.
FAST_TMP = os.environ.get("CRASH_RECOVERY_TEST_TMP") or (
    "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None)


class ReliabilityCase(JournalTestCase):
    """:class:`JournalTestCase` whose temporary directories live on tmpfs."""

    def setUp(self):
        saved = tempfile.tempdir
        tempfile.tempdir = FAST_TMP or saved
        try:
            super().setUp()
        finally:
            tempfile.tempdir = saved
