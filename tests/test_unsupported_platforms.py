"""Platforms where the journal's guarantees cannot hold never fail open: the
plugin loads, unprotected tools run, protected calls are refused with the
reason and what to do, and every status surface says the same (README
§Supported platforms, docs/guard.md §Platforms).  Each missing piece is
simulated in a fresh interpreter: no ``fcntl`` (native Windows), a directory
``fsync`` the file system refuses, a data directory on NFS."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from support import REPO, run_cli

# Runs in a child: load the checkout as Hermes would, register it against a
# stub host, then call an unprotected and a protected tool and ask for status.
CHILD = textwrap.dedent("""
    import importlib.util, json, os, sys, types
    SIMULATION
    sys.modules["hermes_plugins"] = types.ModuleType("hermes_plugins")
    spec = importlib.util.spec_from_file_location(
        "hermes_plugins.crash_recovery", os.path.join(REPO, "__init__.py"),
        submodule_search_locations=[REPO])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    AFTER_LOAD
    from hermes_plugins.crash_recovery.guard import RecoveryGuard
    guard = RecoveryGuard(DATA_DIR)
    ran = []
    def tool():
        ran.append(1)
        return "done"
    free = guard.tool_execution(tool_name="read_file", args={}, next_call=tool,
                                session_id="s", tool_call_id="c1")
    blocked = guard.tool_execution(tool_name="send_payment", args={"amount": 5}, next_call=tool,
                                   session_id="s", tool_call_id="c2")
    hook = guard.pre_tool_call(tool_name="send_payment", args={"amount": 5}, session_id="s",
                               tool_call_id="c2")
    print(json.dumps({"free": free, "ran": len(ran),
                      "blocked": blocked if blocked == "done" else json.loads(blocked),
                      "hook": hook, "status": guard.status_report(),
                      "journal_created": os.path.exists(os.path.join(DATA_DIR, "journal.sqlite3"))}))
