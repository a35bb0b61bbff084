"""Archives under concurrency and failure: overlapping archivers, calls whose
outcome is still out, workers and new processes that meet several archives at
once, an unusable ``archive/``, a full disk, and a killed archiver's copy.

Every scenario runs real processes on real files; forced timing uses the
boundary hook (a child process pauses at a named boundary until the test lets
it go), never the clock.
"""
from __future__ import annotations

import collections
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import unittest

from reliability_support import ReliabilityCase, logical_snapshot
from support import TESTS, run_cli
from test_archive import ARCHIVE_BOUNDARIES, all_events, book

from crash_recovery.guard import RecoveryGuard

TIMEOUT_SECONDS = 120
BOOKED = '{"status": "booked"}'

# ``operator_cli.py archive`` in a child that pauses at the first BOUNDARY:KIND
# it reaches: it writes "paused" to stderr and waits for a line on stdin.  With
# a third argument "enospc" it raises a full-disk OSError there instead.
PAUSING_ARCHIVER = textwrap.dedent("""
    import errno, os, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import durable
    from crash_recovery import operator_cli
    data_dir, wanted = sys.argv[1], tuple(sys.argv[2].split(":"))
    action = sys.argv[3] if len(sys.argv) > 3 else "pause"
    reached = []

    def hook(boundary, kind):
        if (boundary, kind) == wanted and not reached:
            reached.append(1)
            if action == "enospc":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            print("paused", file=sys.stderr, flush=True)
            sys.stdin.readline()

    durable.set_boundary_hook(hook)
    sys.exit(operator_cli.main(["--data-dir", data_dir, "archive"]))
""").format(tests=TESTS)

# One protected call in a child whose tool says "running" on stderr and waits
# for a line on stdin before it returns; prints the call's result.
WAITING_WORKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.guard import RecoveryGuard
    data_dir, name = sys.argv[1], sys.argv[2]

    def tool():
        print("running", file=sys.stderr, flush=True)
        sys.stdin.readline()
        return {booked!r}

    guard = RecoveryGuard(data_dir)
    print(guard.tool_execution(tool_name="book_trip", args={{"n": name}}, next_call=tool,
                               session_id="s", tool_call_id=name))
    guard.close()
""").format(tests=TESTS, booked=BOOKED)

# Bookings in a loop; each tool run appends its name to a side-effect file
# first, so the test knows exactly which tools ran.  Prints a JSON summary.
BOOKING_LOOP = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.guard import RecoveryGuard
    data_dir, prefix, count, effects = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    archive_after = int(sys.argv[5]) if len(sys.argv) > 5 else None
    guard = RecoveryGuard(data_dir, archive_after_events=archive_after)
    refusals = {{}}
    for number in range(count):
        name = f"{{prefix}}-{{number}}"

        def tool(name=name):
            with open(effects, "a") as stream:
                stream.write(name + "\\n")
                stream.flush()
                os.fsync(stream.fileno())
            return {booked!r}

        result = guard.tool_execution(tool_name="book_trip", args={{"n": name}}, next_call=tool,
                                      session_id="s", tool_call_id=name)
        if result != {booked!r}:
            code = json.loads(result).get("code")
            refusals[code] = refusals.get(code, 0) + 1
    guard.close()
    print(json.dumps({{"refusals": refusals, "poisoned": guard.poisoned}}))
""").format(tests=TESTS, booked=BOOKED)


