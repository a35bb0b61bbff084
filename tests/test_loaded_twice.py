"""Two copies of the plugin in one process are harmless (docs/guard.md
§In-process code): the package imported under two names -- as a Hermes
directory plugin beside a pip-installed copy, say -- keeps no process-wide
state that one copy could break for the other.

In a real child process, two guards, one from each copy, share one journal:
they alternate protected calls, one of them is refused while the other's call
runs, other code in the process opens and closes ``journal.sqlite3`` (which
drops every POSIX lock of the process), a process that does not run the
plugin then closes its own connection (SQLite would fold and delete the WAL
there), one copy closes its journal while the other goes on, and a child
forked during a call of one copy calls the other.  Every call that ran is in
the journal exactly once, the WAL was never deleted under a live copy, and
the journal verifies.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support import REPO, JournalTestCase

CHILD_TIMEOUT_SECONDS = 120

# argv: REPO DATA_DIR.  Prints one JSON report.
TWO_COPIES = r'''
import json, os, subprocess, sys, types
sys.path.insert(0, sys.argv[1] + "/tests")
from checkout import load_package
first = load_package("crash_recovery")
# The second copy under the name Hermes gives a directory plugin.
sys.modules.setdefault("hermes_plugins", types.ModuleType("hermes_plugins")).__path__ = []
second = load_package("hermes_plugins.crash_recovery")
assert first is not second and first.guard.RecoveryGuard is not second.guard.RecoveryGuard
data_dir = sys.argv[2]
database = os.path.join(data_dir, "journal.sqlite3")
one, two = first.guard.RecoveryGuard(data_dir), second.guard.RecoveryGuard(data_dir)
report = {"results": [], "wal_kept": [], "child": None}

def call(guard, name, downstream=None):
    result = guard.tool_execution(tool_name="book_trip", args={"n": name},
                                  next_call=downstream or (lambda: {"booked": name}),
                                  session_id="s", tool_call_id=name)
    report["results"].append(result if isinstance(result, dict) else json.loads(result)["code"])

def wal_identity():
    found = os.stat(database + "-wal")
    return found.st_dev, found.st_ino

call(one, "a")
call(two, "b")
wal = wal_identity()
with open(database, "rb") as stream:  # other code in the process: POSIX locks dropped
    stream.read(100)
subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                "c.execute('SELECT count(*) FROM events').fetchone(); c.close()", database],
               check=True)
report["wal_kept"].append(wal_identity() == wal)

def inside_one():  # while one's call runs: two is refused, then a forked child calls two
    call(two, "refused")
    pid = os.fork()
    if pid == 0:
        try:
            result = two.tool_execution(tool_name="book_trip", args={}, next_call=lambda: "RAN",
                                        session_id="s", tool_call_id="child")
            with open(os.path.join(data_dir, "..", "child.json"), "w") as stream:
                json.dump(result if isinstance(result, dict) else json.loads(result)["code"],
                          stream)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return {"booked": "c"}

call(one, "c", inside_one)
with open(os.path.join(data_dir, "..", "child.json")) as stream:
    report["child"] = json.load(stream)
one.close()  # one copy lets go; the other goes on
report["wal_kept"].append(wal_identity() == wal)
call(two, "d")
two.close()
print(json.dumps(report))
'''


class TwoCopiesInOneProcess(JournalTestCase):

    def test_two_copies_of_the_plugin_share_a_journal_safely(self):
        completed = subprocess.run([sys.executable, "-c", TWO_COPIES, REPO, self.data_dir],
                                   capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, 0, completed.stderr[-3000:])
        report = json.loads(completed.stdout)
        self.assertEqual(report["results"], [{"booked": "a"}, {"booked": "b"},
                                             "operation_in_flight", {"booked": "c"},
                                             {"booked": "d"}])
        self.assertEqual(report["child"], "operation_in_flight")  # not nested: another copy
        self.assertEqual(report["wal_kept"], [True, True])
        self.assertEqual(self.assertVerifies().kinds(), ["started", "returned"] * 4)


if __name__ == "__main__":
    import unittest
    unittest.main()
