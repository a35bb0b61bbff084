"""restart-journal (and every other operator command) when its own file work
fails: a full disk at each step, a read-only mount, a user who may not write,
odd files where it works, stdout that cannot be written.  Each ends with one
JSON document naming the right code -- ``storage_unavailable`` for a full
disk, never the journal's ``database_corrupt`` -- the journal's own verdict
unchanged and nothing changed (docs/cli.md §Output, §restart-journal).

Full disks are real: a small tmpfs mounted for the test; read-only is a
read-only bind mount.  Both need the right to mount (root in a container,
as in CI); without it those tests skip and say so.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import unittest

from support import OPERATOR_CLI, JournalTestCase, journal_files, reference, run_cli

from crash_recovery.reports.messages import INTEGRITY_VERDICTS

TESTS = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(TESTS, "crash_worker.py")
EVIDENCE = "head.json deleted by a cleanup script at 07:40 (cron log)"
# Every operator command, with the words it takes (OP: the open operation).
EVERY_COMMAND = (("status",), ("show", "OP"), ("log",), ("verify",), ("checkpoint",),
                 ("resolve", "OP", "--outcome", "not_applied", "--evidence", EVIDENCE),
                 ("acknowledge", "OP", "--evidence", EVIDENCE),
                 ("repair-checkpoint", "--evidence", EVIDENCE), ("archive",),
                 ("restart-journal", "--evidence", EVIDENCE))
TMPFS_BYTES = 4 * 1024 * 1024
PAGE = 4096
# The full-disk walk frees this much more space at each attempt.
STEP_BYTES = 2 * PAGE


def _mount(*words: str) -> "str | None":
    """Run mount/umount; the reason it failed, or None."""
    completed = subprocess.run(list(words), capture_output=True, text=True, timeout=60)
    return None if completed.returncode == 0 else (completed.stderr.strip() or "failed")


@contextlib.contextmanager
def mounted(test: unittest.TestCase, directory: str, *options: str):
    """``mount OPTIONS directory`` for the block; the test skips when this
    process may not mount."""
    problem = _mount("mount", *options, directory)
    if problem:
        test.skipTest(f"cannot mount here ({problem}): needs root with CAP_SYS_ADMIN")
    try:
        yield directory
    finally:
        _mount("umount", "-l", directory)


def kept_files(data_dir: str) -> dict:
    """The files a failed command must leave as they were (support.journal_files
    but owner.lock: the lock's own tag, cleared by whoever releases it)."""
    found = journal_files(data_dir)
    found.pop("owner.lock", None)
    return found


def fill(directory: str, leave: int) -> str:
    """Fill the file system of ``directory`` so that about ``leave`` bytes stay
    free; returns the filler's path."""
    filler = os.path.join(directory, "filler")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(filler)
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    with open(filler, "wb") as stream:
        remaining = max(0, free - leave)
        while remaining > 0:
            try:
                stream.write(bytes(min(remaining, 1 << 20)))
                stream.flush()
            except OSError:
                break
            remaining -= min(remaining, 1 << 20)
    return filler


class DamagedJournal(JournalTestCase):
    """A journal that fails verification (head.json deleted) with a pending
    call whose side effect happened: restart-journal's way forward."""

    def damage(self, data_dir: str) -> dict:
        service = os.path.join(self.root, "service.sqlite3")
        for words in (("--request", "r1"),
                      ("--request", "r2", "--kill", "side_effect:downstream")):
            subprocess.run([sys.executable, WORKER, "call", data_dir, service, *words],
                           capture_output=True, timeout=60)
        os.unlink(os.path.join(data_dir, "head.json"))
        code, status, _ = run_cli(data_dir, "status")
        self.assertEqual((code, status["integrity"]), (1, "checkpoint_missing"))
        return self.pending_operation(data_dir)

    def pending_operation(self, data_dir: str) -> dict:
        """The pending call, as the reference reads it (identity fields)."""
        report = reference.verify(data_dir, require_head=False)
        [operation_id] = report.unresolved()
        record = report.operations[operation_id]
        return {"operation_id": operation_id, "tool": record["tool"],
                "session_id": record["session_id"], "tool_call_id": record["tool_call_id"],
                "started_ns": record["timestamp_ns"]}

    def assertOneDocument(self, code, document, stdout, stderr=""):
        self.assertIsNotNone(document, f"not one JSON document: {stdout!r} {stderr!r}")
        self.assertIn(code, (0, 1, 3), document)
        self.assertNotIn("Traceback", stdout + stderr)
        if code == 1:
            self.assertIn("code", document["error"])
            self.assertNotEqual(document["error"]["code"], "internal_error", document)

    def assertUnchanged(self, data_dir: str, before: dict, verdict: str):
        """Nothing of the journal changed, and it reads as before."""
        self.assertEqual(kept_files(data_dir), before)
        self.assertFalse([name for name in os.listdir(data_dir)
                          if name.endswith(".tmp") or name in ("restart.json", "replaced")])
        code, status, _ = run_cli(data_dir, "status")
        self.assertEqual((code, status["integrity"]), (1, verdict))

    def assertCarriedOver(self, data_dir: str, operation: dict):
        code, status, _ = run_cli(data_dir, "status")
        self.assertEqual(code, 0, status)
        shown = {view["operation_id"]: view for view in status["unresolved"]}
        view = shown[operation["operation_id"]]
        self.assertEqual({key: view[key] for key in operation}, operation)
        self.assertEqual(sorted(view["tool"] for view in shown.values()),
                         sorted([operation["tool"], "unknown"]))
        self.assertVerifies(data_dir)


class FullDisk(DamagedJournal):
    """A real full disk at each step of restart-journal."""

    @contextlib.contextmanager
    def small_disk(self):
        """A tmpfs of TMPFS_BYTES holding the damaged journal: ``(mount point,
        data directory, the pending operation)``."""
        mount_point = os.path.join(self.root, "disk")
        os.mkdir(mount_point)
        with mounted(self, mount_point, "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs"):
            data_dir = os.path.join(mount_point, "data")
            yield mount_point, data_dir, self.damage(data_dir)

    def test_every_failure_is_storage_unavailable_and_changes_nothing(self):
        with self.small_disk() as (mount_point, data_dir, operation):
            saved = os.path.join(self.root, "saved")
            shutil.copytree(data_dir, saved)
            steps, leave = set(), 0
            while True:
                shutil.rmtree(data_dir)
                shutil.copytree(saved, data_dir)
                before = kept_files(data_dir)
                filler = fill(mount_point, leave)
                code, document, stdout = run_cli(data_dir, "restart-journal", "--evidence",
                                                 EVIDENCE)
                os.unlink(filler)
                self.assertOneDocument(code, document, stdout)
                if code == 0:
                    break
                error = document["error"]
                with self.subTest(leave=leave, step=error.get("step")):
                    self.assertEqual((error["code"], document["integrity"]),
                                     ("storage_unavailable", "checkpoint_missing"), document)
                    self.assertLess(error["free_bytes"], 256 * 1024)
                    self.assertIn(f"({error['free_bytes']} bytes free on the data directory's "
                                  "file system)", error["message"])
                    self.assertEqual(error["next"], "run the same command again")
                    self.assertUnchanged(data_dir, before, "checkpoint_missing")
                steps.add(error.get("step"))
                leave += STEP_BYTES
            self.assertCarriedOver(data_dir, operation)
        print(f"\n  full disk: failed at {sorted(steps)}; succeeded with {leave} bytes free",
              file=sys.stderr)
        # The failures met on the way, from the first copy to the switch.
        self.assertIn("read the old journal", steps)
        self.assertIn("build the new journal in its staging folder", steps)

    # Fills the disk when restart-journal reaches a step, then lets it go on.
    FILL_AT = (f"import os, sys; sys.path.insert(0, {TESTS!r}); import support\n"
               "import test_restart_failures as here\n"
               "from crash_recovery import operator_cli\n"
               "from crash_recovery.storage import durable\n"
               "def hook(boundary, kind):\n"
               "    if (boundary, kind) == (sys.argv[3], 'restart'):\n"
               "        here.fill(sys.argv[2], 0)\n"
               "durable.set_boundary_hook(hook)\n"
               "sys.exit(operator_cli.main(['--data-dir', sys.argv[1], 'restart-journal', "
               "'--evidence', 'disk filled at ' + sys.argv[3]]))\n")

    def test_the_disk_fills_up_during_the_switch(self):
        with self.small_disk() as (mount_point, data_dir, operation):
            saved = os.path.join(self.root, "saved")
            shutil.copytree(data_dir, saved)
            # Before the intent: it cannot be written.  After it: the placeholder
            # head.json cannot (this journal has none): everything goes back.
            for boundary in ("staged", "intent_written"):
                with self.subTest(boundary=boundary):
                    before = kept_files(data_dir)
                    completed = subprocess.run([sys.executable, "-c", self.FILL_AT, data_dir,
                                                mount_point, boundary], capture_output=True,
                                               text=True, timeout=60, cwd=TESTS)
                    os.unlink(os.path.join(mount_point, "filler"))
                    document = json.loads(completed.stdout)
                    self.assertEqual((completed.returncode, document["error"]["code"],
                                      document["integrity"]),
                                     (1, "storage_unavailable", "checkpoint_missing"), document)
                    self.assertIn("No space left on device", document["error"]["message"])
                    self.assertUnchanged(data_dir, before, "checkpoint_missing")
            # While the new journal is placed: only operator.log cannot be written.
            completed = subprocess.run([sys.executable, "-c", self.FILL_AT, data_dir,
                                        mount_point, "placed_initialized"], capture_output=True,
                                       text=True, timeout=60, cwd=TESTS)
            os.unlink(os.path.join(mount_point, "filler"))
            document = json.loads(completed.stdout)
            # The disk is still full when the command reads the new journal back.
            error = document["error"]
            self.assertEqual((completed.returncode, error["code"], document["integrity"]),
                             (1, "storage_unavailable", "storage_unavailable"), document)
            self.assertIn("the journal was restarted (error.restarted)", error["message"])
            self.assertIn("No space left on device", error["restarted"]["operator_log_error"])
            self.assertEqual(error["restarted"]["carried_over"], [operation["operation_id"]])
            self.assertCarriedOver(data_dir, operation)

    def test_every_command_answers_one_document_on_a_full_disk(self):
        with self.small_disk() as (mount_point, data_dir, operation):
            code, restarted, _ = run_cli(data_dir, "restart-journal", "--evidence", EVIDENCE)
            self.assertEqual(code, 0, restarted)
            filler = fill(mount_point, 0)
            for words in EVERY_COMMAND:
                words = [operation["operation_id"] if word == "OP" else word for word in words]
                with self.subTest(command=words[0]):
                    code, document, stdout = run_cli(data_dir, *words)
                    self.assertOneDocument(code, document, stdout)
                    # A healthy journal on a full disk is never called damaged
                    # (SQLite's "disk I/O error" sizing -shm was read as wal_missing).
                    self.assertNotIn(document.get("integrity"), INTEGRITY_VERDICTS, document)
            os.unlink(filler)
            self.assertVerifies(data_dir)


class ReadOnlyMount(DamagedJournal):
    """The data directory mounted read-only: every command answers one
    document; restart-journal changes nothing."""

    def test_read_only_bind_mount(self):
        operation = self.damage(self.data_dir)
        before = kept_files(self.data_dir)
        with mounted(self, self.data_dir, "--bind", self.data_dir):
            problem = _mount("mount", "-o", "remount,bind,ro", self.data_dir)
            if problem:
                self.skipTest(f"cannot remount read-only ({problem})")
            for words in EVERY_COMMAND:
                words = [operation["operation_id"] if word == "OP" else word for word in words]
                with self.subTest(command=words[0]):
                    code, document, stdout = run_cli(self.data_dir, *words)
                    self.assertOneDocument(code, document, stdout)
            code, document, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
            self.assertEqual((code, document["error"]["code"], document["integrity"]),
                             (1, "storage_unavailable", "checkpoint_missing"), document)
            self.assertIn("Read-only file system", document["error"]["message"])
            self.assertEqual(kept_files(self.data_dir), before)
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual(code, 0, restarted)
        self.assertCarriedOver(self.data_dir, operation)


# Root without the capabilities that override file permissions: EACCES.
NO_OVERRIDE = ("setpriv", "--bounding-set=-dac_override,-dac_read_search",
               "--inh-caps=-dac_override,-dac_read_search", "--")


class NotAllowedToWrite(DamagedJournal):
    """A user who may read the data directory but not write it (EACCES):
    root without the capabilities that override file permissions."""

    def run_denied(self, *words: str) -> tuple:
        completed = subprocess.run([*NO_OVERRIDE, sys.executable, OPERATOR_CLI, "--data-dir",
                                    self.data_dir, *words], capture_output=True, text=True,
                                   timeout=60)
        try:
            document = json.loads(completed.stdout)
        except ValueError:
            document = None
        return completed.returncode, document, completed.stdout, completed.stderr

    def test_every_command_answers_one_document(self):
        if os.getuid() != 0 or shutil.which("setpriv") is None:
            self.skipTest("needs root and setpriv to take file permissions away")
        operation = self.damage(self.data_dir)
        for name in os.listdir(self.data_dir):
            os.chmod(os.path.join(self.data_dir, name), 0o444)
        os.chmod(self.data_dir, 0o555)
        self.addCleanup(os.chmod, self.data_dir, 0o755)
        before = kept_files(self.data_dir)
        for words in EVERY_COMMAND:
            words = [operation["operation_id"] if word == "OP" else word for word in words]
            with self.subTest(command=words[0]):
                self.assertOneDocument(*self.run_denied(*words))
        code, document, _, _ = self.run_denied("restart-journal", "--evidence", EVIDENCE)
        self.assertEqual((code, document["error"]["code"], document["integrity"]),
                         (1, "read_access_only", "checkpoint_missing"), document)
        self.assertEqual(kept_files(self.data_dir), before)


class OddFilesWhereItWorks(DamagedJournal):
    """Files where restart-journal keeps evidence or records its intent."""

    def test_replaced_that_is_not_a_directory_is_refused_then_moved_away(self):
        operation = self.damage(self.data_dir)
        replaced = os.path.join(self.data_dir, "replaced")
        for kind in ("regular file", "symbolic link", "FIFO"):
            with self.subTest(kind=kind):
                if kind == "regular file":
                    with open(replaced, "w", encoding="utf-8") as stream:
                        stream.write("someone's notes\n")
                elif kind == "symbolic link":
                    os.symlink(self.root, replaced)
                else:
                    os.mkfifo(replaced)
                before = kept_files(self.data_dir)
                try:
                    code, document, stdout = run_cli(self.data_dir, "restart-journal",
                                                     "--evidence", EVIDENCE)
                finally:
                    after = kept_files(self.data_dir)
                    os.unlink(replaced)
                self.assertOneDocument(code, document, stdout)
                error = document["error"]
                self.assertEqual((error["code"], error["directory"], error["file_type"],
                                  document["integrity"], error["next"]),
                                 ("storage_unavailable", "replaced", kind, "checkpoint_missing",
                                  "run the same command again"))
                self.assertEqual(after, before)
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual(code, 0, restarted)
        self.assertCarriedOver(self.data_dir, operation)

    def test_a_restart_json_that_is_not_an_intent_is_kept_as_evidence(self):
        operation = self.damage(self.data_dir)
        os.mkfifo(os.path.join(self.data_dir, "restart.json"))
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual(code, 0, restarted)
        kept = os.path.join(self.data_dir, restarted["evidence_directory"], "restart.json")
        self.assertTrue(stat.S_ISFIFO(os.lstat(kept).st_mode))
        self.assertCarriedOver(self.data_dir, operation)

    def test_a_restart_json_beside_another_staging_folder_stays_for_a_person(self):
        self.damage(self.data_dir)
        with open(os.path.join(self.data_dir, "restart.json"), "w", encoding="utf-8") as stream:
            stream.write('{"written by": "a later version"}')
        os.mkdir(os.path.join(self.data_dir, "restart.1-0123abcd.tmp"))
        before = kept_files(self.data_dir)
        code, document, stdout = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertOneDocument(code, document, stdout)
        self.assertEqual((document["error"]["code"], document["integrity"], document["error"]["next"]),
                         ("restart_intent_unrecognised", "checkpoint_missing", None))
        self.assertEqual(kept_files(self.data_dir), before)
        self.assertTrue(os.path.isdir(os.path.join(self.data_dir, "restart.1-0123abcd.tmp")))


class InterruptedOutput(DamagedJournal):
    """stdout that cannot take the document: the command itself still ran
    to the end, and says so on stderr."""

    def test_stdout_on_a_full_device(self):
        operation = self.damage(self.data_dir)
        with open("/dev/full", "w") as full:
            completed = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir",
                                        self.data_dir, "restart-journal", "--evidence", EVIDENCE],
                                       stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(completed.returncode, 1)
        self.assertIn("could not be written to standard output", completed.stderr)
        self.assertIn("run status", completed.stderr)
        self.assertNotIn("Traceback", completed.stderr)
        self.assertCarriedOver(self.data_dir, operation)
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            self.assertEqual([json.loads(line)["action"] for line in stream], ["restart-journal"])

    def test_ctrl_c_in_the_middle_of_the_switch(self):
        operation = self.damage(self.data_dir)
        script = (f"import os, signal, sys; sys.path.insert(0, {TESTS!r}); import support\n"
                  "from crash_recovery import operator_cli\n"
                  "from crash_recovery.storage import durable\n"
                  "def hook(boundary, kind):\n"
                  "    if (boundary, kind) == ('moved_journal.sqlite3', 'restart'):\n"
                  "        raise KeyboardInterrupt\n"
                  "durable.set_boundary_hook(hook)\n"
                  f"sys.exit(operator_cli.main(['--data-dir', {self.data_dir!r}, "
                  f"'restart-journal', '--evidence', 'first try']))\n")
        completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                   timeout=60)
        document = json.loads(completed.stdout)
        self.assertEqual((completed.returncode, document["error"]["code"],
                          document["error"]["changed"]), (1, "interrupted", True))
        self.assertIn("Run restart-journal again", document["error"]["message"])
        code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual((code, status["integrity"]), (1, "restart_interrupted"))
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual((code, restarted["resumed"]), (0, True))
        self.assertCarriedOver(self.data_dir, operation)


