#!/usr/bin/env python3
"""Operator CLI for the crash-recovery journal (docs/cli.md).

    python operator_cli.py [--data-dir DIR] [--format json|text|prometheus] COMMAND ...
    hermes [-p PROFILE] crash-recovery COMMAND ...     (the same, inside Hermes)

One document on stdout; exit 0, 1 on any error, 3 for ``status --check`` when
a person must act (docs/cli.md §Output).  A failed command changes nothing.
"""
if __name__ == "__main__" and not __package__:  # `python operator_cli.py` in a checkout
    import os
    import runpy
    import sys
    _checkout = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "host", "standalone.py"))
    sys.exit(_checkout["load_module"]("operator_cli").run())

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from .admission.registered_tools import operator_settings_view, read_record, workers_running
from .admission.settings import settings_view
from .host import hermes
from .journal import Journal
from .reconciliation.commands import CommandError, run_command
from .reconciliation.switch import pending_restart
from .reports.messages import (WRITING_COMMANDS, command_line, next_command, next_step_of,
                               standalone_prefix, status_next_step)
from .reports.render import json_text, log_text_lines, render_text, stdout_takes_unicode
from .reports.status import (CHECK_NEEDS_A_PERSON, absent_journal_status, check_view,
                             note_platform_problem, prometheus_text)
from .storage.durable import read_regular_file, storage_error
from .storage.errors import JournalError
from .storage.record import CHECKPOINT_NAME, INTENT_NAME

EXIT_OK, EXIT_ERROR, EXIT_ATTENTION = 0, 1, 3
FORMATS = ("json", "text", "prometheus")
# Full-history commands: a progress line on a terminal every PROGRESS_SECONDS.
PROGRESS_COMMANDS = ("status", "show", "verify", "checkpoint")
PROGRESS_SECONDS = 1.0


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as :class:`CommandError` (JSON, exit 1)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError("usage", f"{message} (see --help)")


class _ExitingParser(argparse.ArgumentParser):
    """Inside Hermes' own argument parser: print the JSON usage error, exit 1."""

    # Hermes parses a failing command line twice (the first time with stderr
    # captured), so the same error would reach stdout twice: print it once.
    _printed: set = set()

    def error(self, message: str) -> None:  # type: ignore[override]
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
  1. stop every worker (gateway, agents, cron jobs) of this profile; while an operation
     is open, never disable or remove the plugin: the model could repeat the call
  2. status --format text        what is unresolved, and whether its owner still runs
  3. show OP --format text       the operation's whole history (OP: its id, or the
                                 first characters of it when they are unique)
  4. check the real service (receipt, request log, database row) for that call; the
     call's arguments: hermes -p PROFILE sessions export --session-id SESSION_ID -
  5. resolve OP --outcome completed|not_applied --evidence "what you checked"
     (or --evidence-file FILE, - for stdin; cannot tell? leave it unresolved: the gate
     stays closed, nothing is repeated)
when the journal itself fails (status exits 1 with an integrity code):
  checkpoint_ahead (a crash between two writes): repair-checkpoint --evidence TEXT
  any other code: restart-journal --evidence TEXT keeps the broken files in replaced/
  and starts a new journal in which every call that may have run is still open
  every error names its next command in "next"
