#!/usr/bin/env python3
"""Operator CLI for the crash-recovery journal (docs/cli.md).

    python operator_cli.py [--data-dir DIR] [--format json|text] COMMAND ...
    hermes [-p PROFILE] crash-recovery COMMAND ...     (the same, inside Hermes)

Commands: ``status [--check]``, ``show OP``, ``log [--since SEQ] [--jsonl]``,
``verify [--checkpoint FILE]``, ``checkpoint``,
``resolve OP --outcome completed|not_applied --evidence TEXT [--force]``,
``acknowledge OP --evidence TEXT``, ``repair-checkpoint --evidence TEXT``,
``archive``.

Output is one JSON document on stdout (``--format text``: tables for
status/show/log; ``--format prometheus``: gauges for status; ``log --jsonl``:
one event per line).  Exit 0 on success with valid integrity, 1 on any error
(usage errors too: they print a JSON error), 3 for ``status --check`` when an
operation is unresolved or a late outcome awaits acknowledgement.  A failed
command changes nothing on disk.
"""
if __name__ == "__main__" and not __package__:  # `python operator_cli.py` in a checkout
    import os
    import runpy
    import sys
    _checkout = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "host", "standalone.py"))
    sys.exit(_checkout["load_module"]("operator_cli").run())

import argparse
import os
import sys
from typing import Any, Callable, Iterator, Optional, Sequence

from .admission.settings import parse_settings
from .journal import Journal
from .reconciliation.commands import COMMANDS, ERROR_HINTS, CommandError
from .reports.render import json_text, log_text_lines, render_text
from .reports.status import GATE_CLOSED, prometheus_text
from .storage.errors import AdmissionRefused, JournalError

EXIT_OK, EXIT_ERROR, EXIT_ATTENTION = 0, 1, 3
FORMATS = ("json", "text", "prometheus")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as :class:`CommandError` (JSON, exit 1)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise instead of printing usage and exiting 2."""
        raise CommandError("usage", f"{message} (see --help)")


class _ExitingParser(argparse.ArgumentParser):
    """Inside Hermes' own argument parser: print the JSON usage error, exit 1."""

    # Hermes parses a failing command line twice (the first time with stderr
    # captured), so the same error would reach stdout twice: print it once.
    _printed: set = set()

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print a JSON usage error (once per process) and exit 1 (argparse
        would exit 2)."""
        if message not in _ExitingParser._printed:
            _ExitingParser._printed.add(message)
            print(json_text({"ok": False, "error": {"code": "usage",
                                                    "message": f"{message} (see --help)"}}, 1))
        sys.exit(EXIT_ERROR)


def default_data_dir() -> str:
    """``$HERMES_HOME/plugin-data/crash-recovery`` (HERMES_HOME defaults to ~/.hermes)."""
    home = os.environ.get("HERMES_HOME") or os.path.join(os.path.expanduser("~"), ".hermes")
    return os.path.join(home, "plugin-data", "crash-recovery")


# The procedure, for a person who has only --help at hand.
RUNBOOK_EPILOG = """\
when protected calls are blocked:
  1. stop every worker (gateway, agents, cron jobs) of this profile
  2. status --format text        what is unresolved, and whether its owner still runs
  3. show OP --format text       the operation's whole history
  4. check the real service (receipt, request log, database row) for that call
  5. resolve OP --outcome completed|not_applied --evidence "what you checked"
     (cannot tell? leave it unresolved: the gate stays closed, nothing is repeated)
