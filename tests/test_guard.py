"""RecoveryGuard on real SQLite files: docs/guard.md §Execution contract table, §Settings, §Inside Hermes
binding/re-entry/fail-closed, §10 blocked result, §13 what is stored."""
from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import unittest
from unittest import mock

from support import REPO, TESTS, JournalTestCase, run_cli, reference

from crash_recovery.admission import binding
from crash_recovery import guard as guard_module
from crash_recovery.guard import RecoveryGuard
from crash_recovery.admission.settings import INSPECTION_TOOLS
from crash_recovery.storage.errors import JournalUnavailable
from crash_recovery.storage.record import value_hash

BOOKING = {"to": "LIS", "date": "2026-12-24", "passengers": 2}
BLOCKED_KEYS = {"error", "blocked", "code", "explanation", "operation_ids", "operations",
                "operator_command"}
OPERATION_KEYS = {"operation_id", "tool", "state", "started_at", "age_seconds"}
RECORD_FAILED_KEYS = {"error", "outcome_unknown", "operation_id", "tool", "code", "explanation"}
# Short lock wait so refusals for a locked database come quickly.
SHORT_BUSY_TIMEOUT = 0.2
SQLITE_SIDE_FILES = ("journal.sqlite3-wal", "journal.sqlite3-shm")
_BOOKING_ARGS = object()  # "use BOOKING" (None is a value under test)


class Downstream:
    """A tool: counts calls, returns ``result`` or raises ``error``."""

    def __init__(self, result='{"status": "confirmed"}', error=None, during=None):
        self.result = result
        self.error = error
        self.during = during  # called inside the tool, before it returns
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.during is not None:
            self.during()
        if self.error is not None:
            raise self.error
        return self.result