late outcome (a tool that ended after a forced resolution): acknowledge OP --evidence TEXT
monitoring: status --check (exit 3 when something needs a person); status --format prometheus
output: one JSON document, or --format text; exit 0 ok, 1 any error (usage, integrity,
refusal, Ctrl-C: code "interrupted"), 3 only for status --check
"""


def evidence_options(parser: argparse.ArgumentParser, meaning: str) -> None:
    """``--evidence TEXT`` or ``--evidence-file PATH`` (``-``: stdin), one required."""
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--evidence", help=meaning)
    given.add_argument("--evidence-file", metavar="PATH",
                       help="the same, read from a UTF-8 file (- reads standard input)")


# The attribute that holds the operator command in a parsed Namespace.
COMMAND_DEST = "crash_recovery_command"


def add_arguments(parser: argparse.ArgumentParser, parser_class: type) -> None:
    """Add the options and commands to ``parser``; ``parser_class`` handles usage errors."""
    parser.add_argument("--data-dir", default=None, help="the profile's plugin data directory "
                        "(default: the active profile's, $HERMES_HOME/plugin-data/crash-recovery)")
    parser.add_argument("--format", choices=FORMATS, default="json",
                        help="json (default); text: tables for status/show/log, a summary "
                             "for the others; prometheus: gauges for status")
    # Not dest="command": Hermes reads its own args.command after our handler's parser
    # ran, and a None there (no subcommand typed) starts its chat.
    commands = parser.add_subparsers(dest=COMMAND_DEST, metavar="COMMAND",
                                     parser_class=parser_class)
    # Options after the command too; SUPPRESS keeps one given before it.
    options = parser_class(add_help=False)
    options.add_argument("--format", choices=FORMATS, default=argparse.SUPPRESS,
                         help="as before the command")
    options.add_argument("--data-dir", default=argparse.SUPPRESS, help="as before the command")

    def command(name: str, summary: str) -> Any:
        return commands.add_parser(name, help=summary, parents=[options])

    command("status", "integrity, the gate, unresolved operations").add_argument(
        "--check", action="store_true",
        help="exit 3 when an operation is unresolved or a late outcome awaits "
             "acknowledgement (0 when clear, 1 on error): for cron and monitors")
    command("show", "one operation's verified history").add_argument(
        "operation_id", help="an operation id from `status` or `log`")
    log = command("log", "verified export of events")
    log.add_argument("--since", type=int, default=0, help="only events with seq > SINCE")
    log.add_argument("--jsonl", action="store_true", help="one JSON event per line")
    log.add_argument("--all", action="store_true",
                     help="archived segments too, oldest first (each event names its journal_id)")
    verify = command("verify", "full verification")
    verify.add_argument("--checkpoint", help="an exported checkpoint that must be an ancestor")
    verify.add_argument("--all", action="store_true", help="every archive too, end to end")
    command("checkpoint", "print the current checkpoint (keep it elsewhere)")
    resolve = command("resolve", "settle a pending or uncertain operation")
    resolve.add_argument("operation_id", help="an operation id from `status`")
    resolve.add_argument("--outcome", required=True, choices=("completed", "not_applied"),
                         help="completed: the side effect happened; not_applied: it did not "
                              "(future calls may run; nothing is replayed)")
    evidence_options(resolve, "what you checked in the real service (receipt, log line, row)")
    resolve.add_argument("--force", action="store_true", help="resolve although the "
                         "operation's worker still runs; the evidence must say why")
    acknowledge = command("acknowledge", "acknowledge a late outcome")
    acknowledge.add_argument("operation_id", help="an operation id from `status` (attention)")
    evidence_options(acknowledge, "what you did about the late outcome")
    evidence_options(command("repair-checkpoint", "clear checkpoint_ahead after a crash between "
                                                  "replace and commit"),
                     "why this repair is justified")
    evidence_options(command("restart-journal", "after any other integrity verdict: keep the "
                             "broken journal as evidence, start a new one that keeps every "
                             "operation that may have run open"),
                     "what happened to the journal and what you checked")
    command("archive", "seal the history into a read-only archive file and start a new, short "
                       "segment")


def console_script_name() -> Optional[str]:
    """This process's name if it is the console script (``crash-recovery-operator``), else None."""
    program = os.path.basename(sys.argv[0] or "")
    return program if program.startswith("crash-recovery") else None


def standalone_words(data_dir: str) -> tuple:
    """The words printed commands (``next``, hints) run this CLI on
    ``data_dir`` with: the console script (by name if PATH finds it), else
    this interpreter and ``operator_cli.py``."""
    program = console_script_name()
    if program is None:
        return standalone_prefix(data_dir)
    found = shutil.which(program)
    same = found is not None and os.path.realpath(found) == os.path.realpath(sys.argv[0])
    return (program if same else os.path.abspath(sys.argv[0]), "--data-dir", data_dir)


def build_parser() -> argparse.ArgumentParser:
    """The stand-alone parser (usage errors raise CommandError), named as it was run."""
    parser = _Parser(prog=console_script_name() or "operator_cli.py",
                     description="Inspect and settle the crash-recovery journal.",
                     epilog=RUNBOOK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, _Parser)
    return parser


