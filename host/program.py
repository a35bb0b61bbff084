"""The name of the program that runs Hermes here (docs/guard.md §Inside Hermes):
printed commands (``hermes -p work crash-recovery ...``) must name a program the
operator has (``hermes`` for 0.19 and 0.22, ``hermesx`` for the 0.20.1
packaging).  Only a name, never a path (it may reach a chat); Hermes is not
imported.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Iterable, Optional, Sequence

DEFAULT_PROGRAM = "hermes"
# The console scripts that start Hermes' command line (every packaging names
# its own, e.g. `hermes`, `hermesx`); others (`hermes-acp`, `hermes-agent`)
# start something else.
HERMES_CLI_ENTRY_POINT = "hermes_cli.main:main"


def host_program(argv0: Optional[str] = None) -> str:
    """The program name an operator types to reach this Hermes: the one this
    process was started as (``argv0``, default ``sys.argv[0]``) when it is one
    of Hermes' command-line scripts, else the first such script beside this
    interpreter (``hermes`` preferred), else ``hermes``."""
    scripts = hermes_cli_scripts()
    started_as = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return choose_program(started_as, scripts, os.path.dirname(sys.executable or ""))


def choose_program(started_as: str, scripts: Sequence[str], bin_dir: str) -> str:
    """:func:`host_program`'s rule on a base name, Hermes' scripts and the interpreter's bin dir."""
    if started_as in scripts:
        return started_as
    preferred = sorted(scripts, key=lambda name: (name != DEFAULT_PROGRAM, name))
    for name in preferred:
        if bin_dir and os.path.exists(os.path.join(bin_dir, name)):
            return name
    return DEFAULT_PROGRAM


@functools.lru_cache(maxsize=1)
def hermes_cli_scripts() -> tuple:
    """The installed console scripts whose entry point is Hermes' command line (read once)."""
    try:
        from importlib.metadata import entry_points
        found: Iterable = entry_points(group="console_scripts")
        return tuple(sorted({entry.name for entry in found
                             if entry.value.replace(" ", "") == HERMES_CLI_ENTRY_POINT}))
    except Exception:  # unreadable metadata: fall back to the usual name
        return (DEFAULT_PROGRAM,)
