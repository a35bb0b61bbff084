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

import contextlib
import json
import os
import time
from typing import Callable, Iterator, Optional

from . import forksafe
from .durable import open_regular_file
from .record import is_uuid

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
# ``owner.lock.<operation id>``: the lock of a call an operator resolved while
# its worker still held it, moved aside so that the profile is not kept busy;
# while it is held, that call's late outcome may still arrive.
RETIRED_PREFIX = OWNER_LOCK_NAME + "."


# (pid, start time) of this process, read once: it cannot change, and the
# tag of every protected call needs it (two /proc reads saved per call).
_OWN_START: Optional[tuple] = None


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """Start time of a process in seconds since the epoch (Linux), else None.

    Together with the pid it names one process: pids are reused, start times are not.
    """
    global _OWN_START
    if pid is None:
        own = _OWN_START
        if own is not None and own[0] == os.getpid():  # a forked child reads its own
            return own[1]
        started = process_start_time(os.getpid())
        _OWN_START = (os.getpid(), started)
        return started
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
        self.data_dir = os.fspath(data_dir)
        self.path = os.path.join(self.data_dir, OWNER_LOCK_NAME)
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

    def acquire(self, operation_id: str,
                retire_if: Optional[Callable[[str], bool]] = None) -> bool:
        """Lock and tag ``owner.lock``; False if another process holds it.

        ``retire_if(operation_id) -> bool`` is asked about the operation a
        holder's tag names; True (an operator resolved it while its worker
        still runs) moves that holder's lock aside (:func:`retire_holder`) and
        this call takes a fresh ``owner.lock``: a resolved operation never keeps
        the profile busy (docs/cli.md §Owner)."""
        if fcntl is None:
            return True
        asked: set = set()
        for attempt in range(ACQUIRE_ATTEMPTS):
            holder = None
            with _tags_settled(self.data_dir, exclusive=True):
                # A symlink/FIFO planted as owner.lock refuses (OSError), never blocks.
                descriptor = open_regular_file(self.path, os.O_RDWR | os.O_CREAT)
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read_tag(descriptor)
                    os.close(descriptor)
                except BaseException:
                    os.close(descriptor)
                    raise
                else:
                    try:
                        # Tagged under the directory lock: a reader holding it
                        # never sees a new holder with the previous holder's tag.
                        tag = json.dumps({"operation_id": operation_id, "pid": os.getpid(),
                                          "process_start": process_start_time()}).encode("utf-8")
                        os.ftruncate(descriptor, 0)
                        os.pwrite(descriptor, tag, 0)
                    except BaseException:
                        os.close(descriptor)  # closing also drops the lock
                        raise
                    self._descriptor = descriptor
                    _remove_released(self.data_dir)
                    return True
            named = (holder or {}).get("operation_id")
            if retire_if is not None and is_uuid(named) and named not in asked:
                asked.add(named)  # one question per holder: the journal is read each time
                if retire_if(named) and retire_holder(self.data_dir, named):
                    continue
            if attempt < ACQUIRE_ATTEMPTS - 1:
                time.sleep(ACQUIRE_PAUSE_SECONDS)
        return False

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


@contextlib.contextmanager
def _tags_settled(data_dir: str, *, exclusive: bool) -> Iterator[bool]:
    """Hold a ``flock`` on the data directory itself while ``owner.lock`` is
    taken and tagged (``exclusive``) or a holder's tag is read: so a reader
    never mistakes a new holder for the previous one whose tag is still in the
    file, and two workers never move the same lock aside.  Held for
    microseconds; yields False (and goes on unprotected) when the directory
    cannot be locked within the acquire attempts."""
    try:
        descriptor = os.open(data_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield False
        return
    try:
        locked = False
        for attempt in range(ACQUIRE_ATTEMPTS):
            try:
                fcntl.flock(descriptor, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                            | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                time.sleep(ACQUIRE_PAUSE_SECONDS)
            except OSError:
                break
        yield locked
    finally:
        os.close(descriptor)  # drops the flock


def _read_tag(descriptor: int) -> Optional[dict]:
    """The tag in an owner lock file, or None (empty, partial, not JSON)."""
    try:
        tag = json.loads(os.pread(descriptor, 4096, 0) or b"null")
    except (OSError, ValueError, RecursionError):
        return None
    return tag if isinstance(tag, dict) else None


def retire_holder(data_dir: str, operation_id: str) -> bool:
    """Move ``owner.lock`` aside to ``owner.lock.<operation_id>`` when it is
    held and its tag names ``operation_id`` -- an operation an operator has
    resolved (``resolve --force``) -- so that the next call takes a fresh lock
    while that worker keeps its own on the moved file (its late outcome still
    counts, :func:`resolved_holders`).  Moved files no longer held are removed.
    Returns True when the lock was moved.  Never raises."""
    if fcntl is None or not is_uuid(operation_id):
        return False
    path = os.path.join(os.fspath(data_dir), OWNER_LOCK_NAME)
    try:
        with _tags_settled(data_dir, exclusive=True) as settled:
            if not settled:
                return False
            descriptor = open_regular_file(path, os.O_RDONLY)
            try:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # held: by the worker of operation_id?
                else:
                    return False  # free: nothing keeps the profile busy
                if (_read_tag(descriptor) or {}).get("operation_id") != operation_id:
                    return False
                if os.path.samestat(os.fstat(descriptor), os.stat(path)):
                    os.replace(path, os.path.join(os.fspath(data_dir),
                                                  RETIRED_PREFIX + operation_id))
                    moved = True
                else:
                    moved = False
            finally:
                os.close(descriptor)
            _remove_released(data_dir)
            return moved
    except OSError:
        return False


def _retired_files(data_dir: str) -> list:
    """Paths of ``owner.lock.<operation id>`` files (see :func:`retire_holder`)."""
    try:
        names = os.listdir(data_dir)
    except OSError:
        return []
    return [os.path.join(data_dir, name) for name in sorted(names)
            if name.startswith(RETIRED_PREFIX) and is_uuid(name[len(RETIRED_PREFIX):])]


def _remove_released(data_dir: str) -> None:
    """Remove moved-aside lock files whose worker has let go (directory lock held)."""
    for path in _retired_files(data_dir):
        try:
            descriptor = open_regular_file(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)  # still locked by us: no worker holds it any more
        except OSError:
            pass
        finally:
            os.close(descriptor)


def resolved_holders(data_dir: str) -> list:
    """Workers still running a call an operator resolved: ``[{"operation_id",
    "pid", "process_start"}]`` from the moved-aside lock files still held (see
    :func:`retire_holder`).  Their late outcome may still arrive.  Never
    creates or changes a file; never raises."""
    found = []
    if fcntl is None:
        return found
    for path in _retired_files(os.fspath(data_dir)):
        try:
            descriptor = open_regular_file(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                tag = _read_tag(descriptor) or {}
                found.append({"operation_id": os.path.basename(path)[len(RETIRED_PREFIX):],
                              "pid": tag.get("pid"), "process_start": tag.get("process_start")})
            except OSError:
                pass
        finally:
            os.close(descriptor)
    return found


def _probe(data_dir: str) -> tuple:
    """``(state, tag)``: state ``absent`` (no lock file: no worker ever held it),
    ``free``, ``held`` (tag: the decoded dict, or None while it is being
    written) or ``unknown`` (no advisory locks here, or the file is unusable).
    Never creates the lock file; never raises."""
    if fcntl is None:
        return "unknown", None
    with _tags_settled(os.fspath(data_dir), exclusive=False):
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
            return "held", _read_tag(descriptor)
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
