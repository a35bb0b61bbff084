"""Archives: sealed segments of history (docs/format.md §Archives).

An operator's ``archive`` seals the live history (journal ``J``, events 1..N)
into ``archive/J.sqlite3`` in the data directory -- a read-only SQLite file,
never deleted or pruned by the plugin -- and starts a new journal ``J'`` whose
first event, ``archived``, anchors it: ``{"journal_id": J, "count": N, "head":
H_N, "file": "archive/J.sqlite3"}``.  The live segment stays short, so the
first call of a process verifies little; each archive's anchor is checked on
every full verification, and ``verify --all`` re-verifies archives end to end.

This module owns the archive files: naming, building the sealed copy, the
switch intent, and checking and reading archives.  The switch itself (under
the writer lock) is :meth:`journal.Journal.archive`.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import sqlite3
import time
import urllib.parse
from typing import Any, Optional

from .chain import Chain, PossibleReuse, extend_chain
from .durable import (fsync_directory, fsync_file, make_durable_directories, read_regular_file,
                      remove_files_of_dead_processes, storage_error, write_atomically)
from .errors import AdmissionRefused, IntegrityError, JournalError
from .record import (INTENT_NAME, SCHEMA, canonical_text, checkpoint_shape_problem, decode_payload,
                     genesis_hash, is_uuid)
from .schema import (SQL_INSERT_EVENT, SQL_SELECT_HASH_AT, SQL_SELECT_LAST_EVENT,
                     SQL_SELECT_METADATA, SQL_SELECT_PAYLOAD_AT, SQL_SELECT_ROWS_AFTER,
                     schema_problem)

ARCHIVE_DIRECTORY = "archive"
ARCHIVE_SUFFIX = ".sqlite3"
# INTENT_NAME (record.py): {"from": sealed checkpoint, "to": new journal id, "file",
# "temp"}; while it exists, the next writer finishes or undoes the switch.
MAX_ARCHIVES = 100000  # an anchor chain is followed at most this far
# What opening the intent raises when a non-regular file lies at its name.
_NOT_AN_INTENT_FILE = frozenset((errno.ELOOP, errno.EINVAL, errno.EISDIR))
# archive/copies/copy.<pid>-<8 hex>.tmp (and its -journal): sweeping dead copies
# lists only them, never the archives.  Older versions made them in archive/.
COPIES_DIRECTORY = "copies"
_COPY_NAME = re.compile(r"copy\.(\d+)-[0-9a-f]{8}\.tmp")
_COPY_SUFFIXES = ("", "-journal")
_COPY_FILE = re.compile(_COPY_NAME.pattern + "(?:-journal)?")
# Directory timestamps move in ticks (up to ~2 s): a newer change may hide another.
_UNSETTLED_NS = 2_000_000_000
# Where an intent's "temp" may name a copy: today's and the earlier layout's.
_COPY_DIRECTORIES = (f"{ARCHIVE_DIRECTORY}/{COPIES_DIRECTORY}", ARCHIVE_DIRECTORY)


def copies_directory(data_dir: str) -> str:
    """``<data_dir>/archive/copies``: where unfinished copies are made."""
    return os.path.join(data_dir, ARCHIVE_DIRECTORY, COPIES_DIRECTORY)


def new_copy_path(data_dir: str) -> str:
    """A fresh path for this process's unfinished copy, in ``archive/copies/``."""
    return os.path.join(copies_directory(data_dir),
                        f"copy.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def copy_path(data_dir: str, relative: Any) -> Optional[str]:
    """The copy an intent names, if of :func:`new_copy_path`'s (or the earlier
    ``archive/copy.<pid>-<hex>.tmp``) exact form; else None."""
    if not isinstance(relative, str):
        return None
    directory, name = os.path.split(relative)
    if directory not in _COPY_DIRECTORIES or not _COPY_NAME.fullmatch(name):
        return None
    return os.path.join(data_dir, *directory.split("/"), name)


def remove_stale_copies(data_dir: str, seen: Optional[tuple] = None) -> tuple:
    """Remove copies in ``archive/copies/`` whose process is gone; returns
    ``(directory state, settled)`` to pass as ``seen`` next time, so it is
    listed again only once it changed (or a live copy was left): one
    ``lstat`` per write.  A non-directory is never listed.  Never raises."""
    directory = copies_directory(data_dir)
    try:  # taken before the listing: a copy created after it changes the state
        found = os.lstat(directory)
    except OSError:
        found = None
    state = None if found is None else (found.st_ino, found.st_mtime_ns, found.st_ctime_ns,
                                        stat.S_IFMT(found.st_mode))
    if seen is not None and seen[0] == state and seen[1]:
        return seen
    left: list = []
    if found is not None and stat.S_ISDIR(found.st_mode):
        remove_files_of_dead_processes(directory, _COPY_FILE, kept=left)
    # Settled: nothing left to a live process, and a later change would show.
    settled = not left and (found is None or time.time_ns() - max(
        found.st_mtime_ns, found.st_ctime_ns) >= _UNSETTLED_NS)
    return state, settled


def remove_stale_copies_of_earlier_layout(data_dir: str) -> None:
    """Remove dead archivers' copies left in ``archive/`` by older versions.
    Lists every archive, so only the ``archive`` command calls it.  Never raises."""
    remove_files_of_dead_processes(os.path.join(data_dir, ARCHIVE_DIRECTORY), _COPY_FILE)


def check_directory(data_dir: str) -> None:
    """``archive/`` and ``archive/copies/`` must each be absent or a real
    directory (never a link).  Raises :class:`AdmissionRefused`
    ``archive_refused`` (details ``archive_directory``: what was found,
    ``directory``: which), or ``storage_unavailable``; changes nothing."""
    for relative in (ARCHIVE_DIRECTORY, f"{ARCHIVE_DIRECTORY}/{COPIES_DIRECTORY}"):
        try:
            found = os.lstat(os.path.join(data_dir, *relative.split("/")))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise storage_error(exc, f"examining {relative}/") from None
        if stat.S_ISDIR(found.st_mode):
            continue
        kind, what = (("symbolic_link", "a symbolic link") if stat.S_ISLNK(found.st_mode)
                      else ("not_a_directory", "not a directory"))
        written, fix = (("archives are written", "make a directory in its place (with the "
                         "archive files it held)") if relative == ARCHIVE_DIRECTORY else
                        ("an archive's copy is made", "the next archive makes a new one (it "
                         "only ever holds unfinished copies)"))
        raise AdmissionRefused(
            "archive_refused", f"{relative} in the data directory is {what}; {written} only "
            f"in a real {relative}/ directory inside the data directory (never through a "
            f"link): move it away, {fix}, then archive again; nothing was changed",
            archive_directory=kind, directory=relative)


def relative_name(journal_id: str) -> str:
    """``archive/<journal_id>.sqlite3``: the anchor's ``file`` field."""
    return f"{ARCHIVE_DIRECTORY}/{journal_id}{ARCHIVE_SUFFIX}"


def archive_path(data_dir: str, anchor: dict) -> str:
    """The archive an anchor names, always inside ``data_dir/archive``."""
    return os.path.join(data_dir, ARCHIVE_DIRECTORY, os.path.basename(str(anchor.get("file", ""))))


def _read_only(path: str, options: str = "") -> sqlite3.Connection:
    return sqlite3.connect("file:" + urllib.parse.quote(path) + "?mode=ro" + options, uri=True,
                           isolation_level=None)


def open_archive(data_dir: str, anchor: dict) -> sqlite3.Connection:
    """A read-only, immutable connection to the archive ``anchor`` names (never
    through a symbolic link).  Raises :class:`IntegrityError` ``archive_missing``."""
    path = archive_path(data_dir, anchor)
    name = os.path.basename(path)
    try:
        directory, found = os.lstat(os.path.dirname(path)), os.lstat(path)
    except FileNotFoundError:
        raise IntegrityError("archive_missing", f"archive {name} is missing") from None
    except OSError as exc:
        raise IntegrityError("archive_missing", f"archive {name} cannot be examined "
                             f"({exc.strerror or exc})") from None
    if not (stat.S_ISDIR(directory.st_mode) and stat.S_ISREG(found.st_mode)):
        raise IntegrityError("archive_missing", f"archive {name} is not a regular file in the "
                             f"{ARCHIVE_DIRECTORY} directory (a symbolic link or another kind of "
                             "file is never followed)")
    try:
        return _read_only(path, "&immutable=1")
    except sqlite3.Error as exc:
        raise IntegrityError("archive_missing", f"archive {name} cannot be opened "
                             f"({exc})") from None


def _mismatch(anchor: dict, what: str) -> IntegrityError:
    return IntegrityError("archive_mismatch", f"archive {anchor.get('file')}: {what}",
                          archive=anchor.get("journal_id"))


def _summary(connection: sqlite3.Connection, anchor: dict) -> tuple:
    """``(journal_id, count, head, first payload)`` of an archive file."""
    try:
        metadata = dict(connection.execute(SQL_SELECT_METADATA).fetchall())
        last = connection.execute(SQL_SELECT_LAST_EVENT).fetchone()
        first = connection.execute(SQL_SELECT_PAYLOAD_AT, (1,)).fetchone()
    except sqlite3.Error as exc:
        raise _mismatch(anchor, f"not a journal ({exc})") from None
    if metadata.get("schema") != SCHEMA:
        raise _mismatch(anchor, f"schema {metadata.get('schema')!r}")
    count, head = last if last else (0, genesis_hash(str(metadata.get("journal_id")), SCHEMA))
    return metadata.get("journal_id"), count, head, first[0] if first else None


def check_anchor(data_dir: str, anchor: dict) -> None:
    """The archive ``anchor`` names exists and ends where it says (journal
    id, count, head); reads two rows of one archive.  Raises
    ``archive_missing`` or ``archive_mismatch``."""
    with contextlib.closing(open_archive(data_dir, anchor)) as connection:
        journal_id, count, head, _ = _summary(connection, anchor)
    if (journal_id, count, head) != (anchor["journal_id"], anchor["count"], anchor["head"]):
        raise _mismatch(anchor, f"holds journal {journal_id} at {count} events ending "
                                f"{str(head)[:12]}..., the anchor names "
                                f"{anchor['journal_id']} at {anchor['count']}")


def _older_anchor(data_dir: str, anchor: dict) -> Optional[dict]:
    """The next older archive's anchor, or None.  Raises as :func:`check_anchor`."""
    with contextlib.closing(open_archive(data_dir, anchor)) as connection:
        first = _summary(connection, anchor)[3]
    earlier = decode_payload(first) if isinstance(first, str) else None
    if not (isinstance(earlier, dict) and earlier.get("kind") == "archived"):
        return None
    older = earlier.get("archive")
    if not (isinstance(older, dict) and isinstance(older.get("journal_id"), str)):
        raise _mismatch(anchor, "its first event is an anchor of no archive")
    return older


def anchors(data_dir: str, anchor: Optional[dict]) -> list:
    """Every anchor of the chain, newest archive first ([] for None)."""
    return _walk(anchor, lambda current: _older_anchor(data_dir, current))


def _walk(anchor: Optional[dict], older: Any) -> list:
    """The anchors from ``anchor`` on via ``older``; ``archive_mismatch`` on a loop."""
    found, seen = [], set()
    while anchor is not None and len(found) < MAX_ARCHIVES:
        if anchor.get("journal_id") in seen:
            raise _mismatch(anchor, "the chain of archives loops")
        seen.add(anchor.get("journal_id"))
        found.append(anchor)
        anchor = older(anchor)
    return found


def anchor_of(data_dir: str, anchor: Optional[dict], journal_id: str) -> Optional[dict]:
    """The anchor of journal ``journal_id``'s archive on the chain from
    ``anchor``, or None.  Raises ``archive_missing``/``archive_mismatch``."""
    for _ in range(MAX_ARCHIVES):
        if not isinstance(anchor, dict):
            return None
        if anchor.get("journal_id") == journal_id:
            return anchor
        anchor = _older_anchor(data_dir, anchor)
    return None


def continues(data_dir: str, anchor: Optional[dict], journal_id: str, count: int,
              head: str) -> bool:
    """Whether the chain from ``anchor`` seals journal ``journal_id``'s first
    ``count`` events ending at ``head`` (archived, not lost).  Raises as
    :func:`anchor_of`."""
    found = anchor_of(data_dir, anchor, journal_id)
    if found is None:
        return False
    sealed = found.get("count", -1)
    if count == sealed:
        return found.get("head") == head
    return 0 < count < sealed and hash_at(data_dir, found, count) == head


def verify_archive(data_dir: str, anchor: dict, follow: bool = True) -> Chain:
    """Verify one archive end to end; returns its :class:`Chain`.  ``follow``:
    also :func:`check_anchor` the next older one.  Raises
    :class:`IntegrityError` ``archive_mismatch`` (naming the verdict)."""
    with contextlib.closing(open_archive(data_dir, anchor)) as connection:
        try:
            chain = _verified_chain(connection, _summary(connection, anchor)[0])
        except JournalError as exc:
            raise _mismatch(anchor, f"{exc.code}: {exc.message}") from None
        except sqlite3.Error as exc:
            raise _mismatch(anchor, f"unreadable ({exc})") from None
    if (chain.journal_id, chain.count, chain.head) != (anchor["journal_id"], anchor["count"],
                                                       anchor["head"]):
        raise _mismatch(anchor, "its verified end differs from the anchor")
    if follow and chain.archive is not None:
        check_anchor(data_dir, chain.archive)
    return chain


def verify_every_archive(data_dir: str, anchor: Optional[dict]) -> list:
    """Verify every archive from ``anchor`` end to end, each once; returns
    their anchors, newest first.  Raises as :func:`verify_archive`."""
    return _walk(anchor, lambda current: verify_archive(data_dir, current, follow=False).archive)


def _verified_chain(connection: sqlite3.Connection, journal_id: Any) -> Chain:
    """Every row verified from genesis.  Raises JournalError, sqlite3.Error."""
    schema_problem(connection)
    for exact in (None, set()):
        chain = Chain(journal_id=journal_id, schema=SCHEMA, count=0,
                      head=genesis_hash(journal_id, SCHEMA), exact_ids=exact)
        try:
            extend_chain(chain, connection.execute(SQL_SELECT_ROWS_AFTER, (0,)), full=True)
            return chain
        except PossibleReuse:
            continue
    raise AssertionError("unreachable: the exact pass never raises PossibleReuse")


def hash_at(data_dir: str, anchor: dict, seq: int) -> Optional[str]:
    """The stored hash of event ``seq`` of an archive (None if absent)."""
    with contextlib.closing(open_archive(data_dir, anchor)) as connection:
        row = connection.execute(SQL_SELECT_HASH_AT, (seq,)).fetchone()
    return row[0] if row else None


def start_copy(database_path: str, temp_path: str) -> None:
    """``VACUUM INTO`` ``temp_path`` from a read-only connection (no writer
    lock for the long part), its directory made durably first."""
    make_durable_directories(os.path.dirname(temp_path))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp_path)
    with contextlib.closing(_read_only(database_path)) as source:
        source.execute("VACUUM INTO ?", (temp_path,))


