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
* ``unknown`` -- the platform has no ``flock``, or what stands at its name
  cannot be probed, or a held lock does not say whose it is (then ``resolve``
  needs ``--force``).

By hand, people delete, move, rename and edit these files; on Linux a held
lock is found wherever it went inside the data directory (the kernel's list
of locks, and its holder's open files).  Looking never costs this process its
SQLite locks: closing a descriptor drops every POSIX lock the process holds
on that file, so the journal's own files, and files it holds such locks on,
are never opened here (:func:`_safe_to_open`).

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
import math
import os
import re
import stat
import uuid
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
_TAG_LIMIT = 4096  # bytes: a tag is under 200
_TEMP_NAME = re.compile(r"\.([0-9a-f-]{36})\.(\d+)\.tmp")
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
# Descriptors never closed (see _open_lock_file); a forked child closes its copies.
_KEPT_OPEN: list = []
_NOT_FINITE = {"NaN", "Infinity", "-Infinity"}
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
    """The tag of a call lock file: ``{"operation_id", "pid", "process_start"}``
    as far as they are well formed (a file edited by hand may hold anything;
    the id canonical); {} when empty, partial or not JSON."""
    def refuse(constant: str) -> None:
        raise ValueError(constant)  # NaN and infinities: not JSON, never ours

    try:
        text = os.pread(descriptor, _TAG_LIMIT, 0).decode("utf-8", "replace")
        # The first JSON value: a tag with bytes appended by hand still says whose.
        tag = json.JSONDecoder(parse_constant=refuse).raw_decode(text.lstrip() or "null")[0]
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(tag, dict):
        return {}
    operation_id, pid, start = tag.get("operation_id"), tag.get("pid"), tag.get("process_start")
    return {"operation_id": str(uuid.UUID(operation_id)) if is_uuid(operation_id) else None,
            "pid": pid if type(pid) is int and pid > 0 else None,
            "process_start": start if type(start) in (int, float) and math.isfinite(start)
            else None}


class _LockView:
    """What one search knows of the data directory's locks, read once: the
    identities of the journal's database and ``-shm``; and, where the
    kernel lists locks in the numbers ``stat`` gives (Linux; not macOS, not a
    btrfs subvolume), the pid holding each flocked inode, the inodes this
    process holds POSIX locks on and the pids connected to the journal.  Where
    it does not, only names are probed."""

    def __init__(self, data_dir: str):
        self.journal, shm = set(), None
        for name in (DATABASE_NAME, DATABASE_NAME + SHM_SUFFIX):
            try:
                file = os.stat(os.path.join(data_dir, name))
            except OSError:
                continue
            self.journal.add((file.st_dev, file.st_ino))
            shm = file if name.endswith(SHM_SUFFIX) else shm
        self.device, self.flocks, self.own, self.connected = None, None, None, set()
        locks = _calibrated_locks(data_dir)
        if locks is not None:
            self.device, own_pid = locks[0], os.getpid()
            self.flocks = {inode: pid for kind, access, pid, inode in locks[1]
                           if kind == b"FLOCK" and access == b"WRITE"}
            self.own = {inode for kind, _, pid, inode in locks[1]
                        if kind == b"POSIX" and pid == own_pid}
            # Every SQLite connection to the journal holds a POSIX lock on -shm.
            shm_inode = shm.st_ino if shm is not None and shm.st_dev == self.device else None
            self.connected = {pid for kind, _, pid, inode in locks[1]
                              if kind == b"POSIX" and inode == shm_inode}

    def safe_to_open(self, file: os.stat_result) -> bool:
        """Whether a descriptor of ``file`` may be opened and closed here: a
        regular file (a FIFO's open may block) that is neither the journal's
        database or ``-shm`` nor carries a POSIX lock of this process.
        Closing any descriptor of a file drops every POSIX lock this process
        holds on it -- its SQLite connections' -- whatever name the file was
        reached by (a hard link, another process's descriptor)."""
        if not stat.S_ISREG(file.st_mode) or (file.st_dev, file.st_ino) in self.journal:
            return False
        return self.own is None or file.st_dev != self.device or file.st_ino not in self.own

    def flock_holder(self, file: os.stat_result) -> Optional[int]:
        """The pid holding a write ``flock`` on ``file``, 0 when none, None
        when unknown."""
        if self.flocks is None or file.st_dev != self.device:
            return None
        return self.flocks.get(file.st_ino, 0)


def _calibrated_locks(data_dir: str) -> Optional[tuple]:
    """``(st_dev, [(kind, access, pid, inode)])`` of the data directory's
    device from the kernel's list, when that list names files as ``stat``
    does -- checked on a shared ``flock`` of the data directory itself, taken
    for the reading (or a writer's exclusive one); else None."""
    try:
        descriptor = forksafe.open_registered(lambda: os.open(data_dir, _DIRECTORY_FLAGS))
    except OSError:
        return None
    try:
        directory = os.fstat(descriptor)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pass  # a writer holds it exclusively: its entry shows as well
        locks = lock_holders.device_locks(directory.st_dev)
    except OSError:
        return None
    finally:
        forksafe.forget(descriptor)
        os.close(descriptor)  # closing drops the shared flock
    if locks is None or not any(kind == b"FLOCK" and inode == directory.st_ino
                                for kind, _, _, inode in locks):
        return None
    return directory.st_dev, locks


def _open_lock_file(view: _LockView, path: str, directory: Optional[int] = None,
                    expected: Optional[tuple] = None) -> tuple:
    """``(descriptor or None, stat)`` of ``path`` (a name in ``directory``,
    never followed; or a ``/proc/<pid>/fd`` link): a read-only descriptor when
    it is the ``expected`` ``(st_dev, st_ino)`` (if given) and
    :meth:`_LockView.safe_to_open`, else None (looked at with ``stat`` only;
    also when it cannot be opened).  A file replaced between the look and the
    open by one that is not safe to close is kept open for good, for the same
    reason.  Raises ``FileNotFoundError`` when absent, else ``OSError``."""
    file = os.stat(path, dir_fd=directory, follow_symlinks=directory is None)
    if expected not in (None, (file.st_dev, file.st_ino)) or not view.safe_to_open(file):
        return None, file
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags | (os.O_NOFOLLOW if directory is not None else 0),
                             dir_fd=directory)
    except OSError:
        return None, file  # unreadable (its mode), or gone since the look
    try:
        opened = os.fstat(descriptor)
    except OSError:
        opened = None
    if opened is not None and (opened.st_dev, opened.st_ino) == (file.st_dev, file.st_ino):
        return descriptor, file
    if opened is not None and view.safe_to_open(opened):
        os.close(descriptor)
    else:
        forksafe.close_in_child(descriptor)
        _KEPT_OPEN.append(descriptor)
    return None, file


