"""The product's full verification against a chain-only reference loop.

The reference (``reference_chain_only``) is written here from docs/format.md
§Hashes alone: fetch every row, recompute every SHA-256 link, nothing else.
The product pays a fresh ``Journal(data_dir, create=False)`` and ``verify()``
(the whole history, the marker and head.json).  They run alternately; the
ratio of their medians is the target.  Diagnostic loops say where the time
goes: only fetching the rows (plain query, and the product's own query), and
fetching the stored bytes and hashing them as the product's fast path does.
With ``--profile``, a cProfile of one product verification.
"""
from __future__ import annotations

import contextlib
import cProfile
import hashlib
import io
import pstats
import statistics
import time
from json.encoder import encode_basestring
from typing import Any, Dict, List, Tuple

import bulk_journal
from product import load_product, product_attribute, read_only_connection
from stats import ratio

REFERENCE_QUERY = "SELECT seq, payload, previous, hash FROM events ORDER BY seq"
BYTES_QUERY = ("SELECT seq, CAST(payload AS BLOB), CAST(previous AS BLOB), CAST(hash AS BLOB) "
               "FROM events ORDER BY seq")


def reference_chain_only(data_dir: str) -> Tuple[float, int]:
    """The chain-only reference loop, written here from docs/format.md §Hashes:
    fetch every row, recompute ``Hi = SHA256(C({"previous": H(i-1), "payload":
    p_i}))`` and check the link to the row before -- nothing else.  Returns
    (seconds, rows)."""
    sha256 = hashlib.sha256
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        journal_id = connection.execute(
            "SELECT value FROM metadata WHERE key = 'journal_id'").fetchone()[0]
        began = time.perf_counter()
        head, rows = bulk_journal.genesis_hash(journal_id), 0
        for seq, payload, previous, stored_hash in connection.execute(REFERENCE_QUERY):
            if previous != head:
                raise RuntimeError(f"reference: broken link at {seq}")
            # C() of the envelope: sorted keys put payload first; encode_basestring
            # is json.dumps(ensure_ascii=False) of a str.
            head = sha256(('{"payload":' + encode_basestring(payload) + ',"previous":"'
                           + previous + '"}').encode()).hexdigest()
            if head != stored_hash:
                raise RuntimeError(f"reference: hash mismatch at {seq}")
            rows += 1
        return time.perf_counter() - began, rows


def fetch_only(data_dir: str, query: str, *parameters: Any) -> float:
    """Seconds to only fetch every row of ``query`` (nothing done with them)."""
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        began = time.perf_counter()
        for _row in connection.execute(query, parameters):
            pass
        return time.perf_counter() - began


def reference_iterate_rows(data_dir: str) -> float:
    """Only fetch every row (what SQLite and the sqlite3 module cost)."""
    return fetch_only(data_dir, REFERENCE_QUERY)


def product_query_fetch(data_dir: str) -> float:
    """Diagnostic: only fetch every row with the product's own verification
    query (``SQL_SELECT_ROWS_AFTER``: stored bytes, type checks)."""
    return fetch_only(data_dir, product_attribute("SQL_SELECT_ROWS_AFTER"), 0)


def reference_bytes_hash(data_dir: str) -> float:
    """Diagnostic: fetch the stored bytes and hash with quote escaping only (the
    product's fast-path hashing; exact for payloads without backslashes or
    control characters, which every bulk payload is), nothing else."""
    sha256 = hashlib.sha256
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        began = time.perf_counter()
        head = None
        for seq, payload, previous, stored_hash in connection.execute(BYTES_QUERY):
            if head is not None and previous != head:
                raise RuntimeError(f"bytes reference: broken link at {seq}")
            head = sha256(b'{"payload":"' + payload.replace(b'"', b'\\"') + b'","previous":"'
                          + previous + b'"}').hexdigest().encode()
            if head != stored_hash:
                raise RuntimeError(f"bytes reference: hash mismatch at {seq}")
        return time.perf_counter() - began


def product_full_verification(data_dir: str) -> Tuple[float, int]:
    """The product's full verification as a fresh process pays it: open
    ``Journal(data_dir, create=False)``, ``verify()`` (the whole history, the
    marker and head.json), close.  Returns (seconds, verified count)."""
    journal_module = load_product("journal")
    began = time.perf_counter()
    journal = journal_module.Journal(data_dir, create=False)
    try:
        status = journal.verify()
    finally:
        journal.close()
    return time.perf_counter() - began, status.checkpoint["count"]


def measure_verification(data_dir: str, repeats: int, profile: bool) -> Dict[str, Any]:
    """Product full verification vs the chain-only reference, alternately
    (``repeats`` each, product first), plus the diagnostic loops once."""
    product_samples: List[float] = []
    reference_samples: List[float] = []
    events = None
    for _ in range(max(1, repeats)):
        seconds, events = product_full_verification(data_dir)
        product_samples.append(seconds)
        seconds, rows = reference_chain_only(data_dir)
        reference_samples.append(seconds)
        if rows != events:
            raise RuntimeError(f"reference read {rows} rows, the product verified {events}")
    product, reference = statistics.median(product_samples), statistics.median(reference_samples)
    result: Dict[str, Any] = {
        "events": events, "repeats": len(product_samples),
        "product_seconds": round(product, 6),
        "product_samples": [round(sample, 6) for sample in product_samples],
        "product_events_per_second": round(events / product) if events else None,
        "reference_chain_only_seconds": round(reference, 6),
        "reference_samples": [round(sample, 6) for sample in reference_samples],
        "reference_chain_only_events_per_second": round(events / reference) if events else None,
        "ratio_to_reference": ratio(product, reference) if events else None,
    }
    iterate = reference_iterate_rows(data_dir)
    bytes_hash = reference_bytes_hash(data_dir)
    result.update({
        "reference_iterate_rows_seconds": round(iterate, 4),
        "product_query_fetch_seconds": round(product_query_fetch(data_dir), 4),
        "reference_bytes_hash_seconds": round(bytes_hash, 4),
        "ratio_to_bytes_hash": ratio(product, bytes_hash) if events else None,
    })
    if profile and events:
        result["profile_top"] = profile_verification(data_dir)
    return result


def profile_verification(data_dir: str) -> List[str]:
    """cProfile of one product verification: the 15 most expensive functions."""
    journal = load_product("journal").Journal(data_dir, create=False)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        journal.verify()
        profiler.disable()
    finally:
        journal.close()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(15)
    return [line for line in stream.getvalue().splitlines() if line.strip()][-17:]
