"""The on-disk record format: names, canonical encoding, hashes, event shapes.

Pure functions, no I/O (docs/format.md).  Everything that decides what bytes
the journal holds and what a valid event looks like lives here, so a second
implementation can be checked against one place:

* ``C(x)``: :func:`canonical_text` / :func:`canonical_bytes`;
* genesis ``H0``, event hash ``Hi``, ``args_hash``, ``fingerprint``,
  ``result_hash``: :func:`genesis_hash`, :func:`event_hash`, :func:`value_hash`,
  :func:`fingerprint`;
* the checkpoint dict and the marker text;
* :func:`payload_problem`: why a decoded payload is not a valid event.
"""
from __future__ import annotations

import hashlib
import json
import re
import uuid
from json.encoder import encode_basestring as _json_string
from typing import Any, Optional

from .errors import EncodingError, short

SCHEMA = "hermes.crash-recovery.v1"
DATABASE_NAME = "journal.sqlite3"
CHECKPOINT_NAME = "head.json"
MARKER_NAME = "initialized"
# The intent of an archive switch in progress (docs/format.md §Archives).
INTENT_NAME = "archive.json"
WAL_SUFFIX = "-wal"
# The metadata row holding when a journal (or archive segment) was created:
# integer nanoseconds since the epoch, as text (docs/format.md §Tables).
CREATED_KEY = "created_ns"
SHM_SUFFIX = "-shm"

STATE_PENDING = "pending"
STATE_UNCERTAIN = "uncertain"
STATE_RETURNED = "returned"
STATE_RESOLVED = "resolved"
OUTCOMES = ("completed", "not_applied")
# Reason labels per event kind (docs/format.md §Events).  ``not_run``: the guard
# itself refused the call's inner entry, so the tool never ran;
# ``not_run_host_refused``: the host reported it refused the call before its
# handler (post_tool_call, status "blocked").  ``lost_in_crash``:
# repair-checkpoint found an event lost in a crash that may have been a
# ``started`` whose tool ran.
REASONS = {
    "returned": ("returned", "not_run", "not_run_host_refused"),
    "uncertain": ("exception", "cancelled", "error_response", "lost_in_crash"),
    "late_outcome": ("returned", "error_response", "exception", "cancelled"),
}
# The tool name of an operation that repair-checkpoint re-created from a lost event.
LOST_TOOL = "unknown"
KIND_ARCHIVED = "archived"

# ------------------------------------------------------- canonical encoding --

def canonical_text(value: Any) -> str:
    """``C(x)`` (docs/format.md §Canonical encoding) as ``str``.

    Only string keys are accepted: JSON turns ``1`` and ``"1"`` into the same key,
    so stringifying would let two different argument sets share one hash.
    Tuples are encoded as arrays, exactly like lists.  Raises
    :class:`EncodingError` (code ``non_canonical_value``).
    """
    _reject_non_string_keys(value)
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # lone surrogates only fail here
    except (ValueError, TypeError, RecursionError) as exc:
        raise EncodingError("non_canonical_value",
                            f"value has no canonical JSON form ({type(exc).__name__}: "
                            f"{short(str(exc))})") from None
    return text


