"""Durable files beside the database: ``head.json``, the marker, and the
helpers that make a file write survive a crash (docs/format.md §Files,
§Checkpoint, §Append).

* :func:`open_regular_file` / :func:`read_regular_file`: the journal's own
  files are opened without following symlinks and without blocking, so a
  symlink, FIFO, directory or device planted in the data directory refuses the
  call -- it never hangs the host and never redirects a write;
* :func:`write_atomically`: temp write, fsync, ``os.replace``, directory fsync;
* :class:`DurableFiles`: ``head.json`` and ``initialized`` of one data
  directory, checked against a verified chain summary and rewritten by appends;
* the boundary hook: the test seam crash tests use to kill a process at each
  durable step.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .errors import IntegrityError, JournalUnavailable, short
from .record import (CHECKPOINT_NAME, INTENT_NAME, MARKER_NAME, canonical_text,
                     checkpoint_shape_problem, is_uuid, marker_text)

# Temporary files of an atomic replace are named <target>.<pid>-<random>.tmp, unique
# per writer; the next writer removes any leftover (docs/format.md §Files).
TEMP_SUFFIX = ".tmp"
_SAFE_OPEN_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
# head.json and the marker are ~200 bytes; anything near this size is not ours.
OWN_FILE_READ_LIMIT = 65536
# Everything the plugin creates is its user's alone (README §Files and
# permissions): evidence, ids and the journal are nobody else's to read, and an
# operator who wants a monitoring account to read them grants it by hand.
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIRECTORY_MODE = 0o700

# Boundary kinds of journal creation (the others are event kinds).
BOUNDARY_KIND_GENESIS = "genesis"
BOUNDARY_KIND_MARKER = "marker"

_boundary_hook: Optional[Callable[[str, str], None]] = None


def set_boundary_hook(hook: Optional[Callable[[str, str], None]]) -> None:
    """Test seam: call ``hook(boundary, kind)`` at each durable boundary.

    Boundaries of an append: ``begin``, ``inserted``, ``checkpoint_written``,
    ``checkpoint_fsynced``, ``checkpoint_replaced``, ``directory_fsynced``,
    ``committed``; ``kind`` is the event kind being appended.  The guard adds
    ``downstream_returned`` (kind ``started``).  Creating a journal announces
    ``tables_committed`` and the checkpoint_* boundaries of the first
    ``head.json`` with kind ``genesis``, then those of the marker with kind
    ``marker``.  Crash tests install a hook that SIGKILLs the process;
    production never sets one.
    """
    global _boundary_hook
    _boundary_hook = hook


def reach_boundary(boundary: str, kind: str) -> None:
    """Announce a durable boundary to the test hook, if one is installed."""
    if _boundary_hook is not None:
        _boundary_hook(boundary, kind)


# ----------------------------------------------------------- file helpers --

def open_regular_file(path: str, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
    """``os.open`` for the journal's own files: refuses a symlink (ELOOP) and a
    FIFO, directory or device (EINVAL) with ``OSError``; never blocks.  A file
    it creates is private to this user (:data:`PRIVATE_FILE_MODE`)."""
    descriptor = os.open(path, flags | _SAFE_OPEN_FLAGS, mode)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return descriptor


def read_regular_file(path: str, limit: int = OWN_FILE_READ_LIMIT) -> bytes:
    """Up to ``limit`` + 1 bytes of a regular file (one more than allowed, so a
    caller can tell "too large").  Raises ``FileNotFoundError`` when absent and
    ``OSError`` as :func:`open_regular_file` does."""
    descriptor = open_regular_file(path, os.O_RDONLY)
    try:
        chunks, remaining = [], limit + 1
        while remaining > 0:
            chunk = os.read(descriptor, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(descriptor)


# What a journal file's name may hold instead of a regular file.
_FILE_TYPES = ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"),
               (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
               (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def foreign_file_type(path: str) -> Optional[str]:
    """What stands at ``path`` when it exists but is not a regular file
    (``"symbolic link"``, ``"directory"``, ``"FIFO"``, ``"character device"``,
    ``"block device"``, ``"socket"``); None for a regular file, nothing, or a
    path that cannot be examined.  Never follows a link, never raises."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in _FILE_TYPES if test(mode)), None)


