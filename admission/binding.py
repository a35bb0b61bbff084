"""The admission binding (docs/guard.md §Inside Hermes): which protected call
the current context is inside.

After admitting an operation the guard binds it in a ``ContextVar``.  Hermes
runs each call in a copied context and may enter the middleware twice, nested,
for one call; the binding tells such a re-entry (the same call by the host's
identity) from a nested protected call (another call while this one runs), and
lets the ``pre_tool_call`` hook leave exactly this call out of its check.  A
thread that copies the context during the call (Hermes' ``execute_code``
bridge) sees the binding; a sibling in a fresh context does not.
"""
from __future__ import annotations

import contextvars
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from ..reports.messages import iso_utc


@dataclass
class Admission:
    """The binding of docs/guard.md §Inside Hermes: the admitted operation and
    the call's identity ``(tool_name, session_id, tool_call_id, args_hash)``.

    ``active`` turns False when the call ends.  A context copied during the call
    (a thread or task the tool started) keeps this same object, so a stale copy
    can never pass as re-entry after the call is over.  ``inner_refusal``: the
    blocked text this guard returned to a nested entry of this call.
    ``host_refusal``: ``(error_type, result)`` when the host reported, through
    its ``post_tool_call`` hook with ``status="blocked"``, that it refused this
    call before its handler (docs/guard.md §Inside Hermes).
    ``pid``: the process that admitted it; a child forked during the call
    inherits the binding but is not inside the call (:func:`inherited_admission`).
    """
    operation_id: str
    identity: tuple
    started_ns: int = 0
    active: bool = True
    inner_refusal: Optional[str] = None
    host_refusal: Optional[tuple] = None
    pid: int = field(default_factory=os.getpid)

    def view(self) -> dict:
        """The running operation as a refusal shows it."""
        return {"operation_id": self.operation_id, "tool": self.identity[0], "state": "pending",
                "started_at": iso_utc(self.started_ns),
                "age_seconds": round(max(0, time.time_ns() - self.started_ns) / 1e9, 3)}


# Per-context: Hermes' concurrent path runs each call in a copied context, so a
# binding never leaks to another call, thread or later call.
ADMISSION: contextvars.ContextVar[Optional[Admission]] = contextvars.ContextVar(
    "crash_recovery_admission", default=None)


def live_admission() -> Optional[Admission]:
    """This context's binding, if its call is still running in this process."""
    admission = ADMISSION.get()
    return (admission if admission is not None and admission.active
            and admission.pid == os.getpid() else None)


def inherited_admission() -> Optional[Admission]:
    """In a child forked during a protected call: the parent's binding (the
    call the child was forked inside), else None (docs/guard.md §Child
    processes)."""
    admission = ADMISSION.get()
    return (admission if admission is not None and admission.active
            and admission.pid != os.getpid() else None)


def same_call(bound: tuple, identity: tuple) -> bool:
    """Whether ``identity`` is the call ``bound`` describes, by the host's
    identity of a call -- tool name, session, tool-call id -- not by argument
    bytes (a host may rewrite arguments between two entries of one call).
    Without a tool-call id, the arguments must match too."""
    if bound[:3] != identity[:3]:
        return False
    return identity[2] is not None or bound[3] == identity[3]
