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
from math import isfinite
import re
import uuid
from json.encoder import encode_basestring as _json_string
from typing import Any, Iterable, Iterator, List, Optional, Tuple

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
# C(x) is json.dumps' output (docs/format.md §Canonical encoding), produced here
# by our own iterative encoder so that what is admitted never depends on the
# interpreter (its recursion limit, its json module) and every value ends in a
# result or a refusal, in bounded time and memory.  Our limits, the same on
# every Python:
MAX_NESTING = 512                    # arrays and objects inside one another
MAX_VALUES = 1_000_000               # every value counts, each time it appears
MAX_CANONICAL_BYTES = 64 * 1024 * 1024   # UTF-8 bytes of C(x)
MAX_INTEGER_DIGITS = 4300            # CPython's default int-to-text limit
_INTEGER_BOUND = 10 ** MAX_INTEGER_DIGITS
_FLUSH_PIECES = 4096                 # pieces joined into one chunk at a time
_END = object()


def canonical_text(value: Any) -> str:
    """``C(x)`` (docs/format.md §Canonical encoding) as ``str``.

    The bytes ``json.dumps(value, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False, allow_nan=False)`` would give, within our limits.
    Only string keys are accepted: JSON turns ``1`` and ``"1"`` into the same key,
    so stringifying would let two different argument sets share one hash.
    Tuples are encoded as arrays, exactly like lists; a sub-object that appears
    in several places is encoded at each.  Raises :class:`EncodingError` (code
    ``non_canonical_value``, the message says what and where) for NaN and
    infinities, non-JSON types, lone surrogates, non-text keys, integers over
    :data:`MAX_INTEGER_DIGITS` digits, a value that contains itself, nesting
    deeper than :data:`MAX_NESTING`, more than :data:`MAX_VALUES` values or
    more than :data:`MAX_CANONICAL_BYTES` bytes.
    """
    return "".join(_canonical_pieces(value))


def canonical_bytes(value: Any) -> bytes:
    """``C(x)`` as UTF-8 bytes; raises :class:`EncodingError`."""
    return canonical_text(value).encode("utf-8")


# The plain scalar types: JSON's own, not subclasses.
_PLAIN_SCALARS = frozenset({str, int, bool, float, type(None)})
# json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False), built once; no cycle check: it only meets scalars and flat objects.
_JSON_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                 allow_nan=False, check_circular=False)


def _canonical_pieces(value: Any) -> Iterable[str]:
    """``C(value)`` in pieces: one, from the json module's C encoder, for a
    plain scalar or a flat object of them (every event payload, checkpoint and
    most arguments); else the iterative encoder's.  The two agree byte for
    byte (tests/test_canonical_limits.py); refusals always come from the
    iterative one, which names what and where."""
    if type(value) is dict:
        if len(value) >= MAX_VALUES:
            return _canonical_chunks(value)
        for key, item in value.items():
            if type(key) is not str or not _plain(item):
                return _canonical_chunks(value)
    elif not _plain(value):
        return _canonical_chunks(value)
    try:
        text = _JSON_ENCODER.encode(value)
        size = len(text.encode("utf-8"))  # a lone surrogate refuses here
    except (ValueError, UnicodeEncodeError):
        return _canonical_chunks(value)
    return (text,) if size <= MAX_CANONICAL_BYTES else _canonical_chunks(value)


def _plain(item: Any) -> bool:
    kind = type(item)
    return kind in _PLAIN_SCALARS and (kind is not int or -_INTEGER_BOUND < item < _INTEGER_BOUND)