def _listed(name: str) -> bool:
    """Whether :func:`held_calls` and :func:`refuse_calls_out` probe
    ``calls/<name>`` by its name."""
    return is_uuid(name)


def _probe_file(view: _LockView, directory: int, name: str) -> tuple:
    """``(state, tag, stat or None)`` of ``calls/<name>``: ``running`` (tag: a
    dict, {} when unreadable), ``gone`` or ``unknown`` (not a regular file,
    or it cannot be told).  A file that cannot be opened here is asked about
    in the kernel's list of locks.  Never raises."""
    try:
        descriptor, file = _open_lock_file(view, name, directory)
    except FileNotFoundError:
        return OWNER_GONE, None, None
    except OSError:
        return OWNER_UNKNOWN, None, None
    if descriptor is None:
        holder = view.flock_holder(file) if stat.S_ISREG(file.st_mode) else None
        if holder:
            return OWNER_RUNNING, {"pid": holder}, file
        return (OWNER_GONE if holder == 0 else OWNER_UNKNOWN), None, file
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return OWNER_RUNNING, _read_tag(descriptor), file
    except OSError:
        return OWNER_UNKNOWN, None, file
    finally:
        os.close(descriptor)  # closing drops the probe's own lock
    return OWNER_GONE, None, file


def _call(operation_id: Optional[str], tag: dict, pid: Optional[int] = None) -> dict:
    """``{"operation_id", "pid", "process_start"}`` of a held lock."""
    return {"operation_id": operation_id, "pid": tag.get("pid") or pid,
            "process_start": tag.get("process_start")}


