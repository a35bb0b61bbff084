"""The crash-recovery journal: which events may be appended, and when.

One data directory holds one journal (docs/format.md §Files): ``journal.sqlite3``
(WAL mode, ``synchronous=FULL``), ``head.json`` (the checkpoint) and
``initialized`` (the marker).  :class:`Journal` is the journal's vocabulary --
admission, outcomes, resolutions, late outcomes, repair -- on top of
:class:`store.JournalStore`, which verifies and appends.

Append protocol (docs/format.md §Append)::

    verify on a read snapshot (no lock; the whole history when needed)
    BEGIN IMMEDIATE: catch up with what changed since (cheap), check the files
    1 INSERT, confirm the stored row  2 head.json: temp write, fsync,
    os.replace, directory fsync  3 COMMIT

What a crash or a failure at each point leaves behind:

* before the ``os.replace``: SQLite rolls the INSERT back; ``head.json`` is
  unchanged.  The event never happened (for ``started``: the tool never ran).
* a failure (not a crash) after the ``os.replace`` and before COMMIT: the old
  ``head.json`` is put back *while the writer lock is still held*, then ROLLBACK.
* a crash between the ``os.replace`` and COMMIT, or a failed COMMIT (the event
  may or may not be durable): ``head.json`` stays one event ahead.  Either the
  event is there after restart (consistent), or verification reports
  ``checkpoint_ahead``, which :meth:`Journal.repair_checkpoint` handles; every
  protected call is refused meanwhile.
* after COMMIT: the event is durable.

Errors: every failure is a :class:`JournalError`; ``sqlite3.Error`` never
escapes (see :func:`database.translate_sqlite_error`).
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .storage import archive, archive_reading
from .storage.calls import refuse_calls_out
from .storage.chain import (Chain, JournalStatus, Operation, lost_window,
                            operation_from_started, operation_key)
from .storage.database import DEFAULT_BUSY_TIMEOUT_SECONDS, translate_sqlite_error
from .storage.durable import marker_written_ns, reach_boundary, storage_error
from .storage.errors import AdmissionRefused, IntegrityError, JournalError, JournalUnavailable
from .storage.record import (LOST_TOOL, OUTCOMES, STATE_PENDING, checkpoint_shape_problem,
                             decode_payload, genesis_hash, optional_text, value_hash)
from .storage.snapshot import DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS
from .storage.store import JournalStore

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
        needing attention (docs/cli.md §status)."""
        with self._store.lock:
            return self._status_of(self._store.snapshot())

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
                self._check_ancestor(chain, external_checkpoint)
            return self._status_of(chain)

    def history(self, since: int = 0, operation_id: Optional[str] = None) -> tuple:
        """One full verification, then the verified events, read lazily:
        ``(JournalStatus, iterator of (seq, payload dict))`` for ``since`` < seq
        <= the verified head, only those of ``operation_id`` when given.
        Streams; consume the iterator before closing the journal."""
        since = max(0, min(int(since), SQLITE_MAX_INTEGER))
        with self._store.lock:
            status = self._status_of(self._store.snapshot(full=True))
        return status, self._store.rows(since, status.checkpoint["count"], operation_id)

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
              session_id: Optional[str], tool_call_id: Optional[str]) -> Operation:
        """Admission (docs/guard.md §Execution contract): refuse if any operation
        is open, else durably append ``started``; returns the pending operation.

        Raises :class:`AdmissionRefused` ``unresolved_operations`` (with
        ``details["operations"]``), :class:`IntegrityError`,
        :class:`JournalUnavailable` (``commit_failed``: the event may or may not
        be durable).  On any other error nothing was committed.
        """
        for name, value in (("session_id", session_id), ("tool_call_id", tool_call_id)):
            if not optional_text(value):
                raise AdmissionRefused("invalid_request", f"{name} must be text or null")
        if not (isinstance(tool, str) and tool):
            raise AdmissionRefused("invalid_request", "tool name must be non-empty text")
        with self._store.writing("started") as chain:
            if chain.open:
                operations = chain.operations()
                raise AdmissionRefused(
                    "unresolved_operations",
                    f"{len(operations)} protected operation(s) have an unknown outcome",
                    operations=[operation.to_json() for operation in operations])
            self._store.append(chain, {"kind": "started", "operation_id": operation_id,
                                       "tool": tool, "fingerprint": fingerprint,
                                       "args_hash": args_hash, "session_id": session_id,
                                       "tool_call_id": tool_call_id})
            return chain.operation(operation_id)

    def record_outcome(self, operation_id: str, *, uncertain: bool, result_hash: str,
                       reason: str) -> None:
        """Append ``returned`` (``uncertain=False``) or ``uncertain`` for a
        pending operation.  Raises :class:`AdmissionRefused`
        ``operation_not_pending`` if it is not pending; its ``details["resolved"]``
        says whether an operator resolved it meanwhile."""
        kind = "uncertain" if uncertain else "returned"
        with self._store.writing(kind) as chain:
            current = chain.operation(operation_id)
            if current is None or current.state != STATE_PENDING:
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
                    self._store.files.write_checkpoint(chain.checkpoint(), announce="repair")
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
        ``owner_running`` while any protected call is out (storage/calls.py);
        :class:`JournalError` for a failure (``storage_unavailable`` for a full
        disk), after which the journal is as it was."""
        if self.readonly:
            raise JournalUnavailable("storage_unavailable", "journal opened read-only")
        with self._store.lock:
            self._refuse_archive(self._store.snapshot())
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
                        self._refuse_archive(chain)
                        refuse_calls_out(self.database_path)
                        archive.refuse_stale_copy(copied, chain, self._hash_at(chain, copied.count))
                        final = archive.refuse_taken_name(self.data_dir, chain.journal_id)
                        before, new_id = chain.checkpoint(), str(uuid.uuid4())
                        anchor = {"journal_id": chain.journal_id, "count": chain.count,
                                  "head": chain.head,
                                  "file": archive.relative_name(chain.journal_id)}
                        archive.finish_copy(temp, self._store.raw_rows(copied.count, chain.count),
                                            chain)
                        reach_boundary("archive_completed", "archived")
                        intent_written = True  # from here on it may exist, even if this fails
                        archive.write_intent(self.data_dir, {
                            "from": before, "to": new_id, "file": anchor["file"],
                            "temp": os.path.relpath(temp, self.data_dir)})
                        archive.seal(temp, final)
                        reach_boundary("archive_sealed", "archived")
                        after = self._store.reset_segment(chain, new_id, anchor).checkpoint()
                    archive.remove_intent(self.data_dir)
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
        oldest_first = list(reversed(archive.anchors(self.data_dir, chain.archive)))
        if operation_id is not None:
            holding = archive_reading.holding(self.data_dir, oldest_first, operation_id)
            oldest_first = [holding] if holding is not None else []
        for anchor in oldest_first:  # each once: linear in archived events
            archive.verify_archive(self.data_dir, anchor, follow=False)
        return ((anchor, seq, payload) for anchor in oldest_first
                for seq, payload in archive_reading.verified_events(self.data_dir, anchor,
                                                                    operation_id))

    # ------------------------------------------------------------ helpers --

    def _hash_at(self, chain: Chain, seq: int) -> Optional[str]:
        """The stored hash of event ``seq`` of the live journal (its genesis
        hash for 0), in the current transaction."""
        return genesis_hash(chain.journal_id, chain.schema) if seq == 0 else \
            self._store.hash_at(seq)

    @staticmethod
    def _refuse_archive(chain: Chain) -> None:
        if chain.open or chain.attention:
            raise AdmissionRefused("archive_refused", "an operation is unresolved or a late "
                                   "outcome awaits acknowledgement: settle it first",
                                   unresolved=len(chain.open), attention=len(chain.attention))
        if chain.count <= (1 if chain.archive is not None else 0):
            raise AdmissionRefused("archive_refused", "nothing to archive: the live segment "
                                   "holds no event but its anchor")

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

    def _check_ancestor(self, chain: Chain, checkpoint: Any) -> None:
        problem = checkpoint_shape_problem(checkpoint)
        if problem:  # the file is malformed; the journal itself verified
            raise AdmissionRefused("invalid_checkpoint", f"external checkpoint: {problem}")
        if checkpoint["journal_id"] != chain.journal_id and checkpoint["schema"] == chain.schema:
            for anchor in archive.anchors(self.data_dir, chain.archive):
                if anchor["journal_id"] == checkpoint["journal_id"]:
                    self._check_archived_ancestor(anchor, checkpoint)
                    return
        if checkpoint["journal_id"] != chain.journal_id or checkpoint["schema"] != chain.schema:
            raise IntegrityError("checkpoint_not_ancestor",
                                 "external checkpoint belongs to another journal or schema")
        count = checkpoint["count"]
        if count > chain.count:
            raise IntegrityError("checkpoint_not_ancestor",
                                 f"external checkpoint anchors {count} events, the journal holds "
                                 f"{chain.count}", checkpoint_count=count, journal_count=chain.count)
        at = (genesis_hash(chain.journal_id, chain.schema) if count == 0
              else self._store.hash_at(count))
        if checkpoint["head"] != at:
            raise IntegrityError("checkpoint_not_ancestor",
                                 f"external checkpoint head is not the hash at position {count}",
                                 checkpoint_count=count, journal_count=chain.count)

    def _check_archived_ancestor(self, anchor: dict, checkpoint: dict) -> None:
        """An export from before an archive proves its prefix in that archive."""
        archive.verify_archive(self.data_dir, anchor)
        count = checkpoint["count"]
        if count > anchor["count"] or checkpoint["head"] != (
                genesis_hash(anchor["journal_id"], checkpoint["schema"]) if count == 0
                else archive.hash_at(self.data_dir, anchor, count)):
            raise IntegrityError("checkpoint_not_ancestor",
                                 f"external checkpoint is not a prefix of archive {anchor['file']}",
                                 checkpoint_count=count, journal_count=anchor["count"])