def book_in_new_process(data_dir, name):
    """One booking by a fresh process (the tool returns at once)."""
    worker = subprocess.Popen([sys.executable, "-c", WAITING_WORKER, data_dir, name],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    output, errors = worker.communicate("\n", timeout=TIMEOUT_SECONDS)
    return output.strip(), errors


def booked_names(data_dir):
    """tool_call_id of every ``started`` event in every segment, in order."""
    code, output, text = run_cli(data_dir, "log", "--all")
    assert code == 0, text
    return [event.get("tool_call_id") for event in output["events"]
            if event["kind"] == "started"]


class Paused:
    """A child process held at a boundary (see PAUSING_ARCHIVER)."""

    def __init__(self, case, script, *arguments):
        self.process = subprocess.Popen([sys.executable, "-c", script, *arguments],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        case.addCleanup(self.kill)
        self.first_line = self.process.stderr.readline().strip()

    def unpaused(self) -> str:
        """Why it did not pause: its exit code and output (it is stopped first)."""
        self.process.kill()
        output, errors = self.process.communicate(timeout=TIMEOUT_SECONDS)
        return (f"exit {self.process.returncode}; stdout {output[-2000:]!r}; "
                f"stderr {errors[-2000:]!r}")

    def release(self):
        """Let it go on; returns (exit code, parsed stdout or None, stdout)."""
        output, errors = self.process.communicate("\n", timeout=TIMEOUT_SECONDS)
        try:
            parsed = json.loads(output)
        except ValueError:
            parsed = None
        return self.process.returncode, parsed, output + errors

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


class ArchiverCase(ReliabilityCase):

    def setUp(self):
        super().setUp()
        self.fresh_journal("data")

    def fresh_journal(self, name):
        """``self.data_dir`` becomes ROOT/NAME with two bookings, a and b."""
        self.data_dir = os.path.join(self.root, name)
        guard = RecoveryGuard(self.data_dir)
        for booking in ("a", "b"):
            self.assertEqual(book(guard, booking), BOOKED)
        guard.close()

    def archive_names(self, data_dir=None):
        """What archive/ holds besides copies/ (the archives, and nothing else)."""
        directory = os.path.join(data_dir or self.data_dir, "archive")
        return sorted(name for name in os.listdir(directory) if name != "copies") \
            if os.path.isdir(directory) else []

    def copy_names(self, data_dir=None):
        """What archive/copies/ holds: unfinished copies."""
        directory = os.path.join(data_dir or self.data_dir, "archive", "copies")
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []

    def assertAllVerify(self, archives):
        """verify --all accepts every segment; exactly ``archives`` archive files
        and nothing else in archive/, no copy left in archive/copies/; the live
        segment passes both checkers."""
        code, verified, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, len(verified["archives_verified"])), (0, archives), text)
        self.assertEqual(len(self.archive_names()), archives, self.archive_names())
        self.assertEqual(self.copy_names(), [])
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "archive.json")))
        self.assertVerifies()


class OverlappingArchivers(ArchiverCase):
    """An archive seals exactly the segment it copied, or changes nothing."""

    def test_an_archive_whose_copy_another_archive_switched_away_changes_nothing(self):
        # The live segment after the other archive: only its anchor; shorter than
        # the stale copy; longer than it.
        for later_bookings in (0, 1, 3):
            with self.subTest(later_bookings=later_bookings):
                self.fresh_journal(f"data-{later_bookings}")
                late = Paused(self, PAUSING_ARCHIVER, self.data_dir, "archive_copied:archived")
                self.assertEqual(late.first_line, "paused")
                code, first, text = run_cli(self.data_dir, "archive")
                self.assertEqual(code, 0, text)
                guard = RecoveryGuard(self.data_dir)
                for number in range(later_bookings):
                    self.assertEqual(book(guard, f"later-{number}"), BOOKED)
                guard.close()
                before = logical_snapshot(self)
                code, refused, text = late.release()
                self.assertEqual((code, refused["error"]["code"]), (1, "archive_refused"), text)
                self.assertEqual(logical_snapshot(self), before)
                self.assertEqual(booked_names(self.data_dir),
                                 ["a", "b"] + [f"later-{n}" for n in range(later_bookings)])
                self.assertAllVerify(1)

    def test_many_archivers_and_workers_at_once_lose_no_event(self):
        effects = os.path.join(self.root, "effects.txt")
        workers = [subprocess.Popen([sys.executable, "-c", BOOKING_LOOP, self.data_dir,
                                     f"w{number}", "25", effects, "6"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for number in range(3)]
        archivers = [subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys\nfor _ in range(6):\n"
             "    subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)",
             sys.executable, os.path.join(os.path.dirname(TESTS), "operator_cli.py"),
             "--data-dir", self.data_dir, "archive"]) for _ in range(3)]
        for process in archivers:
            self.assertEqual(process.wait(timeout=TIMEOUT_SECONDS), 0)
        for worker in workers:
            output, errors = worker.communicate(timeout=TIMEOUT_SECONDS)
            self.assertEqual(worker.returncode, 0, errors)
            summary = json.loads(output)
            self.assertIsNone(summary["poisoned"], output)
            # Busy, never an integrity verdict or an unknown outcome.
            self.assertLessEqual(set(summary["refusals"]), {"operation_in_flight",
                                                            "database_locked"}, output)
        with open(effects) as stream:
            ran = [line.strip() for line in stream]
        names = booked_names(self.data_dir)
        # Every tool that ran has its started event, exactly once, in some segment.
        self.assertEqual(sorted(name for name in names if name not in ("a", "b")), sorted(ran))
        counts = collections.Counter((kind, op) for _, kind, op in all_events(self.data_dir)
                                     if op is not None)
        self.assertEqual(sorted(set(counts.values())), [1])
        code, status, text = run_cli(self.data_dir, "status")
        self.assertEqual((code, status["unresolved"], status["attention"]), (0, [], []), text)
        code, verified, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual(code, 0, text)
        self.assertEqual(len(self.archive_names()), len(verified["archives_verified"]))
        self.assertVerifies()


