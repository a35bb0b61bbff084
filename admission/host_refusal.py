"""Host refusals: a call the host refused after our middleware admitted it
(docs/guard.md §Inside Hermes, "Host refusals").

On Hermes 0.20+ the host runs the ``pre_tool_call`` hooks, scope and argument
checks and guardrails *inside* the middleware's ``next_call``; when one refuses,
the handler never runs and the host fires ``post_tool_call`` with
``status="blocked"`` (0.20.1, 0.22.2: ``agent/tool_executor.py``,
``_blocked_tool_result``).  That report, matched to this context's admitted
call, is the only evidence accepted that the handler did not run, never an
error's text.  Without it (0.19 runs hooks first; a timed-out hook; a
rewriting middleware) the operation stays ``uncertain``.
"""
from __future__ import annotations

from typing import Any

from .binding import Admission, live_admission

# docs/format.md §Events: ``returned`` reasons of a call whose handler never ran.
NOT_RUN_HOST_REFUSED = "not_run_host_refused"
NOT_RUN = ("not_run", NOT_RUN_HOST_REFUSED)
HOST_BLOCKED_STATUS = "blocked"


def note_host_refusal(tool_name: Any, session_id: Any, tool_call_id: Any, status: Any,
                      error_type: Any, result: Any) -> bool:
    """Mark this context's live admitted call as refused by the host when a
    ``post_tool_call`` report says ``status == "blocked"`` for exactly that call
    (tool name, session id, non-empty tool-call id); returns whether it did."""
    if status != HOST_BLOCKED_STATUS or not tool_call_id or not isinstance(tool_call_id, str):
        return False  # without the model's call id a nested call could pass for this one
    admission = live_admission()  # Hermes 0.22 runs hooks in a copy of this context
    if admission is None or tuple(admission.identity[:3]) != (tool_name, session_id, tool_call_id):
        return False
    admission.host_refusal = (str(error_type) if error_type is not None else "blocked", result)
    return True


def host_refused(admission: Admission, result: Any) -> bool:
    """Whether the host reported refusing ``admission``'s call and ``result`` is
    exactly that refusal (a rewritten one leaves the call uncertain)."""
    refusal = admission.host_refusal
    if refusal is None:
        return False
    try:
        return type(result) is type(refusal[1]) and bool(result == refusal[1])
    except Exception:
        return False
