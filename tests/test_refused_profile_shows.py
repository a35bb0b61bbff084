"""A profile whose calls are refused shows as needing someone, under the code
that is really the cause (docs/cli.md §status, §Verdict codes), on real
processes and files.

* A foreign process holds the journal's writer lock and never commits: every
  protected call is refused ``database_locked``, and ``status`` says so too
  (exit 1, ``database_locked`` naming the holder's pid, ``gate_closed 1``)
  instead of ``open``; once the holder lets go, ``status`` is ``open`` again.
* A process holds a call lock (``calls/<operation id>``) for an operation the
  journal does not show (stuck between taking its lock and recording its
  call, or foreign): no lock of the profile as a whole exists, so protected
  calls still run, and only ``archive`` waits for it (``owner_running``
  naming its pid), as for any call that is out.
* A process out of file descriptors reports ``storage_unavailable`` on every
  surface (status, the model's tool, a protected call), never an integrity
  verdict such as ``archive_interrupted`` about an archive that does not exist.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from reliability_support import stop_process
from support import REPO, JournalTestCase, run_cli

from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402
from crash_recovery.reports.status import status_report  # noqa: E402

CHILD_TIMEOUT_SECONDS = 60

# argv: DATABASE.  Takes SQLite's writer lock, says "locked", waits for a line.
FOREIGN_WRITER = r'''
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
connection.execute("ROLLBACK")
'''

# argv: CALL_LOCK.  Holds a call lock naming no call of the journal (a stuck
# or foreign process), says "held", waits for a line.
FOREIGN_OWNER = r'''
import fcntl, json, os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(descriptor, fcntl.LOCK_EX)
os.pwrite(descriptor, json.dumps({"operation_id": "8f0e2a52-5c1b-4c5e-9d57-6f1f7d6c0b11",
                                  "pid": os.getpid(), "process_start": None}).encode(), 0)
print("held", flush=True)
sys.stdin.readline()
'''

# argv: REPO DATA_DIR.  Runs out of descriptors, then asks every surface.
OUT_OF_DESCRIPTORS = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1] + "/tests")
from checkout import load_package; load_package()
from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal
from crash_recovery.storage.errors import JournalError

data_dir = sys.argv[2]
guard = RecoveryGuard(data_dir)
assert json.loads(guard.status_tool({}))["ok"]  # opened before the descriptors run out
reader = Journal(data_dir, readonly=True)
reader.status()
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
found = {}
found["status_tool"] = json.loads(guard.status_tool({}))["integrity"]
found["verify_tool"] = json.loads(guard.verify_tool({}))["integrity"]
call = guard.tool_execution(tool_name="book_trip", args={}, next_call=lambda: {"ran": True},
                            session_id="s", tool_call_id="c")
found["call"] = call if isinstance(call, dict) else json.loads(call)["code"]
try:
    reader.status()
    found["reader"] = "ok"
except JournalError as exc:
    found["reader"] = exc.code
for descriptor in held:
    os.close(descriptor)
print(json.dumps(found))
'''


class RefusedProfileShows(JournalTestCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=dict,
                                              session_id="s", tool_call_id="first"), {})
        guard.close()

    def start_holder(self, program, name, ready):
        """A process running ``program`` on the data directory's file ``name``,
        once it has said ``ready``; it lets go when it reads a line."""
        holder = subprocess.Popen([sys.executable, "-c", program,
                                   os.path.join(self.data_dir, name)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(stop_process, holder)
        self.assertEqual(holder.stdout.readline(), ready + "\n")
        return holder

    def assertRefused(self, guard, code):
        ran = []
        refused = json.loads(guard.tool_execution(
            tool_name="book_trip", args={}, next_call=lambda: ran.append(1),
            session_id="s", tool_call_id="refused"))
        self.assertEqual((refused["code"], ran), (code, []))

    def test_a_foreign_writer_lock_holder_shows_in_status(self):
        holder = self.start_holder(FOREIGN_WRITER, "journal.sqlite3", "locked")
        guard = RecoveryGuard(self.data_dir, busy_timeout=0.2)
        self.addCleanup(guard.close)
        self.assertRefused(guard, "database_locked")
        guard.close()

        code, status, stdout = run_cli(self.data_dir, "status", "--check")
        self.assertEqual((code, status["error"]["code"], status["error"]["writer_pid"]),
                         (1, "database_locked", holder.pid), stdout)
        metrics = run_cli(self.data_dir, "--format", "prometheus", "status")[2]
        self.assertIn('crash_recovery_gate_closed{data_dir="%s"} 1' % self.data_dir, metrics)

        holder.stdin.write("\n")
        holder.stdin.flush()
        self.assertEqual(holder.wait(CHILD_TIMEOUT_SECONDS), 0)
        code, status, stdout = run_cli(self.data_dir, "status", "--check")
        self.assertEqual((code, status["gate"]), (0, "open"), stdout)
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=dict,
                                              session_id="s", tool_call_id="after"), {})
        guard.close()
        self.assertVerifies()

    def test_a_stuck_call_lock_holder_never_blocks_calls_and_holds_only_archive(self):
        holder = self.start_holder(FOREIGN_OWNER, "calls/8f0e2a52-5c1b-4c5e-9d57-6f1f7d6c0b11",
                                   "held")
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=dict,
                                              session_id="s", tool_call_id="during"), {})
        with Journal(self.data_dir, readonly=True, busy_timeout=0.2) as reader:
            report = status_report(reader, self.data_dir)
        self.assertEqual((report["ok"], report["gate"], report["in_flight"],
                          report["resolved_running"]), (True, "open", None, []))
        code, refused, stdout = run_cli(self.data_dir, "archive")
        self.assertEqual((code, refused["error"]["code"], refused["error"]["owner"]["pid"]),
                         (1, "owner_running", holder.pid), stdout)
        holder.stdin.write("\n")
        holder.stdin.flush()
        self.assertEqual(holder.wait(CHILD_TIMEOUT_SECONDS), 0)
        guard.close()
        code, archived, stdout = run_cli(self.data_dir, "archive")
        self.assertEqual((code, archived["archived"]["count"]), (0, 4), stdout)
        # The dead holder's leftover was removed under the writer lock.
        self.assertEqual(os.listdir(os.path.join(self.data_dir, "calls")), [])
        self.assertVerifies()

    def test_out_of_descriptors_is_storage_unavailable_on_every_surface(self):
        program = os.path.join(self.root, "out_of_descriptors.py")
        with open(program, "w", encoding="utf-8") as stream:
            stream.write(OUT_OF_DESCRIPTORS)
        completed = subprocess.run([sys.executable, program, REPO, self.data_dir],
                                   capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        self.assertEqual(json.loads(completed.stdout),
                         {"status_tool": "storage_unavailable", "verify_tool": "storage_unavailable",
                          "call": "storage_unavailable", "reader": "storage_unavailable"})
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "archive.json")))
        self.assertEqual(run_cli(self.data_dir, "status", "--check")[0], 0)
        self.assertVerifies()
