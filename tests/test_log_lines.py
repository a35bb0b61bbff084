"""Every log line the plugin writes is one line, whatever a model, tool or
plugin named (storage/log_lines.py): forged line breaks, carriage returns,
ANSI escapes, NULs, separators, bidirectional overrides and lone surrogates
in tool names, session and call ids reach the log as escapes, through a real
handler writing UTF-8."""
from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import textwrap
import unicodedata
import unittest

from support import REPO, TESTS, JournalTestCase
from test_guard import Downstream

from crash_recovery.guard import RecoveryGuard
from crash_recovery.storage.log_lines import TRACEBACK_INDENT, escaped, plugin_logger

FORGED_LINE = "2026-11-30 07:41:02,000 WARNING hermes_plugins.crash_recovery.guard: all settled"
# Names as a model, a tool or a plugin may send them.
HOSTILE_NAMES = {
    "newline": f"pay\n{FORGED_LINE}",
    "carriage return": f"pay\r{FORGED_LINE}",
    "ansi": "pay\x1b[2K\x1b[1A\x1b[32mall clear\x1b[0m",
    "nul": "pay\x00pay",
    "line separator": f"pay\u2028{FORGED_LINE}",
    "next line": f"pay\x85{FORGED_LINE}",
    "bidi override": "pay\u202eyap",
    "lone surrogate": "pay\ud800\udfff\udc80",
}
BREAKING = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


