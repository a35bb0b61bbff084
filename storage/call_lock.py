"""Is a protected call out, and who runs it?  One lock per running call
(docs/guard.md §Concurrency, docs/cli.md §Owner).

From before its ``started`` event is written until its outcome (or late
outcome) is committed, the worker running a protected call holds an exclusive
``flock`` on ``calls/<operation_id>`` in the data directory, a file that holds
the tag ``{"operation_id", "pid", "process_start"}``.  The kernel drops the
lock when the worker dies, however it dies.  This file is the only
"running / gone / unknown" fact of the plugin:

* ``running`` -- the file exists and its lock is held;
* ``gone`` -- the file is absent or nobody holds its lock (a dead worker's
  leftover; the next archive removes it);
* ``unknown`` -- the platform has no ``flock``, or the file cannot be read.

A call an operator resolved while it hung (``resolve --force``) keeps its own
lock until its late outcome is recorded: nothing is moved aside, and no lock
of the profile as a whole exists that could get stuck.  "No archive while an
outcome can still arrive" is "no call lock held", checked under the writer
lock (:func:`refuse_calls_out`).  Nothing is ever released or resolved because
an owner is ``gone``: that is evidence for a person only.

The lock is made under a temporary name (``calls/.<operation_id>.<pid>.tmp``),
locked and tagged, then renamed into place, so a reader never sees the final
name unlocked while its worker lives.  ``flock`` locks belong to one open file
description, so a probe from another descriptor -- of this process too -- sees
them; a forked child closes its inherited copy without unlocking
(storage/forksafe.py).  Release unlinks the file, then unlocks.
"""
from __future__ import annotations

import json
import os
import re
import stat
from typing import Optional

from . import forksafe, lock_holders
from .durable import foreign_file_type, process_alive
from .errors import AdmissionRefused, JournalUnavailable
from .record import DATABASE_NAME, SHM_SUFFIX, is_uuid

try:
    import fcntl
except ImportError:  # Windows: owners are reported as "unknown"
    fcntl = None  # type: ignore[assignment]

CALLS_DIRECTORY = "calls"
OWNER_RUNNING = "running"
OWNER_GONE = "gone"
OWNER_UNKNOWN = "unknown"
# Where call locks exist, "unknown" is a lock that cannot be read: not "gone".
OWNERS_KNOWABLE = fcntl is not None
# A tag is under 200 bytes; every database of ours and its -shm is several
# 4 KiB pages, so nothing this small is a file SQLite locks (see _open_lock_file).
_TAG_LIMIT = 1024
_TEMP_NAME = re.compile(r"\.([0-9a-f-]{36})\.(\d+)\.tmp")
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
# Descriptors never closed (see _open_lock_file); a forked child closes its copies.
_KEPT_OPEN: list = []
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | os.O_CLOEXEC

