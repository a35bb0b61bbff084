"""Calls out: can any protected call's outcome still arrive?  (docs/format.md
§Archives, docs/guard.md §Concurrency.)

An archive switch starts a new journal; an outcome that arrives afterwards
for an operation of the sealed one can no longer be recorded (its operation
is not in the live segment).  So a switch happens only when no call is out.

While a worker has a protected call out -- from before its ``started`` event
is written until its outcome (or late outcome) is recorded -- it holds a
shared ``flock`` on the journal's database file.  The switch, holding the
writer lock, tries the exclusive lock for a moment (:func:`refuse_calls_out`):
it fails while any call is out, whatever happened to ``owner.lock`` (deleted,
replaced or moved aside while the call ran) -- the database file cannot be
removed or replaced without the journal failing verification.  A worker that
takes the shared lock after that moment cannot write ``started`` before the
switch commits (it needs the writer lock), so its call lands in the new journal.

``flock`` locks are independent of SQLite's own (``fcntl``) locks on Linux and
the BSDs.  A raw descriptor of the database file must not be closed while
this process has an SQLite connection to it (that would drop the connection's
POSIX locks), so every descriptor here is closed through
:func:`database.close_database_descriptor`.  A forked child closes its copy
of the worker's descriptor without unlocking (the lock is the parent's).
"""
from __future__ import annotations

import os
import time
from typing import Optional

from . import forksafe
from .database import close_database_descriptor
from .errors import AdmissionRefused

try:
    import fcntl
except ImportError:  # Windows: no flock; archives then rely on owner.lock alone
    fcntl = None  # type: ignore[assignment]

# The switch holds the exclusive lock for microseconds; a worker retries this
# many times, this many seconds apart, before it gives up.
ACQUIRE_ATTEMPTS = 20
ACQUIRE_PAUSE_SECONDS = 0.005
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class CallLease:
    """The worker's side: hold the shared lock while one call is out.

    ``database_path``: the journal's ``journal.sqlite3``.  ``acquire()``
    returns False when the lock could not be taken (an archive switch was
    checking at that moment); ``release()``
    unlocks (a no-op when nothing is held); ``close()`` gives the descriptor
    back.  Not thread-safe by itself: the guard serializes its calls.
    """

    def __init__(self, database_path: str):
        self.path = database_path
        self._descriptor: Optional[int] = None
        self._held = self._closing = False
        forksafe.register(self)

    def _after_fork_in_child(self) -> None:
        descriptor, self._descriptor = self._descriptor, None
        self._held = self._closing = False
        if descriptor is not None:  # the child holds no POSIX locks on the file
            try:
                os.close(descriptor)
            except OSError:
                pass

    def acquire(self) -> bool:
        """Take the shared lock; False when an archive switch holds it right
        now.  Raises ``OSError`` when the database file cannot be opened."""
        if fcntl is None:
            return True
        if self._descriptor is None:
            self._descriptor = os.open(self.path, _OPEN_FLAGS)
        self._closing = False
        for attempt in range(ACQUIRE_ATTEMPTS):
            try:
                fcntl.flock(self._descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
                self._held = True
                return True
            except BlockingIOError:
                if attempt < ACQUIRE_ATTEMPTS - 1:
                    time.sleep(ACQUIRE_PAUSE_SECONDS)
        return False

    def release(self) -> None:
        """Unlock (the descriptor stays open for the next call, unless
        :meth:`close` was asked for meanwhile)."""
        if self._held and self._descriptor is not None:
            self._held = False
            try:
                fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            except OSError:
                pass
        if self._closing:
            self.close()

    def close(self) -> None:
        """Give the descriptor back (idempotent); while a call is out, only
        once that call's :meth:`release` has run."""
        self._closing = self._held
        if self._held:
            return
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            close_database_descriptor(self.path, descriptor)


def refuse_calls_out(database_path: str) -> None:
    """The switch's side, under the writer lock: raise
    :class:`AdmissionRefused` ``owner_running`` while any worker has a call
    out (its outcome can still arrive).  Changes nothing."""
    if fcntl is None:
        return
    try:
        descriptor = os.open(database_path, _OPEN_FLAGS)
    except OSError:
        return  # the journal's own verification names a missing database
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AdmissionRefused(
                "owner_running", "a protected call is still out in this profile: its outcome "
                "can still arrive, and it must find its operation in the live journal. "
                "Archive when it has finished (a worker hung in a call, even one an operator "
                "resolved, must be stopped first); nothing was changed") from None
        except OSError:
            return
        fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        close_database_descriptor(database_path, descriptor)