class CapturingHandler(logging.Handler):
    """Formats every record as a file handler would and encodes it as UTF-8
    (strict): a lone surrogate that reached it would be a handler error."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.stream = io.BytesIO()
        self.errors = []

    def emit(self, record):
        try:
            self.stream.write((self.format(record) + "\n").encode("utf-8"))
        except Exception as exc:  # noqa: BLE001 (what a real handler would fail with)
            self.errors.append(repr(exc))

    def lines(self):
        return self.stream.getvalue().decode("utf-8").split("\n")[:-1]


class LogLinesAreOneLine(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.handler = CapturingHandler()
        logger = logging.getLogger("crash_recovery")
        logger.addHandler(self.handler)
        previous = logger.level
        logger.setLevel(logging.DEBUG)
        self.addCleanup(logger.setLevel, previous)
        self.addCleanup(logger.removeHandler, self.handler)

    def assertSafeLines(self):
        self.assertEqual(self.handler.errors, [])
        lines = self.handler.lines()
        self.assertTrue(lines)
        for line in lines:
            self.assertFalse([character for character in line
                              if unicodedata.category(character) in BREAKING], line)
            if not line.startswith(TRACEBACK_INDENT):
                # Every line that is not a traceback's continuation is a record.
                self.assertRegex(line, r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ crash_recovery")
        self.assertFalse(any(line.startswith(FORGED_LINE) for line in lines))
        return lines

    def test_hostile_tool_names_and_ids_stay_on_their_line(self):
        for label, name in HOSTILE_NAMES.items():
            with self.subTest(name=label):
                data_dir = os.path.join(self.root, re.sub(r"\W", "_", label))
                guard = RecoveryGuard(data_dir)
                self.addCleanup(guard.close)
                try:  # uncertain: the warning names the tool (or refused, naming it)
                    guard.tool_execution(name, {}, Downstream(error=TimeoutError("lost")),
                                         session_id=name, tool_call_id=name)
                except TimeoutError:
                    pass
                # Refused (the warning quotes the explanation naming the tool and ids).
                guard.tool_execution(name + "2", {}, Downstream(), session_id=name,
                                     tool_call_id=name)
                guard.pre_tool_call(tool_name="terminal", args={}, session_id=name,
                                    tool_call_id=name)
        lines = self.assertSafeLines()
        self.assertIn("pay\\n2026-11-30 07:41:02,000 WARNING", "\n".join(lines))
        self.assertIn("pay\\ud800\\udfff\\udc80", "\n".join(lines))

    def test_a_traceback_cannot_start_a_line_of_its_own(self):
        logger = plugin_logger("crash_recovery.guard")
        try:
            raise RuntimeError(f"tool said\n{FORGED_LINE}")
        except RuntimeError:
            logger.exception("crash-recovery: %s failed", HOSTILE_NAMES["newline"])
        lines = self.assertSafeLines()
        self.assertTrue(lines[1].startswith(TRACEBACK_INDENT + "Traceback"), lines)
        self.assertTrue(all(line.startswith(TRACEBACK_INDENT) for line in lines[1:]), lines)
        # The exception's own line break stays, indented: no record starts there.
        self.assertEqual(lines[-2:], [TRACEBACK_INDENT + "RuntimeError: tool said",
                                      TRACEBACK_INDENT + FORGED_LINE])

    def test_arguments_of_every_kind_are_escaped_and_numbers_stay_numbers(self):
        logger = plugin_logger("crash_recovery.guard")
        logger.warning("%s %r %d %.1f %s %s", "a\nb", "c\x00d", 7, 2.5, None,
                       ValueError("e\u2028f"))
        logger.warning("mapping: %(tool)s", {"tool": "g\x1bh"})
        logger.warning("literal \\ and \x07 in the message itself")
        lines = self.assertSafeLines()
        self.assertTrue(lines[0].endswith(r"a\nb 'c\x00d' 7 2.5 None e\u2028f"), lines[0])
        self.assertTrue(lines[1].endswith(r"mapping: g\x1bh"), lines[1])
        self.assertTrue(lines[2].endswith(r"literal \\ and \x07 in the message itself"), lines[2])

    def test_escaping_keeps_printable_text_and_marks_the_rest(self):
        self.assertEqual(escaped("book_trip Ünïcødé 予約 👍"), "book_trip Ünïcødé 予約 👍")
        self.assertEqual(escaped("a\\n\n\t\r\x00\x7f\x9b\u00ad\u2029\ufeff\U000e0041"),
                         r"a\\n\n\t\r\x00\x7f\x9b\u00ad\u2029\ufeff\U000e0041")


class OperatorLogLines(JournalTestCase):
    """operator.log: one JSON line per action, for any reader of lines."""

    def test_evidence_with_separators_stays_one_line(self):
        from crash_recovery.reconciliation.audit import append_operator_log, read_operator_log
        os.makedirs(self.data_dir)
        evidence = f"receipt R-1\u2028{FORGED_LINE}\x85\u2029\n\x1b[0m"
        self.assertIsNone(append_operator_log(self.data_dir, {"evidence": evidence}))
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            text = stream.read()
        self.assertEqual(len(text.splitlines()), 1)  # str.splitlines splits on all of them
        self.assertEqual(read_operator_log(self.data_dir), [{"evidence": evidence}])

    def test_a_torn_append_is_reported_and_the_next_line_stands_alone(self):
        from crash_recovery.reconciliation.audit import append_operator_log, read_operator_log
        os.makedirs(self.data_dir)
        self.assertIsNone(append_operator_log(self.data_dir, {"action": "first"}))
        size = os.path.getsize(os.path.join(self.data_dir, "operator.log"))
        # A child whose file-size limit ends 5 bytes into the next line: the
        # kernel writes those 5 and returns a short count, as a full disk does.
        child = textwrap.dedent("""
            import resource, signal, sys
            sys.path.insert(0, {tests!r})
            import support
            from crash_recovery.reconciliation.audit import append_operator_log
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
            print(append_operator_log(sys.argv[1], {{"action": "torn"}}))
        """).format(tests=TESTS)
        completed = subprocess.run([sys.executable, "-c", child, self.data_dir, str(size + 5)],
                                   capture_output=True, text=True, timeout=120)
        self.assertEqual(completed.stdout, "operator.log not written completely (5 of 18 bytes; "
                                           "is the disk full?)\n", completed.stderr)
        self.assertIsNone(append_operator_log(self.data_dir, {"action": "third"}))
        with open(os.path.join(self.data_dir, "operator.log"), "rb") as stream:
            self.assertEqual(stream.read(), b'{"action":"first"}\n{"act\n{"action":"third"}\n')
        self.assertEqual(read_operator_log(self.data_dir),
                         [{"action": "first"}, {"unreadable_line": 2}, {"action": "third"}])


class EveryLoggerOfThePluginEscapes(unittest.TestCase):

    def test_no_runtime_module_makes_a_logger_of_its_own(self):
        found = []
        for folder, _, files in os.walk(REPO):
            parts = os.path.relpath(folder, REPO).split(os.sep)
            # Not the runtime: tests, benchmarks, hidden folders (.git, .venv-*)
            # and any virtual environment.
            if (parts[0] in ("tests", "bench") or parts[0].startswith(".")
                    or "__pycache__" in parts
                    or os.path.exists(os.path.join(REPO, parts[0], "pyvenv.cfg"))):
                continue
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith(".py") or path.endswith(os.path.join("storage",
                                                                          "log_lines.py")):
                    continue
                with open(path, encoding="utf-8") as stream:
                    if "getLogger(" in stream.read():
                        found.append(os.path.relpath(path, REPO))
        self.assertEqual(found, [], "make loggers with storage.log_lines.plugin_logger")


if __name__ == "__main__":
    unittest.main()
