"""Host refusals: a call the host refused after our middleware admitted it
(docs/guard.md §Inside Hermes, "Host refusals").

On Hermes 0.20 and later the ``tool_execution`` middleware runs first, and the
host runs every plugin's ``pre_tool_call`` hook, the session scope check, the
pruned-argument check and the tool-loop guardrails *inside* the middleware's
``next_call``.  When one of them refuses, the handler is never invoked; the host
then fires ``post_tool_call`` with ``status="blocked"`` for that call before it
returns the refusal (0.20.1 and 0.22.2: ``agent/tool_executor.py``,
``_run_agent_tool_execution_middleware`` / ``_blocked_tool_result``).  That
report, matched to the call this context has admitted, is the only evidence we
accept that the handler did not run: never the text of an error.  Where the host
does not report it (0.19 runs hooks before the middleware; a hook that timed
out; another middleware that rewrote the result), the operation stays
``uncertain`` as before.
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
    """Mark this context's admitted call as refused by the host when a
    ``post_tool_call`` report says ``status == "blocked"`` for exactly that call
    (tool name, session id and a non-empty tool-call id).  Returns whether it
    marked it.  A report for any other call, one without a tool-call id, or one
    after the call ended, changes nothing."""
    if status != HOST_BLOCKED_STATUS or not tool_call_id or not isinstance(tool_call_id, str):
        return False  # without the model's call id a nested call could pass for this one
    admission = live_admission()  # Hermes 0.22 runs hooks in a copy of this context
    if admission is None or tuple(admission.identity[:3]) != (tool_name, session_id, tool_call_id):
        return False
    admission.host_refusal = (str(error_type) if error_type is not None else "blocked", result)
    return True


def host_refused(admission: Admission, result: Any) -> bool:
    """Whether the host reported refusing ``admission``'s call before its
    handler and ``result`` is exactly the refusal it reported (a middleware
    between us and the host that rewrote it leaves the call uncertain)."""
    refusal = admission.host_refusal
    if refusal is None:
        return False
    try:
        return type(result) is type(refusal[1]) and bool(result == refusal[1])
    except Exception:
        return False
