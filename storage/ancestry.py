"""Whether an exported checkpoint is an ancestor of the journal: its head is
the hash stored at its count in the live segment or an archive its anchors
reach (docs/cli.md §verify --checkpoint, docs/format.md §Archives).  Read-only.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from . import archive
from .chain import Chain
from .errors import AdmissionRefused, IntegrityError
from .record import checkpoint_shape_problem, genesis_hash


def check_ancestor(data_dir: str, chain: Chain, checkpoint: Any,
                   live_hash_at: Callable[[int], Optional[str]]) -> None:
    """Return if ``checkpoint`` (journal_id, schema, count, head) anchors a
    prefix of ``chain`` or its archives; ``live_hash_at(seq)``: live event
    ``seq``'s hash in the caller's snapshot.  Raises :class:`AdmissionRefused`
    ``invalid_checkpoint`` (malformed), :class:`IntegrityError`
    ``checkpoint_not_ancestor``, ``archive_missing``, ``archive_mismatch``."""
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