def foreign_file(path: str, kind: str) -> IntegrityError:
    """The ``foreign_file`` verdict: a journal file's name holds ``kind``, not
    the plugin's regular file (docs/cli.md §Verdict codes).  Nothing is
    opened through it; ``restart-journal`` keeps it as evidence."""
    name = os.path.basename(path)
    return IntegrityError("foreign_file", f"{name} in the data directory is a {kind}, not a "
                          "regular file: the plugin never writes one, never follows it and "
                          "never waits on it", file=name, file_type=kind)


def marker_written_ns(data_dir: str) -> Optional[int]:
    """When the marker of ``data_dir`` was last written (its modification
    time, ns), None when it is absent or not a regular file: a journal writes
    its marker at creation, and an archive switch at the start of a segment,
    before any of their calls can run."""
    try:
        found = os.lstat(os.path.join(data_dir, MARKER_NAME))
    except OSError:
        return None
    return found.st_mtime_ns if stat.S_ISREG(found.st_mode) else None


def file_state(path: str) -> Optional[tuple]:
    """``(device, inode, size, mtime_ns, ctime_ns)`` of a file, None when absent."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def file_size(path: str) -> int:
    """Size in bytes, or -1 when the file does not exist or cannot be stat'ed."""
    try:
        state = file_state(path)
    except OSError:
        return -1
    return -1 if state is None else state[2]


def fsync_directory(path: str) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        descriptor = os.open(path, flags)
    except (PermissionError, IsADirectoryError):
        return  # e.g. Windows: directory handles cannot be fsynced there
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_file(path: str) -> None:
    """``fsync`` a regular file by name (a database SQLite has closed, an
    archive copy) so its content is durable before it is renamed or linked.
    Only for files no open SQLite connection of this process uses: closing a
    descriptor drops the process's POSIX locks on that file.  Raises ``OSError``."""
    descriptor = os.open(path, os.O_RDONLY | _SAFE_OPEN_FLAGS)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def make_durable_directories(path: str) -> None:
    """Create ``path`` and its missing parents (each ``0700``: this user's
    alone), then fsync every ancestor so each entry on the way to ``path``
    survives power loss -- also those a host
    created moments before without an fsync (docs/persistence.md).  Once per
    journal creation: a handful of fsyncs.  Raises ``OSError``."""
    path = os.path.abspath(path)
    missing = []
    current = path
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIRECTORY_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
    current = path
    while True:
        parent = os.path.dirname(current)
        if parent == current:
            return
        try:
            fsync_directory(parent)
        except OSError as exc:
            # A directory high up may not take an fsync (read-only mount, no
            # permission, a filesystem without directory fsync); an I/O error does.
            if exc.errno not in (errno.EINVAL, errno.EROFS, errno.EACCES, errno.EPERM):
                raise
        current = parent


def storage_error(exc: OSError, action: str) -> JournalUnavailable:
    """An ``OSError`` as ``storage_unavailable``, naming the action and file."""
    where = f" ({exc.filename})" if exc.filename else ""
    return JournalUnavailable("storage_unavailable", f"{action}: {exc.strerror or exc}{where}")


def temp_path_for(target: str) -> str:
    """A temporary path beside ``target`` that no other writer uses."""
    return f"{target}.{os.getpid()}-{secrets.token_hex(4)}{TEMP_SUFFIX}"


