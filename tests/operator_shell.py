#!/usr/bin/env python3
"""Run one command as an operator's own shell would: outside the calling
process's tree (docs/cli.md §Who may settle).

    python tests/operator_shell.py COMMAND [ARG ...]

A writing operator command refuses to run from inside an agent: a process
whose ancestors have the journal open.  A test that holds the journal open
itself (an in-process guard) and then settles through the CLI plays both the
agent and the person, so its operator commands run here: forked twice, the
command's parent is a process whose own parent has exited (the system
adopted it), as with a shell the person opened elsewhere.  The environment
is this process's, and so are the standard streams.  Exits with the
command's exit code.  Tests only.
"""
from __future__ import annotations

import os
import subprocess
import sys


def detach() -> bool:
    """Fork twice: True in the grandchild, once the middle process has exited
    and the system has adopted it (a session of its own, its parent chain cut
    from the caller's); False in the calling process, after the middle
    process has gone."""
    middle = os.fork()
    if middle != 0:
        os.waitpid(middle, 0)
        return False
    os.setsid()
    middle_pid = os.getpid()
    if os.fork() != 0:
        os._exit(0)
    while os.getppid() == middle_pid:
        os.sched_yield()
    return True


def main(argv: list) -> int:
    read_end, write_end = os.pipe()
    if detach():
        os.close(read_end)
        try:  # the command shares this process's standard streams (a terminal's)
            returncode = subprocess.run(argv).returncode
        except OSError as exc:
            sys.stderr.write(f"operator_shell.py: {exc}\n")
            returncode = 127
        os.write(write_end, str(returncode).encode("ascii"))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as stream:
        reported = stream.read()
    return int(reported) if reported.strip().isdigit() else 125

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
