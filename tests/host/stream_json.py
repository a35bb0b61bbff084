"""``hermes chat -q … --format stream-json`` (Hermes 0.22+) as evidence.

Where the host has it, tests/native_demo.py runs its ``hermes chat`` sessions
with ``--format stream-json``: Hermes then writes one JSON event per stdout
line (``system``/``init``, ``tool_use``, ``tool_result`` with ``output`` and
``is_error``, ``text``, ``result``), and the ``tool_result`` events are the
host's own record of what each tool call returned, read beside the tool
messages the scripted provider received. Older hosts (0.19, 0.20) have no such
option and run with ``-Q``. Standard library only; Hermes is not imported.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import evidence

FIRST_RELEASE = (0, 22, 0)


def supported() -> bool:
    """Whether the host's ``hermes chat`` has ``--format stream-json`` (0.22+)."""
    return evidence.hermes_release() >= FIRST_RELEASE


def chat_flags() -> List[str]:
    """The output flags of a one-shot ``hermes chat -q``: ``--format
    stream-json`` (which implies quiet mode) where supported, else ``-Q``."""
    return ["--format", "stream-json"] if supported() else ["-Q"]


def events(stdout: str) -> List[Dict[str, Any]]:
    """The JSON objects of a stream-json stdout, in order (other lines skipped)."""
    found = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("type"), str):
            found.append(event)
    return found


def events_in(path: Path) -> List[Dict[str, Any]]:
    """:func:`events` of a file a killed session's stdout went to ([] if absent)."""
    if not Path(path).exists():
        return []
    return events(Path(path).read_text(encoding="utf-8", errors="replace"))


def of_tool(stream: List[Dict[str, Any]], kind: str, tool: str) -> List[Dict[str, Any]]:
    """The ``kind`` events (``tool_use``, ``tool_result``) naming ``tool``.  The
    host names the underlying tool also for a call the model made through
    Tool Search's ``tool_call``; 0.22.2 puts no tool-call id in the events, so
    a session that calls each tool once is matched by name."""
    return [event for event in stream if event.get("type") == kind and event.get("name") == tool]


def tool_result(stream: List[Dict[str, Any]], tool: str) -> Optional[Dict[str, Any]]:
    """The single ``tool_result`` event of ``tool``, or None (none, or several)."""
    results = of_tool(stream, "tool_result", tool)
    return results[0] if len(results) == 1 else None


def output_of(event: Dict[str, Any]) -> Dict[str, Any]:
    """A ``tool_result``'s ``output`` decoded as a JSON object ({} otherwise)."""
    try:
        document = evidence.decode_json_text(str(event.get("output", "")))
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def summary(stream: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The tool events of a session, shortened, for a verdict's evidence."""
    return [{key: (str(value)[:300] if key == "output" else value)
             for key, value in event.items() if key != "timestamp"}
            for event in stream if event.get("type") in ("tool_use", "tool_result", "result")]


def check_sessions(findings: Any, crashed: List[Dict[str, Any]], repeated: List[Dict[str, Any]],
                   later: List[Dict[str, Any]], operation_id: Optional[str]) -> None:
    """The native demo's three sessions as the host reported them (``findings``
    has ``expect(condition, failure)`` and ``facts``): the killed session
    started ``book_trip`` and never reported its result; the restarted one
    reported the refusal (an error naming the pending operation) and the
    read-only lookup's answer; after resolution a booking."""
    findings.facts["stream_json"] = {"crashed": summary(crashed), "restarted": summary(repeated),
                                     "after_resolution": summary(later)}
    findings.expect(len(of_tool(crashed, "tool_use", "book_trip")) == 1
                    and of_tool(crashed, "tool_result", "book_trip") == [],
                    "stream-json s1: expected a tool_use and no tool_result for the killed call, "
                    f"got {summary(crashed)}")
    refused = tool_result(repeated, "book_trip") or {}
    refusal = evidence.blocked_document(refused.get("output", ""))
    findings.expect(refused.get("is_error") is True and refusal is not None
                    and refusal.get("operation_ids") == [operation_id],
                    f"stream-json s2: book_trip's tool_result was {refused}")
    lookup = tool_result(repeated, "lookup_receipt") or {}
    findings.expect(lookup.get("is_error") is False and output_of(lookup).get("count") == 1,
                    f"stream-json s2: lookup_receipt's tool_result was {lookup}")
    booked = tool_result(later, "book_trip") or {}
    findings.expect(booked.get("is_error") is False
                    and output_of(booked).get("status") == "booked",
                    f"stream-json s3: book_trip's tool_result was {booked}")
    results = [event for stream in (repeated, later) for event in stream
               if event.get("type") == "result"]
    findings.expect([event.get("exit_code") for event in results] == [0, 0],
                    f"stream-json: result events {results}")
