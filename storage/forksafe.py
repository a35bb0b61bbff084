"""Nothing of ours crosses into a child process made by ``fork`` (docs/guard.md
§Child processes).

A protected tool may fork: ``multiprocessing`` with the fork start method
(Linux's default), ``os.fork``, or a library that does.  The child inherits
every descriptor and every object of ours, in whatever state they were:

* the SQLite connection -- SQLite forbids using it in a child, and closing it
  there may checkpoint or delete the WAL under the parent;
* the ``flock`` on ``owner.lock`` -- an inherited descriptor keeps the lock held
  for as long as the child lives, after the parent released its own;
* locks held by another thread at the moment of the fork, which nobody will
  ever release in the child.

Objects that own such things call :func:`register`; in the child, right after
the fork, each gets ``_after_fork_in_child()`` and drops them *without* closing
or unlocking anything the parent still uses.  Standard library only.
"""
from __future__ import annotations

import os
import weakref

_OWNERS: "weakref.WeakSet" = weakref.WeakSet()
# Objects a child must never finalize (an SQLite connection's destructor would
# close it): kept alive for the child's whole life.
_ABANDONED: list = []


def register(owner: object) -> None:
    """Call ``owner._after_fork_in_child()`` in every child forked from now on."""
    _OWNERS.add(owner)


def abandon(resource: object) -> None:
    """Keep ``resource`` referenced forever in this (child) process, so that its
    destructor never runs here."""
    _ABANDONED.append(resource)


def _reset_owners_in_child() -> None:
    for owner in list(_OWNERS):
        owner._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_owners_in_child)