def write_atomically(target: str, content: bytes, *, announce: str = "",
                     on_replaced: Optional[Callable[[], None]] = None,
                     before_replace: Optional[Callable[[], None]] = None) -> None:
    """Temp write, fsync, ``os.replace`` over ``target``, directory fsync
    (docs/format.md §Append step 3).  ``before_replace`` runs after the fsync
    and before the replace (a writer takes the head lock there, so that the
    lock spans the replace but not the temp file's fsync); ``on_replaced``
    runs right after the replace (so a caller knows ``target`` changed even if
    the directory fsync then fails).  Raises :class:`JournalUnavailable`
    ``storage_unavailable``; announces boundaries when ``announce`` names a
    kind."""
    directory = os.path.dirname(target)
    temp_path = temp_path_for(target)
    replaced = False
    try:
        descriptor = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _SAFE_OPEN_FLAGS,
                             PRIVATE_FILE_MODE)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(descriptor, view):]
            if announce:
                reach_boundary("checkpoint_written", announce)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        if announce:
            reach_boundary("checkpoint_fsynced", announce)
        if before_replace is not None:
            before_replace()
        os.replace(temp_path, target)
        replaced = True
        if on_replaced is not None:
            on_replaced()
        if announce:
            reach_boundary("checkpoint_replaced", announce)
        fsync_directory(directory)
        if announce:
            reach_boundary("directory_fsynced", announce)
    except BaseException as exc:
        if not replaced:  # whatever failed, this writer's temp file goes
            with contextlib.suppress(OSError):
                os.unlink(temp_path)
        if isinstance(exc, OSError):
            raise storage_error(exc, f"writing {os.path.basename(target)}") from None
        raise


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _remove_files(directory: str, doomed: Callable[[str], bool]) -> list:
    """Unlink every file in ``directory`` whose name ``doomed`` accepts;
    returns the names removed.  Never raises."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if doomed(name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
                removed.append(name)
    return removed


def remove_files_of_dead_processes(directory: str, pattern: "re.Pattern",
                                   kept: Optional[list] = None) -> list:
    """Remove the files in ``directory`` whose whole name matches ``pattern``
    and whose process -- the pattern's first group, a pid -- is gone; returns
    the names removed (one listing).  For files written without the writer
    lock, whose live writer must be left alone; ``kept``, when given, gets the
    names of those.  Never raises."""
    def dead(name: str) -> bool:
        match = pattern.fullmatch(name)
        if not match:
            return False
        if process_alive(int(match.group(1))):
            if kept is not None:
                kept.append(name)
            return False
        return True
    return _remove_files(directory, dead)


def remove_stale_temp_files(data_dir: str, targets: tuple) -> list:
    """Remove leftover temporary files of ``targets`` (names) in ``data_dir``;
    returns the names removed.  Only call it holding the writer lock: every
    writer of those files holds it, so any temp file present is a dead
    writer's.  Never raises."""
    return _remove_files(data_dir, lambda name: name.endswith(TEMP_SUFFIX) and any(
        name.startswith(target + ".") for target in targets))


# ------------------------------------------------------ head.json and marker --

@dataclass(frozen=True)
class FilesAtRest:
    """``head.json``, the marker and the archive intent as one look saw them
    (taken under the head lock: storage/head_lock.py).  ``checkpoint`` and
    ``marker``: the bytes, None when absent, or the ``OSError`` reading them
    raised; ``intent``: whether anything lies at the intent's name."""
    checkpoint: Any
    marker: Any
    intent: bool


def _checkpoint_key(checkpoint: dict) -> tuple:
    """What the text of a checkpoint of :func:`record.checkpoint_of`'s shape
    is a function of."""
    return checkpoint["schema"], checkpoint["journal_id"], checkpoint["count"], checkpoint["head"]


def _written_checkpoint_key(checkpoint: dict) -> Optional[tuple]:
    """:func:`_checkpoint_key` of a checkpoint about to be written, None for
    any other shape (e.g. one an archive intent supplied)."""
    get = checkpoint.get
    key = (get("schema"), get("journal_id"), get("count"), get("head"))
    if len(checkpoint) != 4 or tuple(map(type, key)) != (str, str, int, str):
        return None
    return key


