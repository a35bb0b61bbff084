"""Fictional booking service plugin for the crash-recovery host tests.

The "service" is a SQLite database at ``$BOOKING_SERVICE_DB``. ``book_trip``
records every handler run in ``attempts`` and commits a row to ``bookings``.
A destination of ``Atlantis`` makes the service raise after recording the
attempt (an unknown outcome); ``Interrupted`` raises ``KeyboardInterrupt``
there instead (a cancellation, e.g. Ctrl-C while the tool runs). When the file ``$BOOKING_CRASH_ARM`` exists,
``book_trip`` consumes it after committing, writes the receipt to
``$BOOKING_CRASH_SIGNAL`` and sleeps so the harness can kill the host before
the tool response is recorded. ``lookup_receipt`` only reads.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid

SCHEMA_SQL = (
    "CREATE TABLE IF NOT EXISTS bookings (receipt TEXT PRIMARY KEY, traveler TEXT NOT NULL,"
    " destination TEXT NOT NULL, session_id TEXT, created_ns INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS attempts (seq INTEGER PRIMARY KEY, tool TEXT NOT NULL,"
    " traveler TEXT, destination TEXT, session_id TEXT, created_ns INTEGER NOT NULL)",
)

BOOK_TRIP_SCHEMA = {
    "name": "book_trip",
    "description": "Book a trip for a traveler. Charges the traveler; do not repeat blindly.",
    "parameters": {
        "type": "object",
        "properties": {
            "traveler": {"type": "string", "description": "traveler name"},
            "destination": {"type": "string", "description": "destination city"},
        },
        "required": ["traveler", "destination"],
    },
}

LOOKUP_RECEIPT_SCHEMA = {
    "name": "lookup_receipt",
    "description": "Read-only: list the bookings held by the service for a traveler.",
    "parameters": {
        "type": "object",
        "properties": {"traveler": {"type": "string", "description": "traveler name"}},
        "required": ["traveler"],
    },
}


class ServiceUnavailable(RuntimeError):
    """The fictional service failed after accepting the request."""


def service_path() -> str:
    """Location of the service database (required environment variable)."""
    path = os.environ.get("BOOKING_SERVICE_DB", "")
    if not path:
        raise ServiceUnavailable("BOOKING_SERVICE_DB is not set")
    return path


def open_service() -> sqlite3.Connection:
    """Open (and create if needed) the service database for writing."""
    connection = sqlite3.connect(service_path(), timeout=10, isolation_level=None)
    for statement in SCHEMA_SQL:
        connection.execute(statement)
    return connection


def book_trip(args: dict, **kwargs) -> str:
    """Commit one booking, optionally then stall so the harness can kill the host."""
    traveler = str(args.get("traveler", ""))
    destination = str(args.get("destination", ""))
    session_id = str(kwargs.get("session_id") or "")
    connection = open_service()
    try:
        connection.execute(
            "INSERT INTO attempts (tool, traveler, destination, session_id, created_ns)"
            " VALUES ('book_trip', ?, ?, ?, ?)",
            (traveler, destination, session_id, time.time_ns()))
        if destination == "Atlantis":
            raise ServiceUnavailable("booking service timed out after accepting the request")
        if destination == "Interrupted":
            raise KeyboardInterrupt("cancelled while the booking service was working")
        receipt = "R-" + uuid.uuid4().hex[:10]
        connection.execute(
            "INSERT INTO bookings (receipt, traveler, destination, session_id, created_ns)"
            " VALUES (?, ?, ?, ?, ?)",
            (receipt, traveler, destination, session_id, time.time_ns()))
    finally:
        connection.close()
    stall_if_armed(receipt)
    return json.dumps({"status": "booked", "receipt": receipt, "traveler": traveler,
                       "destination": destination})


def stall_if_armed(receipt: str) -> None:
    """Consume the crash arm file, signal the harness, then wait to be killed."""
    arm_path = os.environ.get("BOOKING_CRASH_ARM", "")
    signal_path = os.environ.get("BOOKING_CRASH_SIGNAL", "")
    if not arm_path or not signal_path:
        return
    try:
        os.unlink(arm_path)
    except FileNotFoundError:
        return
    temporary = signal_path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as signal_file:
        json.dump({"receipt": receipt, "pid": os.getpid()}, signal_file)
        signal_file.flush()
        os.fsync(signal_file.fileno())
    os.replace(temporary, signal_path)
    time.sleep(float(os.environ.get("BOOKING_CRASH_STALL_SECONDS", "60")))


def lookup_receipt(args: dict, **kwargs) -> str:
    """Return the bookings the service holds for a traveler (read-only)."""
    traveler = str(args.get("traveler", ""))
    path = service_path()
    if not os.path.exists(path):
        return json.dumps({"traveler": traveler, "count": 0, "bookings": []})
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = connection.execute(
            "SELECT receipt, destination FROM bookings WHERE traveler = ? ORDER BY created_ns",
            (traveler,)).fetchall()
    finally:
        connection.close()
    return json.dumps({"traveler": traveler, "count": len(rows),
                       "bookings": [{"receipt": r, "destination": d} for r, d in rows]})


def register(ctx) -> None:
    """Register the two booking tools."""
    ctx.register_tool(name="book_trip", toolset="booking", schema=BOOK_TRIP_SCHEMA,
                      handler=book_trip, description=BOOK_TRIP_SCHEMA["description"])
    ctx.register_tool(name="lookup_receipt", toolset="booking", schema=LOOKUP_RECEIPT_SCHEMA,
                      handler=lookup_receipt, description=LOOKUP_RECEIPT_SCHEMA["description"])