class SeveralArchivesBetweenTwoLooks(ArchiverCase):
    """Any number of archives between two looks at the journal is followed."""

    def archive_twice(self):
        for name in ("c", "d"):
            self.assertEqual(book_in_new_process(self.data_dir, name)[0], BOOKED)
            code, _, text = run_cli(self.data_dir, "archive")
            self.assertEqual(code, 0, text)

    def test_a_worker_that_slept_through_two_archives_goes_on(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(book(guard, "before"), BOOKED)
        self.archive_twice()
        self.assertEqual(book(guard, "after"), BOOKED)
        guard.close()
        self.assertEqual(booked_names(self.data_dir), ["a", "b", "before", "c", "d", "after"])
        self.assertAllVerify(2)

    def test_a_new_process_reads_a_wal_that_holds_two_archives(self):
        # An open connection keeps every WAL checkpoint from completing, so the
        # main file still names the first journal while the WAL holds the third.
        held = RecoveryGuard(self.data_dir)
        self.addCleanup(held.close)
        self.assertEqual(book(held, "held"), BOOKED)
        first = run_cli(self.data_dir, "checkpoint")[1]["journal_id"]
        self.archive_twice()
        code, status, text = run_cli(self.data_dir, "status")
        self.assertEqual(code, 0, text)
        self.assertNotEqual(status["checkpoint"]["journal_id"], first)
        self.assertEqual(book_in_new_process(self.data_dir, "fresh")[0], BOOKED)
        held.close()
        self.assertEqual(booked_names(self.data_dir), ["a", "b", "held", "c", "d", "fresh"])
        self.assertAllVerify(2)


class UnusableArchiveDirectory(ArchiverCase):
    """archive/ and archive/copies/ are real directories inside the data
    directory, or nothing is written."""

    def test_a_symbolic_link_or_a_file_named_archive_is_refused_and_nothing_written(self):
        self.assertRefusedUntilReal("archive")

    def test_a_symbolic_link_or_a_file_named_archive_copies_is_refused_and_nothing_written(self):
        os.mkdir(os.path.join(self.data_dir, "archive"))
        self.assertRefusedUntilReal("archive/copies")

    def assertRefusedUntilReal(self, relative):
        """A symbolic link, then a regular file, at ``relative``: ``archive`` is
        refused naming it and changes nothing; calls go on, and nothing outside
        is written or removed (not even a file named like a dead archiver's copy)."""
        outside = os.path.join(self.root, "elsewhere")
        os.mkdir(outside)
        planted = "copy.999999999-0a1b2c3d.tmp"
        with open(os.path.join(outside, planted), "wb") as stream:
            stream.write(b"not ours")
        path = os.path.join(self.data_dir, *relative.split("/"))
        archive_dir = os.path.join(self.data_dir, "archive")

        def archive_entries():  # what a real archive/ holds
            real = os.path.isdir(archive_dir) and not os.path.islink(archive_dir)
            return sorted(os.listdir(archive_dir)) if real else None
        for make, kind, what in (
                (lambda: os.symlink(outside, path), "symbolic_link", "a symbolic link"),
                (lambda: open(path, "w").close(), "not_a_directory", "not a directory")):
            with self.subTest(kind):
                make()
                before = logical_snapshot(self), archive_entries()
                code, refused, text = run_cli(self.data_dir, "archive")
                self.assertEqual((code, refused["error"]["code"],
                                  refused["error"]["archive_directory"],
                                  refused["error"]["directory"]),
                                 (1, "archive_refused", kind, relative), text)
                self.assertIn(f"{relative} in the data directory is {what}",
                              refused["error"]["message"])
                self.assertEqual((logical_snapshot(self), archive_entries()), before)
                guard = RecoveryGuard(self.data_dir)
                self.assertEqual(book(guard, kind), BOOKED)  # the gate stays open
                guard.close()
                self.assertEqual(os.listdir(outside), [planted])
                os.unlink(path)
        self.assertAllVerify(0)
        self.assertEqual(run_cli(self.data_dir, "archive")[0], 0)  # a real one is made again
        self.assertAllVerify(1)


class ArchiverFailures(ArchiverCase):
    """A failing archive is one JSON document with a code, exit 1, and leaves
    the journal exactly as it was: no intent, no copy, no archive file."""

    BEFORE_COMMIT = (("archive_copied", "archived"), ("begin", "archived"),
                     ("archive_completed", "archived"), ("checkpoint_written", "archive_intent"),
                     ("checkpoint_replaced", "archive_intent"), ("archive_sealed", "archived"),
                     ("inserted", "archived"), ("checkpoint_written", "archived"),
                     ("checkpoint_replaced", "archived"), ("checkpoint_replaced", "archived_marker"))

    def test_a_full_disk_at_each_step_before_commit_changes_nothing(self):
        for boundary in self.BEFORE_COMMIT:
            with self.subTest(boundary=":".join(boundary)):
                self.fresh_journal("data-" + "-".join(boundary))
                before = logical_snapshot(self)
                failing = subprocess.run([sys.executable, "-c", PAUSING_ARCHIVER, self.data_dir,
                                          ":".join(boundary), "enospc"],
                                         capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
                self.assertEqual(failing.returncode, 1, failing.stderr)
                result = json.loads(failing.stdout)
                self.assertEqual((result["ok"], result["error"]["code"]),
                                 (False, "storage_unavailable"), failing.stdout)
                self.assertEqual(failing.stderr, "")
                self.assertEqual(logical_snapshot(self), before)
                self.assertEqual(self.archive_names(), [])
                self.assertEqual(run_cli(self.data_dir, "status")[0], 0)
                self.assertAllVerify(0)


class KilledArchiverCopies(ArchiverCase):
    """A killed archiver's copy is removed by the next write of any writer."""

    def test_a_long_running_worker_removes_a_killed_archivers_copy(self):
        # The worker is a process of its own, as in a deployment: an operator
        # command never runs from inside a worker (docs/cli.md §Who may settle).
        worker = subprocess.Popen([sys.executable, os.path.join(TESTS, "live_worker.py"),
                                   self.data_dir, os.path.join(self.root, "service.db")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: worker.poll() is None and worker.kill())
        self.addCleanup(lambda: worker.stdout.close() or worker.stdin.close())
        self.assertIn("ready", json.loads(worker.stdout.readline()))

        def call(name):
            worker.stdin.write(f"call {name}\n")
            worker.stdin.flush()
            return json.loads(worker.stdout.readline())["result"]["status"]

        self.assertEqual(call("first"), "confirmed")  # this worker's first write is done
        archiver = Paused(self, PAUSING_ARCHIVER, self.data_dir, "archive_copied:archived")
        self.assertEqual(archiver.first_line, "paused")
        [copy] = self.copy_names()
        self.assertEqual(self.archive_names(), [])
        self.assertEqual(call("while-alive"), "confirmed")
        self.assertEqual(self.copy_names(), [copy])  # a live archiver's copy stays
        archiver.process.send_signal(signal.SIGKILL)
        archiver.process.communicate(timeout=TIMEOUT_SECONDS)
        self.assertEqual(call("after-kill"), "confirmed")
        self.assertEqual(self.copy_names(), [])
        worker.stdin.close()
        self.assertEqual(worker.wait(TIMEOUT_SECONDS), 0)
        self.assertAllVerify(0)


class FullDisk(ArchiverCase):
    """``archive`` on a real filesystem that runs out of space (a small tmpfs;
    skipped where this user cannot mount one)."""

    FREE_KIB = (0, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512, 1024)

    def setUp(self):
        super().setUp()
        self.mount = os.path.join(self.root, "small-disk")
        os.mkdir(self.mount)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", self.mount],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
        self.addCleanup(subprocess.run, ["umount", "-l", self.mount], capture_output=True)
        guard = RecoveryGuard(self.data_dir)
        for number in range(150):
            self.assertEqual(book(guard, f"bulk-{number}"), BOOKED)
        guard.close()

    def fill(self, free_bytes):
        found = os.statvfs(self.mount)
        filler = found.f_bavail * found.f_frsize - free_bytes
        with open(os.path.join(self.mount, "filler"), "wb") as stream:
            while filler > 0:
                written = stream.write(b"\0" * min(filler, 1 << 20))
                filler -= written

    def test_every_free_space_level_archives_or_changes_nothing(self):
        import shutil
        outcomes = {}
        for free_kib in self.FREE_KIB:
            with self.subTest(free_kib=free_kib):
                for name in os.listdir(self.mount):
                    path = os.path.join(self.mount, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
                data_dir = os.path.join(self.mount, "data")
                shutil.copytree(self.data_dir, data_dir)
                self.fill(free_kib * 1024)
                before = logical_snapshot(self, data_dir)
                archived = subprocess.run(
                    [sys.executable, os.path.join(os.path.dirname(TESTS), "operator_cli.py"),
                     "--data-dir", data_dir, "archive"],
                    capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
                result = json.loads(archived.stdout)  # one JSON document, whatever happened
                self.assertNotIn("Traceback", archived.stderr)
                os.unlink(os.path.join(self.mount, "filler"))
                names = self.archive_names(data_dir)
                self.assertEqual(self.copy_names(data_dir), [])
                self.assertFalse(os.path.exists(os.path.join(data_dir, "archive.json")))
                if archived.returncode == 0:
                    outcomes[free_kib] = "archived"
                    self.assertEqual(len(names), 1, names)
                    code, verified, text = run_cli(data_dir, "verify", "--all")
                    self.assertEqual((code, len(verified["archives_verified"])), (0, 1), text)
                else:
                    outcomes[free_kib] = result["error"]["code"]
                    self.assertEqual((archived.returncode, result["ok"]), (1, False))
                    self.assertIn(result["error"]["code"], ("storage_unavailable",
                                                            "database_error"), archived.stdout)
                    self.assertEqual(names, [])
                    self.assertEqual(logical_snapshot(self, data_dir), before)
                self.assertEqual(run_cli(data_dir, "status")[0], 0)
                self.assertVerifies(data_dir)
        # The levels span both outcomes: the smallest fails, the largest archives.
        self.assertNotEqual(outcomes[self.FREE_KIB[0]], "archived", outcomes)
        self.assertEqual(outcomes[self.FREE_KIB[-1]], "archived", outcomes)


class OutcomeStillOut(ArchiverCase):
    """No archive while any call's outcome can still arrive, whatever happened
    to its lock file."""

    def assert_archive_refused_while_out(self):
        before = logical_snapshot(self)
        code, refused, text = run_cli(self.data_dir, "archive")
        self.assertEqual((code, refused["error"]["code"]), (1, "owner_running"), text)
        self.assertEqual(logical_snapshot(self), before)

    def assert_late_outcome_recorded(self, worker, operation_id):
        """The slow call comes back: its late outcome is recorded, not lost."""
        code, output, text = worker.release()
        self.assertEqual((code, output), (0, json.loads(BOOKED)), text)
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual([item["operation_id"] for item in status["attention"]], [operation_id])

    def test_no_archive_while_a_resolved_call_runs_after_its_lock_file_was_deleted(self):
        worker = Paused(self, WAITING_WORKER, self.data_dir, "slow")
        self.assertEqual(worker.first_line, "running")
        [operation] = run_cli(self.data_dir, "status")[1]["unresolved"]
        os.unlink(os.path.join(self.data_dir, "calls", operation["operation_id"]))
        code, _, text = run_cli(self.data_dir, "resolve", operation["operation_id"], "--outcome",
                                "not_applied", "--force", "--evidence", "the worker looked gone")
        self.assertEqual(code, 0, text)
        # Another worker runs a call and lets its own lock go.
        self.assertEqual(book_in_new_process(self.data_dir, "other")[0], BOOKED)
        self.assert_archive_refused_while_out()
        self.assert_late_outcome_recorded(worker, operation["operation_id"])
        code, _, text = run_cli(self.data_dir, "acknowledge", operation["operation_id"],
                                "--evidence", "booked after all; refunded")
        self.assertEqual(code, 0, text)
        code, _, text = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, text)
        kinds = [kind for _, kind, op in all_events(self.data_dir)
                 if op == operation["operation_id"]]
        self.assertEqual(kinds, ["started", "resolved", "late_outcome", "acknowledged"])
        self.assertAllVerify(1)

    def test_no_archive_while_a_resolved_call_runs_after_calls_itself_was_deleted(self):
        worker = Paused(self, WAITING_WORKER, self.data_dir, "slow")
        self.assertEqual(worker.first_line, "running")
        [operation] = run_cli(self.data_dir, "status")[1]["unresolved"]
        operation_id = operation["operation_id"]
        shutil.rmtree(os.path.join(self.data_dir, "calls"))  # a cleanup script
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual((status["gate"], status["in_flight"]["operation_id"]),
                         ("busy", operation_id))
        code, _, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                "not_applied", "--force", "--evidence", "the worker looked hung")
        self.assertEqual(code, 0, text)
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual([call["operation_id"] for call in status["resolved_running"]],
                         [operation_id])
        self.assert_archive_refused_while_out()
        self.assert_late_outcome_recorded(worker, operation_id)
        kinds = [kind for _, kind, op in all_events(self.data_dir) if op == operation_id]
        self.assertEqual(kinds, ["started", "resolved", "late_outcome"])
        self.assertAllVerify(0)

    def test_a_running_call_whose_lock_file_was_moved_still_reads_running(self):
        # Moved by hand: the file inside the data directory, or calls/ itself.
        for move in ("file", "directory"):
            with self.subTest(move=move):
                worker = Paused(self, WAITING_WORKER, self.data_dir, "slow-" + move)
                self.assertEqual(worker.first_line, "running")
                [operation] = run_cli(self.data_dir, "status")[1]["unresolved"]
                operation_id = operation["operation_id"]
                calls = os.path.join(self.data_dir, "calls")
                if move == "file":
                    moved = os.path.join(self.data_dir, "moved-lock")
                    os.rename(os.path.join(calls, operation_id), moved)
                else:
                    moved = calls + ".bak"
                    os.rename(calls, moved)
                status = run_cli(self.data_dir, "status")[1]
                self.assertEqual((status["gate"], status["in_flight"]["operation_id"],
                                  [item["owner"] for item in status["unresolved"]]),
                                 ("busy", operation_id, ["running"]))
                code, result, text = run_cli(self.data_dir, "resolve", operation_id,
                                             "--outcome", "not_applied", "--evidence", "gone?")
                self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
                code, result, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                             "not_applied", "--force", "--evidence", "hung")
                self.assertEqual(code, 0, text)
                self.assert_archive_refused_while_out()
                self.assert_late_outcome_recorded(worker, operation_id)
                kinds = [kind for _, kind, op in all_events(self.data_dir) if op == operation_id]
                self.assertEqual(kinds, ["started", "resolved", "late_outcome"])
                self.assertEqual(run_cli(self.data_dir, "acknowledge", operation_id, "--evidence",
                                         "checked with the service")[0], 0)
                if move == "file":
                    os.unlink(moved)
                else:
                    shutil.rmtree(moved)

    def test_a_running_call_whose_lock_file_was_deleted_still_reads_running(self):
        worker = Paused(self, WAITING_WORKER, self.data_dir, "slow")
        self.assertEqual(worker.first_line, "running")
        [operation] = run_cli(self.data_dir, "status")[1]["unresolved"]
        os.unlink(os.path.join(self.data_dir, "calls", operation["operation_id"]))
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual((status["gate"], [item["owner"] for item in status["unresolved"]]),
                         ("busy", ["running"]))
        refused = json.loads(book_in_new_process(self.data_dir, "other")[0])
        self.assertEqual(refused["code"], "operation_in_flight")
        code, result, text = run_cli(self.data_dir, "resolve", operation["operation_id"],
                                     "--outcome", "not_applied", "--evidence", "it looked gone")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        code, output, text = worker.release()
        self.assertEqual((code, output), (0, json.loads(BOOKED)), text)
        kinds = [kind for _, kind, op in all_events(self.data_dir)
                 if op == operation["operation_id"]]
        self.assertEqual(kinds, ["started", "returned"])


class ManyArchives(ArchiverCase):
    """Start-up checks one archive, whatever their number; ``verify --all``
    checks every one, each once."""

    def test_a_start_opens_only_the_newest_archive_and_verify_all_every_one(self):
        for name in ("c", "d", "e"):
            self.assertEqual(book_in_new_process(self.data_dir, name)[0], BOOKED)
            self.assertEqual(run_cli(self.data_dir, "archive")[0], 0)
        anchors = run_cli(self.data_dir, "verify", "--all")[1]["archives_verified"]
        self.assertEqual(len(anchors), 3)
        oldest, newest = (os.path.join(self.data_dir, anchors[index]["file"])
                          for index in (-1, 0))
        os.rename(oldest, oldest + ".away")
        self.assertEqual(book_in_new_process(self.data_dir, "f")[0], BOOKED)
        code, result, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, result["integrity"]), (1, "archive_missing"), text)
        os.rename(oldest + ".away", oldest)
        os.rename(newest, newest + ".away")
        refused = json.loads(book_in_new_process(self.data_dir, "g")[0])
        self.assertEqual(refused["code"], "archive_missing")
        os.rename(newest + ".away", newest)
        self.assertEqual(booked_names(self.data_dir), ["a", "b", "c", "d", "e", "f"])
        self.assertAllVerify(3)