def probe_owner(data_dir: str, operation_id: str) -> dict:
    """The operator's side: is the worker of ``operation_id`` running its call?

    Returns ``{"owner": "running"|"gone"|"unknown", "pid": int|None,
    "process_start": float|None}``: ``running`` when the lock at its name is
    held, or a held lock's tag names it (its file deleted, moved or renamed by
    hand: :func:`held_calls`); ``unknown`` when that cannot be told (no
    ``flock``; what stands at its name cannot be probed, or a held lock's tag
    cannot be read, and no held lock names the call).  Creates nothing; never
    raises."""
    result = {"owner": OWNER_UNKNOWN, "pid": None, "process_start": None}
    if fcntl is None or not is_uuid(operation_id):
        return result
    data_dir = os.fspath(data_dir)
    view = _LockView(data_dir)
    try:
        directory = _open_directory(data_dir, create=False)
    except FileNotFoundError:
        state, tag = OWNER_GONE, None
    except OSError:
        state, tag = OWNER_UNKNOWN, None  # calls/ replaced by something else
    else:
        try:
            state, tag, _ = _probe_file(view, directory, operation_id)
        finally:
            os.close(directory)
    if state != OWNER_RUNNING:  # its file deleted, moved or renamed while its worker holds it?
        held = _held(data_dir, view)
        mine = [call for call in held if call["operation_id"] == str(uuid.UUID(operation_id))]
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
    "process_start"}]``; a lock at its name under its name and under the
    operation its tag names, plus (Linux) those whose lock file someone
    deleted, moved or renamed while its worker holds it
    (:func:`_held_off_its_name`); ``operation_id`` None for a held lock whose
    tag cannot be read.  Creates and changes nothing; never raises."""
    if fcntl is None:
        return []
    data_dir = os.fspath(data_dir)
    return _held(data_dir, _LockView(data_dir))


def _held(data_dir: str, view: _LockView) -> list:
    found, probed = [], set()
    try:
        directory = _open_directory(data_dir, create=False)
    except OSError:  # calls/ deleted or replaced by hand
        return _held_off_its_name(data_dir, view, probed)
    try:
        for name in sorted(os.listdir(directory)):
            if not _listed(name):
                continue
            state, tag, file = _probe_file(view, directory, name)
            if state == OWNER_RUNNING:
                # Under its name and its tag's operation, when they differ (a
                # lock renamed, or its tag edited, by hand): either may be the call.
                # None: a tag that says not whose (emptied by hand), whatever its name.
                for operation_id in dict.fromkeys((str(uuid.UUID(name)), tag.get("operation_id"))):
                    found.append(_call(operation_id, tag))
                probed.add((file.st_dev, file.st_ino))
    except OSError:
        pass
    finally:
        os.close(directory)
    return found + _held_off_its_name(data_dir, view, probed)


def _held_off_its_name(data_dir: str, view: _LockView, probed: set) -> list:
    """Calls whose lock is held but was not found at its name (``probed``:
    the ``(st_dev, st_ino)`` found there) -- deleted by hand, or moved or
    renamed (the file, or calls/ itself) anywhere inside the data directory:
    the worker may still record an outcome, but no name shows it.  Found from
    the kernel's list of locks and each holder's open files (same user:
    ``/proc/<pid>/fd``, each read once); the operation is the one its tag
    names (else a temporary name's; None when neither: then only a holder
    with an SQLite connection to this journal counts, not another program's
    flock).  A lock file moved out of the data directory is not found, unless
    its new path is too long to be read back, which counts as inside; nor
    where the operator sees the data directory by another path or pid
    namespace (docs/guard.md §Late outcomes).  [] where that cannot be
    read."""
    if view.flocks is None:
        return []
    by_holder: dict = {}
    for inode, pid in view.flocks.items():
        if (view.device, inode) not in probed:
            by_holder.setdefault(pid, set()).add(inode)
    inside = os.path.realpath(data_dir) + os.sep
    found = []
    for pid, inodes in sorted(by_holder.items()):
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
            if not target.startswith(inside):
                continue
            try:
                file = os.stat(path)
            except OSError:
                continue
            if file.st_dev != view.device or file.st_ino not in inodes:
                continue
            inodes.discard(file.st_ino)  # one entry per lock, however many descriptors of it
            tag = _tag_held_at(view, path, file)
            operation_id = tag.get("operation_id")
            temp = _TEMP_NAME.fullmatch(os.path.basename(target.removesuffix(" (deleted)")))
            if operation_id is None and temp is not None:
                operation_id = temp.group(1)  # a lock being made: its name says whose
            if operation_id is None and pid not in view.connected:
                continue
            found.append(_call(operation_id, tag, pid))
    return found


def _tag_held_at(view: _LockView, path: str, file: os.stat_result) -> dict:
    """The tag ({} when it cannot be read) of ``file``, which another process
    has open at ``path`` (a ``/proc/<pid>/fd`` link); opened only when
    :meth:`_LockView.safe_to_open`."""
    try:
        descriptor, _ = _open_lock_file(view, path, expected=(file.st_dev, file.st_ino))
    except OSError:
        return {}
    if descriptor is None:
        return {}
    try:
        return _read_tag(descriptor)
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
    view = _LockView(data_dir)
    try:
        directory = _open_directory(data_dir, create=False)
    except FileNotFoundError:  # none, or calls/ itself deleted by hand
        directory = None
    except OSError as exc:
        raise _cannot_tell(exc.strerror or str(exc)) from None
    try:
        for name in sorted(os.listdir(directory)) if directory is not None else ():
            temp = _TEMP_NAME.fullmatch(name)
            if temp is not None and not process_alive(int(temp.group(2))):
                _remove(directory, name)
            elif _listed(name):
                state, tag, file = _probe_file(view, directory, name)
                if state == OWNER_RUNNING:
                    raise _call_out(_call(tag.get("operation_id") or name, tag))
                if state == OWNER_GONE and file is not None:
                    _remove(directory, name)  # nobody holds it: a dead worker's leftover
                elif (state == OWNER_UNKNOWN and (file is None or stat.S_ISREG(file.st_mode))
                      and view.flocks is None):
                    raise _cannot_tell(f"{name} cannot be probed")  # else: the search below
    except OSError as exc:
        raise _cannot_tell(exc.strerror or str(exc)) from None
    finally:
        if directory is not None:
            os.close(directory)
    # A lock file deleted, moved or renamed by hand while its worker still runs the call.
    for call in _held_off_its_name(data_dir, view, set()):
        raise _call_out(call)


def _cannot_tell(why: str) -> AdmissionRefused:
    return AdmissionRefused("owner_running", f"{CALLS_DIRECTORY}/ cannot be examined ({why}): "
                            "whether a protected call is out is unknown; nothing was changed")


def _call_out(call: dict) -> AdmissionRefused:
    """``owner_running`` for a call whose outcome can still arrive."""
    operation = call["operation_id"] or "unknown: its lock file says not whose"
    return AdmissionRefused(
        "owner_running", f"a protected call is still out in this profile (operation "
        f"{operation}, pid {call['pid']}): its outcome can still arrive, and it must "
        "find its operation in the live journal. Archive when it has finished (a worker hung in "
        "a call, even one an operator resolved, must be stopped first); nothing was changed",
        owner=call)


def _remove(directory: int, name: str) -> None:
    """Unlink a leftover; one that cannot be removed stays as evidence (nothing
    depends on its removal)."""
    try:
        os.unlink(name, dir_fd=directory)
    except OSError:
        pass
