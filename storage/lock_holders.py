"""Which processes hold POSIX locks on a journal file: evidence for a person,
never a verdict (docs/cli.md §status: ``writer_pid``, ``workers_running``).

Read from Linux's ``/proc/locks``: no descriptor of the file is opened (closing
one would drop this process's own POSIX locks).  Every SQLite connection holds a
read lock on the database's shared range, the writer byte 120 of ``-shm``.
Without ``/proc/locks`` (macOS) nothing is known (None).
"""
from __future__ import annotations

import os
from typing import Optional

PROC_LOCKS = "/proc/locks"
# SQLite's unix VFS: the first shared-memory lock of -shm, the WAL write lock.
WAL_WRITE_LOCK_OFFSET = 120


def posix_lock_holders(path: str, first: int, last: int, *,
                       writes_only: bool = False) -> Optional[list]:
    """Sorted pids (this process's included) with a POSIX lock on ``path``
    overlapping bytes ``first``..``last`` (``writes_only``: write locks);
    [] when the file is absent, None when unknown.  Never raises."""
    try:
        with open(PROC_LOCKS, "rb") as stream:
            listing = stream.read()
        found = os.stat(path)
    except FileNotFoundError:
        return [] if os.path.exists(PROC_LOCKS) else None
    except OSError:
        return None
    where = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}".encode()
    pids = set()
    for line in listing.splitlines():
        fields = line.split()
        if b"->" in fields[:2]:  # a waiter, blocked behind the holder
            continue
        try:
            position = fields.index(where)
        except ValueError:
            continue
        kind, access, pid = fields[1], fields[position - 2], fields[position - 1]
        start, end = fields[position + 1], fields[position + 2]
        if kind != b"POSIX" or (writes_only and access != b"WRITE"):
            continue
        end_value = 2**63 if end == b"EOF" else int(end)
        if int(start) <= last and end_value >= first and int(pid) > 0:
            pids.add(int(pid))
    return sorted(pids)


def device_locks(device: int) -> Optional[list]:
    """``(kind, access, pid, inode)`` of every lock held now on a file of
    ``device`` (``st_dev``): kind ``b"POSIX"``, ``b"FLOCK"``, ``b"OFDLCK"``,
    access ``b"READ"``/``b"WRITE"``; unlinked files included, waiters left
    out; None when unknown.  Never raises."""
    try:
        with open(PROC_LOCKS, "rb") as stream:
            listing = stream.read()
    except OSError:
        return None
    prefix = f"{os.major(device):02x}:{os.minor(device):02x}:".encode()
    found = []
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) < 8 or b"->" in fields[:2] or not fields[5].startswith(prefix):
            continue
        try:
            found.append((fields[1], fields[3], int(fields[4]), int(fields[5][len(prefix):])))
        except ValueError:
            continue
    return found


def wal_writer_pids(database_path: str) -> Optional[list]:
    """Pids holding SQLite's WAL write lock on the journal now (at most one)."""
    return posix_lock_holders(database_path + "-shm", WAL_WRITE_LOCK_OFFSET,
                              WAL_WRITE_LOCK_OFFSET, writes_only=True)


def connected_pids(database_path: str, shared_first: int, shared_last: int) -> Optional[list]:
    """Pids with an SQLite connection to the journal (its shared lock)."""
    return posix_lock_holders(database_path, shared_first, shared_last)
