"""Whether an exported checkpoint is an ancestor of the journal: a prefix of
its live segment, or of an archive its anchors reach (docs/cli.md §verify
--checkpoint, docs/format.md §Archives).

An export proves the history it anchors was not rewritten: the hash the
journal (or the archive holding it) stores at the export's count must be the
export's head.  Nothing here writes.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from . import archive
from .chain import Chain
from .errors import AdmissionRefused, IntegrityError
from .record import checkpoint_shape_problem, genesis_hash


def check_ancestor(data_dir: str, chain: Chain, checkpoint: Any,
                   live_hash_at: Callable[[int], Optional[str]]) -> None:
    """Return if ``checkpoint`` (a parsed export: journal_id, schema, count,
    head) anchors a prefix of ``chain`` or of one of its archives.
    ``live_hash_at(seq)``: the stored hash of live event ``seq`` (>= 1), read
    in the caller's snapshot.  Raises :class:`AdmissionRefused`
    ``invalid_checkpoint`` for a malformed export, :class:`IntegrityError`
    ``checkpoint_not_ancestor`` for one of another history (or an archive's
    ``archive_missing``/``archive_mismatch``)."""
    problem = checkpoint_shape_problem(checkpoint)
    if problem:  # the file is malformed; the journal itself verified
        raise AdmissionRefused("invalid_checkpoint", f"external checkpoint: {problem}")
    if checkpoint["journal_id"] != chain.journal_id and checkpoint["schema"] == chain.schema:
        for anchor in archive.anchors(data_dir, chain.archive):
            if anchor["journal_id"] == checkpoint["journal_id"]:
                _check_archived_ancestor(data_dir, anchor, checkpoint)
                return
    if checkpoint["journal_id"] != chain.journal_id or checkpoint["schema"] != chain.schema:
        raise IntegrityError("checkpoint_not_ancestor",
                             "external checkpoint belongs to another journal or schema")
    count = checkpoint["count"]
    if count > chain.count:
        raise IntegrityError("checkpoint_not_ancestor",
                             f"external checkpoint anchors {count} events, the journal holds "
                             f"{chain.count}", checkpoint_count=count, journal_count=chain.count)
    at = genesis_hash(chain.journal_id, chain.schema) if count == 0 else live_hash_at(count)
    if checkpoint["head"] != at:
        raise IntegrityError("checkpoint_not_ancestor",
                             f"external checkpoint head is not the hash at position {count}",
                             checkpoint_count=count, journal_count=chain.count)


def _check_archived_ancestor(data_dir: str, anchor: dict, checkpoint: dict) -> None:
    """An export from before an archive proves its prefix in that archive."""
    archive.verify_archive(data_dir, anchor)
    count = checkpoint["count"]
    if count > anchor["count"] or checkpoint["head"] != (
            genesis_hash(anchor["journal_id"], checkpoint["schema"]) if count == 0
            else archive.hash_at(data_dir, anchor, count)):
        raise IntegrityError("checkpoint_not_ancestor",
                             f"external checkpoint is not a prefix of archive {anchor['file']}",
                             checkpoint_count=count, journal_count=anchor["count"])