def _reject_non_string_keys(value: Any) -> None:
    """Walk containers iteratively (deep nesting must not recurse here)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise EncodingError("non_canonical_value",
                                        f"object key of type {type(key).__name__} is not a string")
                stack.append(child)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def canonical_bytes(value: Any) -> bytes:
    """``C(x)`` as UTF-8 bytes; raises :class:`EncodingError`."""
    return canonical_text(value).encode("utf-8")


def sha256_hex(raw: bytes) -> str:
    """Lower-case hex SHA-256 of ``raw``."""
    return hashlib.sha256(raw).hexdigest()


def value_hash(value: Any) -> str:
    """``SHA256(C(value))``: ``args_hash`` and ``result_hash`` (docs/format.md §Hashes)."""
    return sha256_hex(canonical_bytes(value))


def fingerprint(tool: str, args: Any) -> str:
    """``SHA256(C({"tool": tool, "args": args}))`` (docs/format.md §Hashes)."""
    return value_hash({"tool": tool, "args": args})


def genesis_hash(journal_id: str, schema: str = SCHEMA) -> str:
    """``H0 = SHA256(C({"schema", "journal_id"}))`` (docs/format.md §Hashes)."""
    return value_hash({"schema": schema, "journal_id": journal_id})


def event_hash(previous: str, payload_text: str) -> str:
    """``Hi = SHA256(C({"payload": p_i, "previous": H(i-1)}))`` (docs/format.md §Hashes).

    Built by hand: the keys are already in sorted order ("payload" <
    "previous"), ``previous`` is hex and needs no escaping, and ``_json_string``
    is ``json.dumps`` of a str with ``ensure_ascii=False``.  Raises
    ``UnicodeEncodeError`` for lone surrogates.
    """
    return hashlib.sha256(
        ('{"payload":%s,"previous":"%s"}' % (_json_string(payload_text), previous)).encode("utf-8")
    ).hexdigest()


def checkpoint_of(journal_id: str, count: int, head: str, schema: str = SCHEMA) -> dict:
    """The checkpoint dict ``{"schema", "journal_id", "count", "head"}``
    (docs/format.md §Checkpoint)."""
    return {"schema": schema, "journal_id": journal_id, "count": count, "head": head}


def marker_text(journal_id: str, schema: str = SCHEMA) -> str:
    """Content of the ``initialized`` marker (docs/format.md §Files)."""
    return canonical_text({"journal_id": journal_id, "schema": schema}) + "\n"


# ------------------------------------------------------------ event shapes --

_HEX_DIGITS = "0123456789abcdef"
# The form uuid4() prints; other spellings uuid.UUID accepts take the slow path.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_hex64(value: Any) -> bool:
    """Lower-case SHA-256 hex.  (str.strip is ~20x faster than a per-character
    loop, and this runs for every stored event.)"""
    return isinstance(value, str) and len(value) == 64 and not value.strip(_HEX_DIGITS)


def created_time(metadata: dict) -> Optional[int]:
    """The ``created_ns`` metadata row of a journal as an integer (ns since the
    epoch), or None when absent (a journal from before it existed) or not a
    plain non-negative integer (it is evidence, never trusted blindly)."""
    value = metadata.get(CREATED_KEY)
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,20}", value):
        return int(value)
    return None


def is_uuid(value: Any) -> bool:
    """Text that ``uuid.UUID`` accepts (any of its spellings)."""
    if not isinstance(value, str):
        return False
    if _CANONICAL_UUID.fullmatch(value):
        return True
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def optional_text(value: Any) -> bool:
    """None or a str."""
    return value is None or isinstance(value, str)


def payload_problem(payload: Any, schema: str) -> Optional[str]:
    """Why a decoded payload is not a valid event, or None (docs/format.md §Events).

    Extra fields are allowed (later versions may add some).  Runs on the slow
    path of verification only: plain ``type() is`` checks, one lookup per field.
    """
    if type(payload) is not dict:
        return "payload is not a JSON object"
    get = payload.get
    if get("schema") != schema:
        return f"payload schema is {get('schema')!r}"
    stamp = get("timestamp_ns")
    if type(stamp) is not int or stamp < 0:  # type() also rejects bool
        return "timestamp_ns is not a non-negative integer"
    kind = get("kind")
    if kind == KIND_ARCHIVED:
        return _archive_problem(get("archive"))
    # A UUID check on `started` suffices: every later event must name an open
    # operation (else invalid_transition); non-text ids must not reach a dict.
    if type(get("operation_id")) is not str:
        return "operation_id is not a UUID"
    if kind == "started":
        if not is_uuid(payload["operation_id"]):
            return "operation_id is not a UUID"
        tool = get("tool")
        if type(tool) is not str or not tool:
            return "started without a tool name"
        if not (is_hex64(get("fingerprint")) and is_hex64(get("args_hash"))):
            return "started without SHA-256 fingerprint/args_hash"
        if "session_id" not in payload or "tool_call_id" not in payload:
            return "started without session_id/tool_call_id"
        if not (optional_text(payload["session_id"]) and optional_text(payload["tool_call_id"])):
            return "session_id/tool_call_id is neither text nor null"
        return None
    reasons = REASONS.get(kind)
    if reasons is not None:
        if not is_hex64(get("result_hash")):
            return f"{kind} without a SHA-256 result_hash"
        if get("reason") not in reasons:
            return f"{kind} with reason {get('reason')!r}"
        return None
    if kind in ("resolved", "acknowledged"):
        if kind == "resolved" and get("outcome") not in OUTCOMES:
            return f"resolved with outcome {get('outcome')!r}"
        evidence = get("evidence")
        if type(evidence) is not str or not evidence.strip():
            return f"{kind} without evidence"
        return None
    return f"unknown kind {kind!r}"


def _archive_problem(archive: Any) -> Optional[str]:
    """Why an ``archived`` event's ``archive`` field is malformed, or None."""
    if type(archive) is not dict:
        return "archived without an archive object"
    count = archive.get("count")
    if not (is_uuid(archive.get("journal_id")) and type(count) is int and count >= 0
            and is_hex64(archive.get("head")) and type(archive.get("file")) is str
            and archive["file"]):
        return "archived with a malformed archive object"
    return None


def checkpoint_shape_problem(checkpoint: Any) -> Optional[str]:
    """Why a decoded checkpoint is not ``{"schema", "journal_id", "count",
    "head"}`` with the right types, or None (docs/format.md §Checkpoint)."""
    if not isinstance(checkpoint, dict):
        return "not a JSON object"
    if set(checkpoint) != {"schema", "journal_id", "count", "head"}:
        return f"keys {sorted(map(str, checkpoint))} are not count/head/journal_id/schema"
    count = checkpoint["count"]
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
        return "count is not a non-negative integer"
    if not (isinstance(checkpoint["head"], str) and isinstance(checkpoint["journal_id"], str)
            and isinstance(checkpoint["schema"], str)):
        return "head/journal_id/schema are not text"
    return None


_DECODER = json.JSONDecoder()


def decode_payload(text: str) -> Any:
    """``json.loads(text)``, or None when it is not JSON.  ``raw_decode`` first:
    it skips ``loads``' wrapper work, a measurable share of verification."""
    try:
        value, end = _DECODER.raw_decode(text)
        if end == len(text):
            return value
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
