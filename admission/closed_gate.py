"""What may run while the gate is closed (docs/guard.md §While the gate is
closed).

Two questions are kept apart.  *Which calls are journaled* is the mode's
(``protected_tools``, or every tool but ``read_only_tools``).  *Which calls
run while an operation awaits a person* is this module's: while the gate is
closed -- an operation is uncertain, or pending with no running worker; the
journal fails verification; the guard is poisoned -- only the tools of
:meth:`settings.Settings.while_closed` run, in every mode.  Every other call is
refused, not journaled (a failing ``ls`` still never closes the gate in
``protected_tools`` mode), with the code a protected call gets at that moment.
While the gate is merely *busy* (a protected call is still running) the
unprotected tools run as usual.

So the agent cannot settle, repair, restart or archive its own operations, nor
switch the plugin off or change its settings, while an operation awaits a
person: no shell, no code execution, no file writes, no delegation.  Pure
decisions and texts; the gate (:class:`gate.Gate`) reads the journal.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

from ..reports.messages import closed_gate_explanation
from ..storage.record import CHECKPOINT_NAME, DATABASE_NAME, MARKER_NAME

# Journal files whose presence means a journal exists (or existed) here.
_JOURNAL_FILES = (DATABASE_NAME, DATABASE_NAME + "-wal", DATABASE_NAME + "-shm",
                  CHECKPOINT_NAME, MARKER_NAME)
# Verdicts after which unprotected tools still run: nothing can be journaled on
# such a platform, so no operation can be waiting there (docs/guard.md §Platforms).
OPEN_VERDICTS = frozenset({"platform_unsupported"})


def journal_present(data_dir: Optional[str]) -> bool:
    """Whether any file of a journal exists in ``data_dir`` (None: unknown,
    treated as none).  Before the first protected call there is none: the
    gate is open, and an unprotected call reads and creates nothing."""
    if data_dir is None:
        return False
    return any(os.path.lexists(os.path.join(data_dir, name)) for name in _JOURNAL_FILES)


def keeps_gate_open(code: str) -> bool:
    """Whether a journal error ``code`` leaves unprotected tools running."""
    return code in OPEN_VERDICTS


def while_closed_text(tool_name: str, why: str, runs: Iterable[str]) -> str:
    """The explanation of a call refused while the gate is closed: which tool,
    why the gate is closed (``why``: what a protected call is told now, no
    command that changes the journal), and what still runs."""
    return closed_gate_explanation(tool_name, why, runs)
