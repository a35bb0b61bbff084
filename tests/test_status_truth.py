"""Read-only checks tell the truth about a healthy busy profile, on real
processes and files (docs/cli.md §status, §Verdict codes).

Worker processes hammer protected calls that all return normally; the test
process polls what people and models read -- ``status`` (the report, and the
CLI's ``status --check``), ``verify``, the model's ``crash_recovery_status``
and the ``pre_tool_call`` hook of a guard that makes no call itself -- until it
has its number of polls, then stops the workers.  Counted, and required to be
0: polls that call the profile closed or exit 3 (a call that is running or
has just finished is never an unknown outcome), integrity verdicts on the
healthy journal, hook refusals other than ``operation_in_flight``, and
sibling refusals other than ``operation_in_flight`` seen by the workers -- on
the slow disk also ``database_locked``, the busy refusal: there each append
holds the writer lock a second, and a worker that loses the race for it five
times in a row has waited its busy timeout (nothing runs for it).
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

from support import REPO, JournalTestCase, run_cli

from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402
from crash_recovery.reports.status import status_report  # noqa: E402

WORKERS = 3
POLLS = 100
CLI_POLLS = 15
# The slow disk: each append stalls this long with head.json already replaced
# and its COMMIT not yet made (longer than a reader ever waited before).
SLOW_COMMIT_SECONDS = 1.0
SLOW_POLLS = 5
CHILD_TIMEOUT_SECONDS = 120

# argv: REPO DATA_DIR STOP_FILE STALL.  Protected calls until STOP_FILE exists,
# each append stalling STALL seconds before its COMMIT (0: none); prints
# "ready" after the first call, then {"returned": n, "refused": {code: n}}.
WORKER = r'''
import collections, json, os, sys
sys.path.insert(0, sys.argv[1] + "/tests")
from checkout import load_package; load_package()
from crash_recovery.guard import RecoveryGuard

data_dir, stop, stall = sys.argv[2], sys.argv[3], float(sys.argv[4])
if stall:  # a slow disk: every append stalls between head.json and COMMIT
    import time
    from crash_recovery.storage import durable
    durable.set_boundary_hook(lambda boundary, kind: boundary == "directory_fsynced"
                              and time.sleep(stall))
guard = RecoveryGuard(data_dir)
returned, refused, messages = 0, collections.Counter(), {}
while not os.path.exists(stop):
    result = guard.tool_execution(tool_name="book_trip", args={"n": returned},
                                  next_call=lambda: {"pnr": "P"}, session_id="s",
                                  tool_call_id=None)
    if result == {"pnr": "P"}:
        returned += 1
    else:
        refusal = json.loads(result)
        refused[refusal["code"]] += 1
        if refusal["code"] != "operation_in_flight":
            messages.setdefault(refusal["code"], refusal.get("explanation"))
    if returned + sum(refused.values()) == 1:
        print("ready", flush=True)
guard.close()
print(json.dumps({"returned": returned, "refused": refused, "messages": messages}), flush=True)
'''


class HealthyBusyProfile(JournalTestCase):

    def start_workers(self, stall=0.0):
        program = os.path.join(self.root, "worker.py")
        with open(program, "w", encoding="utf-8") as stream:
            stream.write(WORKER)
        self.stop = os.path.join(self.root, "stop")
        workers = [subprocess.Popen([sys.executable, program, REPO, self.data_dir, self.stop,
                                     str(stall)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(WORKERS)]
        for worker in workers:  # each has made its first call: the profile is busy now
            self.assertEqual(worker.stdout.readline(), "ready\n")

        def reap():
            open(self.stop, "a").close()
            for worker in workers:
                if worker.poll() is None:
                    worker.communicate(timeout=CHILD_TIMEOUT_SECONDS)
        self.addCleanup(reap)
        return workers

    def stop_workers(self, workers):
        open(self.stop, "a").close()
        returned, refused = 0, collections.Counter()
        self.messages = {}  # the first message of each refusal but operation_in_flight
        self.logged = []  # the workers' log lines about anything else
        for worker in workers:
            output, errors = worker.communicate(timeout=CHILD_TIMEOUT_SECONDS)
            self.assertEqual(worker.returncode, 0, errors)
            report = json.loads(output)
            returned += report["returned"]
            refused.update(report["refused"])
            self.messages.update(report["messages"])
            self.logged += [line for line in errors.splitlines()
                            if "operation_in_flight" not in line][:5]
        return returned, refused

    def test_polls_of_a_busy_profile_never_report_an_unknown_outcome_or_a_verdict(self):
        self.poll_busy_profile(stall=0.0, polls=POLLS, cli_polls=CLI_POLLS)

    def test_polls_of_a_profile_on_a_slow_disk_never_report_a_verdict(self):
        self.poll_busy_profile(stall=SLOW_COMMIT_SECONDS, polls=SLOW_POLLS, cli_polls=3,
                               busy_refusals={"database_locked"})

    def poll_busy_profile(self, *, stall, polls, cli_polls, busy_refusals=frozenset()):
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=dict,
                                              session_id="s", tool_call_id="first"), {})
        workers = self.start_workers(stall)
        seen = collections.Counter()
        wrong = []
        with Journal(self.data_dir, readonly=True) as journal:
            for poll in range(polls):
                report = status_report(journal, self.data_dir)
                seen[("status", report["integrity"], report["gate"])] += 1
                if not report["ok"] or report["gate"] == "closed":
                    wrong.append(("status", report.get("error"), report["unresolved"]))
                tool = json.loads(guard.status_tool({}))
                seen[("status_tool", tool["integrity"], tool["gate"])] += 1
                if not tool["ok"] or tool["gate"] == "closed":
                    wrong.append(("status_tool", tool.get("error"), tool["unresolved"]))
                verified = json.loads(guard.verify_tool({}))
                seen[("verify_tool", verified["integrity"])] += 1
                if not verified["ok"]:
                    wrong.append(("verify_tool", verified["error"]))
                hook = guard.pre_tool_call(tool_name="book_trip", args={"poll": poll},
                                           session_id="monitor", tool_call_id=str(poll))
                code = json.loads(hook["message"])["code"] if hook else None
                seen[("hook", code)] += 1
                if code not in (None, "operation_in_flight"):
                    wrong.append(("hook", hook["message"]))
        guard.close()
        for _ in range(cli_polls):
            code, document, stdout = run_cli(self.data_dir, "status", "--check")
            seen[("cli", code)] += 1
            if code != 0:
                wrong.append(("cli", stdout))
        returned, refused = self.stop_workers(workers)
        self.assertEqual(wrong, [], f"false reports of a healthy busy profile; seen {dict(seen)}")
        self.assertGreater(returned, 0)
        self.assertEqual(set(refused) - {"operation_in_flight"} - set(busy_refusals), set(),
                         f"sibling refusals {dict(refused)}: {self.messages}; logged: {self.logged}")
        for line in self.logged:  # a busy refusal is a wait for the writer lock, nothing else
            if "journal refuses protected calls (database_locked)" in line:
                self.assertIn("taking the journal writer lock", line)
        status = self.assertVerifies()
        self.assertEqual(run_cli(self.data_dir, "status", "--check")[0], 0)