class DurableFiles:
    """``head.json`` and ``initialized`` of one data directory.

    :meth:`read_at_rest` looks at the files; the checks compare what it saw
    with a verified chain summary (``journal_id``, ``schema``, ``count``,
    ``head``) and raise :class:`IntegrityError` with the verdict code of
    docs/cli.md §Verdict codes.  A file whose state (inode, size, times) is
    unchanged since it was last read is not read again.
    """

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.checkpoint_path = os.path.join(data_dir, CHECKPOINT_NAME)
        self.marker_path = os.path.join(data_dir, MARKER_NAME)
        self.intent_path = os.path.join(data_dir, INTENT_NAME)
        # True once this writer's current transaction replaced head.json.
        self.checkpoint_replaced = False
        # path -> (file state, content) as last read.
        self._files_read: dict = {}
        self._expected_checkpoint: tuple = (None, b"")
        self._expected_marker: tuple = (None, b"")

    def forget(self) -> None:
        """Drop every cached file state (the next look reads the files)."""
        self._files_read = {}

    def read_at_rest(self) -> FilesAtRest:
        """One look at the three files (one ``stat`` each; a file is read
        only when its state changed since it was last read).  Never raises."""
        return FilesAtRest(self._content(self.checkpoint_path), self._content(self.marker_path),
                           os.path.lexists(self.intent_path))

    def _content(self, path: str) -> Any:
        try:
            state = file_state(path)
            if state is None:
                return None
            cached = self._files_read.get(path)
            if cached is not None and cached[0] == state:
                return cached[1]
            content = read_regular_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return exc
        # The state taken before the read: a change during it is seen next time.
        self._files_read[path] = (state, content)
        return content

    def _bytes(self, found: Any, name: str,
               missing: Optional[Callable[[], IntegrityError]]) -> Optional[bytes]:
        """The bytes seen, raising ``missing()`` (absent), ``foreign_file`` (not
        a regular file) or ``storage_unavailable`` (unreadable); None for an
        absent file when ``missing`` is None."""
        if isinstance(found, OSError):
            path = os.path.join(self.data_dir, name)
            kind = foreign_file_type(path)
            if kind is not None:
                raise foreign_file(path, kind) from None
            raise storage_error(found, f"reading {name}")
        if found is None and missing is not None:
            raise missing()
        return found

    def check_marker_identity(self, journal_id: str, at_rest: FilesAtRest) -> None:
        """Before the chain is read: a marker naming another journal means the
        metadata was changed (or the database swapped) -- not a broken link."""
        if not isinstance(at_rest.marker, bytes):
            return  # missing or unreadable: check_marker names it after the chain
        try:
            decoded = json.loads(at_rest.marker)
        except ValueError:
            return
        if (isinstance(decoded, dict) and is_uuid(decoded.get("journal_id"))
                and decoded["journal_id"] != journal_id):
            raise IntegrityError("identity_mismatch",
                                 f"{MARKER_NAME} names journal {decoded['journal_id']} but the "
                                 f"database metadata names {journal_id}")

    def check_marker(self, journal_id: str, schema: str, count: int, at_rest: FilesAtRest, *,
                     creation_interrupted: bool = False) -> None:
        """The marker must hold exactly :func:`record.marker_text`.
        ``creation_interrupted``: an empty journal whose creator died before
        writing it -- its absence is then not an error."""
        missing = None if creation_interrupted else lambda: IntegrityError(
            "marker_missing", f"{MARKER_NAME} is missing beside a journal with {count} events")
        found = self._bytes(at_rest.marker, MARKER_NAME, missing)
        if self._expected_marker[0] != (journal_id, schema):  # encode once per journal
            self._expected_marker = ((journal_id, schema),
                                     marker_text(journal_id, schema).encode("utf-8"))
        if found is None or found == self._expected_marker[1]:
            return
        try:
            decoded = json.loads(found)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and decoded.get("journal_id") not in (None, journal_id):
            raise IntegrityError("identity_mismatch",
                                 f"{MARKER_NAME} names journal "
                                 f"{short(str(decoded.get('journal_id')))} but the database is "
                                 f"journal {journal_id}")
        raise IntegrityError("marker_corrupt", f"{MARKER_NAME} does not match the journal metadata")

    def check_checkpoint(self, expected: dict, at_rest: FilesAtRest, *,
                         creation_interrupted: bool = False) -> None:
        """``head.json`` must equal ``expected`` (the journal summary) exactly."""
        key = _checkpoint_key(expected)
        if self._expected_checkpoint[0] != key:  # encode once per chain state
            self._expected_checkpoint = (key, canonical_text(expected).encode("utf-8"))
        missing = None if creation_interrupted else lambda: IntegrityError(
            "checkpoint_missing", f"{CHECKPOINT_NAME} is missing")
        found = self._bytes(at_rest.checkpoint, CHECKPOINT_NAME, missing)
        if found is not None and found != self._expected_checkpoint[1]:
            compare_checkpoint(found, expected)

    def read_checkpoint(self) -> Any:
        """The decoded ``head.json`` (raises ``OSError``/``ValueError``)."""
        return json.loads(read_regular_file(self.checkpoint_path))

    def all_present(self) -> bool:
        """Whether both head.json and the marker exist (whatever they hold)."""
        return os.path.lexists(self.checkpoint_path) and os.path.lexists(self.marker_path)

    def write_checkpoint(self, checkpoint: dict, *, announce: str,
                         before_replace: Optional[Callable[[], None]] = None) -> None:
        """Replace ``head.json`` durably with ``checkpoint`` (sets
        :attr:`checkpoint_replaced` as soon as the replace happened).  The
        replace happens under the head lock held exclusively
        (``before_replace`` takes it, :func:`write_atomically`)."""
        content = canonical_text(checkpoint).encode("utf-8")
        write_atomically(self.checkpoint_path, content, announce=announce,
                         on_replaced=self._note_replaced, before_replace=before_replace)
        self._remember_written(self.checkpoint_path, content)
        key = _written_checkpoint_key(checkpoint)
        if key is not None:  # the next check of head.json compares with this text
            self._expected_checkpoint = (key, content)

    def _remember_written(self, path: str, content: bytes) -> None:
        """What this writer just wrote, so the next look needs only a ``stat``
        (the state taken after the replace: any later change shows in it)."""
        try:
            state = file_state(path)
        except OSError:
            state = None
        if state is None:
            self._files_read.pop(path, None)
        else:
            self._files_read[path] = (state, content)

    def _note_replaced(self) -> None:
        self.checkpoint_replaced = True

    def write_marker(self, journal_id: str, schema: str, *, announce: str) -> None:
        """Write the ``initialized`` marker durably (head lock held exclusively)."""
        content = marker_text(journal_id, schema).encode("utf-8")
        write_atomically(self.marker_path, content, announce=announce)
        self._remember_written(self.marker_path, content)

    def remove_stale_temp_files(self) -> list:
        """Leftover temp files of ``head.json`` and the marker (writer lock held)."""
        return remove_stale_temp_files(self.data_dir, (CHECKPOINT_NAME, MARKER_NAME,
                                                       INTENT_NAME))


