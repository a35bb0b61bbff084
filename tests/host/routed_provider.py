"""A scripted provider that serves several agents of one process at once: a
parent agent and the subagents its ``delegate_task`` starts.

Standard library only. :class:`RoutedProvider` is a
:class:`mock_provider.ScriptedProvider` with one script per agent: an
agent-loop request whose first ``user`` message (a subagent's first user
message is its delegated goal) contains a lane's marker takes its turns from
that lane; every other agent-loop request takes them from the main script. So
each agent gets its own turns in order however the host interleaves the
agents' requests (a subagent may run on its own thread, beside its parent).

A turn may hold its answer until the provider has been sent the result of a
given tool call: ``{"after_tool_result": "call_x", "tool_calls": [...]}`` is
answered only once some request carries the ``role: tool`` message of
``call_x``. That orders a subagent's call after its parent's call has ended
(the parent sends that result on its next request) by what the provider saw,
never by time; a hold that is not released within ``hold_seconds`` answers
anyway and is listed in :attr:`RoutedProvider.holds_timed_out`.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from mock_provider import AUXILIARY_TEXT, EXHAUSTED_TEXT, ScriptedProvider


def first_user_text(body: Dict[str, Any]) -> str:
    """The text of a request's first ``user`` message ("" when there is none)."""
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def tool_result_ids(body: Dict[str, Any]) -> set:
    """The tool-call ids whose results a request carries."""
    return {message.get("tool_call_id") for message in body.get("messages") or []
            if isinstance(message, dict) and message.get("role") == "tool"}


class RoutedProvider(ScriptedProvider):
    """One script per agent, chosen by a marker in the agent's first user
    message (``lanes``: marker -> turns); the main script serves the rest."""

    def __init__(self, turns: List[Dict[str, Any]], lanes: Dict[str, List[Dict[str, Any]]], *,
                 timeout_seconds: Optional[float] = None, hold_seconds: float = 60.0) -> None:
        super().__init__(turns, timeout_seconds=timeout_seconds)
        self._lanes = {marker: list(lane) for marker, lane in lanes.items()}
        self._results_seen = threading.Condition(self._lock)
        self._seen_ids: set = set()
        self.hold_seconds = hold_seconds
        self.holds_timed_out: List[str] = []

    def remaining_lane_turns(self, marker: str) -> int:
        """Turns of one lane not yet served."""
        with self._lock:
            return len(self._lanes[marker])

    def _record(self, method: str, path: str, body: Any) -> None:
        super()._record(method, path, body)
        if isinstance(body, dict):
            with self._results_seen:
                self._seen_ids |= tool_result_ids(body)
                self._results_seen.notify_all()

    def _next_turn(self, body: Dict[str, Any]) -> Dict[str, Any]:
        if not body.get("tools"):
            return {"text": AUXILIARY_TEXT}
        first = first_user_text(body)
        marker: Optional[str] = next((m for m in self._lanes if m in first), None)
        with self._results_seen:
            script = self._turns if marker is None else self._lanes[marker]
            if not script:
                return {"text": EXHAUSTED_TEXT}
            turn = script.pop(0)
            awaited = turn.get("after_tool_result")
            if awaited and not self._results_seen.wait_for(lambda: awaited in self._seen_ids,
                                                           self.hold_seconds):
                self.holds_timed_out.append(awaited)
            return turn