class GuardTestCase(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.guard = self.make_guard()

    def make_guard(self, **options):
        options.setdefault("busy_timeout", SHORT_BUSY_TIMEOUT)
        guard = RecoveryGuard(self.data_dir, **options)
        self.addCleanup(self.close_guard, guard)
        return guard

    @staticmethod
    def close_guard(guard):
        if guard.gate.opened_journal is not None:
            guard.close()

    def call(self, tool="book_trip", args=_BOOKING_ARGS, downstream=None, guard=None,
             session="s-1", call_id="call-1"):
        downstream = downstream if downstream is not None else Downstream()
        return (guard or self.guard).tool_execution(
            tool_name=tool, args=dict(BOOKING) if args is _BOOKING_ARGS else args,
            next_call=downstream,
            session_id=session, tool_call_id=call_id, task_id="t", turn_id="u",
            middleware_schema_version="hermes.middleware.v1")

    def hook(self, tool="book_trip", args=_BOOKING_ARGS, guard=None, session="s-1",
             call_id="call-1"):
        return (guard or self.guard).pre_tool_call(
            tool_name=tool, args=dict(BOOKING) if args is _BOOKING_ARGS else args,
            session_id=session,
            tool_call_id=call_id, task_id="t", turn_id="u", middleware_trace=[])

    def report(self):
        return reference.verify(self.data_dir)

    def events(self):
        """(kind, reason-or-outcome) of every event, in order, via the checker."""
        report = self.report()
        self.assertTrue(report.ok, report.errors)
        return [(event["kind"], event.get("reason", event.get("outcome"))) for event in report.events]

    def assertBlocked(self, result, code, operation_ids=None):
        self.assertIsInstance(result, str)
        blocked = json.loads(result)
        self.assertEqual(set(blocked), BLOCKED_KEYS)
        self.assertEqual(blocked["error"], "crash_recovery_blocked")
        self.assertIs(blocked["blocked"], True)
        self.assertEqual(blocked["code"], code, blocked["explanation"])
        self.assertIsInstance(blocked["explanation"], str)
        self.assertTrue(blocked["explanation"].strip())
        if operation_ids is not None:
            self.assertEqual(blocked["operation_ids"], operation_ids)
        self.assertEqual([operation["operation_id"] for operation in blocked["operations"]],
                         blocked["operation_ids"])
        for operation in blocked["operations"]:
            self.assertEqual(set(operation), OPERATION_KEYS)
        return blocked

    def assertHookBlocked(self, directive, code, operation_ids=None):
        self.assertIsInstance(directive, dict)
        self.assertEqual(set(directive), {"action", "message"})
        self.assertEqual(directive["action"], "block")
        return self.assertBlocked(directive["message"], code, operation_ids)

    def assertRefusedWithoutChange(self, code, operation_ids=None, **call_options):
        """A protected call and the hook are refused; nothing on disk changes."""
        before = self.snapshot()
        downstream = Downstream()
        blocked = self.assertBlocked(self.call(downstream=downstream, **call_options), code,
                                     operation_ids)
        self.assertEqual(downstream.calls, 0)
        hook_options = {key: value for key, value in call_options.items() if key != "downstream"}
        hooked = self.assertHookBlocked(self.hook(**hook_options), code, operation_ids)
        self.assertEqual(self.snapshot(), before)
        return blocked, hooked

    def open_operation_ids(self):
        return self.report().unresolved()


class ExecutionContractTests(GuardTestCase):
    """docs/guard.md §Execution contract, one row at a time."""

    def test_started_is_durable_before_downstream_runs(self):
        seen = {}

        def inspect():
            report = self.report()  # independent checker, while the tool runs
            seen["ok"] = report.ok
            seen["events"] = [(event["kind"], event["tool"]) for event in report.events]
            seen["unresolved"] = report.unresolved()
            seen["binding"] = binding.ADMISSION.get()

        downstream = Downstream(during=inspect)
        self.assertEqual(self.call(downstream=downstream), '{"status": "confirmed"}')
        self.assertEqual(downstream.calls, 1)
        self.assertEqual(seen["ok"], True)
        self.assertEqual(seen["events"], [("started", "book_trip")])
        self.assertEqual(len(seen["unresolved"]), 1)
        self.assertEqual(seen["binding"].operation_id, seen["unresolved"][0])
        self.assertEqual(seen["binding"].identity,
                         ("book_trip", "s-1", "call-1", value_hash(BOOKING)))
        report = self.report()
        started = report.events[0]
        self.assertEqual((started["session_id"], started["tool_call_id"], started["args_hash"]),
                         ("s-1", "call-1", value_hash(BOOKING)))
        self.assertIsNone(binding.ADMISSION.get())

    def test_normal_response_appends_returned_and_opens_the_gate(self):
        response = {"status": "confirmed", "id": 7}
        first = Downstream(result=response)
        self.assertIs(self.call(downstream=first), response)
        second = Downstream(result="plain text")
        self.assertEqual(self.call(downstream=second, call_id="call-2"), "plain text")
        self.assertEqual((first.calls, second.calls), (1, 1))
        self.assertEqual(self.events(), [("started", None), ("returned", "returned"),
                                         ("started", None), ("returned", "returned")])
        report = self.report()
        self.assertEqual(report.events[1]["result_hash"], value_hash(response))
        self.assertEqual(report.events[3]["result_hash"], value_hash("plain text"))
        self.assertEqual(report.unresolved(), [])
        self.assertVerifies()

    def test_exception_is_uncertain_and_propagates_unchanged(self):
        error = ValueError("payment gateway timeout")
        downstream = Downstream(error=error)
        with self.assertRaises(ValueError) as caught:
            self.call(downstream=downstream)
        self.assertIs(caught.exception, error)
        self.assertEqual(downstream.calls, 1)
        self.assertEqual(self.events(), [("started", None), ("uncertain", "exception")])
        self.assertEqual(self.report().events[1]["result_hash"], value_hash(None))
        operation_ids = self.open_operation_ids()
        self.assertRefusedWithoutChange("unresolved_operations", operation_ids)

    def test_cancellation_is_uncertain_and_propagates_unchanged(self):
        for error in (KeyboardInterrupt(), asyncio.CancelledError(), SystemExit(3)):
            with self.subTest(type(error).__name__):
                self.setUp()
                downstream = Downstream(error=error)
                with self.assertRaises(type(error)) as caught:
                    self.call(downstream=downstream)
                self.assertIs(caught.exception, error)
                self.assertEqual(self.events(), [("started", None), ("uncertain", "cancelled")])
                self.assertEqual(self.report().events[1]["result_hash"], value_hash(None))
                self.assertIsNone(binding.ADMISSION.get())
                self.assertRefusedWithoutChange("unresolved_operations", self.open_operation_ids())

    def test_error_response_is_uncertain_and_returned_unchanged(self):
        for response in ('{"status": "failed"}', {"error": "card declined"}, {"exit_code": 2},
                         '{"success": false}'):
            with self.subTest(response=response):
                self.setUp()
                downstream = Downstream(result=response)
                self.assertIs(self.call(downstream=downstream), response)
                self.assertEqual(self.events(), [("started", None), ("uncertain", "error_response")])
                self.assertEqual(self.report().events[1]["result_hash"], value_hash(response))
                self.assertRefusedWithoutChange("unresolved_operations", self.open_operation_ids())

    def test_non_canonical_response_is_uncertain(self):
        response = {"amount": float("nan")}
        self.assertIs(self.call(downstream=Downstream(result=response)), response)
        self.assertEqual(self.events(), [("started", None), ("uncertain", "error_response")])
        self.assertEqual(self.report().events[1]["result_hash"], value_hash(None))

    def test_process_death_leaves_pending(self):
        script = ("import os, signal, sys\n"
                  f"sys.path.insert(0, {TESTS!r})\n"
                  "from checkout import load_module\n"
                  "RecoveryGuard = load_module('guard').RecoveryGuard\n"
                  "def die():\n"
                  "    os.kill(os.getpid(), signal.SIGKILL)\n"
                  "RecoveryGuard(sys.argv[1]).tool_execution(tool_name='book_trip', "
                  "args={'to': 'LIS'}, next_call=die, session_id='s-dead', tool_call_id='c-dead')\n")
        completed = subprocess.run([sys.executable, "-c", script, self.data_dir],
                                   capture_output=True, timeout=60)
        self.assertEqual(completed.returncode, -signal.SIGKILL, completed.stderr)
        self.assertEqual(self.events(), [("started", None)])
        report = self.report()
        [operation_id] = report.unresolved()
        self.assertEqual(report.state_of(operation_id), "pending")
        self.assertRefusedWithoutChange("unresolved_operations", [operation_id])

    def test_unresolved_blocks_whole_profile(self):
        with self.assertRaises(RuntimeError):
            self.call(downstream=Downstream(error=RuntimeError("x")))
        operation_ids = self.open_operation_ids()
        other_process = self.make_guard()
        variants = [dict(), dict(tool="send_payment", args={"amount": 1}),
                    dict(session="other-session", call_id="other-call"),
                    dict(tool="unknown_tool_never_seen", args={}),
                    dict(guard=other_process, tool="post_message", args={"text": "hi"},
                         session=None, call_id=None)]
        for variant in variants:
            with self.subTest(variant=str(variant)):
                self.assertRefusedWithoutChange("unresolved_operations", operation_ids, **variant)
        # Exempt tools still run and append nothing.
        before = self.snapshot()
        for tool in ("read_file", "search_files") + INSPECTION_TOOLS:
            downstream = Downstream(result="contents")
            self.assertEqual(self.call(tool=tool, downstream=downstream), "contents")
            self.assertEqual(downstream.calls, 1)
            self.assertIsNone(self.hook(tool=tool))
        self.assertEqual(self.snapshot(), before)

    def test_integrity_failure_blocks_and_downstream_never_runs(self):
        self.call()  # this guard now has a verified, cached chain
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                             "'book_trip', 'book_tripX') WHERE seq = 1")
        self.assertRefusedWithoutChange("hash_mismatch")
        self.assertRefusedWithoutChange("hash_mismatch", guard=self.make_guard())

    def test_checkpoint_failures_block(self):
        self.call()
        head_path = os.path.join(self.data_dir, "head.json")
        with open(head_path, "rb") as stream:
            good = stream.read()
        checkpoint = json.loads(good)
        cases = [
            ("checkpoint_corrupt", b"{not json"),
            ("checkpoint_empty", b""),
            ("checkpoint_behind", json.dumps(dict(checkpoint, count=1)).encode()),
            ("journal_rolled_back", json.dumps(dict(checkpoint, count=5)).encode()),
            ("checkpoint_ahead", json.dumps(dict(checkpoint, count=3)).encode()),
            ("checkpoint_mismatch", json.dumps(dict(checkpoint, head="0" * 64)).encode()),
            ("checkpoint_foreign", json.dumps(dict(
                checkpoint, journal_id="00000000-0000-4000-8000-000000000000")).encode()),
        ]
        for code, content in cases:
            with self.subTest(code):
                with open(head_path, "wb") as stream:
                    stream.write(content)
                self.assertRefusedWithoutChange(code)
                with open(head_path, "rb") as stream:
                    self.assertEqual(stream.read(), content)  # never repaired
        os.unlink(head_path)
        self.assertRefusedWithoutChange("checkpoint_missing")
        self.assertFalse(os.path.exists(head_path))
        with open(head_path, "wb") as stream:
            stream.write(good)
        self.assertEqual(self.call(call_id="call-2"), '{"status": "confirmed"}')
        self.assertVerifies()

    def test_record_failure_after_downstream_ran_poisons_the_guard(self):
        locker = sqlite3.connect(os.path.join(self.root, "unused.sqlite3"))
        self.addCleanup(lambda: locker.close())  # whichever connection it is by then
        self.call()  # creates the journal

        def lock_journal():
            nonlocal locker
            locker.close()
            locker = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"),
                                     isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")

        downstream = Downstream(during=lock_journal)
        with self.assertLogs(guard_module.logger, "ERROR"):
            failed = json.loads(self.call(downstream=downstream, call_id="call-2"))
        locker.execute("ROLLBACK")
        self.assertEqual(set(failed), RECORD_FAILED_KEYS)
        self.assertEqual(failed["error"], "crash_recovery_record_failed")
        self.assertIs(failed["outcome_unknown"], True)
        self.assertEqual(failed["code"], "database_locked")
        self.assertEqual(failed["tool"], "book_trip")
        self.assertEqual(downstream.calls, 1)
        self.assertTrue(self.guard.poisoned)
        self.assertEqual(self.events(), [("started", None), ("returned", "returned"),
                                         ("started", None)])
        self.assertEqual(self.open_operation_ids(), [failed["operation_id"]])
        # The lock is gone, but this guard instance refuses everything from now on.
        before = self.snapshot()
        again = Downstream()
        self.assertBlocked(self.call(downstream=again, call_id="call-3"), "guard_poisoned")
        self.assertHookBlocked(self.hook(call_id="call-3"), "guard_poisoned")
        self.assertEqual(again.calls, 0)
        self.assertEqual(downstream.calls, 1)
        self.assertEqual(self.snapshot(), before)
        self.assertFalse(json.loads(self.guard.status_tool({}))["ok"])
        # Another process sees the pending operation.
        self.assertBlocked(self.call(guard=self.make_guard()), "unresolved_operations",
                           [failed["operation_id"]])
        self.assertVerifies()

    def test_record_failure_after_exception_still_propagates(self):
        self.call()
        error = ValueError("tool failed")

        def fail_recording(*args, **kwargs):
            raise JournalUnavailable("storage_unavailable", "disk went away")

        with mock.patch.object(self.guard.gate.opened_journal, "record_outcome", fail_recording), \
                self.assertLogs(guard_module.logger, "ERROR"):
            with self.assertRaises(ValueError) as caught:
                self.call(downstream=Downstream(error=error), call_id="call-2")
        self.assertIs(caught.exception, error)
        self.assertTrue(self.guard.poisoned)
        self.assertBlocked(self.call(call_id="call-3"), "guard_poisoned")

    def test_record_failure_from_unexpected_exception(self):
        self.call()

        def broken(*args, **kwargs):
            raise RuntimeError("bug")

        with mock.patch.object(self.guard.gate.opened_journal, "record_outcome", broken), \
                self.assertLogs(guard_module.logger, "ERROR"):
            failed = json.loads(self.call(call_id="call-2"))
        self.assertEqual((failed["error"], failed["outcome_unknown"], failed["code"]),
                         ("crash_recovery_record_failed", True, "RuntimeError"))
        self.assertBlocked(self.call(call_id="call-3"), "guard_poisoned")

    def test_operator_resolution_reopens_the_gate(self):
        with self.assertRaises(RuntimeError):
            self.call(downstream=Downstream(error=RuntimeError("x")))
        [operation_id] = self.open_operation_ids()
        self.assertBlocked(self.call(call_id="call-2"), "unresolved_operations", [operation_id])
        # Operator procedure: stop the worker first.  (Also: this test process read
        # journal.sqlite3 through the checker, which drops SQLite's POSIX locks of
        # a connection still open here, so the CLI would think it is alone.)
        self.close_guard(self.guard)
        code, result, _ = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                  "not_applied", "--evidence", "gateway log: request never arrived")
        self.assertEqual((code, result["ok"]), (0, True))
        self.assertIsNone(self.hook(call_id="call-3"))
        downstream = Downstream()
        self.assertEqual(self.call(downstream=downstream, call_id="call-3"), '{"status": "confirmed"}')
        self.assertEqual(downstream.calls, 1)
        self.assertEqual(self.events(), [("started", None), ("uncertain", "exception"),
                                         ("resolved", "not_applied"), ("started", None),
                                         ("returned", "returned")])
        self.assertVerifies()


