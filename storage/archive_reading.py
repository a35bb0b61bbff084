"""Reading archived history for people: only what verified is printed
(docs/cli.md §show, §log; docs/format.md §Archives).

``show`` and ``log --all`` print events from archives.  An archive is verified
end to end first (:func:`archive.verify_archive`), and the rows printed are
read again with the hash chain recomputed row by row, ending at the anchor's
count and head: so a row edited, an archive replaced or removed between the
verification and the printing is never passed off as verified -- the reading
ends with ``archive_mismatch`` / ``archive_missing`` instead.  No
``sqlite3.Error`` leaves this module.
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
    """The anchor of the archive whose events name ``operation_id`` (the
    first, oldest first), or None.  A search only: nothing read here is
    printed.  Raises :class:`IntegrityError` for an archive that cannot be read."""
    needle = f'"operation_id":"{operation_id}"'
    for anchor in anchors_oldest_first:
        with _reading(data_dir, anchor) as connection:
            if connection.execute(SQL_SELECT_OPERATION_EVENTS + " LIMIT 1",
                                  (0, anchor["count"], needle)).fetchone():
                return anchor
    return None


def verified_events(data_dir: str, anchor: dict,
                    operation_id: Optional[str] = None) -> Iterator[tuple]:
    """``(seq, payload dict)`` of the archive ``anchor`` names (only those of
    ``operation_id`` when given), each row's hash and link recomputed as it is
    read; the caller has verified the archive end to end first
    (:func:`archive.verify_archive`).  Streamed; the archive ends at exactly
    the anchor's count and head or the reading raises ``archive_mismatch``
    (after the rows already yielded: the caller ends its output with that
    error).  Raises only :class:`IntegrityError`."""
    head, count = genesis_hash(anchor["journal_id"], SCHEMA), 0
    with _reading(data_dir, anchor) as connection:
        try:
            for seq, payload, previous, stored in connection.execute(SQL_SELECT_ROWS_AFTER,
                                                                     (0,)):
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
    """A read-only connection to one archive; ``sqlite3.Error`` becomes
    ``archive_mismatch``."""
    connection = archive._open(archive.archive_path(data_dir, anchor))
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