# (pid, start time) of this process, read once: it cannot change, and the
# tag of every protected call needs it.
_OWN_START: Optional[tuple] = None


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """Start time of a process (this one by default) in seconds since the
    epoch (Linux), else None.  With the pid it names one process: pids are
    reused, start times are not."""
    global _OWN_START
    if pid is None:
        own = _OWN_START
        if own is not None and own[0] == os.getpid():  # a forked child reads its own
            return own[1]
        started = process_start_time(os.getpid())
        _OWN_START = (os.getpid(), started)
        return started
    ticks = process_start_ticks(pid)
    try:
        with open("/proc/stat", "rb") as stream:
            boot = next(int(line.split()[1]) for line in stream if line.startswith(b"btime"))
        return None if ticks is None else boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def process_start_ticks(pid: int) -> Optional[int]:
    """Clock ticks after boot at which process ``pid`` started (Linux), else
    None.  What tells one process from a later one with its pid: unlike
    :func:`process_start_time` it never moves (the kernel's boot time in
    seconds since the epoch follows the wall clock, which a VM's clock
    adjustments move by seconds)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            return int(stream.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def check_calls_directory(data_dir: str) -> None:
    """Raise ``storage_unavailable`` when ``calls/`` exists but is not a real
    directory (a file, a symbolic link, ...): no call can take its lock then,
    so every surface says so, not only the refused call.  Never follows it."""
    path = os.path.join(os.fspath(data_dir), CALLS_DIRECTORY)
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # absent (made by the next call), or the directory itself unreadable
    if not stat.S_ISDIR(mode):
        kind = foreign_file_type(path) or "regular file"
        raise JournalUnavailable(
            "storage_unavailable", f"{CALLS_DIRECTORY}/ in the data directory {data_dir} is a "
            f"{kind}, not a directory: protected calls cannot take their locks there, so every "
            f"one is refused; move it away (the next protected call makes a new {CALLS_DIRECTORY}/)")


def _open_directory(data_dir: str, create: bool) -> int:
    """A descriptor of ``calls/`` (never through a symbolic link); made
    ``0700`` when ``create``.  Raises ``OSError`` (``FileNotFoundError`` when
    absent)."""
    path = os.path.join(data_dir, CALLS_DIRECTORY)
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    return os.open(path, _DIRECTORY_FLAGS)


class CallLock:
    """The worker's side: the lock of one protected call.

    ``acquire()`` creates, locks and tags ``calls/<operation_id>`` (raises
    ``OSError`` when it cannot: the call is then refused); ``release()``
    removes the file and unlocks (idempotent, never raises; in a child forked
    meanwhile it touches nothing).  One object per call; not shared between
    threads.
    """

    def __init__(self, data_dir: str, operation_id: str):
        self.data_dir = os.fspath(data_dir)
        self.operation_id = operation_id
        self._directory: Optional[int] = None
        self._descriptor: Optional[int] = None
        self._pid = os.getpid()

    def acquire(self) -> None:
        """Hold the call's lock (see the module docstring).  Raises ``OSError``."""
        if fcntl is None:
            return
        self._pid = os.getpid()
        directory = forksafe.open_registered(lambda: _open_directory(self.data_dir, create=True))
        self._directory = directory
        temp = f".{self.operation_id}.{os.getpid()}.tmp"
        descriptor = forksafe.open_registered(lambda: os.open(
            temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600, dir_fd=directory))
        self._descriptor = descriptor
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: free
            os.write(descriptor, json.dumps({"operation_id": self.operation_id,
                                             "pid": os.getpid(),
                                             "process_start": process_start_time()}).encode())
            os.rename(temp, self.operation_id, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=directory)
            except OSError:
                pass
            self.release()
            raise

    def release(self) -> None:
        """Remove ``calls/<operation_id>``, then unlock and close (the explicit
        unlock also releases a copy a forked child may still hold)."""
        descriptor, self._descriptor = self._descriptor, None
        directory, self._directory = self._directory, None
        if self._pid != os.getpid():
            # A child forked during the call: the lock and its file are the
            # parent's, its descriptors were closed at the fork (their numbers
            # may name the child's own files by now).
            return
        try:
            if descriptor is not None:
                try:
                    os.unlink(self.operation_id, dir_fd=directory)
                except OSError:
                    pass  # never renamed into place, or removed by hand: the unlock matters
                finally:
                    forksafe.forget(descriptor)
                    try:
                        fcntl.flock(descriptor, fcntl.LOCK_UN)
                    except OSError:
                        pass
                    finally:
                        os.close(descriptor)  # even if interrupted: closing drops the lock
        finally:
            if directory is not None:
                forksafe.forget(directory)
                os.close(directory)


def _read_tag(descriptor: int) -> dict:
    """The tag of a call lock file ({} when empty, partial or not JSON)."""
    try:
        tag = json.loads(os.pread(descriptor, _TAG_LIMIT, 0) or b"null")
    except (OSError, ValueError, RecursionError):
        return {}
    return tag if isinstance(tag, dict) else {}


def _may_be_lock_file(found: os.stat_result) -> bool:
    return stat.S_ISREG(found.st_mode) and found.st_size <= _TAG_LIMIT


def _open_lock_file(path: str, directory: Optional[int] = None) -> Optional[int]:
    """A read-only descriptor of ``path`` (a name in ``directory``, never
    followed; or a ``/proc/<pid>/fd`` link) when it may be a call lock file:
    a regular file of at most ``_TAG_LIMIT`` bytes.  None for anything else,
    which is looked at with ``stat`` only: opening a FIFO may block, and
    closing a descriptor drops every POSIX lock this process holds on its file
    -- an SQLite connection's too, whatever name the file was reached by (a
    hard link, another process's descriptor).  A file replaced between the
    look and the open by one that is not small is kept open for good, for the
    same reason.  Raises ``FileNotFoundError`` when absent, else ``OSError``."""
    if not _may_be_lock_file(os.stat(path, dir_fd=directory, follow_symlinks=directory is None)):
        return None
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    descriptor = os.open(path, flags | (os.O_NOFOLLOW if directory is not None else 0),
                         dir_fd=directory)
    try:
        small = _may_be_lock_file(os.fstat(descriptor))
    except OSError:
        small = False
    if small:
        return descriptor
    forksafe.close_in_child(descriptor)
    _KEPT_OPEN.append(descriptor)
    return None


def _listed(name: str) -> bool:
    """Whether :func:`held_calls` and :func:`refuse_calls_out` probe
    ``calls/<name>`` by its name (so the search off names skips it)."""
    return is_uuid(name)


