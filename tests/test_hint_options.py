"""Every hint names only options its command has (docs/cli.md §Output): each
``--option`` in the hint a command gives for any error code is checked
against that command's real argparse parser -- or, where the hint names
another command first (`` `resolve --force` ``), against that one's.  Every
``next`` step parses with the real parser, and the page's own hints name no
command-line option at all (docs/dashboard.md: it has a checkbox)."""
from __future__ import annotations

import argparse
import re
import unittest

import support  # noqa: F401  (loads the package)
from crash_recovery import operator_cli
from crash_recovery.host.dashboard import PAGE_HINTS
from crash_recovery.reconciliation.commands import COMMANDS
from crash_recovery.reports.hints import ERROR_HINTS, hint_for
from crash_recovery.reports.messages import INTEGRITY_VERDICTS, NEXT_STEPS, next_step

# An option: a dash or two, a letter, not inside a word (journal.sqlite3-wal).
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z-]*)")
QUOTED = re.compile(r"`([^`]*)`")
# Options of Hermes itself that hints may name: `hermes -p PROFILE ...`.
HOST_OPTIONS = {"-p"}


def command_parsers() -> dict:
    """``{command: its argparse parser}`` of the real stand-alone CLI."""
    parser = operator_cli.build_parser()
    subparsers = next(action for action in parser._actions
                      if isinstance(action, argparse._SubParsersAction))
    return dict(subparsers.choices)


def options_of(parser: argparse.ArgumentParser) -> set:
    return {option for action in parser._actions for option in action.option_strings}


def owners_of_options(hint: str, command: str) -> list:
    """``(option, command it is an option of)`` for every option in ``hint``:
    inside a quoted span, the span's command; after one, the last quoted
    command; else ``command``."""
    found = []
    spans = [(match.start(), match.group(1).split()[:1]) for match in QUOTED.finditer(hint)]
    for match in OPTION.finditer(hint):
        owner = command
        for start, first in spans:
            if start <= match.start() and first and first[0] in COMMANDS:
                owner = first[0]
        found.append((match.group(1), owner))
    return found


class HintOptions(unittest.TestCase):

    def test_every_hint_names_only_options_of_its_command(self):
        parsers = command_parsers()
        self.assertEqual(set(parsers), set(COMMANDS))
        checked = 0
        for command in COMMANDS:
            for code in sorted(set(ERROR_HINTS) | INTEGRITY_VERDICTS):
                hint = hint_for(command, code)
                if not hint:
                    continue
                for option, owner in owners_of_options(hint, command):
                    with self.subTest(command=command, code=code, option=option):
                        allowed = options_of(parsers[owner]) | HOST_OPTIONS
                        self.assertIn(option, allowed, f"{command} {code}: {hint}")
                        checked += 1
        self.assertGreater(checked, 30)  # the check is not vacuous

    def test_the_archive_refusal_hint_names_no_force(self):
        self.assertNotIn("--force", options_of(command_parsers()["archive"]))
        self.assertNotIn("--force", hint_for("archive", "owner_running"))
        self.assertIn("`resolve --force`", hint_for("resolve", "owner_running"))

    def test_the_checker_catches_an_option_the_command_lacks(self):
        parsers = command_parsers()
        wrong = owners_of_options("archive when it has finished, or use --force", "archive")
        self.assertEqual(wrong, [("--force", "archive")])
        self.assertNotIn("--force", options_of(parsers["archive"]))
        right = owners_of_options("then run `status`; `resolve --force` only when, with "
                                  "--evidence", "archive")
        self.assertEqual(right, [("--force", "resolve"), ("--evidence", "resolve")])

    def test_every_next_step_parses_with_the_real_parser(self):
        fill = {"<OPERATION_ID>": "0f6ddf0b-dfd0-449d-8904-8748f592e1d4",
                "<completed|not_applied>": "completed"}
        for code in sorted(set(NEXT_STEPS) | INTEGRITY_VERDICTS):
            words = next_step(code)
            if not words:  # none, or "the same command again"
                continue
            with self.subTest(code=code, words=words):
                filled = [fill.get(word, "x" if word.startswith("<") else word)
                          for word in words]
                parsed = operator_cli.build_parser().parse_args(filled)
                self.assertEqual(parsed.crash_recovery_command, words[0])

    def test_the_page_hints_speak_the_page_words(self):
        for code, hint in PAGE_HINTS.items():
            with self.subTest(code=code):
                self.assertEqual(OPTION.findall(hint), [])
        self.assertIn('Tick "force"', PAGE_HINTS["owner_running"])


if __name__ == "__main__":
    unittest.main()