def _canonical_chunks(value: Any) -> Iterator[str]:
    """``C(value)`` in consecutive pieces of text (every one valid UTF-8).

    One loop, no recursion: ``frames`` holds the open arrays and objects as
    ``[children, closing text, id, is_object, position]``; ``open_ids`` their
    ids, so a container met again while it is open (a cycle) is refused, while
    one met again after it closed (shared, not a cycle) is encoded again.
    """
    pieces: List[str] = []
    frames: List[list] = []
    open_ids: set = set()
    size = count = 0
    item = value
    while True:
        count += 1
        if count > MAX_VALUES:
            raise _over_limit(frames, f"more than {MAX_VALUES:,} values (each counted every "
                                      "time it appears)")
        if item is None:
            piece = "null"
        elif item is True:
            piece = "true"
        elif item is False:
            piece = "false"
        elif isinstance(item, str):
            piece = _json_string(item)
            if not piece.isascii():
                size += _extra_utf8_bytes(piece, frames, "value")
        elif isinstance(item, int):
            piece = _integer_text(item, frames)
        elif isinstance(item, float):
            if not isfinite(item):
                name = "NaN" if item != item else "Infinity" if item > 0 else "-Infinity"
                raise _refusal(frames, f"is {name}, a number JSON cannot carry")
            piece = float.__repr__(item)
        elif isinstance(item, (list, tuple, dict)):
            if len(frames) >= MAX_NESTING:
                raise _refusal(frames, f"is nested deeper than {MAX_NESTING} arrays and objects")
            if id(item) in open_ids:
                kind = "object" if isinstance(item, dict) else "array"
                raise _refusal(frames, f"is the {kind} at {_where(frames[:_open_index(frames, item)])}"
                                       " again: a value that contains itself has no JSON form")
            if isinstance(item, dict):
                for key in item:
                    if not isinstance(key, str):
                        raise _refusal(frames, f"has a key of type {type(key).__name__} "
                                       f"({short(repr(key), 40)}), not text: JSON would turn "
                                       '1 and "1" into the same key')
                children = iter(sorted(item.items(), key=_first))
                frames.append([children, "}", id(item), True, None])
                piece = "{"
            else:
                frames.append([iter(item), "]", id(item), False, None])
                piece = "["
            open_ids.add(id(item))
        else:
            raise _refusal(frames, f"is of type {type(item).__name__}, not a JSON value (text, "
                           "number, true, false, null, array or object with text keys)")
        pieces.append(piece)
        size += len(piece)
        if size > MAX_CANONICAL_BYTES:
            raise _too_large(frames)
        # The next value: the next child of the innermost open container.
        while frames:
            frame = frames[-1]
            child = next(frame[0], _END)
            if child is _END:
                frames.pop()
                open_ids.discard(frame[2])
                pieces.append(frame[1])
                size += 1
                continue
            first = frame[4] is None
            if frame[3]:
                key, item = child
                frame[4] = key
                piece = _json_string(key)
                if not piece.isascii():
                    size += _extra_utf8_bytes(piece, frames, "key")
                piece = piece + ":" if first else "," + piece + ":"
            else:
                item = child
                frame[4] = 0 if first else frame[4] + 1
                piece = "" if first else ","
            pieces.append(piece)
            size += len(piece)
            break
        else:
            yield "".join(pieces)
            return
        if size > MAX_CANONICAL_BYTES:
            raise _too_large(frames)
        if len(pieces) >= _FLUSH_PIECES:
            yield "".join(pieces)
            pieces.clear()


def _too_large(frames: List[list]) -> EncodingError:
    return _over_limit(frames, f"more than {MAX_CANONICAL_BYTES // (1024 * 1024)} MiB of "
                               "canonical JSON")


def _over_limit(frames: List[list], limit: str) -> EncodingError:
    where = _where(frames)
    return EncodingError("non_canonical_value", f"the whole value holds {limit}, passed at "
                                                f"{where}", path=where)


def _first(pair: tuple) -> Any:
    return pair[0]


