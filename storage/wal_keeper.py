"""The WAL keeper: nobody folds and deletes the journal's WAL while a process
of ours has the journal open (docs/guard.md §In-process code).

Before SQLite's last connection to a database closes, it takes an EXCLUSIVE
lock on the database file -- a write lock over the *shared range*, 510 bytes
from ``PENDING_BYTE + 2`` -- and only when it gets it does it checkpoint the
WAL into the database and delete it.  SQLite's own locks are POSIX record
locks, and code inside a worker that opens and closes ``journal.sqlite3``
itself drops them all; another process -- a worker of ours, the ``sqlite3``
shell, a backup tool -- then gets that lock at its close and deletes the WAL
the worker still writes to: events committed there would be lost.

So every read-write connection of ours is opened under a keeper: an *open
file description* lock for reading over the shared range (``F_OFD_SETLK``,
Linux), on a descriptor of its own.  Such a lock belongs to that descriptor,
not to the process, so no close elsewhere drops it, and it conflicts with
every other lock holder's write lock over the range -- POSIX or OFD, of any
process, this one included.  While any keeper holds it, no connection
anywhere gets EXCLUSIVE, and the WAL stays.

A connection closes with its keeper let go first only when its journal was
last seen healthy (docs/format.md §Files): the last such process then lets
SQLite fold the WAL as usual.  A process that refuses a journal keeps the
keeper through the close, so a refusal changes no byte of it.  Where open file
description locks do not exist, connections close the SQLite way (which lost
locks defeat; docs/guard.md says so).
"""
from __future__ import annotations

import errno
import os
import struct
import time
from typing import Optional

from . import forksafe
from .durable import open_regular_file

try:
    import fcntl
except ImportError:  # Windows: nothing here to coordinate with
    fcntl = None  # type: ignore[assignment]

# SQLite's unix VFS (os_unix.c): PENDING_BYTE, then RESERVED, then the shared range.
PENDING_BYTE = 0x40000000
SHARED_FIRST = PENDING_BYTE + 2
SHARED_SIZE = 510
# ``struct flock`` on Linux (64-bit off_t): l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = "@hhqqi4x"
SUPPORTED = fcntl is not None and hasattr(fcntl, "F_OFD_SETLK")
# A file system that refuses open file description locks with one of these:
# its connections close the SQLite way.
_NOT_SUPPORTED_HERE = frozenset(getattr(errno, name) for name in (
    "EINVAL", "EOPNOTSUPP", "ENOTSUP", "ENOLCK", "ENOSYS") if hasattr(errno, name))
_PAUSE_SECONDS = 0.002


def _request(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, SHARED_FIRST, SHARED_SIZE, 0)


class WalKeeper:
    """The keeper of one read-write connection to ``database_path``.

    ``hold(timeout)`` takes the lock (raises ``OSError``; waits up to
    ``timeout`` seconds while another process is closing the database with
    SQLite's EXCLUSIVE lock); ``let_go()`` releases it before a healthy close;
    ``close()`` gives the descriptor back after the connection closed (a
    descriptor of the database: closed earlier, it would drop this process's
    POSIX locks on the file).  Not thread-safe by itself.
    """

    def __init__(self, database_path: str):
        self.path = database_path
        self._descriptor: Optional[int] = None

    def hold(self, timeout: float) -> None:
        if not SUPPORTED:
            return
        descriptor = forksafe.open_registered(
            lambda: open_regular_file(self.path, os.O_RDONLY | os.O_CLOEXEC))
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.fcntl(descriptor, fcntl.F_OFD_SETLK, _request(fcntl.F_RDLCK))
                break
            except OSError as exc:
                if exc.errno in _NOT_SUPPORTED_HERE:  # this file system: SQLite's rules only
                    forksafe.forget(descriptor)
                    os.close(descriptor)
                    return
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    forksafe.forget(descriptor)
                    os.close(descriptor)
                    raise
            time.sleep(_PAUSE_SECONDS)  # another process is closing it right now
        self._descriptor = descriptor

    def let_go(self) -> None:
        """Release the lock, keeping the descriptor (never raises)."""
        if self._descriptor is not None:
            try:
                fcntl.fcntl(self._descriptor, fcntl.F_OFD_SETLK, _request(fcntl.F_UNLCK))
            except OSError:
                pass

    def close(self) -> None:
        """Release and give the descriptor back (idempotent, never raises)."""
        if self._descriptor is not None:
            self.let_go()  # a child forked meanwhile may share the description: unlock it for both
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            forksafe.forget(descriptor)
            try:
                os.close(descriptor)
            except OSError:
                pass


def journal_open_elsewhere(database_path: str) -> Optional[bool]:
    """Whether any connection anywhere has the journal open: a keeper of ours,
    or any SQLite connection (its shared lock), in any process.  Ask with no
    connection of this process open to it (this process's own locks count
    too).  None when this platform cannot tell; False when the file is gone.
    Never raises."""
    if not SUPPORTED:
        return None
    try:
        descriptor = os.open(database_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        found = fcntl.fcntl(descriptor, fcntl.F_OFD_GETLK, _request(fcntl.F_WRLCK))
        return struct.unpack(_FLOCK, found)[0] != fcntl.F_UNLCK
    except OSError:
        return None
    finally:
        os.close(descriptor)
