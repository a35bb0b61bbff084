"""The crash-recovery journal: which events may be appended, and when.

One data directory holds one journal (docs/format.md §Files): ``journal.sqlite3``
(WAL mode, ``synchronous=FULL``), ``head.json`` (the checkpoint) and
``initialized`` (the marker).  :class:`Journal` is the journal's vocabulary --
admission, outcomes, resolutions, late outcomes, repair, archive -- on top of
:class:`store.JournalStore`, which verifies and appends.

The state machine of one operation (docs/format.md §Events, §Transitions)::

    started ──► PENDING ──returned──► RETURNED (closed)
                   │ └───uncertain──► UNCERTAIN
                   │                    │
                   └──resolved──┬───────┘  (an operator, with evidence)
                                ▼
                             RESOLVED ──late_outcome──► RESOLVED, needs attention
                                                            │ acknowledged
                                                            ▼
                                                         RESOLVED (closed)

* PENDING: its ``started`` is durable, so its tool may be running, or may have
  run.  Its worker holds the call's lock (storage/call_lock.py) from before
  ``started`` until the outcome is committed: while the lock is held the call
  is out (the gate is *busy*); once it is gone -- the worker died, however --
  nobody knows whether the side effect happened, and the gate is *closed*
  until a person resolves it.  A crash here is exactly that case.
* UNCERTAIN: the tool raised, was cancelled or answered an error; the gate is
  closed until a person resolves it.  Nothing can happen to it but that.
* RETURNED: the tool answered normally; nothing more is ever written for it.
* RESOLVED: an operator recorded ``completed`` or ``not_applied``.  If the
  call was still running (``resolve --force``), its worker keeps its lock and
  records how the tool really ended as a ``late_outcome`` when it returns;
  that needs an operator's ``acknowledged``.  A crash of that worker leaves
  the resolution as it is (the late outcome never comes; nothing waits for it).

Only PENDING and UNCERTAIN are *open*; while any is open, :meth:`Journal.admit`
refuses (the one rule of admission, under the writer lock).  An ``archived``
event is no operation's: it anchors the sealed segment a new one continues
(docs/format.md §Archives).

Append protocol (docs/format.md §Append; the order of database and file work
lives in one place, :meth:`store.JournalStore.writing`)::

    verify on a read snapshot (no lock; the whole history when needed)
    BEGIN IMMEDIATE: catch up with what changed since (cheap), check the files
    1 INSERT, confirm the stored row  2 head.json: temp write, fsync;
      head lock (exclusive), os.replace, directory fsync  3 COMMIT, head lock released

What a crash or a failure at each point leaves behind:

* before the ``os.replace``: SQLite rolls the INSERT back; ``head.json`` is
  unchanged.  The event never happened (for ``started``: the tool never ran).
* a failure (not a crash) after the ``os.replace`` and before COMMIT: the old
  ``head.json`` is put back *while both locks are still held*, then ROLLBACK.
* a crash between the ``os.replace`` and COMMIT, or a failed COMMIT (the event
  may or may not be durable): ``head.json`` stays one event ahead.  Either the
  event is there after restart (consistent), or verification reports
  ``checkpoint_ahead``, which :meth:`Journal.repair_checkpoint` handles; every
  protected call is refused meanwhile.  A reader never mistakes a live
  writer's step 2 for this state: it reads the files under the head lock.
* after COMMIT: the event is durable.

Errors: every failure is a :class:`JournalError`; ``sqlite3.Error`` never
escapes (see :func:`database.translate_sqlite_error`).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .storage import archive, archive_reading
from .storage.ancestry import check_ancestor
from .storage.call_lock import check_calls_directory, refuse_calls_out
from .storage.chain import (Chain, JournalStatus, Operation, lost_window,
                            operation_from_started, operation_key)
from .storage.database import DEFAULT_BUSY_TIMEOUT_SECONDS, translate_sqlite_error
from .storage.durable import marker_written_ns, reach_boundary, storage_error
from .storage.errors import AdmissionRefused, IntegrityError, JournalError, JournalUnavailable
from .storage.record import (LOST_TOOL, OUTCOMES, STATE_PENDING, decode_payload, genesis_hash,
                             optional_text, value_hash)
from .storage.snapshot import DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS
from .storage.store import JournalStore

# Reads of the live segment that find it switched between their verification
# and their rows (an archive sealed it) verify again this many times in all.
READ_ATTEMPTS = 3
# SQLite integers are 64-bit.
SQLITE_MAX_INTEGER = 2**63 - 1
# result_hash, fingerprint and args_hash when there is nothing to hash.
NO_RESPONSE_HASH = value_hash(None)


@contextlib.contextmanager
def _archive_step(action: str) -> Iterator[None]:
    """Name a failure of the archive files' SQLite or filesystem work as a
    :class:`JournalError` (``storage_unavailable`` for a full disk, ...)."""
    try:
        yield
    except sqlite3.Error as exc:
        raise translate_sqlite_error(exc, action) from None
    except OSError as exc:
        raise storage_error(exc, action) from None


@dataclass(frozen=True)
class Resolution:
    """What :meth:`Journal.resolve` or :meth:`Journal.acknowledge` did: the
    operation as it was, and the checkpoint before and after, read in the same
    transaction."""
    operation: Operation
    checkpoint_before: dict
    checkpoint_after: dict


class Journal:
    """Appends, state reconstruction and verification for one data directory
    (docs/format.md, docs/cli.md).

    ``data_dir``: the profile's plugin data directory (str or path).
    ``busy_timeout``: seconds to wait for SQLite's writer lock.
    ``readonly``: never creates or writes anything (the operator's inspection).
    ``create``: create a fresh journal when none exists (the guard); when False a
    missing journal raises ``journal_absent``.
    ``full_verification``: verify the whole history on every call.
    ``full_verification_interval``: seconds after which the next call verifies
    the whole history again (default 600).

    Thread-safe.  Every method raises only :class:`JournalError` subclasses.
    """

    def __init__(self, data_dir: "os.PathLike[str] | str", *,
                 busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
                 readonly: bool = False, create: bool = True,
                 full_verification: bool = False,
                 full_verification_interval: float = DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS):
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        self.readonly = readonly
        self.busy_timeout = float(busy_timeout)  # seconds (also what status waits for, docs/cli.md)
        self._store = JournalStore(self.data_dir, busy_timeout=float(busy_timeout),
                                   readonly=readonly, create=create and not readonly,
                                   full_verification=full_verification,
                                   full_verification_interval=float(full_verification_interval))
        self.database_path = self._store.database.path

    # ------------------------------------------------------------ reading --

    def status(self) -> JournalStatus:
        """Verify and return the summary, open operations and late outcomes
        needing attention (docs/cli.md §status); ``storage_unavailable`` when
        ``calls/`` is not a directory."""
        with self._store.lock:
            status = self._status_of(self._store.snapshot())
        check_calls_directory(self.data_dir)  # else every call is refused: say so here too
        return status

    def unresolved(self) -> tuple:
        """Verify and return the open (pending/uncertain) operations, oldest first."""
        return self.status().unresolved

    def checkpoint(self) -> dict:
        """Verify and return the current checkpoint dict (docs/cli.md §checkpoint)."""
        return self.status().checkpoint

    def resolved_while_running(self, operation_id: str) -> bool:
        """Verify, then whether an operator resolved ``operation_id`` and no late
        outcome of it is recorded yet: its worker, if it still runs, holds a
        lock that must not keep the profile busy (docs/cli.md §Owner)."""
        with self._store.lock:
            return operation_key(operation_id) in self._store.snapshot().resolved

    def verify(self, external_checkpoint: Any = None) -> JournalStatus:
        """Full verification of the whole history (docs/cli.md §verify).

        ``external_checkpoint``: an optional dict that must be an *ancestor* of
        the journal (docs/format.md §Checkpoint); raises
        :class:`IntegrityError` ``checkpoint_not_ancestor`` otherwise and
        :class:`AdmissionRefused` ``invalid_checkpoint`` for a malformed one.
        """
        with self._store.lock:
            chain = self._store.snapshot(full=True)
            if external_checkpoint is not None:
                check_ancestor(self.data_dir, chain, external_checkpoint, self._store.hash_at)
            return self._status_of(chain)

    def history(self, since: int = 0, operation_id: Optional[str] = None) -> tuple:
        """One full verification, then ``(JournalStatus, iterator of (seq,
        payload dict))`` for ``since`` < seq <= the verified head (only
        ``operation_id``'s when given), read lazily in the read snapshot that
        holds the verified segment (:meth:`_pinned_history`): consume it before
        using the journal again."""
        status, rows, _ = self._pinned_history(since, operation_id, with_archives=False)
        return status, rows

    def export(self, since: int = 0) -> tuple:
        """``log --all`` (docs/cli.md §log): ``(JournalStatus, iterator of
        (anchor, seq, payload))``: every archived event, oldest archive first
        (``anchor`` names its segment), then the live segment's events with
        seq > ``since`` (``anchor`` None).  The archives are those the verified
        live segment anchors, each verified end to end before this returns;
        the live rows are read as :meth:`history` reads them, so an archive
        switching the segment meanwhile gives the old state or the new one,
        never half of each.  Raises as :meth:`history` and
        :meth:`archived_history`."""
        status, rows, anchors = self._pinned_history(since, None, with_archives=True)
        return status, itertools.chain(self._archived_events(anchors, None),
                                       ((None, seq, payload) for seq, payload in rows))

    def _pinned_history(self, since: int, operation_id: Optional[str], *,
                        with_archives: bool) -> tuple:
        """``(status, live rows, archives oldest first)``, read so that the
        rows are the verified segment's: the first row is read (SQLite keeps
        that read snapshot until the rows are all read), and in the same
        snapshot the row at the verified head must have the verified hash.
        A segment switched between the verification and that read (an
        archive) is verified again, up to :data:`READ_ATTEMPTS` times, then
        ``journal_changed_while_read``."""
        since = max(0, min(int(since), SQLITE_MAX_INTEGER))
        for _ in range(READ_ATTEMPTS):
            with self._store.lock:
                chain = self._store.snapshot(full=True)
                status = self._status_of(chain)
            anchors = self._verified_archives(chain, None) if with_archives else []
            reach_boundary("verified", "export" if with_archives else "history")
            count, head = status.checkpoint["count"], status.checkpoint["head"]
            with self._store.lock:
                rows = self._store.rows(since, count, operation_id)
                first = next(rows, None)
                if count == 0 or self._store.hash_at(count) == head:
                    return (status, itertools.chain(() if first is None else (first,), rows),
                            anchors)
                rows.close()
        raise JournalUnavailable(
            "journal_changed_while_read", f"the live segment was switched (an archive sealed "
            f"it) each of the {READ_ATTEMPTS} times it was read; nothing of it was printed")

    def events(self, since: int = 0) -> list:
        """Verify the whole journal, then return ``(seq, payload dict)`` for every
        event with seq > ``since`` (a list; see :meth:`history` to stream)."""
        with self._store.lock:
            return list(self.history(since)[1])

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._store.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------ writing --

    def admit(self, *, operation_id: str, tool: str, args_hash: str, fingerprint: str,
              session_id: Optional[str], tool_call_id: Optional[str],
              call_lock: Any = None) -> None:
        """Admission (docs/guard.md §Execution contract): refuse if any operation
        is open, else take the call's lock (``call_lock``, a
        :class:`call_lock.CallLock` the caller releases) and durably append
        ``started``, in that order under the writer lock: a refused call
        touches no file, and no reader ever sees the operation pending
        without its lock.  Raises :class:`AdmissionRefused`
        ``unresolved_operations`` (with ``details["operations"]``),
        :class:`IntegrityError`, :class:`JournalUnavailable`
        (``storage_unavailable`` when the call's lock cannot be made;
        ``commit_failed``: the event may or may not be durable).  On any other
        error nothing was committed."""
        for name, value in (("session_id", session_id), ("tool_call_id", tool_call_id)):
            if not optional_text(value):
                raise AdmissionRefused("invalid_request", f"{name} must be text or null")
        if not (isinstance(tool, str) and tool):
            raise AdmissionRefused("invalid_request", "tool name must be non-empty text")
        with self._store.writing("started", give_up=self._refuse_open) as chain:
            self._refuse_open(chain)
            if call_lock is not None:
                try:
                    call_lock.acquire()
                except OSError as exc:
                    check_calls_directory(self.data_dir)  # the status surfaces' own words
                    raise storage_error(exc, "making the call's lock") from None
            self._store.append(chain, {"kind": "started", "operation_id": operation_id,
                                       "tool": tool, "fingerprint": fingerprint,
                                       "args_hash": args_hash, "session_id": session_id,
                                       "tool_call_id": tool_call_id})

    @staticmethod
    def _refuse_open(chain: Chain) -> None:
        """Admission's one rule: nothing may be open (docs/guard.md §Execution
        contract); also asked while another writer holds the lock, so that a
        call that would be refused under it is refused at once."""
        if chain.open:
            operations = chain.operations()
            raise AdmissionRefused(
                "unresolved_operations",
                f"{len(operations)} protected operation(s) have an unknown outcome",
                operations=[operation.to_json() for operation in operations])

    def record_outcome(self, operation_id: str, *, uncertain: bool, result_hash: str,
                       reason: str) -> None:
        """Append ``returned`` (``uncertain=False``) or ``uncertain`` for a pending
        operation; else :class:`AdmissionRefused` ``operation_not_pending``,
        ``details["resolved"]``: whether an operator resolved it meanwhile."""
        kind = "uncertain" if uncertain else "returned"
        with self._store.writing(kind) as chain:
            current = chain.open.get(operation_key(operation_id))  # [payload, seq, state, ...]
            if current is None or current[2] != STATE_PENDING:
                raise AdmissionRefused("operation_not_pending",
                                       f"operation {operation_id} is not pending",
                                       operation_id=operation_id,
                                       resolved=operation_key(operation_id) in chain.resolved)
            self._store.append(chain, {"kind": kind, "operation_id": operation_id,
                                       "result_hash": result_hash, "reason": reason})

    def record_late_outcome(self, operation_id: str, *, result_hash: str, reason: str) -> None:
        """Append ``late_outcome`` for an operation an operator resolved while
        its call was still running (docs/format.md §Events).  Raises
        :class:`AdmissionRefused` ``operation_not_resolved``."""
        with self._store.writing("late_outcome") as chain:
            if operation_key(operation_id) not in chain.resolved:
                raise AdmissionRefused("operation_not_resolved",
                                       f"operation {operation_id} is not resolved (or already "
                                       "has a late outcome)", operation_id=operation_id)
            self._store.append(chain, {"kind": "late_outcome", "operation_id": operation_id,
                                       "result_hash": result_hash, "reason": reason})

    def resolve(self, operation_id: str, *, outcome: str, evidence: str,
                operator: Optional[dict] = None, forced: bool = False) -> Resolution:
        """Append ``resolved`` for a pending or uncertain operation
        (docs/cli.md §resolve).  ``operator``: who acted (``user``, ``uid``,
        ``host``).  Raises :class:`AdmissionRefused` (``invalid_request``,
        ``unknown_operation``, ``operation_not_open``), :class:`IntegrityError`,
        :class:`JournalUnavailable`."""
        if outcome not in OUTCOMES:
            raise AdmissionRefused("invalid_request", f"outcome must be one of {OUTCOMES}")
        self._require_evidence(evidence)
        with self._store.writing("resolved") as chain:
            current = chain.operation(operation_id)
            if current is None:
                self._refuse_closed(chain, operation_id)
            before = chain.checkpoint()
            fields = {"kind": "resolved", "operation_id": operation_id, "outcome": outcome,
                      "evidence": evidence, "forced": bool(forced)}
            if operator is not None:
                fields["operator"] = operator
            self._store.append(chain, fields)
            return Resolution(current, before, chain.checkpoint())

    def acknowledge(self, operation_id: str, *, evidence: str,
                    operator: Optional[dict] = None) -> Resolution:
        """Append ``acknowledged`` for a late outcome (docs/cli.md
        §acknowledge).  Raises :class:`AdmissionRefused` ``nothing_to_acknowledge``."""
        self._require_evidence(evidence)
        with self._store.writing("acknowledged") as chain:
            record = chain.attention.get(operation_key(operation_id))
            if record is None:
                raise AdmissionRefused("nothing_to_acknowledge",
                                       f"operation {operation_id} has no late outcome awaiting "
                                       "acknowledgement", operation_id=operation_id)
            late = self._late_operation(operation_id, *record)
            before = chain.checkpoint()
            fields = {"kind": "acknowledged", "operation_id": operation_id, "evidence": evidence}
            if operator is not None:
                fields["operator"] = operator
            self._store.append(chain, fields)
            return Resolution(late, before, chain.checkpoint())

    def repair_checkpoint(self) -> tuple:
        """Clear ``checkpoint_ahead`` (docs/cli.md §repair-checkpoint).

        Only when the database chain and marker verify on their own and
        ``head.json`` names the same journal and schema and exactly one event
        more.  When no operation is open, the lost event may have been a
        ``started`` whose tool ran, so it comes back as an open operation
        (tool ``unknown``, ``uncertain`` with reason ``lost_in_crash``) for a
        person to settle; otherwise the open operation keeps blocking.

        Returns ``(checkpoint_before, checkpoint_after, lost operation id or
        None)``.  Raises :class:`IntegrityError` ``repair_not_applicable`` for
        every other state (``details["found"]`` is the real verdict).
        """
        if self.readonly:
            raise JournalUnavailable("storage_unavailable", "journal opened read-only")
        with self._store.lock:
            with self._store.writing("repair", check_checkpoint=False) as chain:
                before = self._ahead_checkpoint(chain)
                lost = None
                if chain.open:
                    self._store.replace_checkpoint(chain.checkpoint(), announce="repair")
                else:
                    # One transaction: head.json moves from the lost event to the
                    # new started, so a crash here leaves checkpoint_ahead again.
                    lost = str(uuid.uuid4())
                    self._store.append(chain, {
                        "kind": "started", "operation_id": lost, "tool": LOST_TOOL,
                        "fingerprint": NO_RESPONSE_HASH, "args_hash": NO_RESPONSE_HASH,
                        "session_id": None, "tool_call_id": None, "lost_in_crash": before,
                        "lost_window": lost_window(
                            time.time_ns(), last_event_ns=self._timestamp_at(chain.count),
                            created_ns=self._store.created_ns(),
                            marker_written_ns=marker_written_ns(self.data_dir))})
            if lost is not None:
                self.record_outcome(lost, uncertain=True, result_hash=NO_RESPONSE_HASH,
                                    reason="lost_in_crash")
            return before, self.checkpoint(), lost

    def archive(self) -> dict:
        """Seal the live history into ``archive/<journal id>.sqlite3`` and start a
        new segment anchored to it (docs/cli.md §archive, docs/format.md
        §Archives).  The long copy runs without the writer lock; the switch runs
        under it, recorded in an intent file first, so that a crash at any point
        leaves the old state or the new one (the next writer finishes or undoes
        it).  It seals exactly the segment it copied, or changes nothing.
        Returns ``{"archived": anchor, "checkpoint_before",
        "checkpoint_after"}``.  Raises :class:`AdmissionRefused`
        ``archive_refused`` while an operation is open or a late outcome awaits
        acknowledgement, when there is nothing to archive, when another archive
        switched the segment away meanwhile, or when ``archive/`` is unusable;
        ``owner_running`` while any protected call is out (storage/call_lock.py);
        :class:`JournalError` for a failure (``storage_unavailable`` for a full
        disk), after which the journal is as it was."""
        if self.readonly:
            raise JournalUnavailable("storage_unavailable", "journal opened read-only")
        with self._store.lock:
            archive.refuse_unsealable(self._store.snapshot())
            archive.check_directory(self.data_dir)
            archive.remove_stale_copies_of_earlier_layout(self.data_dir)  # rare: lists archive/
            temp = archive.new_copy_path(self.data_dir)
            intent_written, after = False, None
            try:
                with _archive_step("archiving"):
                    archive.start_copy(self._store.database.path, temp)
                    copied = archive.verify_copy(temp)
                    reach_boundary("archive_copied", "archived")
                    with self._store.writing("archived") as chain:
                        archive.refuse_unsealable(chain)
                        refuse_calls_out(self.data_dir)
                        archive.refuse_stale_copy(copied, chain, self._hash_at(chain, copied.count))
                        final = archive.refuse_taken_name(self.data_dir, chain.journal_id)
                        before, new_id = chain.checkpoint(), str(uuid.uuid4())
                        anchor = {"journal_id": chain.journal_id, "count": chain.count,
                                  "head": chain.head,
                                  "file": archive.relative_name(chain.journal_id)}
                        archive.finish_copy(temp, self._store.raw_rows(copied.count, chain.count),
                                            chain)
                        reach_boundary("archive_completed", "archived")
                        self._store.hold_files()  # readers never see a live intent
                        intent_written = True  # from here on it may exist, even if this fails
                        archive.write_intent(self.data_dir, {
                            "from": before, "to": new_id, "file": anchor["file"],
                            "temp": os.path.relpath(temp, self.data_dir)})
                        archive.seal(temp, final)
                        reach_boundary("archive_sealed", "archived")
                        after = self._store.reset_segment(chain, new_id, anchor).checkpoint()
                        self._store.after_commit(lambda: archive.remove_intent(self.data_dir))
                    intent_written = False
                    reach_boundary("intent_removed", "archived")
                    self._store.compact()
            except BaseException as exc:
                archive.discard(temp)
                # Finish or undo now rather than leave it to the next writer.
                settled = self._store.settle_interrupted_archive() if intent_written else None
                if settled == "finished" and after is not None:  # e.g. a COMMIT that said failed
                    return {"archived": anchor, "checkpoint_before": before,
                            "checkpoint_after": after}
                if settled == "undid" and isinstance(exc, JournalError) \
                        and exc.code == "commit_failed":  # no longer "may or may not be durable"
                    raise JournalUnavailable("storage_unavailable", f"{exc.message}; the archive "
                                             "switch was undone: nothing was changed") from None
                raise
            return {"archived": anchor, "checkpoint_before": before, "checkpoint_after": after}

    def verify_all(self) -> dict:
        """Full verification of the live segment and, end to end, of every
        archive its anchors reach (docs/cli.md §verify --all).  Returns
        ``{"status": JournalStatus, "archives": [anchor, ...]}``, newest first."""
        with self._store.lock:
            chain = self._store.snapshot(full=True)
            anchors = archive.verify_every_archive(self.data_dir, chain.archive)
            return {"status": self._status_of(chain), "archives": anchors}

    def archived_history(self, operation_id: Optional[str] = None) -> Iterator[tuple]:
        """``(anchor, seq, payload)`` of every archived event, oldest archive
        first (only those of ``operation_id`` when given, from the archive
        holding it).  Every archive read is verified end to end *before* this
        returns (docs/cli.md §show, §log); the rows are then read with their
        hashes recomputed, so an archive changed meanwhile ends the iteration
        with ``archive_mismatch`` (:mod:`storage.archive_reading`).  Raises
        :class:`IntegrityError` (``archive_missing``, ``archive_mismatch``)."""
        with self._store.lock:
            chain = self._store.snapshot()
        return self._archived_events(self._verified_archives(chain, operation_id), operation_id)

    def _verified_archives(self, chain: Chain, operation_id: Optional[str]) -> list:
        """The anchors of ``chain``'s archives, oldest first (only the one
        holding ``operation_id`` when given), each verified end to end."""
        oldest_first = list(reversed(archive.anchors(self.data_dir, chain.archive)))
        if operation_id is not None:
            holding = archive_reading.holding(self.data_dir, oldest_first, operation_id)
            oldest_first = [holding] if holding is not None else []
        for anchor in oldest_first:  # each once: linear in archived events
            archive.verify_archive(self.data_dir, anchor, follow=False)
        return oldest_first

    def _archived_events(self, anchors: list, operation_id: Optional[str]) -> Iterator[tuple]:
        """``(anchor, seq, payload)`` of the archives ``anchors``, their rows
        hashed again as they are read (:mod:`storage.archive_reading`)."""
        return ((anchor, seq, payload) for anchor in anchors
                for seq, payload in archive_reading.verified_events(self.data_dir, anchor,
                                                                    operation_id))

    # ------------------------------------------------------------ helpers --

    def _hash_at(self, chain: Chain, seq: int) -> Optional[str]:
        """The stored hash of event ``seq`` of the live journal (its genesis
        hash for 0), in the current transaction."""
        return genesis_hash(chain.journal_id, chain.schema) if seq == 0 else \
            self._store.hash_at(seq)

    def _ahead_checkpoint(self, chain: Chain) -> dict:
        """head.json, when it is exactly one event ahead of ``chain``."""
        try:
            self._store.check_files(chain)
        except IntegrityError as exc:
            if exc.code != "checkpoint_ahead":
                raise IntegrityError("repair_not_applicable",
                                     f"repair-checkpoint only clears checkpoint_ahead; found "
                                     f"{exc.code}: {exc.message}", found=exc.code) from None
        else:
            raise IntegrityError("repair_not_applicable",
                                 "head.json already matches the journal", found="ok")
        try:
            return self._store.files.read_checkpoint()
        except (OSError, ValueError) as error:
            raise IntegrityError("repair_not_applicable", f"head.json changed while it was "
                                 f"read ({error})", found="checkpoint_corrupt") from None

    def _status_of(self, chain: Chain) -> JournalStatus:
        attention = tuple(self._late_operation(*item) for item in chain.late_outcomes())
        return JournalStatus(checkpoint=chain.checkpoint(), unresolved=tuple(chain.operations()),
                             attention=attention)

    def operation_ids(self, prefix: str, limit: int = 10) -> list:
        """Verify, then up to ``limit`` distinct operation ids of the live
        segment that start with ``prefix`` (lower-case hex and hyphens), oldest
        first (docs/cli.md §Operation ids)."""
        with self._store.lock:
            count = self._store.snapshot().count
            return self._store.ids_starting_with(prefix, count, limit)

    def _timestamp_at(self, seq: int) -> Optional[int]:
        """``timestamp_ns`` of event ``seq`` (None for 0 or an unreadable one)."""
        payload = decode_payload(self._store.payload_at(seq) or "") if seq else None
        stamp = payload.get("timestamp_ns") if isinstance(payload, dict) else None
        return stamp if isinstance(stamp, int) else None

    def _late_operation(self, operation_id: str, started_seq: int, late_reason: str,
                        late_seq: int) -> Operation:
        started_text = self._store.payload_at(started_seq) or "{}"
        # The resolution the late outcome must be compared with, and why the
        # operation was open: the events between its start and the late outcome.
        reason = outcome = None
        for _, payload in self._store.rows(started_seq, late_seq, operation_id):
            if payload.get("kind") == "uncertain":
                reason = payload.get("reason")
            elif payload.get("kind") == "resolved":
                outcome = payload.get("outcome")
        return operation_from_started(operation_id, started_text.encode("utf-8"), started_seq,
                                      state="resolved", reason=reason, last_seq=late_seq,
                                      outcome=outcome, late_reason=late_reason)

    @staticmethod
    def _require_evidence(evidence: Any) -> None:
        if not (isinstance(evidence, str) and evidence.strip()):
            raise AdmissionRefused("invalid_request", "evidence must be non-empty text")

    def _refuse_closed(self, chain: Chain, operation_id: str) -> None:
        """Raise ``operation_not_open`` for an operation that was started and
        closed, else ``unknown_operation`` (an error path: one table scan)."""
        closing = None
        for seq, payload in self._store.rows(0, chain.count, operation_id):
            if payload.get("kind") in ("returned", "resolved"):
                closing = dict(payload, seq=seq)
        if closing is not None:
            how = (f"its tool returned ({closing.get('reason')})" if closing["kind"] == "returned"
                   else f"it was resolved as {closing.get('outcome')}"
                   + (f" by {closing['operator'].get('user')}"
                      if isinstance(closing.get("operator"), dict) else ""))
            raise AdmissionRefused("operation_not_open", f"operation {operation_id} is already "
                                   f"closed: {how} (event {closing['seq']})",
                                   operation_id=operation_id, closed_by=closing["kind"],
                                   closed_seq=closing["seq"], outcome=closing.get("outcome"),
                                   reason=closing.get("reason"))
        raise AdmissionRefused("unknown_operation", f"no operation {operation_id} in this "
                               "journal", operation_id=operation_id)
