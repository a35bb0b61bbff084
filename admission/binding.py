"""The admission binding (docs/guard.md §Inside Hermes): which protected call
the current context is inside.

An admitted operation is bound in a ``ContextVar``: Hermes runs each call in
a copied context and may enter the middleware twice, nested, for one call, so
the binding tells re-entry from a nested protected call and lets the
``pre_tool_call`` hook leave this call out.  A thread copying the context
during the call (``execute_code``'s bridge) sees it; a fresh sibling does not.
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
    """The admitted operation and the call's identity ``(tool_name,
    session_id, tool_call_id, args_hash)``.  ``active`` turns False when the
    call ends (copied contexts share this object, so a stale copy never passes
    as re-entry); ``inner_refusal``: the text returned to a nested entry;
    ``host_refusal``: ``(error_type, result)`` of a host-blocked call
    (:mod:`host_refusal`); ``pid``: the admitting process (a forked child is
    not inside the call: :func:`inherited_admission`)."""
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
    """Whether ``identity`` is the call ``bound`` describes by tool name,
    session and tool-call id (a host may rewrite arguments between two entries
    of one call); without a tool-call id, the arguments must match too."""
    if bound[:3] != identity[:3]:
        return False
    return identity[2] is not None or bound[3] == identity[3]
