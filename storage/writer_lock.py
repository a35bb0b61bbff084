"""Is another process inside a write transaction of the journal right now?
(docs/format.md §Verification: what a reader may conclude.)

In WAL mode SQLite marks its one writer with a POSIX record lock on byte 120
of the ``-shm`` file (the WAL write lock), held from ``BEGIN IMMEDIATE`` to
the end of COMMIT or ROLLBACK -- exactly the span in which a writer of ours
replaces ``head.json``, the marker or (archive switch) both.  A reader can
ask the kernel who holds that byte (``F_GETLK``) without taking any lock, so
a read-only check can tell "the files disagree because a writer is half-way"
from "the files disagree".

Hazard: closing *any* descriptor of a file drops every POSIX lock this process
holds on it.  While this process has a connection to the journal (SQLite
holds read locks on ``-shm``), the descriptor used to ask is therefore kept
until its last connection closes (:func:`database.companion_descriptor`).
"""
from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import time
from typing import Iterator, Optional

try:
    import fcntl
except ImportError:  # Windows: nobody can tell
    fcntl = None  # type: ignore[assignment]

from .database import companion_descriptor
from .durable import file_state
from .record import SHM_SUFFIX, WAL_SUFFIX

# SQLite's unix VFS: the shared-memory locks start at byte 120; the first is
# the WAL write lock.
WAL_WRITE_LOCK_OFFSET = 120
# ``struct flock`` on Linux (64-bit off_t): l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = "@hhqqi4x"
_WRITING_LOCK = threading.Lock()
# Write transactions of this process in progress: database path -> thread ids.
_WRITING: dict = {}
# Seconds between two looks at a writer that may be stuck (stuck_writer).
STUCK_POLL_SECONDS = 0.01


@contextlib.contextmanager
def writing_here(database_path: str) -> Iterator[None]:
    """Mark a write transaction of this thread on ``database_path``: the
    kernel does not report a process's own locks to itself, so the other
    threads of this process learn it here."""
    thread = threading.get_ident()
    with _WRITING_LOCK:
        _WRITING.setdefault(database_path, []).append(thread)
    try:
        yield
    finally:
        with _WRITING_LOCK:
            _WRITING[database_path].remove(thread)
            if not _WRITING[database_path]:
                del _WRITING[database_path]


def writer_pid(database_path: str) -> Optional[int]:
    """The pid of the process holding the journal's WAL write lock now (this
    process's own while another of its threads is inside
    :func:`writing_here`), 0 when nobody does (or no ``-shm`` exists: no
    connection anywhere), None when this platform cannot tell.  Never takes a
    file lock; never raises."""
    with _WRITING_LOCK:
        if set(_WRITING.get(database_path, ())) - {threading.get_ident()}:
            return os.getpid()
    if fcntl is None or not sys.platform.startswith("linux"):
        return None
    request = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, WAL_WRITE_LOCK_OFFSET, 1, 0)
    try:
        with companion_descriptor(database_path, database_path + SHM_SUFFIX) as descriptor:
            answer = struct.unpack(_FLOCK, fcntl.fcntl(descriptor, fcntl.F_GETLK, request))
    except FileNotFoundError:
        return 0
    except OSError:
        return None
    return 0 if answer[0] == fcntl.F_UNLCK else int(answer[4]) or -1


def _reset_in_child() -> None:
    """A forked child writes nothing of its parent's (docs/guard.md §Child processes)."""
    global _WRITING_LOCK
    _WRITING_LOCK = threading.Lock()
    _WRITING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def stuck_writer(database_path: str, wait_seconds: float) -> Optional[int]:
    """The pid of a process holding the journal's WAL write lock for
    ``wait_seconds`` (a protected call's busy timeout: the time after which it
    is refused ``database_locked``) with no commit meanwhile; None when nobody
    holds it that long, when writers make progress, or when this platform
    cannot tell.  Polls every :data:`STUCK_POLL_SECONDS`; never raises."""
    holder = writer_pid(database_path)
    if not holder:
        return None
    progress = (file_state(database_path), file_state(database_path + WAL_SUFFIX))
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        time.sleep(STUCK_POLL_SECONDS)
        try:
            moved = progress != (file_state(database_path),
                                 file_state(database_path + WAL_SUFFIX))
        except OSError:
            return None
        if moved or writer_pid(database_path) != holder:
            return None
    return holder