def _call_of(name: str, tag: dict) -> dict:
    """``{"operation_id", "pid", "process_start"}`` of a held lock file: the
    operation its worker wrote in the tag, whatever the file is named now (a
    lock renamed by hand to another operation's id still says whose it is)."""
    operation_id = tag.get("operation_id")
    return {"operation_id": operation_id if is_uuid(operation_id) else name,
            "pid": tag.get("pid"), "process_start": tag.get("process_start")}


def _probe_file(directory: int, name: str) -> tuple:
    """``(state, tag)`` of ``calls/<name>``: ``running`` (tag: a dict),
    ``gone`` or ``unknown``.  Never raises."""
    try:
        descriptor = _open_lock_file(name, directory)
    except FileNotFoundError:
        return OWNER_GONE, None
    except OSError:
        return OWNER_UNKNOWN, None
    if descriptor is None:
        return OWNER_UNKNOWN, None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return OWNER_RUNNING, _read_tag(descriptor)
    except OSError:
        return OWNER_UNKNOWN, None
    finally:
        os.close(descriptor)  # closing drops the probe's own lock
    return OWNER_GONE, None


def probe_owner(data_dir: str, operation_id: str) -> dict:
    """The operator's side: is the worker of ``operation_id`` running its call?

    Returns ``{"owner": "running"|"gone"|"unknown", "pid": int|None,
    "process_start": float|None}``; ``running`` too when its file was deleted,
    moved or replaced by hand while its worker holds the lock
    (:func:`held_calls`); ``unknown`` when that cannot be told (no ``flock``;
    what stands at its name cannot be probed, or a held lock's tag cannot be
    read, and no held lock names the call).  Creates nothing; never raises."""
    result = {"owner": OWNER_UNKNOWN, "pid": None, "process_start": None}
    if fcntl is None or not is_uuid(operation_id):
        return result
    data_dir = os.fspath(data_dir)
    try:
        directory = _open_directory(data_dir, create=False)
    except FileNotFoundError:
        state, tag = OWNER_GONE, None
    except OSError:
        state, tag = OWNER_UNKNOWN, None  # calls/ replaced by something else
    else:
        try:
            state, tag = _probe_file(directory, operation_id)
        finally:
            os.close(directory)
    if state == OWNER_RUNNING and _call_of(operation_id, tag)["operation_id"] != operation_id:
        state, tag = OWNER_GONE, None  # another call's lock, renamed by hand to this name
    if state != OWNER_RUNNING:  # its file deleted, moved or replaced while its worker holds it?
        held = held_calls(data_dir)
        mine = [call for call in held if call["operation_id"] == operation_id]
        if mine:
            state, tag = OWNER_RUNNING, mine[0]
        elif any(call["operation_id"] is None for call in held):
            state, tag = OWNER_UNKNOWN, None  # a held lock that does not say whose it is
    result["owner"] = state
    if tag is not None:
        result.update(pid=tag.get("pid"), process_start=tag.get("process_start"))
    return result


def held_calls(data_dir: str) -> list:
    """Every call whose lock is held now: ``[{"operation_id", "pid",
    "process_start"}]``, by name, plus (Linux) those whose lock file someone
    deleted, moved or replaced while its worker holds it
    (:func:`_held_off_its_name`; ``operation_id`` None for one whose tag
    cannot be read).  Creates and changes nothing; never raises."""
    if fcntl is None:
        return []
    data_dir = os.fspath(data_dir)
    found = []
    try:
        directory = _open_directory(data_dir, create=False)
    except OSError:  # calls/ deleted or replaced by hand
        return _held_unnamed(data_dir)
    try:
        for name in sorted(os.listdir(directory)):
            if not _listed(name):
                continue
            state, tag = _probe_file(directory, name)
            if state == OWNER_RUNNING:
                found.append(_call_of(name, tag))
        device = os.fstat(directory).st_dev
    except OSError:
        return found + _held_unnamed(data_dir)
    finally:
        os.close(directory)
    named = {call["operation_id"] for call in found}
    return found + [call for call in _held_off_its_name(data_dir, device)
                    if call["operation_id"] is None or call["operation_id"] not in named]


def _held_unnamed(data_dir: str) -> list:
    """:func:`_held_off_its_name` on the data directory's device."""
    try:
        device = os.stat(data_dir).st_dev
    except OSError:
        return []
    return _held_off_its_name(data_dir, device)


