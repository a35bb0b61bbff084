"""The search for a running call's lock beyond its name (docs/guard.md
§Concurrency) under what other programs leave in the data directory: a foreign
``flock`` on the journal's own files, a flocked FIFO, a lock file renamed to
another spelling or to another operation's id.

Each case keeps the input of a failure report (a breaker's repro) as its
regression test: the search once opened and closed every flocked file, or a
journal file hard-linked at a lock's name (which dropped this process's SQLite
locks), blocked in ``open`` on a FIFO, took a lock file's name for its
operation, and lost a call whose lock file was moved out of reach of
``readlink``, emptied, record-locked by another program, or replaced at its
name.  Real processes hold the locks.
"""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import uuid

from reliability_support import ReliabilityCase
from support import TESTS, run_cli
from test_archive import all_events
from test_archive_concurrency import (BOOKED, BOOKING_LOOP, TIMEOUT_SECONDS, WAITING_WORKER,
                                      ArchiverCase, Paused)

from crash_recovery.storage import call_lock, wal_keeper
from crash_recovery.storage.errors import AdmissionRefused

# Takes an exclusive flock on each path given (opened without blocking, so a
# FIFO too), says "locked" on stderr and waits for a line on stdin.
FOREIGN_FLOCKER = textwrap.dedent("""
    import fcntl, os, sys
    descriptors = [os.open(path, os.O_RDWR | os.O_NONBLOCK) for path in sys.argv[1:]]
    for descriptor in descriptors:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
    print("locked", file=sys.stderr, flush=True)
    sys.stdin.readline()
""")

# The three searches of call_lock in a child (a hang is cut off by the
# parent's timeout): prints held_calls, probe_owner of argv[2], refuse_calls_out.
SEARCHES = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import call_lock, lock_holders
    from crash_recovery.storage.errors import AdmissionRefused
    data_dir, operation_id = sys.argv[1], sys.argv[2]
    if sys.argv[3:] == ["no-lock-list"]:  # as on macOS: no /proc/locks
        lock_holders.PROC_LOCKS = data_dir + "/no-such-file"
    if sys.argv[3:] == ["foreign-lock-list"]:  # as on btrfs: other device numbers
        lock_holders.PROC_LOCKS = "/dev/null"
    found = {{"held": [call["operation_id"] for call in call_lock.held_calls(data_dir)],
             "owner": call_lock.probe_owner(data_dir, operation_id)["owner"], "refusal": None}}
    try:
        call_lock.refuse_calls_out(data_dir)  # last: it removes leftovers
    except AdmissionRefused as exc:
        found["refusal"] = exc.code
    print(json.dumps(found))
""").format(tests=TESTS)


def running_alone(operation_id):
    """What SEARCHES prints while ``operation_id`` is the one call out."""
    return (f'{{"held": ["{operation_id}"], "owner": "running", '
            '"refusal": "owner_running"}')


def own_posix_locks(paths):
    """This process's POSIX locks on ``paths``: sorted (inode, access, start, end)."""
    inodes = {os.stat(path).st_ino for path in paths}
    found = []
    with open("/proc/locks") as stream:
        for line in stream:
            fields = line.split()
            if fields[1] != "POSIX" or int(fields[4]) != os.getpid():
                continue
            inode = int(fields[5].rsplit(":", 1)[1])
            if inode in inodes:
                found.append((inode, fields[3], fields[6], fields[7]))
    return sorted(found)


