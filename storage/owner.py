"""Who is running a protected call right now?  Evidence for the operator only.

While a protected call runs, the worker process holds an exclusive OS advisory
lock on ``owner.lock`` in the data directory and writes a tag into it:
``{"operation_id", "pid", "process_start"}``.  The kernel drops the lock when the
process dies, however it dies, so an operator can ask "is the worker of this
pending operation still running?":

* ``running`` -- the lock is held and the tag names that operation;
* ``gone`` -- nobody holds the lock, or its holder is running another operation;
* ``unknown`` -- the platform has no advisory locks, or the tag cannot be read.

Nothing is ever released or resolved because an owner is ``gone``: docs/guard.md §Settings forbids
inferring safety from process state; this only tells a person where to look.

``flock`` is used rather than ``fcntl``/``lockf`` record locks on purpose: POSIX
record locks belong to the process and vanish when *any* descriptor of the file
is closed, so an inspection in the same process could silently drop the
worker's lock.  ``flock`` locks belong to one open file description -- which a
child made by ``fork`` shares: so the lock is released with an explicit
``LOCK_UN`` (closing the worker's descriptor alone would leave it held by a
child that is still alive), and a forked child drops its copy of the
descriptor without unlocking (docs/guard.md §Child processes).  The lock file
is never the database (SQLite's own locking is of the record kind).
"""
from __future__ import annotations

import json
import os
import time
from typing import Optional

from . import forksafe
from .durable import open_regular_file

try:
    import fcntl
except ImportError:  # Windows: owners are reported as "unknown"
    fcntl = None  # type: ignore[assignment]

OWNER_LOCK_NAME = "owner.lock"
OWNER_RUNNING = "running"
OWNER_GONE = "gone"
OWNER_UNKNOWN = "unknown"
# An inspector holds a shared lock for microseconds; a worker retries this many
# times, this many seconds apart, before it concludes another worker is in flight.
ACQUIRE_ATTEMPTS = 20
ACQUIRE_PAUSE_SECONDS = 0.005


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """Start time of a process in seconds since the epoch (Linux), else None.

    Together with the pid it names one process: pids are reused, start times are not.
    """
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            fields = stream.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as stream:
            boot = next(int(line.split()[1]) for line in stream if line.startswith(b"btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


class OwnerLock:
    """The worker's side: hold ``owner.lock`` while one protected call runs.

    ``acquire(operation_id)`` returns True when this process now holds the lock
    (tagged with the operation), False when another process holds it.  Raises
    ``OSError`` when the lock file cannot be opened or written.  ``release()``
    clears the tag and unlocks.  Not thread-safe by itself: the guard serializes.
    """

    def __init__(self, data_dir: str):
        self.path = os.path.join(os.fspath(data_dir), OWNER_LOCK_NAME)
        self._descriptor: Optional[int] = None
        forksafe.register(self)

    def _after_fork_in_child(self) -> None:
        """The child closes its copy of the descriptor, never unlocking: the
        lock is the parent's."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            try:
                os.close(descriptor)
            except OSError:
                pass

    def acquire(self, operation_id: str) -> bool:
        """Lock and tag ``owner.lock``; False if another process holds it."""
        if fcntl is None:
            return True
        # A symlink/FIFO planted as owner.lock refuses (OSError), never blocks.
        descriptor = open_regular_file(self.path, os.O_RDWR | os.O_CREAT)
        try:
            for attempt in range(ACQUIRE_ATTEMPTS):
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if attempt == ACQUIRE_ATTEMPTS - 1:
                        os.close(descriptor)
                        return False
                    time.sleep(ACQUIRE_PAUSE_SECONDS)
            tag = json.dumps({"operation_id": operation_id, "pid": os.getpid(),
                              "process_start": process_start_time()}).encode("utf-8")
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, tag, 0)
        except BaseException:
            os.close(descriptor)  # closing also drops the lock
            raise
        self._descriptor = descriptor
        return True

    def release(self) -> None:
        """Clear the tag, unlock, close; a no-op when this object holds nothing.
        The explicit unlock also releases the copy a forked child may hold."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is None:
            return
        try:
            try:
                os.ftruncate(descriptor, 0)
            except OSError:
                pass  # the tag is evidence only; the unlock below is what matters
            finally:
                fcntl.flock(descriptor, fcntl.LOCK_UN)
        finally:
            os.close(descriptor)


def _probe(data_dir: str) -> tuple:
    """``(state, tag)``: state ``absent`` (no lock file: no worker ever held it),
    ``free``, ``held`` (tag: the decoded dict, or None while it is being
    written) or ``unknown`` (no advisory locks here, or the file is unusable).
    Never creates the lock file; never raises."""
    if fcntl is None:
        return "unknown", None
    try:
        descriptor = open_regular_file(os.path.join(os.fspath(data_dir), OWNER_LOCK_NAME),
                                       os.O_RDONLY)
    except FileNotFoundError:
        return "absent", None
    except OSError:
        return "unknown", None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held by a worker
        except OSError:
            return "unknown", None
        else:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            return "free", None
        try:
            tag = json.loads(os.pread(descriptor, 4096, 0) or b"null")
        except (OSError, ValueError):
            tag = None
        return "held", tag if isinstance(tag, dict) else None
    finally:
        os.close(descriptor)


def probe_owner(data_dir: str, operation_id: str) -> dict:
    """The operator's side: is the worker of ``operation_id`` running?

    Returns ``{"owner": "running"|"gone"|"unknown", "pid": int|None,
    "process_start": float|None}``.  Never creates the lock file; never raises.
    """
    state, tag = _probe(data_dir)
    result = {"owner": OWNER_UNKNOWN, "pid": None, "process_start": None}
    if state in ("absent", "free"):
        result["owner"] = OWNER_GONE
    elif state == "held" and tag is not None:
        if tag.get("operation_id") != operation_id:
            result["owner"] = OWNER_GONE
        else:
            result.update(owner=OWNER_RUNNING, pid=tag.get("pid"),
                          process_start=tag.get("process_start"))
    return result


def probe_lock(data_dir: str) -> Optional[dict]:
    """Who holds ``owner.lock`` right now, whatever operation it names: None
    when nobody does (or the platform cannot tell), else ``{"operation_id",
    "pid", "process_start"}`` from the tag (values None while the tag is being
    written).  Never creates the lock file; never raises."""
    state, tag = _probe(data_dir)
    if state != "held":
        return None
    return {key: (tag or {}).get(key) for key in ("operation_id", "pid", "process_start")}