def verify_copy(temp_path: str) -> Chain:
    """Verify a :func:`start_copy` copy end to end, without the writer lock;
    returns its :class:`Chain`.  Raises JournalError and sqlite3.Error."""
    with contextlib.closing(_read_only(temp_path)) as copy:
        journal_id = dict(copy.execute(SQL_SELECT_METADATA).fetchall()).get("journal_id")
        if not is_uuid(journal_id):
            raise IntegrityError("archive_mismatch", "the archive copy names no journal; "
                                 "nothing was switched")
        return _verified_chain(copy, journal_id)


def refuse_unsealable(chain: Chain) -> None:
    """:class:`AdmissionRefused` ``archive_refused`` when ``chain`` has an
    open or unacknowledged operation, or only its anchor (docs/cli.md §archive)."""
    if chain.open or chain.attention:
        raise AdmissionRefused("archive_refused", "an operation is unresolved or a late "
                               "outcome awaits acknowledgement: settle it first",
                               unresolved=len(chain.open), attention=len(chain.attention))
    if chain.count <= (1 if chain.archive is not None else 0):
        raise AdmissionRefused("archive_refused", "nothing to archive: the live segment "
                               "holds no event but its anchor")


def refuse_stale_copy(copied: Chain, live: Chain, live_hash_at_copied: Optional[str]) -> None:
    """Under the writer lock: the copy must be a prefix of the live journal
    (else another archive switched meanwhile and sealing would lose events):
    :class:`AdmissionRefused` ``archive_refused``, nothing changed."""
    if (copied.journal_id == live.journal_id and copied.count <= live.count
            and live_hash_at_copied == copied.head):
        return
    raise AdmissionRefused(
        "archive_refused", f"the live history changed while it was copied (journal "
        f"{copied.journal_id} with {copied.count} events was copied; the live journal is now "
        f"{live.journal_id} with {live.count}): another archive sealed it meanwhile. Nothing was "
        "changed; run archive again to seal the new segment", copied=copied.checkpoint(),
        live=live.checkpoint())


