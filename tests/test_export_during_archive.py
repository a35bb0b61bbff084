"""An export that meets an archive switch tells the truth (docs/cli.md §log):
``log --all --jsonl`` (a backup pipe) running while an operator archives gives
the old state or the new one -- each event once, under its own segment -- or
fails loudly: exit 1 and a last line that says why.

Real processes, synchronised through pipes, never the clock:

* a reader whose stdout nobody reads stops, its pipe full, in the middle of
  the archived history; ``archive`` runs to its end meanwhile; then the pipe
  is drained;
* a reader held (the boundary hook: it waits for a line on stdin) between
  verifying the journal and reading its rows, while ``archive`` runs.

Either way the export equals, line for line, the export of the state before
the archive or of the state after it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from support import OPERATOR_CLI, TESTS, JournalTestCase, run_cli
from crash_recovery.guard import RecoveryGuard

TIMEOUT_SECONDS = 120
# Enough archived events that their export is several times a pipe's buffer.
ARCHIVED_CALLS = 400
LIVE_CALLS = 3

# `log --all --jsonl` held at the boundary named in argv[2] (BOUNDARY:KIND)
# until a line arrives on stdin; says "paused" on stderr when it gets there.
PAUSING_EXPORT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import durable
    from crash_recovery import operator_cli
    data_dir, wanted = sys.argv[1], tuple(sys.argv[2].split(":"))
    reached = []

    def hook(boundary, kind):
        if (boundary, kind) == wanted and not reached:
            reached.append(1)
            print("paused", file=sys.stderr, flush=True)
            sys.stdin.readline()

    durable.set_boundary_hook(hook)
    sys.argv[1:3] = []  # the rest is the command line of the export
    sys.exit(operator_cli.run())
""").format(tests=TESTS)


def book(guard, name):
    return guard.tool_execution(tool_name="book_trip", args={"n": name},
                                next_call=lambda: {"status": "booked"}, session_id="s",
                                tool_call_id=name)


class ExportMeetsAnArchive(JournalTestCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        for number in range(ARCHIVED_CALLS):
            book(guard, f"old-{number}")
        guard.close()
        self.assertEqual(run_cli(self.data_dir, "archive")[0], 0)
        guard = RecoveryGuard(self.data_dir)
        for number in range(LIVE_CALLS):
            book(guard, f"live-{number}")
        guard.close()
        self.before = self.export()
        self.assertEqual(len(self.before), 2 * ARCHIVED_CALLS + 1 + 2 * LIVE_CALLS)

    def export(self) -> list:
        ran = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir", self.data_dir, "log",
                              "--all", "--jsonl"], capture_output=True, text=True,
                             timeout=TIMEOUT_SECONDS)
        self.assertEqual(ran.returncode, 0, ran.stderr)
        return ran.stdout.splitlines()

    def archive_now(self) -> None:
        code, document, output = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, output)

    def assert_old_or_new_or_loud(self, code: int, lines: list) -> str:
        """The export is the state before, the state after, or a loud failure."""
        after = self.export()
        self.assertEqual(len(after), len(self.before) + 1)  # the new segment's anchor
        if code != 0:
            last = json.loads(lines[-1])
            self.assertEqual((last["ok"], last["verified"]), (False, False), lines[-1])
            self.assertTrue(last["error"]["message"], lines[-1])
            return "loud"
        if lines == self.before:
            return "old"
        self.assertEqual(lines, after, "neither the state before the archive nor the one after")
        return "new"

    def test_a_reader_stopped_by_its_full_pipe_meets_the_switch(self):
        with open(f"{self.root}/reader.err", "w+", encoding="utf-8") as errors:
            reader = subprocess.Popen([sys.executable, OPERATOR_CLI, "--data-dir",
                                       self.data_dir, "log", "--all", "--jsonl"],
                                      stdout=subprocess.PIPE, stderr=errors, text=True)
            self.addCleanup(lambda: reader.poll() is None and reader.kill())
            first = reader.stdout.readline()  # it is printing: the full pipe stops it
            self.assertEqual(json.loads(first), json.loads(self.before[0]))
            self.archive_now()
            lines = [first.rstrip("\n"), *reader.stdout.read().splitlines()]
            reader.stdout.close()
            reader.wait(timeout=TIMEOUT_SECONDS)
            errors.seek(0)
            self.assertEqual(self.assert_old_or_new_or_loud(reader.returncode, lines), "old",
                             errors.read())

    def test_a_reader_held_between_verifying_and_reading_meets_the_switch(self):
        script = f"{self.root}/pausing_export.py"
        with open(script, "w", encoding="utf-8") as stream:
            stream.write(PAUSING_EXPORT)
        reader = subprocess.Popen([sys.executable, script, self.data_dir, "verified:export",
                                   "--data-dir", self.data_dir, "log", "--all", "--jsonl"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: reader.poll() is None and reader.kill())
        self.assertEqual(reader.stderr.readline(), "paused\n")
        self.archive_now()
        output, errors = reader.communicate("go\n", timeout=TIMEOUT_SECONDS)
        # It read the segment again: the state after the archive, whole.
        self.assertEqual(self.assert_old_or_new_or_loud(reader.returncode, output.splitlines()),
                         "new", errors)