def execute(args: argparse.Namespace, data_dir_default: Callable[[], str],
            prefix: Optional[Callable[[str], Sequence[str]]] = None,
            settings: Optional[Callable[[], Any]] = None,
            registered_tools: Optional[Callable[[], Any]] = None) -> int:
    """Run the parsed command, print its one document, return the exit code.
    ``prefix(data_dir)``: how commands run here; ``settings()``,
    ``registered_tools()``: Hermes' raw settings and tool names (docs/cli.md §status)."""
    output_format, command = getattr(args, "format", "json"), getattr(args, COMMAND_DEST, None)
    if not stdout_takes_unicode():  # text output: escapes, never a UnicodeEncodeError
        with contextlib.suppress(AttributeError, ValueError):
            sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    data_dir = None
    try:
        result, exit_code, data_dir = _run(args, command, output_format, data_dir_default,
                                           in_profile=settings is not None)
        exit_code = _complete(args, command, result, exit_code, data_dir, prefix, settings,
                              registered_tools)
    except Exception as exc:  # noqa: BLE001 - one document whatever happens (docs/cli.md §Output)
        result, exit_code = {"ok": False, "error": {
            "code": "internal_error", "message": f"an unexpected {type(exc).__name__} in the "
            f"operator CLI ({str(exc)[:300]}); run status to see the journal's state"}}, EXIT_ERROR
    if command == "log" and exit_code == EXIT_OK:
        exit_code = _print_log(result, jsonl=args.jsonl, text=output_format == "text")
    elif output_format == "prometheus" and command == "status":  # else its usage error
        # A failure keeps the healthy series' data_dir label, so an alert fires.
        print(prometheus_text(result) if exit_code != EXIT_ERROR
              else prometheus_text({"data_dir": data_dir or "",
                                    "settings": result.get("settings")}))
    elif output_format == "text":
        words = prefix(result.get("data_dir", "")) if prefix and exit_code != EXIT_ERROR else None
        print(render_text(command or "", result, words))
    else:
        print(json_text(result, 1))
    return exit_code


def _run(args: argparse.Namespace, command: Optional[str], output_format: str,
         data_dir_default: Callable[[], str], *, in_profile: bool) -> tuple:
    """``(result, exit code, data dir or None)``; ``in_profile``: inside Hermes."""
    data_dir = None
    try:
        if command is None:
            raise CommandError("usage", "a command is required (see --help)")
        if args.data_dir is not None and not args.data_dir.strip():
            raise CommandError("usage", "--data-dir is empty (an unset shell variable?)")
        if output_format == "prometheus" and command != "status":
            raise CommandError("usage", "--format prometheus is for status only")
        data_dir = os.path.abspath(args.data_dir or data_dir_default())
        if args.data_dir is not None and hermes.is_hermes_home(data_dir):
            data_dir = str(hermes.data_dir_of_home(data_dir))  # a home typed for its data dir
        before = _checkpoint_bytes(data_dir)
        try:
            with progress_on_terminal(command):
                result, ok = run_command(command, args, data_dir, Journal)
        except KeyboardInterrupt:  # Ctrl-C: one document, no traceback
            result, ok = _interrupted(command, data_dir, before), False
        if (not ok and command == "status" and result["error"]["code"] == "journal_absent"
                and ((in_profile and args.data_dir is None)
                     or hermes.home_of_data_dir(data_dir) is not None
                     or read_record(data_dir) is not None)):
            # A profile's own directory: no protected call yet, nothing blocked.
            result, ok = absent_journal_status(data_dir), True
        exit_code = EXIT_OK if ok else EXIT_ERROR
    except CommandError as exc:  # a usage error, found before any command ran
        result, exit_code = {"ok": False, "error": {"code": exc.code, "message": exc.message,
                                                    **exc.details}}, EXIT_ERROR
    return result, exit_code, data_dir


def _complete(args: argparse.Namespace, command: Optional[str], result: dict, exit_code: int,
              data_dir: Optional[str], prefix: Optional[Callable[[str], Sequence[str]]],
              settings: Optional[Callable[[], Any]],
              registered_tools: Optional[Callable[[], Any]]) -> int:
    """Add settings, platform, ``next``, ``workers_running``, ``check``; the exit code."""
    if command == "status":
        shown = (operator_settings_view(settings, data_dir, registered_tools)
                 if data_dir is not None else
                 settings_view(settings, registered_tools) if settings is not None else None)
        if shown is not None:
            result["settings"] = shown
        if data_dir is not None:
            note_platform_problem(result, data_dir)  # the guard refuses protected calls then
    if data_dir is not None:  # the next command, as it is run here (docs/cli.md §Output)
        here = tuple(prefix(data_dir)) if prefix else standalone_prefix(data_dir)
        if exit_code == EXIT_ERROR:
            error = result["error"]
            error["next"] = next_command(here, next_step_of(error))
            if error["next"] is None:
                error["next"] = _profile_status_command(error["code"], data_dir, prefix)
        elif command == "status":
            result["next"] = next_command(here, status_next_step(result))
    if command == "status":
        if data_dir is not None:
            result["workers_running"] = workers_running(result, data_dir)
        result["check"] = check_view(result)
        if (exit_code == EXIT_OK and getattr(args, "check", False)
                and result["check"]["exit_code"] == CHECK_NEEDS_A_PERSON):
            exit_code = EXIT_ATTENTION  # a running call (gate busy) needs nobody
    return exit_code


