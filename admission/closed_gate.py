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

import json
import os
from typing import Any, Iterable, Optional

from ..reports.messages import closed_gate_explanation
from ..storage.record import CHECKPOINT_NAME, DATABASE_NAME, MARKER_NAME
from .bridge import BRIDGE_CALL, bridge_calls

# Journal files whose presence means a journal exists (or existed) here.
_JOURNAL_FILES = (DATABASE_NAME, DATABASE_NAME + "-wal", DATABASE_NAME + "-shm",
                  CHECKPOINT_NAME, MARKER_NAME)
# Verdicts after which unprotected tools still run: nothing can be journaled on
# such a platform, so no operation can be waiting there (docs/guard.md §Platforms).
OPEN_VERDICTS = frozenset({"platform_unsupported"})
# Hermes' file tools run through the terminal's shell with their text arguments on
# a command line (rg, grep, find, sed, head): a value beginning with "-" is read
# there as an option, and some options run programs (rg --pre=sh runs one per file).
SHELL_BACKED_TOOLS = frozenset({"read_file", "search_files"})


def journal_present(data_dir: Optional[str]) -> bool:
    """Whether any journal file exists in ``data_dir`` (None: treated as none;
    before the first protected call the gate is open)."""
    if data_dir is None:
        return False
    return any(os.path.lexists(os.path.join(data_dir, name)) for name in _JOURNAL_FILES)


def keeps_gate_open(code: str) -> bool:
    """Whether a journal error ``code`` leaves unprotected tools running."""
    return code in OPEN_VERDICTS


def option_argument_problem(tool_name: Any, args: Any) -> Optional[str]:
    """For a call of a shell-backed file tool (:data:`SHELL_BACKED_TOOLS`),
    directly or as an entry of a ``tool_call``: what makes it unsafe while the
    gate is closed, as a phrase (its first text argument that begins with "-"
    after blanks, or arguments that are neither an object nor JSON text of
    one); else None (docs/guard.md §While the gate is closed)."""
    if tool_name == BRIDGE_CALL:
        for name, arguments in bridge_calls(args) or ():
            found = option_argument_problem(name, {} if arguments is None else arguments)
            if found is not None:
                return found
        return None
    if tool_name not in SHELL_BACKED_TOOLS or args is None:
        return None
    if isinstance(args, str):  # a host may pass a bridge entry's arguments as JSON text
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            args = None
    if not isinstance(args, dict):
        return f"the arguments of {tool_name} are not a JSON object, so they cannot be checked"
    for name, value in args.items():
        if isinstance(value, str) and value.lstrip().startswith("-"):
            return f"its argument {str(name)[:100]!r} begins with \"-\""
    return None


def while_closed_text(tool_name: str, why: str, runs: Iterable[str]) -> str:
    """The explanation of a call refused while closed: the tool, ``why`` (what a
    protected call is told now) and what still ``runs``."""
    return closed_gate_explanation(tool_name, why, runs)