class ConfigurationTests(GuardTestCase):
    """docs/guard.md §Settings: two protection modes; what people type is read
    exactly or refused (fail closed)."""

    def tools_journaled(self):
        if not os.path.exists(self.data_dir):
            return []
        return [event["tool"] for event in self.report().events if event["kind"] == "started"]

    def test_defaults(self):
        settings = self.guard.settings()
        self.assertEqual((settings.mode, settings.tools, settings.problem),
                         ("read_only_tools", frozenset({"read_file", "search_files"}), None))
        for tool in ("read_file", "search_files", *INSPECTION_TOOLS):
            self.assertFalse(self.guard.is_protected(tool))
        for tool in ("write_file", "never_heard_of_it", None, 7):
            self.assertTrue(self.guard.is_protected(tool))

    def test_read_only_list_replaces_the_defaults_in_every_spelling(self):
        # A YAML list, what `hermes config set` stores for '["a","b"]', and a
        # comma-separated string all mean the same list.
        for value in (["search_files", "lookup_receipt"], ("search_files", "lookup_receipt"),
                      '["search_files", "lookup_receipt"]', "search_files, lookup_receipt"):
            with self.subTest(value=value):
                self.setUp()
                guard = self.make_guard(read_only_tools=value)
                self.assertIsNone(guard.settings().problem)
                for tool in ("lookup_receipt", "search_files") + INSPECTION_TOOLS:
                    self.assertEqual(self.call(tool=tool, guard=guard), '{"status": "confirmed"}')
                self.assertFalse(os.path.exists(self.data_dir))  # exempt calls touch nothing
                self.call(tool="read_file", guard=guard, args={"path": "/etc/hosts"})
                self.assertEqual(self.tools_journaled(), ["read_file"])

    def test_protected_tools_mode_gates_only_the_listed_tools(self):
        guard = self.make_guard(protected_tools='["book_trip", "send_payment"]')
        self.assertEqual(guard.settings().mode, "protected_tools")
        failing = Downstream(result='{"success": false, "error": "text not found"}')
        for tool in ("patch", "web_search", "terminal"):  # failing tools pass untouched
            self.assertEqual(self.call(tool=tool, guard=guard, downstream=failing),
                             failing.result)
            self.assertIsNone(self.hook(tool=tool, guard=guard))
        self.assertFalse(os.path.exists(self.data_dir))
        with self.assertRaises(TimeoutError):
            self.call(guard=guard, downstream=Downstream(error=TimeoutError("gateway timeout")))
        open_ids = self.open_operation_ids()
        self.assertEqual(len(open_ids), 1)
        # The booking is unknown: protected tools are refused, and so is every
        # tool but the read-only pair (docs/guard.md §While the gate is closed).
        downstream = Downstream()
        self.assertBlocked(self.call(tool="send_payment", guard=guard, downstream=downstream,
                                     call_id="c2"), "unresolved_operations", open_ids)
        self.assertBlocked(self.call(tool="terminal", guard=guard, downstream=downstream),
                           "unresolved_operations", open_ids)
        self.assertEqual(downstream.calls, 0)
        self.assertEqual(self.call(tool="read_file", guard=guard, downstream=downstream),
                         '{"status": "confirmed"}')
        self.assertIsNone(self.hook(tool="read_file", guard=guard))
        self.assertEqual(self.tools_journaled(), ["book_trip"])

    def test_empty_list_protects_everything_but_the_inspection_tools(self):
        guard = self.make_guard(read_only_tools=[])
        self.assertIsNone(guard.settings().problem)
        self.assertTrue(guard.is_protected("read_file"))
        self.assertFalse(guard.is_protected("crash_recovery_status"))

    def test_settings_problems_fail_closed_and_are_reported(self):
        def broken_loader():
            raise OSError("config.yaml unreadable")

        cases = {
            "not a list": (dict(settings={"read_only_tools": 42}), "read_only_tools"),
            "list with a number": (dict(read_only_tools=["read_file", 3]), "read_only_tools"),
            "a mapping": (dict(read_only_tools={"read_file": True}), "read_only_tools"),
            "bad JSON list": (dict(read_only_tools='["read_file",'), "read_only_tools"),
            "both modes": (dict(read_only_tools=["read_file"], protected_tools=["pay"]),
                           "both set"),
            "typo": (dict(settings={"read_only_tool": ["read_file"]}), "read_only_tool"),
            "broken loader": (dict(settings=broken_loader), "unreadable"),
            "not a mapping": (dict(settings=["read_file"]), "mapping"),
            "bad interval": (dict(full_verification_interval="soon"),
                             "full_verification_interval"),
        }
        for name, (options, mentioned) in cases.items():
            with self.subTest(name):
                self.setUp()
                guard = self.make_guard(**options)
                with self.assertLogs("crash_recovery.guard", "WARNING"):
                    problem = guard.settings().problem
                self.assertIn(mentioned, problem)
                self.assertTrue(guard.is_protected("read_file"))  # fail closed
                self.assertFalse(guard.is_protected("crash_recovery_verify"))
                self.call(tool="read_file", guard=guard, args={"path": "x"})
                self.assertEqual(self.tools_journaled(), ["read_file"])
                report = json.loads(guard.status_tool({}))
                self.assertEqual(report["settings"]["problem"], problem)
                self.assertEqual(report["settings"]["read_only_tools"], [])

    def test_unknown_library_setting_is_a_type_error(self):
        with self.assertRaises(TypeError):
            RecoveryGuard(self.data_dir, read_only_tool=["read_file"])


