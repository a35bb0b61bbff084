"""What may run while the gate is closed (docs/guard.md §While the gate is
closed).

Which calls are journaled is the mode's; which run while the gate is closed
is this module's: in every mode only :meth:`settings.Settings.while_closed`,
every other call refused, not journaled, with the code a protected call gets
then (so the agent cannot settle its own operations or change the plugin).
While the gate is merely *busy* unprotected tools run.  Pure decisions and
texts; the gate (:class:`gate.Gate`) reads the journal.
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
    """Whether any journal file exists in ``data_dir`` (None: treated as none;
    before the first protected call the gate is open)."""
    if data_dir is None:
        return False
    return any(os.path.lexists(os.path.join(data_dir, name)) for name in _JOURNAL_FILES)


def keeps_gate_open(code: str) -> bool:
    """Whether a journal error ``code`` leaves unprotected tools running."""
    return code in OPEN_VERDICTS


def while_closed_text(tool_name: str, why: str, runs: Iterable[str]) -> str:
    """The explanation of a call refused while closed: the tool, ``why`` (what a
    protected call is told now) and what still ``runs``."""
    return closed_gate_explanation(tool_name, why, runs)