def compare_checkpoint(found: bytes, expected: dict) -> None:
    """Raise the verdict for ``head.json`` bytes that differ from ``expected``
    (or return when they are JSON-equal: written by another tool, say with a
    trailing newline)."""
    if len(found) > OWN_FILE_READ_LIMIT:
        raise IntegrityError("checkpoint_corrupt",
                             f"{CHECKPOINT_NAME} is larger than {OWN_FILE_READ_LIMIT} bytes")
    if not found.strip():
        raise IntegrityError("checkpoint_empty", f"{CHECKPOINT_NAME} is empty")
    try:
        checkpoint = json.loads(found)
    except ValueError:
        raise IntegrityError("checkpoint_corrupt", f"{CHECKPOINT_NAME} is not JSON") from None
    problem = checkpoint_shape_problem(checkpoint)
    if problem:
        raise IntegrityError("checkpoint_corrupt", f"{CHECKPOINT_NAME}: {problem}")
    count = expected["count"]
    details = {"checkpoint_count": checkpoint["count"], "journal_count": count}
    if checkpoint["journal_id"] != expected["journal_id"]:
        raise IntegrityError("checkpoint_foreign",
                             f"{CHECKPOINT_NAME} belongs to journal {checkpoint['journal_id']}, "
                             f"not {expected['journal_id']}")
    if checkpoint["schema"] != expected["schema"]:
        raise IntegrityError("schema_mismatch", f"{CHECKPOINT_NAME} has schema "
                             f"{short(repr(checkpoint['schema']))}")
    if checkpoint["count"] == count + 1:
        raise IntegrityError("checkpoint_ahead",
                             f"{CHECKPOINT_NAME} is one event ahead of the database (a crash "
                             "between os.replace and COMMIT, or the last event was deleted)",
                             **details)
    if checkpoint["count"] > count:
        raise IntegrityError("journal_rolled_back",
                             f"the database holds {count} events but {CHECKPOINT_NAME} "
                             f"anchors {checkpoint['count']}: events were deleted or an older "
                             "copy was restored", **details)
    if checkpoint["count"] < count:
        raise IntegrityError("checkpoint_behind",
                             f"the database holds {count} events but {CHECKPOINT_NAME} "
                             f"anchors only {checkpoint['count']}: unanchored events or an "
                             "older checkpoint", **details)
    if checkpoint["head"] != expected["head"]:
        raise IntegrityError("checkpoint_mismatch",
                             f"{CHECKPOINT_NAME} head differs from the journal head at "
                             f"count {count}: history was rewritten", **details)
    if checkpoint != expected:
        raise IntegrityError("checkpoint_corrupt", f"{CHECKPOINT_NAME} has extra content")