def _integer_text(number: int, frames: List[list]) -> str:
    """``int.__repr__`` within :data:`MAX_INTEGER_DIGITS` digits, whatever the
    interpreter's own int-to-text limit (``sys.set_int_max_str_digits``)."""
    if not -_INTEGER_BOUND < number < _INTEGER_BOUND:
        raise _refusal(frames, f"is an integer of more than {MAX_INTEGER_DIGITS} digits")
    try:
        return int.__repr__(number)
    except ValueError:  # this interpreter was told to convert fewer digits
        sign, rest = ("-", -int(number)) if number < 0 else ("", int(number))
        groups = []
        while rest >= 10 ** 18:
            rest, group = divmod(rest, 10 ** 18)
            groups.append("%018d" % group)
        return sign + "%d" % rest + "".join(reversed(groups))


def _extra_utf8_bytes(piece: str, frames: List[list], what: str) -> int:
    """How many more UTF-8 bytes than characters ``piece`` takes; refuses a
    lone surrogate (it has no UTF-8 form)."""
    try:
        return len(piece.encode("utf-8")) - len(piece)
    except UnicodeEncodeError as exc:
        raise _refusal(frames, f"holds the lone surrogate U+{ord(piece[exc.start]):04X}, which "
                               "UTF-8 cannot encode", subject=what) from None


def _open_index(frames: List[list], container: Any) -> int:
    """Index of the frame of the open ``container`` (to name where it began)."""
    for index, frame in enumerate(frames):
        if frame[2] == id(container):
            return index
    return len(frames)


def _where(frames: List[list]) -> str:
    """The path of the value the innermost frame is at, JSONPath style
    (``$.items[3]["a b"]``); long paths keep their two ends."""
    steps = []
    for frame in frames:
        position = frame[4]
        if position is None:  # a container just opened: the path is its own
            continue
        if not frame[3]:
            steps.append(f"[{position}]")
        elif position.isidentifier():
            steps.append("." + short(position, 40))
        else:  # escaped to ASCII: the key may hold a lone surrogate
            steps.append("[" + short(json.dumps(position), 40) + "]")
    if len(steps) > 12:
        steps = steps[:6] + [f"...({len(steps) - 10} more)..."] + steps[-4:]
    return "$" + "".join(steps)


def _refusal(frames: List[list], problem: str, subject: str = "value") -> EncodingError:
    """``non_canonical_value``: "the value (or key) at PATH PROBLEM"."""
    where = _where(frames)
    return EncodingError("non_canonical_value", f"the {subject} at {where} {problem}",
                         path=where)


def sha256_hex(raw: bytes) -> str:
    """Lower-case hex SHA-256 of ``raw``."""
    return hashlib.sha256(raw).hexdigest()


def value_hash(value: Any) -> str:
    """``SHA256(C(value))``: ``args_hash`` and ``result_hash`` (docs/format.md §Hashes)."""
    digest = hashlib.sha256()
    for chunk in _canonical_pieces(value):  # hashed as it is encoded: memory stays small
        digest.update(chunk.encode("utf-8"))
    return digest.hexdigest()


def fingerprint(tool: str, args: Any) -> str:
    """``SHA256(C({"tool": tool, "args": args}))`` (docs/format.md §Hashes)."""
    return call_hashes(tool, args)[1]


def call_hashes(tool: str, args: Any) -> Tuple[str, str]:
    """``(args_hash, fingerprint)`` of one call, ``args`` encoded once: with its
    keys sorted, ``C({"tool": tool, "args": args})`` is ``{"args":`` + ``C(args)``
    + ``,"tool":`` + ``C(tool)`` + ``}``.  The limits of :func:`canonical_text`
    apply to ``args`` (and to ``tool``); raises :class:`EncodingError`."""
    args_digest, call_digest = hashlib.sha256(), hashlib.sha256(b'{"args":')
    for chunk in _canonical_pieces(args):
        raw = chunk.encode("utf-8")
        args_digest.update(raw)
        call_digest.update(raw)
    call_digest.update(b',"tool":' + canonical_bytes(tool) + b"}")
    return args_digest.hexdigest(), call_digest.hexdigest()


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
