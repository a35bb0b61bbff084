"""Reading archived history for ``show`` and ``log --all``: only what verified
is printed (docs/cli.md §show, §log; docs/format.md §Archives).

Rows are read again with the hash chain recomputed, ending at the anchor's
count and head, so an archive changed since its verification ends the reading
with ``archive_mismatch``/``archive_missing``.  No ``sqlite3.Error`` leaves here.
"""
from __future__ import annotations

import contextlib
import sqlite3
from typing import Iterator, Optional

from . import archive
from .errors import IntegrityError
from .record import SCHEMA, decode_payload, event_hash, genesis_hash
from .schema import SQL_SELECT_OPERATION_EVENTS, SQL_SELECT_ROWS_AFTER


def holding(data_dir: str, anchors_oldest_first: list, operation_id: str) -> Optional[dict]:
    """The first (oldest) archive's anchor whose events name ``operation_id``,
    or None; a search, nothing printed.  Raises :class:`IntegrityError`."""
    needle = f'"operation_id":"{operation_id}"'
    for anchor in anchors_oldest_first:
        with _reading(data_dir, anchor) as connection:
            if connection.execute(SQL_SELECT_OPERATION_EVENTS + " LIMIT 1",
                                  (0, anchor["count"], needle)).fetchone():
                return anchor
    return None


def verified_events(data_dir: str, anchor: dict,
                    operation_id: Optional[str] = None) -> Iterator[tuple]:
    """Stream ``(seq, payload dict)`` of an archive the caller verified (only
    ``operation_id``'s when given), each row's hash recomputed.  Raises only
    :class:`IntegrityError` ``archive_mismatch``, possibly after rows were
    yielded, if it does not end at the anchor's count and head."""
    head, count = genesis_hash(anchor["journal_id"], SCHEMA), 0
    with _reading(data_dir, anchor) as connection:
        try:
            for seq, payload, previous, stored in connection.execute(SQL_SELECT_ROWS_AFTER, (0,)):
                text = payload.decode("utf-8") if isinstance(payload, bytes) else None
                if (seq != count + 1 or text is None or previous != head.encode("ascii")
                        or stored != event_hash(head, text).encode("ascii")):
                    raise _changed(anchor, f"event {seq} differs from the verified one")
                head, count = stored.decode("ascii"), seq
                event = decode_payload(text)
                if operation_id is None or (isinstance(event, dict)
                                            and event.get("operation_id") == operation_id):
                    yield seq, event
        except (sqlite3.Error, UnicodeDecodeError, ValueError) as exc:
            raise _changed(anchor, f"unreadable ({exc})") from None
    if (count, head) != (anchor["count"], anchor["head"]):
        raise _changed(anchor, f"it ends at event {count}, not where its anchor says")


@contextlib.contextmanager
def _reading(data_dir: str, anchor: dict) -> Iterator[sqlite3.Connection]:
    """One archive's connection; ``sqlite3.Error`` becomes ``archive_mismatch``."""
    connection = archive.open_archive(data_dir, anchor)
    try:
        yield connection
    except sqlite3.Error as exc:
        raise _changed(anchor, f"unreadable ({exc})") from None
    finally:
        connection.close()


def _changed(anchor: dict, what: str) -> IntegrityError:
    return IntegrityError("archive_mismatch", f"archive {anchor.get('file')}: {what} (changed "
                          "or damaged since it was sealed); what was read from it is not "
                          "verified", archive=anchor.get("journal_id"))