class LockSearch(ArchiverCase):

    def foreign_flocks(self, *paths):
        """Another program holds an exclusive flock on each path until the test ends."""
        holder = Paused(self, FOREIGN_FLOCKER, *paths)
        self.assertEqual(holder.first_line, "locked")
        return holder

    def searches(self, operation_id, *options):
        completed = subprocess.run([sys.executable, "-c", SEARCHES, self.data_dir, operation_id,
                                    *options],
                                   capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        return completed.stdout.strip()

    def running_call(self, name):
        worker = Paused(self, WAITING_WORKER, self.data_dir, name)
        self.assertEqual(worker.first_line, "running")
        [operation] = run_cli(self.data_dir, "status")[1]["unresolved"]
        return worker, operation["operation_id"]

    def test_a_foreign_flock_on_the_journal_files_keeps_this_process_s_sqlite_locks(self):
        worker, operation_id = self.running_call("slow")
        database = os.path.join(self.data_dir, "journal.sqlite3")
        journal_files = [database, database + "-shm", database + "-wal",
                         os.path.join(self.data_dir, "head.json")]
        self.foreign_flocks(*journal_files)
        connection = sqlite3.connect(database, timeout=0, isolation_level=None)
        self.addCleanup(connection.close)
        connection.execute("BEGIN IMMEDIATE")  # SQLite's WAL write lock, a POSIX lock of -shm
        locks = own_posix_locks(journal_files)
        self.assertTrue(locks)
        self.assertEqual([call["operation_id"] for call in call_lock.held_calls(self.data_dir)],
                         [operation_id])
        self.assertEqual(call_lock.probe_owner(self.data_dir, str(uuid.uuid4()))["owner"], "gone")
        self.assertEqual(own_posix_locks(journal_files), locks)
        second = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sqlite3, sys
            try:
                sqlite3.connect(sys.argv[1], timeout=0).execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                print(exc)
        """), database], capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        self.assertEqual(second.stdout.strip(), "database is locked", second.stderr)
        connection.execute("ROLLBACK")
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_without_a_lock_list_in_stat_s_numbers_a_call_at_its_name_is_found(self):
        # No /proc/locks (macOS), or one naming files by other device numbers
        # than stat (btrfs subvolumes): names are probed, nothing else.
        for lock_list in ("no-lock-list", "foreign-lock-list"):
            with self.subTest(lock_list=lock_list):
                self.assertEqual(self.searches(str(uuid.uuid4()), lock_list),
                                 '{"held": [], "owner": "gone", "refusal": null}')
                worker, operation_id = self.running_call("slow-" + lock_list)
                self.assertEqual(self.searches(operation_id, lock_list),
                                 running_alone(operation_id))
                self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))
                self.assertEqual(self.searches(operation_id, lock_list),
                                 '{"held": [], "owner": "gone", "refusal": null}')

    def test_a_flocked_fifo_in_the_data_directory_blocks_no_search(self):
        fifo = os.path.join(self.data_dir, "pipe")
        os.mkfifo(fifo, 0o600)
        self.foreign_flocks(fifo)
        unknown = str(uuid.uuid4())
        self.assertEqual(self.searches(unknown),
                         '{"held": [], "owner": "gone", "refusal": null}')
        worker, operation_id = self.running_call("slow")
        self.assertEqual(self.searches(operation_id), running_alone(operation_id))
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_lock_file_renamed_to_another_spelling_or_id_still_names_its_call(self):
        worker, operation_id = self.running_call("slow")
        other_id = str(uuid.uuid4())
        calls = os.path.join(self.data_dir, "calls")
        # A held lock is listed under its name and under its tag's operation:
        # either may be the call (a file renamed, or a tag edited, by hand).
        for name, held in ((operation_id.upper(), [operation_id]),
                           ("{" + operation_id + "}", [operation_id]),
                           (other_id, [other_id, operation_id])):
            with self.subTest(renamed_to=name):
                os.rename(os.path.join(calls, os.listdir(calls)[0]), os.path.join(calls, name))
                self.assertEqual(os.listdir(calls), [name])
                self.assertEqual(self.searches(operation_id),
                                 f'{{"held": {json.dumps(held)}, "owner": "running", '
                                 '"refusal": "owner_running"}')
                code, result, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                             "not_applied", "--evidence", "it looked gone")
                self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))
        kinds = [kind for _, kind, op in all_events(self.data_dir) if op == operation_id]
        self.assertEqual(kinds, ["started", "returned"])

    def test_a_lock_file_moved_and_replaced_at_its_name_still_reads_running(self):
        worker, operation_id = self.running_call("slow")
        at_name = os.path.join(self.data_dir, "calls", operation_id)
        os.rename(at_name, os.path.join(self.data_dir, "moved-lock"))
        os.mkfifo(at_name, 0o600)  # what stands at its name now cannot be probed
        self.assertEqual(self.searches(operation_id), running_alone(operation_id))
        self.assertTrue(stat.S_ISFIFO(os.lstat(at_name).st_mode))  # left as it was found
        code, result, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                     "not_applied", "--evidence", "it looked gone")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def assert_running_and_refused(self, operation_id):
        """Every surface treats the call as running: resolve and archive refused."""
        found = json.loads(self.searches(operation_id))
        self.assertEqual((found["owner"], found["refusal"], operation_id in found["held"]),
                         ("running", "owner_running", True))
        code, result, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                     "not_applied", "--evidence", "it looked gone")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        code, result, text = run_cli(self.data_dir, "archive")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)

    def test_a_foreign_record_lock_on_a_moved_lock_file_hides_nothing(self):
        worker, operation_id = self.running_call("slow")
        moved = os.path.join(self.data_dir, "moved-by-hand")
        os.rename(os.path.join(self.data_dir, "calls", operation_id), moved)
        holder = Paused(self, textwrap.dedent("""
            import fcntl, sys
            stream = open(sys.argv[1], "rb")
            fcntl.lockf(stream, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0)
            print("locked", file=sys.stderr, flush=True)
            sys.stdin.readline()
        """), moved)
        self.assertEqual(holder.first_line, "locked")
        self.assert_running_and_refused(operation_id)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_calls_replaced_after_it_was_moved_hides_nothing(self):
        worker, operation_id = self.running_call("slow")
        calls = os.path.join(self.data_dir, "calls")
        os.rename(calls, calls + ".old")
        os.symlink(calls + ".old", calls)
        self.assertEqual(self.searches(operation_id), running_alone(operation_id))
        code, result, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                     "not_applied", "--evidence", "it looked gone")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        os.unlink(calls)
        os.rename(calls + ".old", calls)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_lock_file_moved_deeper_than_a_path_can_be_read_hides_nothing(self):
        worker, operation_id = self.running_call("slow")
        parent = os.open(self.data_dir, os.O_RDONLY)
        for _ in range(20):  # 20 x 251 bytes: past PATH_MAX, so readlink fails
            os.mkdir("d" * 250, dir_fd=parent)
            child = os.open("d" * 250, os.O_RDONLY, dir_fd=parent)
            os.close(parent)
            parent = child
        self.addCleanup(os.close, parent)
        os.rename(os.path.join(self.data_dir, "calls", operation_id), "lock", dst_dir_fd=parent)
        self.assertEqual(self.searches(operation_id), running_alone(operation_id))
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_lock_file_emptied_and_moved_is_still_a_call_out(self):
        worker, operation_id = self.running_call("slow")
        at_name = os.path.join(self.data_dir, "calls", operation_id)
        os.truncate(at_name, 0)  # its tag gone: nothing says whose it is
        os.rename(at_name, os.path.join(self.data_dir, "moved-by-hand"))
        self.assertEqual(self.searches(operation_id),
                         '{"held": [null], "owner": "unknown", "refusal": "owner_running"}')
        code, result, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                     "not_applied", "--evidence", "it looked gone")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        self.assertIn("may still run", result["error"]["message"])
        code, result, text = run_cli(self.data_dir, "archive")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual([view["owner"] for view in status["unresolved"]], ["unknown"])
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_journal_file_hard_linked_at_a_lock_name_keeps_this_process_s_sqlite_locks(self):
        worker, operation_id = self.running_call("slow")
        database = os.path.join(self.data_dir, "journal.sqlite3")
        for linked in (database + "-shm", database):
            with self.subTest(linked=os.path.basename(linked)):
                name = os.path.join(self.data_dir, "calls", str(uuid.uuid4()))
                os.link(linked, name)
                connection = sqlite3.connect(database, timeout=0, isolation_level=None)
                connection.execute("BEGIN IMMEDIATE")
                locks = own_posix_locks([database, database + "-shm"])
                call_lock.held_calls(self.data_dir)
                call_lock.probe_owner(self.data_dir, os.path.basename(name))
                with self.assertRaises(AdmissionRefused) as refused:
                    call_lock.refuse_calls_out(self.data_dir)
                self.assertEqual(refused.exception.code, "owner_running")
                self.assertEqual(own_posix_locks([database, database + "-shm"]), locks)
                connection.execute("ROLLBACK")
                connection.close()
                if os.path.lexists(name):  # else removed as a leftover: nobody flocks it
                    os.unlink(name)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_lock_file_grown_by_hand_still_reads_running(self):
        worker, operation_id = self.running_call("slow")
        at_name = os.path.join(self.data_dir, "calls", operation_id)
        with open(at_name, "ab") as stream:
            stream.write(b"x" * 5000)  # past the tag's 4 KiB: the tag still leads
        self.assert_running_and_refused(operation_id)
        moved = os.path.join(self.data_dir, "moved-by-hand")
        os.rename(at_name, moved)
        self.assert_running_and_refused(operation_id)
        code, _, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                "not_applied", "--force", "--evidence", "it looked hung")
        self.assertEqual(code, 0, text)
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual([call["operation_id"] for call in status["resolved_running"]],
                         [operation_id])
        code, result, text = run_cli(self.data_dir, "archive")
        self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))
        kinds = [kind for _, kind, op in all_events(self.data_dir) if op == operation_id]
        self.assertEqual(kinds, ["started", "resolved", "late_outcome"])

    def test_a_tag_edited_to_another_operation_still_reads_running(self):
        worker, operation_id = self.running_call("slow")
        at_name = os.path.join(self.data_dir, "calls", operation_id)
        with open(at_name, "r+b") as stream:  # the worker's own descriptor keeps its lock
            stream.write(json.dumps({"operation_id": str(uuid.uuid4()), "pid": 1,
                                     "process_start": 0}).encode())
            stream.truncate()
        self.assert_running_and_refused(operation_id)
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual(status["in_flight"]["operation_id"], operation_id)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_lock_file_emptied_and_renamed_to_another_id_is_still_a_call_out(self):
        worker, operation_id = self.running_call("slow")
        at_name = os.path.join(self.data_dir, "calls", operation_id)
        os.truncate(at_name, 0)
        other = str(uuid.uuid4())
        for place in (os.path.join(self.data_dir, "calls", other),
                      os.path.join(self.data_dir, other)):
            with self.subTest(renamed_to=os.path.relpath(place, self.data_dir)):
                os.rename(at_name, place)
                at_name = place
                owner = json.loads(self.searches(operation_id))
                self.assertEqual((owner["owner"], owner["refusal"]), ("unknown", "owner_running"))
                code, result, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                             "not_applied", "--evidence", "it looked gone")
                self.assertEqual((code, result["error"]["code"]), (1, "owner_running"), text)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_tag_with_nan_or_a_huge_number_leaves_status_valid_json(self):
        worker, operation_id = self.running_call("slow")
        for values in ('"pid": NaN, "process_start": Infinity', '"pid": 7, "process_start": 1e400'):
            with self.subTest(values=values):
                with open(os.path.join(self.data_dir, "calls", operation_id), "r+b") as stream:
                    stream.write(('{"operation_id": "%s", %s}' % (operation_id, values)).encode())
                    stream.truncate()
                code, _, text = run_cli(self.data_dir, "status")
                self.assertEqual((text.count("NaN"), text.count("Infinity")), (0, 0), text)
                status = json.loads(text)
                [view] = status["unresolved"]
                self.assertEqual((code, view["owner"], status["in_flight"]["process_start"]),
                                 (0, "running", None))
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_a_tag_in_another_spelling_names_its_call_wherever_the_file_goes(self):
        worker, operation_id = self.running_call("slow")
        at_name = os.path.join(self.data_dir, "calls", operation_id)
        with open(at_name, "r+b") as stream:
            stream.write(json.dumps({"operation_id": operation_id.upper(), "pid": 1,
                                     "process_start": 0}).encode())
            stream.truncate()
        os.rename(at_name, os.path.join(self.data_dir, "moved-by-hand"))
        self.assert_running_and_refused(operation_id)
        self.assertEqual(worker.release()[:2], (0, json.loads(BOOKED)))

    def test_the_search_keeps_no_descriptor_while_calls_come_and_go(self):
        before = len(os.listdir("/proc/self/fd"))
        loop = subprocess.Popen([sys.executable, "-c", BOOKING_LOOP, self.data_dir, "loop", "300",
                                 os.path.join(self.root, "effects")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(loop.kill)
        searches = 0
        while loop.poll() is None or searches == 0:
            call_lock.held_calls(self.data_dir)
            searches += 1
        output, errors = loop.communicate(timeout=TIMEOUT_SECONDS)
        self.assertEqual(json.loads(output), {"refusals": {}, "poisoned": None}, errors)
        self.assertEqual(len(os.listdir("/proc/self/fd")), before)


class KeeperShared(ReliabilityCase):

    def test_a_closed_keeper_leaves_no_lock_behind_a_shared_description(self):
        # A child forked before its fork handler ran shares the keeper's open
        # file description (os.dup makes the same sharing without a fork).
        if not wal_keeper.SUPPORTED:
            self.skipTest("no open file description locks on this platform")
        path = os.path.join(self.root, "file")
        with open(path, "wb") as stream:
            stream.write(b"x")
        keeper = wal_keeper.WalKeeper(path)
        keeper.hold(1.0)
        self.assertIs(wal_keeper.journal_open_elsewhere(path), True)
        [descriptor] = [int(name) for name in os.listdir("/proc/self/fd")
                        if os.path.realpath(f"/proc/self/fd/{name}") == os.path.realpath(path)]
        shared = os.dup(descriptor)
        self.addCleanup(os.close, shared)
        keeper.close()
        self.assertIs(wal_keeper.journal_open_elsewhere(path), False)