integrity errors: verify; checkpoint_ahead after a crash: repair-checkpoint --evidence TEXT
monitoring: status --check (exit 3 when something needs a person); status --format prometheus
output: one JSON document (exit 0 ok, 1 error); --format text for status/show/log
"""


def add_arguments(parser: argparse.ArgumentParser, parser_class: type) -> None:
    """Add the options and every command to ``parser`` (the CLI's own, or the
    one Hermes gives ``hermes crash-recovery``); ``parser_class`` builds the
    command parsers (it decides what a usage error does)."""
    parser.add_argument("--data-dir", default=None,
                        help="the profile's plugin data directory (default: the active "
                             "profile's, $HERMES_HOME/plugin-data/crash-recovery)")
    parser.add_argument("--format", choices=FORMATS, default="json",
                        help="json (default); text tables for status/show/log; prometheus "
                             "gauges for status")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)
    # `status --format text --data-dir D` works too: people put options after the command.
    # SUPPRESS keeps a value given before the command when none is given after.
    options = parser_class(add_help=False)
    options.add_argument("--format", choices=FORMATS, default=argparse.SUPPRESS,
                         help="as before the command")
    options.add_argument("--data-dir", default=argparse.SUPPRESS, help="as before the command")
    status = commands.add_parser("status", help="integrity, the gate, unresolved operations",
                                 parents=[options])
    status.add_argument("--check", action="store_true",
                        help="exit 3 when an operation is unresolved or a late outcome awaits "
                             "acknowledgement (0 when clear, 1 on error): for cron and monitors")
    show = commands.add_parser("show", help="one operation's verified history", parents=[options])
    show.add_argument("operation_id", help="an operation id from `status` or `log`")
    log = commands.add_parser("log", help="verified export of events", parents=[options])
    log.add_argument("--since", type=int, default=0, help="only events with seq > SINCE")
    log.add_argument("--jsonl", action="store_true", help="one JSON event per line")
    log.add_argument("--all", action="store_true",
                     help="archived segments too, oldest first (each event names its journal_id)")
    verify = commands.add_parser("verify", help="full verification", parents=[options])
    verify.add_argument("--checkpoint", help="an exported checkpoint that must be an ancestor")
    verify.add_argument("--all", action="store_true", help="every archive too, end to end")
    commands.add_parser("checkpoint", help="print the current checkpoint (keep it elsewhere)",
                        parents=[options])
    resolve = commands.add_parser("resolve", help="settle a pending or uncertain operation",
                                  parents=[options])
    resolve.add_argument("operation_id", help="an operation id from `status`")
    resolve.add_argument("--outcome", required=True, choices=("completed", "not_applied"),
                         help="completed: the side effect happened; not_applied: it did not "
                              "(future calls may run; nothing is replayed)")
    resolve.add_argument("--evidence", required=True,
                         help="what you checked in the real service (receipt, log line, row)")
    resolve.add_argument("--force", action="store_true",
                         help="resolve although the operation's worker still runs; the "
                              "evidence must say why")
    acknowledge = commands.add_parser("acknowledge", help="acknowledge a late outcome",
                                      parents=[options])
    acknowledge.add_argument("operation_id", help="an operation id from `status` (attention)")
    acknowledge.add_argument("--evidence", required=True,
                             help="what you did about the late outcome")
    repair = commands.add_parser("repair-checkpoint",
                                 help="clear checkpoint_ahead after a crash between replace and "
                                      "commit", parents=[options])
    repair.add_argument("--evidence", required=True, help="why this repair is justified")
    commands.add_parser("archive", help="seal the history into a read-only archive file and "
                                        "start a new, short segment", parents=[options])


def build_parser() -> argparse.ArgumentParser:
    """The stand-alone parser for every command (usage errors raise CommandError)."""
    # The console script (`crash-recovery-operator`) is named as it was run.
    program = os.path.basename(sys.argv[0] or "")
    parser = _Parser(prog=program if program.startswith("crash-recovery") else "operator_cli.py",
                     description="Inspect and settle the crash-recovery journal (docs/cli.md).",
                     epilog=RUNBOOK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, _Parser)
    return parser


def execute(args: argparse.Namespace, data_dir_default: Callable[[], str],
            prefix: Optional[Callable[[str], Sequence[str]]] = None,
            settings: Optional[Callable[[], Any]] = None) -> int:
    """Run the parsed command; print its result; return the exit code.
    ``prefix(data_dir)``: how the commands are run here, for the hints in text
    output (default: the stand-alone form).  ``settings()``: the raw plugin
    settings where they are known (inside Hermes); ``status`` then shows them
    parsed, with any problem (docs/cli.md §status)."""
    output_format, command = getattr(args, "format", "json"), getattr(args, "command", None)
    data_dir = None
    try:
        if command is None:
            raise CommandError("usage", "a command is required (see --help)")
        if args.data_dir is not None and not args.data_dir.strip():
            raise CommandError("usage", "--data-dir is empty (an unset shell variable?)")
        if output_format == "prometheus" and command != "status":
            raise CommandError("usage", "--format prometheus is for status only")
        data_dir = os.path.abspath(args.data_dir or data_dir_default())
        result = COMMANDS[command](args, data_dir, Journal)
        exit_code = EXIT_OK
    except CommandError as exc:
        result, exit_code = {"ok": False, "error": {"code": exc.code, "message": exc.message,
                                                    **exc.details}}, EXIT_ERROR
    except AdmissionRefused as exc:
        # The journal verified; the request itself was refused (e.g. already resolved).
        result, exit_code = {"ok": False, "integrity": "ok", "error": exc.to_json()}, EXIT_ERROR
    except JournalError as exc:
        # repair_not_applicable carries the state it found (``found``), which is
        # the journal's real integrity.
        result, exit_code = {"ok": False, "integrity": exc.details.get("found", exc.code),
                             "error": exc.to_json()}, EXIT_ERROR
    if command == "status" and settings is not None:
        result["settings"] = _settings_view(settings)
    if exit_code and result["error"]["code"] in ERROR_HINTS:
        result["error"]["hint"] = ERROR_HINTS[result["error"]["code"]]
    if exit_code == EXIT_OK and getattr(args, "check", False) and (
            result.get("gate") == GATE_CLOSED or result.get("attention")):
        exit_code = EXIT_ATTENTION  # a running call (gate busy) needs nobody
    if command == "log" and exit_code == EXIT_OK:
        _print_log(result, jsonl=args.jsonl, text=output_format == "text")
    elif output_format == "prometheus":
        # A failure keeps the healthy series' label (the absolute data directory),
        # so an alert on it fires.
        print(prometheus_text(result) if exit_code != EXIT_ERROR
              else prometheus_text({"data_dir": data_dir or ""}))
    elif output_format == "text":
        words = prefix(result.get("data_dir", "")) if prefix and exit_code != EXIT_ERROR else None
        print(render_text(command or "", result, words))
    else:
        print(json_text(result, 1))
    return exit_code


def _settings_view(settings: Callable[[], Any]) -> dict:
    """The parsed settings as ``status`` shows them; never raises."""
    try:
        raw = settings()
    except Exception as exc:  # the same fail-closed reading as the guard's
        raw = f"<unreadable: {type(exc).__name__}: {exc}>"
    return parse_settings(raw).to_json()


def _print_log(result: dict, *, jsonl: bool, text: bool) -> None:
    """Print ``log``'s events as they are read (constant memory)."""
    events: Iterator[dict] = result["events"]
    if jsonl:
        for event in events:
            print(json_text(event, None))
    elif text:
        for line in log_text_lines(result):
            print(line)
    else:
        head = json_text({key: value for key, value in result.items() if key != "events"}, 1)
        print(head[:-2] + ',\n "events": [')
        first = True
        for event in events:
            print(("  " if first else ", ") + json_text(event, None))
            first = False
        print(" ]\n}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command from ``argv``; print its result; return the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except CommandError as exc:
        print(json_text({"ok": False, "error": {"code": exc.code, "message": exc.message}}, 1))
        return EXIT_ERROR
    return execute(args, default_data_dir)


def run() -> int:
    """Console entry point: :func:`main`, quiet when stdout is closed early
    (``log --jsonl | head``)."""
    return _quiet_on_closed_stdout(main)


def _quiet_on_closed_stdout(function: Callable[[], int]) -> int:
    try:
        exit_code = function()
        sys.stdout.flush()
        return exit_code
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except OSError as exc:  # stdout itself failed (a full disk): nothing to print to
        print(f"operator_cli.py: cannot write the result: {exc.strerror or exc}",
              file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR


# ------------------------------------------------------------ inside Hermes --

def setup_hermes_command(parser: argparse.ArgumentParser) -> None:
    """``setup_fn`` of ``ctx.register_cli_command``: the same options and commands
    on the parser Hermes made for ``hermes crash-recovery``."""
    parser.epilog = RUNBOOK_EPILOG
    add_arguments(parser, _ExitingParser)


def hermes_command_handler(data_dir: Callable[[], str], prefix: Callable[[], Sequence[str]],
                           settings: Optional[Callable[[], Any]] = None,
                           ) -> Callable[[argparse.Namespace], None]:
    """``handler_fn`` of ``ctx.register_cli_command``: run the command on the
    active profile's data directory (``data_dir()``, resolved by Hermes from
    ``HERMES_HOME`` / ``-p``; ``prefix()`` how the profile's commands are run;
    ``settings()`` the profile's raw plugin settings, shown by ``status``)
    and exit with its code (Hermes ignores return values)."""
    def handle(args: argparse.Namespace) -> None:
        sys.exit(_quiet_on_closed_stdout(lambda: execute(
            args, lambda: str(data_dir()), lambda _: prefix(), settings)))
    return handle