class ArchiverKilledWhileWorkersRun(ArchiverCase):
    """A SIGKILL at every step of an archive while a worker books: every tool
    that ran is in the history exactly once, and the archive happened or not."""

    def test_kill_at_every_step_with_a_worker_running(self):
        effects = os.path.join(self.root, "effects.txt")
        for boundary in ARCHIVE_BOUNDARIES:
            with self.subTest(boundary=":".join(boundary)):
                self.fresh_journal("data-" + "-".join(boundary))
                archiver = Paused(self, PAUSING_ARCHIVER, self.data_dir, ":".join(boundary))
                if archiver.first_line != "paused":  # say what the archive did instead
                    self.fail(f"{archiver.first_line!r}: {archiver.unpaused()}")
                worker = subprocess.Popen([sys.executable, "-c", BOOKING_LOOP, self.data_dir,
                                           "-".join(boundary), "2", effects],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
                archiver.process.send_signal(signal.SIGKILL)
                archiver.process.communicate(timeout=TIMEOUT_SECONDS)
                output, errors = worker.communicate(timeout=TIMEOUT_SECONDS)
                self.assertEqual(worker.returncode, 0, errors)
                summary = json.loads(output)
                self.assertIsNone(summary["poisoned"], output)
                self.assertLessEqual(set(summary["refusals"]), {"database_locked"}, output)
                self.assertEqual(book_in_new_process(self.data_dir, "last")[0], BOOKED)
                with open(effects) as stream:
                    ran = [line.strip() for line in stream if line.startswith("-".join(boundary))]
                self.assertEqual(booked_names(self.data_dir), ["a", "b"] + ran + ["last"])
                counts = collections.Counter((kind, op) for _, kind, op in all_events(self.data_dir)
                                             if op is not None)
                self.assertEqual(set(counts.values()), {1})
                code, verified, text = run_cli(self.data_dir, "verify", "--all")
                self.assertEqual(code, 0, text)
                self.assertIn(len(verified["archives_verified"]), (0, 1))
                self.assertAllVerify(len(verified["archives_verified"]))


if __name__ == "__main__":
    unittest.main()
