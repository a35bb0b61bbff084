"""No process of ours ever folds and deletes the journal's WAL while another of
our processes has the journal open (docs/guard.md §In-process code).

SQLite's locks are POSIX record locks: code inside a worker that opens and
closes ``journal.sqlite3`` itself drops them all.  When the last connection of
*another* process then closes, SQLite believes it is the last one anywhere,
checkpoints the WAL into the database and deletes it -- while the worker still
writes to its open, now unlinked, WAL: events committed there are lost.

So every process of ours with a read-write connection to a journal also holds
an *open file description* lock (``F_OFD_SETLK``, Linux) for reading on one
byte of ``journal.sqlite3`` that SQLite never locks (:data:`REGISTRY_OFFSET`).
Such a lock belongs to the descriptor that took it: closing another
descriptor of the file never drops it.  A process closes its last read-write
connection the normal way (SQLite may then checkpoint and delete the WAL) only
when no other descriptor holds that byte, i.e. no other process of ours has
the journal open; otherwise the connection is *parked*: kept open and never
closed by this process -- not even at interpreter exit (its reference count is
pinned), so SQLite's close never runs and the WAL stays.  A parked connection
is handed back to the next read-write opening of the same file in this
process, so nothing accumulates.  Read-only connections never checkpoint or
delete the WAL (they cannot take SQLite's exclusive lock) and take no part.
Where open file description locks do not exist, connections close the normal
way (SQLite's own protocol, which lost locks defeat).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import os
import sqlite3
import struct
import threading
from typing import Optional

from . import forksafe

try:
    import fcntl
except ImportError:  # Windows: nothing here to coordinate with
    fcntl = None  # type: ignore[assignment]

# SQLite locks bytes 0x40000000 to 0x40000201 of a database; this one is far
# beyond them (a lock may lie past the end of a file).
REGISTRY_OFFSET = 1 << 62
# ``struct flock`` on Linux (64-bit off_t): l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = "@hhqqi4x"
_SUPPORTED = fcntl is not None and hasattr(fcntl, "F_OFD_SETLK")
# A file system that refuses open file description locks with one of these:
# its connections close the normal way.
_NOT_SUPPORTED_HERE = frozenset(getattr(errno, name) for name in (
    "EINVAL", "EOPNOTSUPP", "ENOTSUP", "ENOLCK", "ENOSYS") if hasattr(errno, name))

_LOCK = threading.Lock()
# database path -> [registry descriptor, [open read-write connections], openings pending]
_REGISTERED: dict = {}
# database path -> [(file identity, connection)] parked connections (see above)
_PARKED: dict = {}
# Registry descriptors to close (see spare_descriptors).
_SPARE: list = []


def register(database_path: str) -> None:
    """Before a read-write connection to the existing ``database_path``
    opens: hold the registry byte (a read lock of this process's own open file
    description); follow with :func:`adopt` or :func:`unregister`.  Raises
    ``OSError``."""
    if not _SUPPORTED:
        return
    with _LOCK:
        entry = _REGISTERED.get(database_path)
        if entry is None:
            descriptor = os.open(database_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                                 | getattr(os, "O_CLOEXEC", 0))
            try:
                fcntl.fcntl(descriptor, fcntl.F_OFD_SETLK,
                            struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, REGISTRY_OFFSET, 1, 0))
            except OSError as exc:
                _SPARE.append(descriptor)  # closed by the caller, never here (POSIX locks)
                if exc.errno in _NOT_SUPPORTED_HERE:  # this file system: SQLite's rules only
                    return
                raise
            except BaseException:
                _SPARE.append(descriptor)
                raise
            entry = _REGISTERED[database_path] = [descriptor, [], 0]
        entry[2] += 1


def adopt(database_path: str, connection: sqlite3.Connection) -> None:
    """The read-write connection :func:`register` announced is open."""
    if not _SUPPORTED:
        return
    with _LOCK:
        entry = _REGISTERED.get(database_path)
        if entry is not None:  # None: this file system has no such locks
            entry[2] -= 1
            entry[1].append(connection)


def unregister(database_path: str) -> None:
    """The read-write connection :func:`register` announced did not open."""
    if not _SUPPORTED:
        return
    with _LOCK:
        entry = _REGISTERED.get(database_path)
        if entry is not None:
            entry[2] -= 1
            _forget_if_unused(database_path)


def spare_descriptors() -> list:
    """Registry descriptors no longer needed, taken out: the caller closes
    them through ``database.close_database_descriptor`` (a plain close while
    a connection of this process has the file open would drop its locks)."""
    with _LOCK:
        spare, _SPARE[:] = list(_SPARE), []
    return spare


def take_parked(database_path: str, identity: tuple) -> Optional[sqlite3.Connection]:
    """A parked connection to the same database file (``(st_dev, st_ino)``),
    or None; call between :func:`register` and :func:`adopt`."""
    with _LOCK:
        parked = _PARKED.get(database_path, [])
        for index, (found, connection) in enumerate(parked):
            if found == identity:
                del parked[index]
                return connection
    return None


def close(database_path: str, identity: Optional[tuple],
          connection: sqlite3.Connection) -> bool:
    """Close a read-write connection, or park it when it is this process's
    last one and another process of ours has the journal open (or this
    process has parked one before).  Returns True when it was parked: it
    stays open, and the caller keeps counting it as open.  Afterwards the
    caller closes :func:`spare_descriptors`.  ``sqlite3.Error`` of the close
    propagates."""
    with _LOCK:
        entry = _REGISTERED.get(database_path)
        if entry is None:
            connection.close()
            return False
        with contextlib.suppress(ValueError):
            entry[1].remove(connection)
        if entry[1] or entry[2]:  # another connection here keeps SQLite's shared lock
            connection.close()
            return False
        if _PARKED.get(database_path) or not _alone(entry[0]):
            _PARKED.setdefault(database_path, []).append((identity, connection))
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(connection))  # never finalized
            return True
        try:
            connection.close()  # the only process of ours: SQLite may fold the WAL
        finally:
            _forget_if_unused(database_path)
        return False


def _alone(descriptor: int) -> bool:
    """Whether no other open file description holds the registry byte (a
    write lock there would conflict with nothing).  Undecidable: not alone."""
    try:
        found = fcntl.fcntl(descriptor, fcntl.F_OFD_GETLK,
                            struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, REGISTRY_OFFSET, 1, 0))
    except OSError:
        return False
    return struct.unpack(_FLOCK, found)[0] == fcntl.F_UNLCK


def _forget_if_unused(database_path: str) -> None:
    """Lock held: drop a registration with nothing open, parked or pending
    (its descriptor goes to :func:`spare_descriptors`)."""
    entry = _REGISTERED.get(database_path)
    if entry is None or entry[1] or entry[2] or _PARKED.get(database_path):
        return
    del _REGISTERED[database_path]
    _SPARE.append(entry[0])


@atexit.register
def _keep_the_wal_at_exit() -> None:
    """At exit, every read-write connection still open (or parked) is pinned
    so that the interpreter's teardown never closes it, unless no other
    process of ours is connected: then they close the normal way."""
    with _LOCK:
        for database_path, entry in list(_REGISTERED.items()):
            connections = entry[1] + [connection for _, connection
                                      in _PARKED.get(database_path, [])]
            alone = _alone(entry[0])
            for connection in connections:
                if alone:
                    with contextlib.suppress(sqlite3.Error):
                        connection.close()
                else:
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(connection))


class _ForkReset:
    """A forked child holds no connection of the parent's: it forgets the
    registrations without unlocking (the flock is shared with the parent)
    and never closes the parked connections."""

    def _after_fork_in_child(self) -> None:
        global _LOCK
        _LOCK = threading.Lock()
        for parked in _PARKED.values():
            for _, connection in parked:
                forksafe.abandon(connection)
        # Registered ones too: one whose Database was dropped unclosed is held
        # only here, and the child's garbage collector would close it.
        for entry in _REGISTERED.values():
            for connection in entry[1]:
                forksafe.abandon(connection)
        _PARKED.clear()
        _REGISTERED.clear()  # the descriptors stay open: the lock is the parent's
        _SPARE.clear()


_FORK_RESET = _ForkReset()
forksafe.register(_FORK_RESET)