class BindingTests(GuardTestCase):
    """docs/guard.md §Inside Hermes: ContextVar binding, re-entry, nesting."""

    def test_hook_excludes_bound_operation_only_for_same_identity(self):
        # While a call runs, the hook lets only that call's own entries through
        # (host identity: tool, session, tool-call id -- arguments may be
        # rewritten by the host between entries).  Another call is refused as
        # nested where the running call's admission is visible (this context,
        # whatever its ids: Hermes' execute_code bridge passes no session) and
        # as in flight from a fresh context (a concurrent sibling), never as
        # an unknown outcome: the operation is running right here.
        seen = {}

        def inside():
            [operation_id] = self.open_operation_ids()
            seen["same"] = self.hook()
            seen["other_args"] = self.hook(args={"to": "OPO"})
            seen["fresh_context"] = contextvars.Context().run(self.hook)
            seen["other_call_id"] = self.hook(call_id="call-other")
            seen["other_session"] = self.hook(session="s-other")
            seen["other_tool"] = self.hook(tool="send_payment")
            seen["operation_id"] = operation_id

        self.call(downstream=Downstream(during=inside))
        self.assertIsNone(seen["same"])
        self.assertIsNone(seen["other_args"])
        for key, code in (("fresh_context", "operation_in_flight"),
                          ("other_call_id", "nested_call"), ("other_tool", "nested_call"),
                          ("other_session", "nested_call")):
            with self.subTest(key):
                blocked = self.assertHookBlocked(seen[key], code, [seen["operation_id"]])
                self.assertIn("not run", blocked["explanation"])
                self.assertNotIn("unknown", blocked["explanation"])
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])

    def test_fresh_context_middleware_with_identical_ids_is_refused(self):
        # A thread with a fresh context (a concurrent sibling of the same
        # session, even with identical ids) sees no admission: it must wait.
        seen = {}

        def inside():
            seen["downstream"] = Downstream()
            seen["result"] = contextvars.Context().run(self.call, downstream=seen["downstream"])
            seen["other_session"] = contextvars.Context().run(self.call, session="s-2",
                                                              downstream=seen["downstream"])

        self.call(downstream=Downstream(during=inside))
        self.assertBlocked(seen["result"], "operation_in_flight")
        self.assertBlocked(seen["other_session"], "operation_in_flight")
        self.assertEqual(seen["downstream"].calls, 0)
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])

    def test_binding_reset_after_exception_and_interrupt(self):
        for error, reason in ((RuntimeError("x"), "exception"), (KeyboardInterrupt(), "cancelled")):
            with self.subTest(reason):
                self.setUp()
                with self.assertRaises(type(error)) as caught:
                    self.call(downstream=Downstream(error=error))
                self.assertIs(caught.exception, error)
                self.assertIsNone(binding.ADMISSION.get())
                self.assertEqual(self.events(), [("started", None), ("uncertain", reason)])
                [operation_id] = self.open_operation_ids()
                # Same identity, same context: no binding any more, so the hook refuses.
                self.assertHookBlocked(self.hook(), "unresolved_operations", [operation_id])
                # The in-flight slot was released: the refusal names the operation.
                self.assertBlocked(self.call(), "unresolved_operations", [operation_id])

    def test_binding_reset_after_normal_return(self):
        self.call()
        self.assertIsNone(binding.ADMISSION.get())
        self.assertIsNone(self.hook())

    def test_nested_reentry_with_same_identity_passes_through(self):
        inner = Downstream(result="inner result")

        def outer_tool():
            return self.call(downstream=inner)  # the host nests the middleware

        outer = Downstream()
        outer.result = None
        result = self.guard.tool_execution(tool_name="book_trip", args=dict(BOOKING),
                                           next_call=outer_tool, session_id="s-1",
                                           tool_call_id="call-1")
        self.assertEqual(result, "inner result")
        self.assertEqual(inner.calls, 1)
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])
        self.assertEqual(self.report().events[1]["result_hash"], value_hash("inner result"))

    def test_different_nested_call_is_refused(self):
        seen = {}

        def outer_tool():
            for label, options in (("tool", dict(tool="send_payment", args={"amount": 1})),
                                   ("call id", dict(call_id="call-2"))):
                nested = Downstream()
                seen[label] = (self.call(downstream=nested, **options), nested)
            return "outer done"

        result = self.guard.tool_execution(tool_name="book_trip", args=dict(BOOKING),
                                           next_call=outer_tool, session_id="s-1",
                                           tool_call_id="call-1")
        self.assertEqual(result, "outer done")
        for label, (nested_result, nested) in seen.items():
            with self.subTest(label):
                self.assertBlocked(nested_result, "nested_call")
                self.assertEqual(nested.calls, 0)
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])

    def test_reentry_with_rewritten_arguments_passes_through(self):
        # Hermes' coerce_tool_args rewrites arguments in place between the two
        # entries of one call: the inner entry is still that call.
        inner = Downstream(result='{"status": "extracted"}')

        def outer_tool():
            return self.call(args={"to": ["LIS"]}, downstream=inner)

        self.assertEqual(self.call(downstream=outer_tool), '{"status": "extracted"}')
        self.assertEqual(inner.calls, 1)
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])

    def test_refused_inner_entry_leaves_the_gate_open(self):
        # The guard itself refused the inner entry, so nothing ran: the outer
        # operation ends `returned`/not_run, not uncertain.
        inner = Downstream()

        def outer_tool():
            return self.call(call_id="call-2", downstream=inner)

        blocked = self.assertBlocked(self.call(downstream=outer_tool), "nested_call")
        self.assertEqual(inner.calls, 0)
        self.assertEqual(self.events(), [("started", None), ("returned", "not_run")])
        self.assertEqual(self.report().events[1]["result_hash"],
                         value_hash(json.dumps(blocked, ensure_ascii=False, sort_keys=True)))
        self.assertEqual(self.open_operation_ids(), [])
        self.assertEqual(self.call(call_id="call-3"), '{"status": "confirmed"}')

    def test_bridge_thread_with_copied_context_is_nested(self):
        # Hermes 0.19's execute_code runs its RPC bridge in a thread with a
        # copy of the tool's context and calls tools with no session and no
        # tool-call id, hook first.  Both gates see the admission: nested_call.
        inner = Downstream()
        seen = {}

        def execute_code():
            def bridge():
                seen["hook"] = self.hook(tool="send_payment", session=None, call_id=None)
                seen["middleware"] = self.call(tool="send_payment", session="", call_id="",
                                               downstream=inner)
            context = contextvars.copy_context()
            thread = threading.Thread(target=context.run, args=(bridge,))
            thread.start()
            thread.join()
            return seen["middleware"]

        self.assertBlocked(self.call(downstream=execute_code), "nested_call")
        self.assertHookBlocked(seen["hook"], "nested_call")
        self.assertEqual(inner.calls, 0)
        self.assertEqual(self.events(), [("started", None), ("returned", "not_run")])
        self.assertEqual(self.open_operation_ids(), [])

    def test_reentry_without_tool_call_id_needs_the_same_arguments(self):
        inner = Downstream()

        def outer_tool():
            return self.call(args={"to": "OPO"}, call_id=None, downstream=inner)

        self.assertBlocked(self.call(call_id=None, downstream=outer_tool), "nested_call")
        self.assertEqual(inner.calls, 0)

    def test_nested_exempt_tool_runs(self):
        def outer_tool():
            return self.call(tool="read_file", downstream=Downstream(result="file"))

        self.assertEqual(self.call(downstream=outer_tool), "file")
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])