def refuse_taken_name(data_dir: str, journal_id: str) -> str:
    """Under the writer lock: the path of ``journal_id``'s archive, after
    :func:`check_directory`; ``archive_refused`` if the name is taken."""
    check_directory(data_dir)
    final = archive_path(data_dir, {"file": relative_name(journal_id)})
    if os.path.lexists(final):
        raise AdmissionRefused("archive_refused", f"{relative_name(journal_id)} already exists; "
                               "an archive is never replaced: a person must look (nothing was "
                               "changed)", file=relative_name(journal_id))
    return final


def discard(temp_path: str) -> None:
    """Remove an unfinished copy and its ``-journal``.  Never raises."""
    for path in (temp_path + suffix for suffix in _COPY_SUFFIXES):
        with contextlib.suppress(OSError):
            os.unlink(path)


def finish_copy(temp_path: str, rows: list, chain: Chain) -> None:
    """Add the rows since the copy began, check it ends at ``chain``, fsync."""
    copy = sqlite3.connect(temp_path, isolation_level=None)
    try:
        copy.execute("BEGIN IMMEDIATE")
        copy.executemany(SQL_INSERT_EVENT, rows)
        last = copy.execute(SQL_SELECT_LAST_EVENT).fetchone()
        copy.execute("COMMIT")
    finally:
        copy.close()
    if tuple(last or (0, None)) != (chain.count, chain.head):
        raise IntegrityError("archive_mismatch", "the archive copy does not end at the live "
                             "head; nothing was switched")
    fsync_file(temp_path)


