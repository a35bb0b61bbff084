"""Nothing of ours crosses into a child process made by ``fork`` (docs/guard.md
§Child processes).

A protected tool may fork: ``multiprocessing`` with the fork start method
(Linux's default), ``os.fork``, or a library that does.  The child inherits
every descriptor and every object of ours, in whatever state they were.  Two
rules keep the parent's journal safe:

* **Objects check the pid where they are used.**  A :class:`Database`, a
  journal store or a guard remembers the pid that made its connection or lock
  (:func:`current_pid`); used from another pid, it drops them without closing
  them (an SQLite connection closed or finalized in a child may checkpoint or
  delete the WAL under the parent: :func:`abandon` keeps it referenced for the
  child's whole life) and starts afresh.  A thread lock another thread held at
  the fork is replaced the same way.
* **Locks held through a descriptor are closed in the child at once.**  A
  ``flock`` belongs to the open file description, which a child shares: an
  inherited descriptor of a per-call lock (storage/call_lock.py) or of the head
  lock (storage/head_lock.py) would keep it held for as long as the child
  lives, after the parent let go.  Such descriptors are registered here
  (:func:`close_in_child`); the one fork handler of the plugin closes them in
  the child *without unlocking* (the lock stays the parent's).  A descriptor
  is opened and registered in one step (:func:`open_registered`): a fork in
  another thread waits for both, so no child inherits one unregistered.

Standard library only.
"""
from __future__ import annotations

import os
import threading
from typing import Callable

# Re-entrant, both: a signal handler may close a guard or fork while its own
# thread is inside (a plain lock would hang the host; a child forked there may
# keep that one descriptor, which only holds a lock longer: fail closed).
_LOCK = threading.RLock()
# Held across a lock descriptor's open and registration, and by a fork (before
# it, until it returns in the parent).
_FORK_GATE = threading.RLock()
# Descriptors a forked child closes at once (flocks of the parent's).
_CLOSE_IN_CHILD: set = set()
# Objects a child must never finalize (an SQLite connection's destructor would
# close it): kept alive for the child's whole life.
_ABANDONED: list = []


def current_pid() -> int:
    """The pid to remember beside a connection or lock (``os.getpid()``)."""
    return os.getpid()


def close_in_child(descriptor: int) -> None:
    """A forked child closes ``descriptor`` right after the fork."""
    with _LOCK:
        _CLOSE_IN_CHILD.add(descriptor)


def open_registered(opener: Callable[[], int]) -> int:
    """``opener()`` -- an ``os.open`` of a file or directory to lock -- and
    :func:`close_in_child` of the descriptor it returns, with no fork between
    (a flock taken later belongs to the open file description, which a child
    forked in between would share for its whole life).  Raises what ``opener``
    raises."""
    with _FORK_GATE:
        descriptor = opener()
        close_in_child(descriptor)
    return descriptor


def forget(descriptor: int) -> None:
    """``descriptor`` is about to be closed by its owner: not the child's business."""
    with _LOCK:
        _CLOSE_IN_CHILD.discard(descriptor)


def abandon(resource: object) -> None:
    """Keep ``resource`` referenced forever in this process, so that its
    destructor never runs here (a forked child's copy of a connection)."""
    _ABANDONED.append(resource)


def _close_inherited_descriptors() -> None:
    global _LOCK, _FORK_GATE
    _LOCK = threading.RLock()  # another thread may have held it at the fork
    _FORK_GATE = threading.RLock()  # held by the fork itself
    for descriptor in _CLOSE_IN_CHILD:
        try:
            os.close(descriptor)
        except OSError:
            pass
    _CLOSE_IN_CHILD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: _FORK_GATE.acquire(),
                        after_in_parent=lambda: _FORK_GATE.release(),
                        after_in_child=_close_inherited_descriptors)
