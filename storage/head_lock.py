"""The head lock: a reader sees ``head.json`` and the database at rest
(docs/format.md §Verification: what a reader may conclude).

``head.json``, the marker and the archive intent are files beside the
database, and SQLite cannot commit them together with a row.  A writer of ours
therefore changes them only while it holds this lock *exclusively*, from just
before it replaces the first of them until its COMMIT has returned (and the
archive intent is gone again): milliseconds.  A reader holds it *shared* while
it pins its database snapshot and reads those files, and lets go before it
verifies.  So the pair a reader compares is either the state before a write or
the state after it, never half of one: a disagreement it finds is a verdict,
whoever is writing, and no reader ever retries or waits for a writer to
finish.  A writer that died between its replace and its COMMIT leaves the
files ahead of the database; the kernel drops its lock, and the next reader
reports ``checkpoint_ahead`` (docs/format.md §Append).

The lock is a ``flock`` on the data directory itself: it needs no file of its
own (a read-only user can take it) and works the same on Linux and macOS.
Waiting is bounded by the busy timeout (``database_locked``).  A forked child
closes an inherited descriptor of it (storage/forksafe.py).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator

from . import forksafe
from .errors import JournalUnavailable

try:
    import fcntl
except ImportError:  # Windows: the platform check refuses protected calls there
    fcntl = None  # type: ignore[assignment]

# Pauses between two tries while another process holds the lock: writers hold
# it for a millisecond or two (a slow disk's fsyncs longer) and may take it
# again within a millisecond, so a waiter looks often (a flock try costs about
# a microsecond of CPU).
_PAUSES_SECONDS = (0.00005, 0.0001, 0.0002, 0.0005)
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC


# Per thread: the data directories whose head lock it holds now, and how.  A
# nested use -- through any HeadLock of the same directory in this thread --
# is then a no-op: a second descriptor would wait for the first forever.
_HELD = threading.local()


def _holding() -> dict:
    try:
        return _HELD.modes
    except AttributeError:
        _HELD.modes = {}
        return _HELD.modes


class HeadLock:
    """The head lock of one data directory.  ``timeout``: seconds to wait for
    it (the busy timeout).  Each use opens a descriptor of the directory of
    its own (an open and a close: microseconds), so a process that has run
    out of descriptors says so here, as its calls would."""

    def __init__(self, data_dir: str, timeout: float):
        self.data_dir = data_dir
        self.timeout = timeout
        self._key = os.path.realpath(data_dir)

    @contextlib.contextmanager
    def held(self, *, exclusive: bool) -> Iterator[None]:
        """Hold the lock (``exclusive``: a writer changing the files beside the
        database; else a reader pinning its snapshot).  Raises
        :class:`JournalUnavailable` ``database_locked`` after the timeout and
        ``storage_unavailable`` when the directory cannot be opened; a reader
        that may not open the directory reads without it (see docs)."""
        holding = _holding()
        held = holding.get(self._key)
        if fcntl is None or held == "exclusive" or (held == "shared" and not exclusive):
            yield
            return
        if held is not None:
            raise RuntimeError("head lock: a shared holder cannot take it exclusively")
        try:
            descriptor = forksafe.open_registered(lambda: os.open(self.data_dir, _DIRECTORY_FLAGS))
        except PermissionError:
            if exclusive:
                raise JournalUnavailable("storage_unavailable", f"the data directory "
                                         f"{self.data_dir} cannot be opened") from None
            yield  # a reader without read access to the directory itself
            return
        except OSError as exc:
            raise JournalUnavailable("storage_unavailable", f"the data directory cannot be "
                                     f"opened ({exc.strerror or exc})") from None
        try:
            self._take(descriptor, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            holding[self._key] = "exclusive" if exclusive else "shared"
            try:
                yield
            finally:
                holding.pop(self._key, None)
        finally:
            forksafe.forget(descriptor)
            with contextlib.suppress(OSError):
                # Explicitly: a child forked since the forget shares the lock.
                fcntl.flock(descriptor, fcntl.LOCK_UN)
            os.close(descriptor)

    def _take(self, descriptor: int, mode: int) -> None:
        deadline = None
        attempt = 0
        while True:
            try:
                fcntl.flock(descriptor, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.timeout
            elif now >= deadline:
                raise JournalUnavailable(
                    "database_locked", "another process held the journal's head lock (it "
                    "replaces head.json and commits) for longer than the busy timeout "
                    f"({self.timeout:g} s)")
            time.sleep(_PAUSES_SECONDS[min(attempt, len(_PAUSES_SECONDS) - 1)])
            attempt += 1
