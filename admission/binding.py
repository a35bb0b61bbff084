"""The admission binding (docs/guard.md §Inside Hermes): which protected call
the current context is inside.

Hermes runs each call in a copied context and may enter the middleware twice
for one call, so a ``ContextVar`` binding tells re-entry from a nested call.  A
thread copying the context during the call sees it; a fresh sibling does not.
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
    """The admitted operation and ``identity`` ``(tool_name, session_id,
    tool_call_id, args_hash)``.  ``active``: False once the call ends (shared
    by copied contexts); ``inner_refusal``: the text for a nested entry;
    ``host_refusal``: ``(error_type, result)`` (:mod:`host_refusal`);
    ``pid``: the admitting process (see :func:`inherited_admission`)."""
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


# Per context: a binding never leaks to another call, thread or later call.
ADMISSION: contextvars.ContextVar[Optional[Admission]] = contextvars.ContextVar(
    "crash_recovery_admission", default=None)


def live_admission() -> Optional[Admission]:
    """This context's binding, if its call is still running in this process."""
    admission = ADMISSION.get()
    return (admission if admission is not None and admission.active
            and admission.pid == os.getpid() else None)


def inherited_admission() -> Optional[Admission]:
    """In a child forked during a protected call, the parent's binding, else
    None (docs/guard.md §Child processes)."""
    admission = ADMISSION.get()
    return (admission if admission is not None and admission.active
            and admission.pid != os.getpid() else None)


def same_call(bound: tuple, identity: tuple) -> bool:
    """Whether ``identity`` is ``bound``'s call by tool, session and call id
    (hosts may rewrite arguments); without a call id the arguments match too."""
    if bound[:3] != identity[:3]:
        return False
    return identity[2] is not None or bound[3] == identity[3]