def _profile_status_command(code: str, data_dir: str,
                            prefix: Optional[Callable[[str], Sequence[str]]]) -> Optional[str]:
    """``next`` for a directory that is no profile's: ``status`` on the nearest
    Hermes home's data dir (or a placeholder); None for other codes."""
    if not (code == "journal_absent"
            or (code == "storage_unavailable" and not os.path.isdir(data_dir))):
        return None
    home = os.path.dirname(os.path.dirname(default_data_dir()))
    candidate = str(hermes.nearest_profile_data_dir(data_dir, home)
                    or "<HERMES_HOME>/plugin-data/crash-recovery")
    return command_line(tuple(prefix(candidate)) if prefix else standalone_prefix(candidate),
                        "status")


@contextlib.contextmanager
def progress_on_terminal(command: str, *, fd: int = 2, interval: float = PROGRESS_SECONDS,
                         terminal: Optional[bool] = None) -> Iterator[None]:
    """Rewrite one stderr line every ``interval`` seconds while a full-history
    command runs on a terminal (``terminal`` overrides), by SIGALRM; nothing
    off the main thread or without ``setitimer``."""
    if (command not in PROGRESS_COMMANDS or not (os.isatty(fd) if terminal is None else terminal)
            or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    started, shown = time.monotonic(), [False]

    def tick(signum: int, frame: Any) -> None:
        shown[0] = True
        with contextlib.suppress(OSError):
            os.write(fd, (f"\rcrash-recovery {command}: verifying the journal, "
                          f"{int(time.monotonic() - started)} s (Ctrl-C stops it; nothing is "
                          "changed)").encode())
    previous = signal.signal(signal.SIGALRM, tick)
    signal.siginterrupt(signal.SIGALRM, False)
    signal.setitimer(signal.ITIMER_REAL, interval, interval)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if shown[0]:
            with contextlib.suppress(OSError):
                os.write(fd, b"\r\x1b[K")  # the terminal line is cleared again


def _checkpoint_bytes(data_dir: str) -> Optional[bytes]:
    """``head.json`` now (None: unreadable)."""
    try:
        return read_regular_file(os.path.join(data_dir, CHECKPOINT_NAME))
    except OSError:
        return None


def _interrupted(command: str, data_dir: str, before: Optional[bytes]) -> dict:
    """The ``interrupted`` error document of a Ctrl-C (docs/cli.md §Output)."""
    changed = _checkpoint_bytes(data_dir) != before
    pending = os.path.lexists(os.path.join(data_dir, INTENT_NAME))
    if command not in WRITING_COMMANDS:
        message = f"{command} was interrupted; it only reads, so nothing changed"
    elif command == "restart-journal" and pending_restart(data_dir) is not None:
        message = ("restart-journal was interrupted in the middle of its switch (restart.json "
                   "records it). Run restart-journal again: it finishes the switch with the "
                   "journal it built, carrying over the same operations")
        changed = True
    elif pending:
        message = ("archive was interrupted in the middle of its switch; the next writer "
                   "(any protected call, resolve, archive) finishes or undoes it. Run status")
    elif changed:
        message = f"{command} was interrupted after its change was recorded. Run status"
    else:
        message = f"{command} was interrupted before it changed anything. Run it again"
    return {"ok": False, "error": {"code": "interrupted", "message": message,
                                   "changed": changed or pending}}


def _failures_named(events: Iterator[dict]) -> Iterator[dict]:
    """``events``, reading failures raised as :class:`JournalError` (never stdout's)."""
    try:
        for event in events:
            yield event
    except (JournalError, KeyboardInterrupt):
        raise
    except OSError as exc:
        raise storage_error(exc, "reading the journal") from None
    except Exception as exc:  # noqa: BLE001 - the document still closes
        raise JournalError("internal_error", f"an unexpected {type(exc).__name__} while "
                           f"reading the journal ({str(exc)[:300]})") from None


def _print_log(result: dict, *, jsonl: bool, text: bool) -> int:
    """Stream ``log``'s events, closing the document on Ctrl-C or error; the exit code."""
    events: Iterator[dict] = _failures_named(result["events"])
    closing = None
    if jsonl:
        lines: Iterator[str] = (json_text(event, None) for event in events)
    elif text:
        lines = log_text_lines({**result, "events": events})  # failures named, as below
    else:
        # The verdict comes last: it covers every event above it.
        head = json_text({key: value for key, value in result.items()
                          if key not in ("events", "ok", "integrity")}, 1)
        print(head[:-2] + ',\n "events": [')
        lines = (("  " if index == 0 else ", ") + json_text(event, None)
                 for index, event in enumerate(events))
        closing = ' ],\n "integrity": "ok",\n "ok": true,\n "verified": true\n}'
    try:
        for line in lines:
            print(line)
    except KeyboardInterrupt:
        print(json_text({"interrupted": True}, None) if jsonl
              else "interrupted: the export above is incomplete" if text
              else ' ],\n "interrupted": true,\n "ok": false,\n "verified": false\n}')
        return EXIT_ERROR
    except JournalError as exc:  # an archive changed while it was printed
        print(json_text(_log_failure(exc), None) if jsonl
              else f"NOT VERIFIED: {exc.code}: {exc.message}" if text
              else " ],\n" + json_text(_log_failure(exc), 1)[2:])
        return EXIT_ERROR
    if closing:
        print(closing)
    return EXIT_OK


def _log_failure(exc: JournalError) -> dict:
    return {"ok": False, "verified": False, "integrity": exc.code, "error": exc.to_json()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command from ``argv``; print its result; return the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except CommandError as exc:
        print(json_text({"ok": False, "error": {"code": exc.code, "message": exc.message}}, 1))
        return EXIT_ERROR
    return execute(args, default_data_dir, standalone_words)


def run() -> int:
    """Console entry point: :func:`main`, quiet when stdout closes early (``log | head``)."""
    return _quiet_on_closed_stdout(main)


def _quiet_on_closed_stdout(function: Callable[[], int]) -> int:
    try:
        exit_code = function()
        sys.stdout.flush()
        return exit_code
    except BrokenPipeError:
        pass
    except OSError as exc:  # stdout itself failed (a full disk): nothing to print to
        print(f"operator_cli.py: the result could not be written to standard output "
              f"({exc.strerror or exc}); the command itself ran: run status to see the journal",
              file=sys.stderr)
    # Python flushes stdout again at exit; point it at /dev/null first.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_ERROR


def setup_hermes_command(parser: argparse.ArgumentParser) -> None:
    """``setup_fn`` of ``ctx.register_cli_command``: our options on ``hermes
    crash-recovery``; any usage error prints JSON and exits 1 (docs/cli.md §Output)."""
    parser.epilog = RUNBOOK_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_arguments(parser, _ExitingParser)
    parser.error = lambda message: _ExitingParser.error(parser, message)  # type: ignore
    leave = parser.exit

    def exit_or_json(status: int = 0, message: Optional[str] = None) -> None:
        # Newer Hermes parsers report an unknown command through exit(2, text).
        if status:
            parser.error(" ".join((message or "usage error").split()))
        leave(status, message)
    parser.exit = exit_or_json  # type: ignore[method-assign]
    parse_known_args = parser.parse_known_args

    def parse_all(args: Any = None, namespace: Any = None) -> tuple:
        parsed, extras = parse_known_args(args, namespace)
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(map(str, extras))[:200]}")
        return parsed, extras
    parser.parse_known_args = parse_all  # type: ignore[method-assign]


def hermes_command_handler(data_dir: Callable[[], str], prefix: Callable[[], Sequence[str]],
                           settings: Optional[Callable[[], Any]] = None,
                           registered_tools: Optional[Callable[[], Any]] = None,
                           ) -> Callable[[argparse.Namespace], None]:
    """``handler_fn`` of ``ctx.register_cli_command``: :func:`execute` on
    ``data_dir()``, then exit with its code (Hermes ignores return values)."""
    def handle(args: argparse.Namespace) -> None:
        sys.exit(_quiet_on_closed_stdout(lambda: execute(
            args, lambda: str(data_dir()), lambda _: prefix(), settings, registered_tools)))
    return handle