def _held_off_its_name(data_dir: str, device: int) -> list:
    """Calls whose lock file no longer stands at its name while its worker
    still holds the lock -- deleted by hand, or moved (the file, or calls/
    itself) anywhere inside the data directory: the worker may still record an
    outcome, but no name shows it.  Found from the kernel's list of locks and
    each holder's open files (same user: ``/proc/<pid>/fd``); the operation is
    the file's tag (or, deleted, its name; None when neither says).  A lock
    file moved out of the data directory is not found, unless its new path is
    too long to be read, which counts as inside (docs/guard.md §Late
    outcomes).  [] where that cannot be read."""
    inside = os.path.realpath(data_dir) + os.sep
    at_name = inside + CALLS_DIRECTORY + os.sep  # probed by name already (:func:`_listed`)
    found = []
    for pid, inode in lock_holders.flock_holders(device) or ():
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            path = f"/proc/{pid}/fd/{descriptor}"
            try:
                target = os.readlink(path)
            except OSError:
                target = inside  # a path too long to read back: could be anywhere inside
            if not target.startswith(inside) or (
                    target.startswith(at_name) and _listed(target[len(at_name):])):
                continue
            tag = _tag_held_at(path, device, inode)
            if tag is None:
                continue
            call = _call_of(os.path.basename(target.removesuffix(" (deleted)")), tag)
            if not is_uuid(call["operation_id"]):
                # No tag says whose: a call's only if its holder has an SQLite
                # connection to this journal (another program's flock is not one).
                connected = lock_holders.posix_lock_holders(
                    os.path.join(data_dir, DATABASE_NAME + SHM_SUFFIX), 0, 2**62)
                if pid not in (connected or ()):
                    continue
                call["operation_id"] = None
            found.append({**call, "pid": call["pid"] or pid})
    return found


def _tag_held_at(path: str, device: int, inode: int) -> Optional[dict]:
    """The tag ({} when unreadable) of the file another process has open at
    ``path`` (a ``/proc/<pid>/fd`` link) when it is the flocked file
    ``device``/``inode`` and may be a call lock (:func:`_open_lock_file`);
    None when it is not."""
    try:
        descriptor = _open_lock_file(path)
    except OSError:
        return None
    if descriptor is None:
        return None
    try:
        opened = os.fstat(descriptor)
        if (opened.st_dev, opened.st_ino) != (device, inode):
            return None  # not the flocked file (or replaced since)
        return _read_tag(descriptor)
    except OSError:
        return None
    finally:
        os.close(descriptor)


def refuse_calls_out(data_dir: str) -> None:
    """Under the writer lock: raise :class:`AdmissionRefused` ``owner_running``
    while any call lock is held (its outcome can still arrive, and must find
    its operation in the live journal), or while that cannot be told.
    Leftovers of dead workers (unheld lock files, temporary files of gone
    processes) are removed meanwhile.  A worker locking a new call after this
    check cannot write its ``started`` before the caller commits (it needs the
    writer lock)."""
    if fcntl is None:
        return
    data_dir = os.fspath(data_dir)
    try:
        directory = _open_directory(data_dir, create=False)
    except FileNotFoundError:  # none, or calls/ itself deleted by hand
        for call in _held_unnamed(data_dir):
            raise _call_out(call)
        return
    except OSError as exc:
        raise _cannot_tell(exc) from None
    try:
        for name in sorted(os.listdir(directory)):
            temp = _TEMP_NAME.fullmatch(name)
            if temp is not None and not process_alive(int(temp.group(2))):
                _remove(directory, name)
            elif _listed(name):
                _refuse_if_held(directory, name)
        device = os.fstat(directory).st_dev
    except OSError as exc:
        raise _cannot_tell(exc) from None
    finally:
        os.close(directory)
    # A lock file deleted or moved by hand while its worker still runs the call.
    for call in _held_off_its_name(data_dir, device):
        raise _call_out(call)


def _cannot_tell(exc: OSError) -> AdmissionRefused:
    return AdmissionRefused("owner_running", f"{CALLS_DIRECTORY}/ cannot be examined "
                            f"({exc.strerror or exc}): whether a protected call is out "
                            "is unknown; nothing was changed")


def _call_out(call: dict) -> AdmissionRefused:
    """``owner_running`` for a call whose outcome can still arrive."""
    operation = call["operation_id"] or "unknown: its lock file's tag cannot be read"
    return AdmissionRefused(
        "owner_running", f"a protected call is still out in this profile (operation "
        f"{operation}, pid {call['pid']}): its outcome can still arrive, and it must "
        "find its operation in the live journal. Archive when it has finished (a worker hung in "
        "a call, even one an operator resolved, must be stopped first); nothing was changed",
        owner=call)


def _refuse_if_held(directory: int, name: str) -> None:
    try:
        descriptor = _open_lock_file(name, directory)
    except OSError:
        return
    if descriptor is None:
        return  # not a lock of ours: left as it was found
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _call_out(_call_of(name, _read_tag(descriptor))) from None
        except OSError:
            return
        _remove(directory, name)  # locked by us: no worker holds it any more
    finally:
        os.close(descriptor)


def _remove(directory: int, name: str) -> None:
    """Unlink a leftover; one that cannot be removed stays as evidence (nothing
    depends on its removal)."""
    try:
        os.unlink(name, dir_fd=directory)
    except OSError:
        pass