class OddOperatorLog(DamagedJournal):
    """operator.log holding lines that are not actions, or longer than the
    part of it that is read: every command still reads the newest actions."""

    def test_lines_that_are_not_objects_stop_neither_verify_nor_a_restart(self):
        operation = self.damage(self.data_dir)
        with open(os.path.join(self.data_dir, "operator.log"), "w", encoding="utf-8") as stream:
            stream.write("1\n" + "[" * 100000 + "\n" + '"notes"\n')
        code, restarted, stdout = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual((code, restarted["resumed"]), (0, False), stdout)
        self.assertCarriedOver(self.data_dir, operation)
        code, verified, stdout = run_cli(self.data_dir, "verify")
        self.assertEqual((code, verified["integrity"], verified["repairs"]), (0, "ok", []), stdout)
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            lines = stream.read().splitlines()
        self.assertEqual(len(lines), 4)
        self.assertEqual(json.loads(lines[-1])["action"], "restart-journal")

    def test_the_newest_repair_is_listed_however_long_the_log(self):
        service = os.path.join(self.root, "service.sqlite3")
        subprocess.run([sys.executable, WORKER, "call", self.data_dir, service,
                        "--kill", "checkpoint_replaced:started"], capture_output=True, timeout=60)
        line = json.dumps({"action": "resolve", "pad": "x" * 1000}) + "\n"
        with open(os.path.join(self.data_dir, "operator.log"), "w", encoding="utf-8") as stream:
            stream.write(line * (17 * 1024))  # more than the 16 MiB that are read
        code, repaired, stdout = run_cli(self.data_dir, "repair-checkpoint", "--evidence", EVIDENCE)
        self.assertEqual(code, 0, stdout)
        code, verified, stdout = run_cli(self.data_dir, "verify")
        self.assertEqual(code, 0, stdout)
        self.assertEqual([(entry["action"], entry["lost_operation"])
                          for entry in verified["repairs"]],
                         [("repair-checkpoint", repaired["lost_operation"])])


if __name__ == "__main__":
    unittest.main()