class FailClosedTests(GuardTestCase):
    """The middleware never raises before next_call; every failure is a
    blocked result naming its cause, and nothing is half-written."""

    def test_data_dir_under_a_regular_file(self):
        blocker = os.path.join(self.root, "blocker")
        with open(blocker, "w") as stream:
            stream.write("not a directory")
        for data_dir in (blocker, os.path.join(blocker, "data")):
            with self.subTest(data_dir=data_dir):
                guard = RecoveryGuard(data_dir, busy_timeout=SHORT_BUSY_TIMEOUT)
                self.addCleanup(self.close_guard, guard)
                downstream = Downstream()
                self.assertBlocked(self.call(guard=guard, downstream=downstream),
                                   "storage_unavailable")
                self.assertHookBlocked(self.hook(guard=guard), "storage_unavailable")
                self.assertEqual(downstream.calls, 0)
                with open(blocker) as stream:
                    self.assertEqual(stream.read(), "not a directory")

    def test_data_dir_that_cannot_be_resolved(self):
        def no_home():
            raise KeyError("HERMES_HOME")

        guard = RecoveryGuard(no_home, busy_timeout=SHORT_BUSY_TIMEOUT)
        self.addCleanup(self.close_guard, guard)
        downstream = Downstream()
        self.assertBlocked(self.call(guard=guard, downstream=downstream), "storage_unavailable")
        self.assertHookBlocked(self.hook(guard=guard), "storage_unavailable")
        self.assertEqual(downstream.calls, 0)

    def test_database_locked_past_busy_timeout(self):
        self.call()
        locker = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"),
                                 isolation_level=None)
        self.addCleanup(locker.close)
        locker.execute("BEGIN IMMEDIATE")
        before = self.snapshot()
        for guard in (self.guard, self.make_guard()):
            downstream = Downstream()
            self.assertBlocked(self.call(guard=guard, downstream=downstream, call_id="call-2"),
                               "database_locked")
            # The hook only reads, on a snapshot: a held writer lock never blocks it.
            self.assertIsNone(self.hook(guard=guard, call_id="call-2"))
            self.assertEqual(downstream.calls, 0)
        locker.execute("ROLLBACK")
        self.assertEqual(self.snapshot(), before)
        self.assertEqual(self.call(call_id="call-3"), '{"status": "confirmed"}')
        self.assertVerifies()

    def test_unexpected_exceptions_in_journal_become_blocked_results(self):
        self.call()
        # admit: the middleware's way in (inside its transaction the open check and
        # the call's lock); unresolved: the hook's only journal call.
        for method, entry in (("admit", "middleware"), ("unresolved", "hook")):
            with self.subTest(method):
                downstream = Downstream()
                with mock.patch.object(type(self.guard.gate.opened_journal), method,
                                       side_effect=RuntimeError("bug")), \
                        self.assertLogs(guard_module.logger, "ERROR"):
                    if entry == "middleware":
                        self.assertBlocked(self.call(downstream=downstream, call_id="call-2"),
                                           "internal_error")
                    else:
                        self.assertHookBlocked(self.hook(call_id="call-2"), "internal_error")
                self.assertEqual(downstream.calls, 0)
        self.assertEqual(self.call(call_id="call-3"), '{"status": "confirmed"}')
        self.assertVerifies()

    def test_missing_or_odd_tool_names(self):
        for tool in (None, "", 5, b"book_trip"):
            with self.subTest(tool=tool):
                downstream = Downstream()
                self.assertBlocked(self.call(tool=tool, downstream=downstream), "invalid_request")
                self.assertHookBlocked(self.hook(tool=tool), "invalid_request")
                self.assertEqual(downstream.calls, 0)
        self.assertFalse(os.path.exists(self.data_dir))

    def test_next_call_missing(self):
        # What Hermes' plugins.isolation: host does (tests/test_isolation_mode.py).
        self.assertBlocked(self.guard.tool_execution(tool_name="book_trip", args={}),
                           "isolation_unsupported")

    def test_non_dict_arguments(self):
        for args in (None, [], ["to", "LIS"], "to=LIS", 5):
            with self.subTest(args=args):
                downstream = Downstream()
                self.assertBlocked(self.call(args=args, downstream=downstream), "invalid_arguments")
                self.assertHookBlocked(self.hook(args=args), "invalid_arguments")
                self.assertEqual(downstream.calls, 0)
        self.assertFalse(os.path.exists(self.data_dir))

    def test_non_canonical_arguments(self):
        self.call()
        before = self.snapshot()
        for args in ({"x": float("nan")}, {"x": float("inf")}, {"x": "\ud800"}, {"x": b"raw"},
                     {"x": {1, 2}}, {"x": object()}, {"x": {1: "a", "1": "b"}}):
            with self.subTest(args=repr(args)):
                downstream = Downstream()
                self.assertBlocked(self.call(args=args, downstream=downstream, call_id="c-2"),
                                   "non_canonical_arguments")
                self.assertHookBlocked(self.hook(args=args), "non_canonical_arguments")
                self.assertEqual(downstream.calls, 0)
        for identity in (dict(session="\udc80"), dict(call_id="\ud800"), dict(session=7)):
            with self.subTest(identity=repr(identity)):
                downstream = Downstream()
                result = json.loads(self.call(downstream=downstream, **identity))
                self.assertIn(result["code"], ("non_canonical_arguments", "invalid_request"))
                self.assertEqual(downstream.calls, 0)
        self.assertEqual(self.snapshot(), before)
        self.assertVerifies()