""")

NO_FCNTL = 'sys.modules["fcntl"] = None  # as on native Windows'
NO_DIRECTORY_FSYNC = textwrap.dedent("""
    import errno, stat
    real_fsync = os.fsync
    def fsync(descriptor):
        if stat.S_ISDIR(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(descriptor)
    os.fsync = fsync
""")
# The mount table the plugin reads (/proc/mounts on Linux), with the profile
# on an NFS export; set on the plugin's module once it is loaded.
ON_NFS = textwrap.dedent("""
    table = os.path.join(ROOT, "mounts")
    with open(table, "w") as handle:
        handle.write("overlay / overlay rw 0 0\\n")
        handle.write("server:/export " + ROOT.replace(" ", "\\\\040")
                     + " nfs4 rw,relatime 0 0\\n")
    sys.modules["hermes_plugins.crash_recovery.storage.platform_support"].MOUNTS_TABLE = table
""")

# A mount table that lists no mount holding the profile, as inside a chroot whose
# root is not itself a mount point (the kernel leaves out mounts outside the root).
SILENT_MOUNT_TABLE = textwrap.dedent("""
    table = os.path.join(ROOT, "mounts")
    with open(table, "w") as handle:
        handle.write("proc /proc proc rw 0 0\\n")
        handle.write("devtmpfs /dev devtmpfs rw 0 0\\n")
    sys.modules["hermes_plugins.crash_recovery.storage.platform_support"].MOUNTS_TABLE = table
""")


class UnsupportedPlatformTests(unittest.TestCase):

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="cr platform ")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.root])
        self.data_dir = os.path.join(self.root, "profile", "plugin-data", "crash-recovery")

    def run_child(self, before_load="", after_load=""):
        script = CHILD.replace("SIMULATION", before_load).replace("AFTER_LOAD", after_load)
        script = (f"REPO = {REPO!r}\nROOT = {self.root!r}\nDATA_DIR = {self.data_dir!r}\n"
                  + script)
        completed = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True,
                                   text=True, timeout=60)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        return json.loads(completed.stdout)

    def assertRefusedWithReason(self, outcome, reason):
        self.assertEqual(outcome["free"], "done")  # unprotected tools run untouched
        self.assertEqual(outcome["ran"], 1)  # the protected call never ran
        self.assertEqual(outcome["blocked"]["code"], "platform_unsupported")
        self.assertIn(reason, outcome["blocked"]["explanation"])
        self.assertIn("local disk", outcome["blocked"]["explanation"])  # what to do
        self.assertEqual(outcome["hook"]["action"], "block")
        self.assertEqual(json.loads(outcome["hook"]["message"])["code"], "platform_unsupported")
        status = outcome["status"]
        self.assertEqual((status["ok"], status["integrity"], status["gate"]),
                         (False, "platform_unsupported", "closed"))
        self.assertIn(reason, status["error"]["message"])
        self.assertFalse(outcome["journal_created"])  # nothing written where it cannot hold

    def test_without_fcntl_protected_calls_are_refused(self):
        self.assertRefusedWithReason(self.run_child(NO_FCNTL), "no fcntl module")

    def test_without_directory_fsync_protected_calls_are_refused(self):
        self.assertRefusedWithReason(self.run_child(NO_DIRECTORY_FSYNC), "cannot fsync a directory")

    def test_on_a_network_file_system_protected_calls_are_refused(self):
        self.assertRefusedWithReason(self.run_child(after_load=ON_NFS), "network file system (nfs4)")

    def operator_status(self, *words):
        """``operator_cli.py status`` in an interpreter without fcntl."""
        script = (f"import sys, runpy\n{NO_FCNTL}\nsys.argv = ['operator_cli.py', '--data-dir', "
                  f"{self.data_dir!r}, 'status', *{list(words)!r}]\n"
                  f"runpy.run_path({os.path.join(REPO, 'operator_cli.py')!r}, run_name='__main__')")
        return subprocess.run([sys.executable, "-I", "-c", script], capture_output=True,
                              text=True, timeout=60)

    def test_operator_status_says_the_same(self):
        # No journal could be created there: status says both.
        completed = self.operator_status()
        document = json.loads(completed.stdout)
        self.assertEqual(completed.returncode, 1, completed.stderr)
        self.assertEqual(document["error"]["code"], "journal_absent")
        self.assertIn("no fcntl module", document["platform_problem"])
        text = self.operator_status("--format", "text").stdout
        self.assertIn("PLATFORM NOT SUPPORTED (every protected call is refused): This platform "
                      "has no fcntl module", text)
        # Where the platform is fine, status carries no such field.
        code, document, _ = run_cli(self.data_dir, "status")
        self.assertNotIn("platform_problem", document)

    def test_operator_status_check_needs_a_person_when_unsupported(self):
        # A journal written where it was supported, read where it is not.
        code, _, _ = run_cli(self.data_dir, "status")
        from crash_recovery.guard import RecoveryGuard
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution(tool_name="send_payment", args={}, next_call=lambda: "ok",
                                              session_id="s", tool_call_id="c"), "ok")
        guard.close()
        completed = self.operator_status("--check")
        document = json.loads(completed.stdout)
        self.assertEqual((completed.returncode, document["ok"], document["gate"]),
                         (3, True, "closed"))
        self.assertIn("no fcntl module", document["platform_problem"])
        gauges = self.operator_status("--format", "prometheus").stdout
        self.assertIn("crash_recovery_gate_closed{", gauges)
        self.assertRegex(gauges, r"crash_recovery_gate_closed\{[^}]*\} 1")
        self.assertRegex(gauges, r"crash_recovery_gate_open\{[^}]*\} 0")

    def test_local_file_systems_are_supported(self):
        from crash_recovery.storage.platform_support import (NETWORK_FILE_SYSTEMS,
                                                              mounted_file_system,
                                                              platform_problem)
        self.assertIsNone(platform_problem(self.data_dir))
        # The mount table names this file system, or (no /proc, a chroot whose
        # root is not a mount point) tells nothing; either way it is no network one.
        found = mounted_file_system(self.root)
        sys.stderr.write(f"\n  the mount table says {self.root} is on "
                         f"{found or 'nothing it lists'} ")
        self.assertNotIn(found, NETWORK_FILE_SYSTEMS)

    def test_a_mount_table_that_tells_nothing_does_not_refuse(self):
        # Where the table lists no mount holding the data directory the file
        # system cannot be checked: as where there is no table (macOS), the
        # plugin relies on the owner lock and directory fsync checks.
        outcome = self.run_child(after_load=SILENT_MOUNT_TABLE)
        self.assertEqual((outcome["free"], outcome["blocked"], outcome["ran"], outcome["hook"]),
                         ("done", "done", 2, None))
        self.assertEqual((outcome["status"]["ok"], outcome["status"]["gate"]), (True, "open"))
        self.assertTrue(outcome["journal_created"])


if __name__ == "__main__":
    unittest.main()
