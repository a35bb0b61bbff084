#!/usr/bin/env python3
"""Operator CLI for the crash-recovery journal (docs/cli.md).

    python operator_cli.py [--data-dir DIR] [--format json|text] COMMAND ...

Commands: ``status``, ``show OP``, ``log [--since SEQ] [--jsonl]``,
``verify [--checkpoint FILE]``, ``checkpoint``,
``resolve OP --outcome completed|not_applied --evidence TEXT [--force]``,
``repair-checkpoint --evidence TEXT``.

Output is one JSON document on stdout (``--format text`` prints aligned tables
for status/show/log instead; ``log --jsonl`` prints one event per line).  Exit
0 on success with valid integrity, 1 on any error, usage errors included (they
print a JSON error too).  A failed command changes nothing on disk.  ``status``,
``show``, ``log``, ``verify`` and ``checkpoint`` open the database read-only and
never create a journal, marker or checkpoint.

Every ``resolve`` and ``repair-checkpoint`` is also appended to ``operator.log``
beside the journal (one JSON line per action: time, action, evidence, the
checkpoint before and after), which ``verify`` reports.
"""
if __name__ == "__main__" and not __package__:  # `python operator_cli.py` in a checkout
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from standalone import load_module
    sys.exit(load_module("operator_cli").run())

import argparse
import os
import sys
from typing import Optional, Sequence

from .commands import COMMANDS, ERROR_HINTS, CommandError
from .errors import AdmissionRefused, JournalError
from .report import json_text, render_text


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as :class:`CommandError` (JSON, exit 1)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise instead of printing usage and exiting 2."""
        raise CommandError("usage", f"{message} (see --help)")


def default_data_dir() -> str:
    """``$HERMES_HOME/plugin-data/crash-recovery`` (HERMES_HOME defaults to ~/.hermes)."""
    home = os.environ.get("HERMES_HOME") or os.path.join(os.path.expanduser("~"), ".hermes")
    return os.path.join(home, "plugin-data", "crash-recovery")


# The procedure, for a person who has only --help at hand.
RUNBOOK_EPILOG = """\
when protected calls are blocked:
  1. stop every worker (gateway, agents) of this profile
  2. status --format text        what is unresolved, and whether its owner still runs
  3. show OP --format text       the operation's whole history
  4. check the real service (receipt, request log, database row) for that call
  5. resolve OP --outcome completed|not_applied --evidence "what you checked"
     (cannot tell? leave it unresolved: the gate stays closed, nothing is repeated)
integrity errors: verify; checkpoint_ahead after a crash: repair-checkpoint --evidence TEXT
output: one JSON document (exit 0 ok, 1 error); --format text for status/show/log
"""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for every command (usage errors raise CommandError)."""
    parser = _Parser(prog="operator_cli.py",
                     description="Inspect and settle the crash-recovery journal (docs/cli.md).",
                     epilog=RUNBOOK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None,
                        help="the profile's plugin data directory "
                             "(default: $HERMES_HOME/plugin-data/crash-recovery)")
    parser.add_argument("--format", choices=("json", "text"), default="json",
                        help="json (default) or aligned text tables for status/show/log")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # `status --format text --data-dir D` works too: people put options after the command.
    # SUPPRESS keeps a value given before the command when none is given after.
    format_option = _Parser(add_help=False)
    format_option.add_argument("--format", choices=("json", "text"), default=argparse.SUPPRESS,
                               help="json (default) or aligned text tables")
    format_option.add_argument("--data-dir", default=argparse.SUPPRESS,
                               help="as before the command")
    commands.add_parser("status", help="integrity and unresolved operations",
                        parents=[format_option])
    show = commands.add_parser("show", help="one operation's verified history",
                               parents=[format_option])
    show.add_argument("operation_id", help="an operation id from `status` or `log`")
    log = commands.add_parser("log", help="verified export of events", parents=[format_option])
    log.add_argument("--since", type=int, default=0, help="only events with seq > SINCE")
    log.add_argument("--jsonl", action="store_true", help="one JSON event per line")
    verify = commands.add_parser("verify", help="full verification", parents=[format_option])
    verify.add_argument("--checkpoint", help="an exported checkpoint that must be an ancestor")
    commands.add_parser("checkpoint", help="print the current checkpoint (keep it elsewhere)",
                        parents=[format_option])
    resolve = commands.add_parser("resolve", help="settle a pending or uncertain operation",
                                  parents=[format_option])
    resolve.add_argument("operation_id", help="an operation id from `status`")
    resolve.add_argument("--outcome", required=True, choices=("completed", "not_applied"),
                         help="completed: the side effect happened; not_applied: it did not "
                              "(future calls may run; nothing is replayed)")
    resolve.add_argument("--evidence", required=True,
                         help="what you checked in the real service (receipt, log line, row)")
    resolve.add_argument("--force", action="store_true",
                         help="resolve although the operation's worker still runs; the "
                              "evidence must say why")
    repair = commands.add_parser("repair-checkpoint",
                                 help="re-anchor head.json after a crash between replace and commit",
                                 parents=[format_option])
    repair.add_argument("--evidence", required=True, help="why this repair is justified")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; print its result; return the exit code (0 or 1)."""
    parser = build_parser()
    output_format, command = "json", None
    try:
        args = parser.parse_args(argv)
        output_format, command = args.format, args.command
        if command is None:
            raise CommandError("usage", "a command is required (see --help)")
        if args.data_dir is not None and not args.data_dir.strip():
            raise CommandError("usage", "--data-dir is empty (an unset shell variable?)")
        data_dir = os.path.abspath(args.data_dir or default_data_dir())
        result = COMMANDS[command](args, data_dir)
        exit_code = 0
    except CommandError as exc:
        result, exit_code = {"ok": False, "error": {"code": exc.code, "message": exc.message,
                                                    **exc.details}}, 1
    except AdmissionRefused as exc:
        # The journal verified; the request itself was refused (e.g. already resolved).
        result, exit_code = {"ok": False, "integrity": "ok", "error": exc.to_json()}, 1
    except JournalError as exc:
        # repair_not_applicable carries the state it found (``found``), which is
        # the journal's real integrity.
        result, exit_code = {"ok": False, "integrity": exc.details.get("found", exc.code),
                             "error": exc.to_json()}, 1
    if exit_code and result["error"]["code"] in ERROR_HINTS:
        result["error"]["hint"] = ERROR_HINTS[result["error"]["code"]]
    if command == "log" and exit_code == 0 and getattr(args, "jsonl", False):
        for event in result["events"]:
            print(json_text(event, None))
        return 0
    if output_format == "text":
        print(render_text(command or "", result))
    else:
        print(json_text(result, 1))
    return exit_code


def run() -> int:
    """Console entry point: :func:`main`, quiet when stdout is closed early
    (``log --jsonl | head``)."""
    try:
        exit_code = main()
        sys.stdout.flush()
        return exit_code
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # stdout itself failed (a full disk): nothing to print to
        print(f"operator_cli.py: cannot write the result: {exc.strerror or exc}",
              file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(run())