class BlockedResultTests(GuardTestCase):
    """docs/guard.md §Blocked result: the same refusal on the hook and the middleware path."""

    def test_shape_and_identical_codes_on_both_paths(self):
        with self.assertRaises(RuntimeError):
            self.call(downstream=Downstream(error=RuntimeError("x")))
        [operation_id] = self.open_operation_ids()
        middleware, hooked = self.assertRefusedWithoutChange("unresolved_operations", [operation_id],
                                                             call_id="call-2")
        for key in ("error", "blocked", "code", "operation_ids", "operator_command"):
            self.assertEqual(middleware[key], hooked[key], key)
        [operation] = middleware["operations"]
        self.assertEqual((operation["operation_id"], operation["tool"], operation["state"]),
                         (operation_id, "book_trip", "uncertain"))
        self.assertRegex(operation["started_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertGreaterEqual(operation["age_seconds"], 0)
        self.assertIn("--data-dir", middleware["operator_command"])
        self.assertIn(self.data_dir, middleware["operator_command"])
        self.assertIn(operation_id, middleware["explanation"])

    def test_refusal_before_data_dir_is_known_has_the_same_keys(self):
        blocked = self.assertBlocked(self.call(args=None), "invalid_arguments", [])
        self.assertIsNone(blocked["operator_command"])
        self.assertEqual(blocked["operations"], [])


class SecretsTests(GuardTestCase):
    """docs/format.md §What is stored: raw arguments, results and exception messages are never stored."""

    SECRET = "sk-live-9f8e7d6c5b4a-S3CR3T-\u00e4\u00f6"

    def assertSecretNowhere(self):
        needles = (self.SECRET.encode("utf-8"), b"9f8e7d6c5b4a-S3CR3T")
        names = []
        for directory, _, files in os.walk(self.data_dir):
            for name in files:
                names.append(name)
                with open(os.path.join(directory, name), "rb") as stream:
                    content = stream.read()
                for needle in needles:
                    self.assertNotIn(needle, content, f"secret found in {name}")
        return names

    def test_secret_in_arguments_results_and_exceptions(self):
        args = {"card": self.SECRET, "memo": f"pay with {self.SECRET}", "nested": [self.SECRET]}
        self.call(args=args, downstream=Downstream(result=json.dumps({"receipt": self.SECRET})))
        self.call(args=args, call_id="call-2",
                  downstream=Downstream(result={"status": "failed", "detail": self.SECRET}))
        [operation_id] = self.open_operation_ids()
        from crash_recovery.journal import Journal
        with Journal(self.data_dir) as journal:
            journal.resolve(operation_id, outcome="not_applied", evidence="no charge in ledger")
        with self.assertRaises(RuntimeError):
            self.call(args=args, call_id="call-3",
                      downstream=Downstream(error=RuntimeError(f"declined {self.SECRET}")))
        self.hook(args=args, call_id="call-4")
        self.call(args=args, call_id="call-4")  # refused
        self.guard.status_tool({})
        self.guard.verify_tool({})
        names = self.assertSecretNowhere()  # with the connection open: -wal/-shm present
        self.assertIn("journal.sqlite3-wal", names)
        self.close_guard(self.guard)
        self.assertSecretNowhere()
        self.assertVerifies()


class CopiedContextBindingTests(GuardTestCase):
    """A context copied during a call does not pass as re-entry after the call
    ended: the middleware and the hook both meet the gate."""

    def test_stale_binding_is_refused(self):
        captured = {}

        def downstream():
            captured["context"] = contextvars.copy_context()
            raise TimeoutError("gateway timeout")

        with self.assertRaises(TimeoutError):
            self.call(downstream=downstream)
        again = Downstream()
        self.assertBlocked(captured["context"].run(self.call, downstream=again),
                           "unresolved_operations")
        self.assertHookBlocked(captured["context"].run(self.hook), "unresolved_operations")
        self.assertEqual(again.calls, 0)
        kinds = [event["kind"] for _, event in self.guard.gate.opened_journal.events()]
        self.assertEqual(kinds, ["started", "uncertain"])
        self.close_guard(self.guard)
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