def seal(temp_path: str, final_path: str) -> None:
    """chmod 0400, rename into ``archive/``, fsync both directories and the data
    directory."""
    os.chmod(temp_path, 0o400)  # read-only, and this user's alone
    os.replace(temp_path, final_path)
    archive_dir = os.path.dirname(final_path)
    for directory in dict.fromkeys((archive_dir, os.path.dirname(temp_path),
                                    os.path.dirname(archive_dir))):
        fsync_directory(directory)


def settle_switch(data_dir: str, files: Any, intent: Any, journal_id: Optional[str],
                  count: int, first_hash: Optional[str]) -> str:
    """Finish or undo a switch under the writer lock from what the database
    holds: ``"undid"`` (still the sealed journal; head.json and marker put
    back) or ``"finished"`` (the new journal, only its anchor).  ``files``: a
    :class:`durable.DurableFiles`.  Else ``archive_interrupted``, nothing changed."""
    sealed = intent.get("from") if isinstance(intent, dict) else None
    target = intent.get("to") if isinstance(intent, dict) else None
    if (checkpoint_shape_problem(sealed) is not None or not is_uuid(sealed["journal_id"])
            or not is_uuid(target)):
        raise IntegrityError("archive_interrupted", f"{INTENT_NAME} is not an intent this "
                             "plugin writes; nothing was changed: a person must look")
    if journal_id == sealed["journal_id"]:  # undo: the old history is live
        # Only names this switch makes, never a path the intent spells out.
        made = [archive_path(data_dir, {"file": relative_name(journal_id)}),
                copy_path(data_dir, intent.get("temp"))]
        for path in filter(None, made):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(path)
        files.write_checkpoint(sealed, announce="")
        files.write_marker(journal_id, SCHEMA, announce="")
        done = "undid"
    elif journal_id == target and count == 1 and first_hash is not None:
        files.write_marker(journal_id, SCHEMA, announce="")
        files.write_checkpoint({"schema": SCHEMA, "journal_id": journal_id, "count": 1,
                                "head": first_hash}, announce="")
        done = "finished"
    else:
        raise IntegrityError("archive_interrupted",
                             f"{INTENT_NAME} names journals {sealed['journal_id']} -> {target}, "
                             f"but the database is journal {journal_id} with {count} events: "
                             "a person must look")
    remove_intent(data_dir)
    return done


def write_intent(data_dir: str, intent: dict) -> None:
    """Record the switch about to happen, durably."""
    write_atomically(os.path.join(data_dir, INTENT_NAME),
                     canonical_text(intent).encode("utf-8"), announce="archive_intent")


def read_intent(data_dir: str) -> Optional[dict]:
    """The switch in progress, or None."""
    try:
        return json.loads(read_regular_file(os.path.join(data_dir, INTENT_NAME)))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in _NOT_AN_INTENT_FILE:
            # EMFILE, EIO...: says nothing about the switch.
            raise storage_error(exc, f"reading {INTENT_NAME}") from None
        raise IntegrityError("archive_interrupted", f"{INTENT_NAME} is not a regular file "
                             f"({exc})") from None
    except ValueError as exc:
        raise IntegrityError("archive_interrupted", f"{INTENT_NAME} is unreadable ({exc})") \
            from None


def remove_intent(data_dir: str) -> None:
    """The switch is complete or undone."""
    try:
        os.unlink(os.path.join(data_dir, INTENT_NAME))
        fsync_directory(data_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise storage_error(exc, f"removing {INTENT_NAME}") from None
