"""Bad-input catalogue (docs/format.md §Canonical encoding, docs/guard.md, docs/cli.md).

Arguments, responses, operator input, odd tool names and session ids: each
gets a clear refusal or a defined outcome, never a crash, never a half-written
journal; the journal verifies (independent verifier) afterwards.  Response
decisions are the ones documented in classify.py's docstring; each is pinned
here through ``is_error_response`` *and* through the guard (the event kind it
leaves in the journal).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest
import uuid

from reliability_support import ReliabilityCase, logical_snapshot
from support import OPERATOR_CLI, run_cli, reference

from crash_recovery.classify import is_error_response
from crash_recovery.guard import NO_RESPONSE_HASH, RecoveryGuard
from crash_recovery.storage.record import MAX_NESTING, value_hash

TEN_MB = 10 * 1024 * 1024


def deep(levels, leaf=None):
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def itself():
    """A dict that holds itself."""
    value = {"amount": 5}
    value["self"] = value
    return value


_DEFAULT = object()


class Counter:
    def __init__(self, result=_DEFAULT):
        self.calls = 0
        self.result = {"ok": True} if result is _DEFAULT else result

    def __call__(self):
        self.calls += 1
        return self.result


class Arguments(ReliabilityCase):

    def setUp(self):
        super().setUp()
        self.guard = RecoveryGuard(self.data_dir)
        self.assertEqual(self.guard.tool_execution("warm", {}, Counter(), session_id="s",
                                                   tool_call_id="w"), {"ok": True})

    def tearDown(self):
        self.guard.close()
        super().tearDown()

    def assert_refused(self, args, code, tool="book_flight"):
        before = logical_snapshot(self)
        downstream = Counter()
        result = self.guard.tool_execution(tool, args, downstream, session_id="s", tool_call_id="c")
        blocked = json.loads(result)
        self.assertEqual((blocked["error"], blocked["code"]), ("crash_recovery_blocked", code))
        self.assertEqual(downstream.calls, 0)
        hook = self.guard.pre_tool_call(tool_name=tool, args=args, session_id="s", tool_call_id="c")
        self.assertEqual(json.loads(hook["message"])["code"], code)
        self.assertEqual(logical_snapshot(self), before)
        self.assertVerifies()

    def test_values_without_canonical_form_are_refused(self):
        cases = {
            "nan": {"x": float("nan")}, "inf": {"x": float("inf")}, "-inf": {"x": float("-inf")},
            "lone surrogate value": {"x": "\ud83d"}, "lone surrogate key": {"\udc00": 1},
            "bytes": {"x": b"abc"}, "set": {"x": {1, 2}}, "object": {"x": object()},
            "integer key": {1: "a"}, "colliding keys": {1: "a", "1": "b"},
            "mixed keys": {"a": 1, 2: "b"}, "nested integer key": {"x": [{"y": {3: 4}}]},
            "nested deeper than MAX_NESTING": {"x": deep(MAX_NESTING)},
            "containing itself": itself(), "holding itself deeper": {"a": [itself()]},
        }
        for label, args in cases.items():
            with self.subTest(label):
                self.assert_refused(args, "non_canonical_arguments")

    def test_arguments_that_are_not_an_object_are_refused(self):
        for args in (None, [], ["a"], "book it", 7, ("a",)):
            with self.subTest(repr(args)):
                self.assert_refused(args, "invalid_arguments")

    def test_tuples_hash_like_lists(self):
        self.assertEqual(value_hash({"a": (1, 2)}), value_hash({"a": [1, 2]}))
        self.assertEqual(self.guard.tool_execution("t", {"a": (1, (2, 3))}, Counter(),
                                                   session_id="s", tool_call_id="t"), {"ok": True})
        report = self.assertVerifies()
        started = [event for event in report.events if event["kind"] == "started"][-1]
        self.assertEqual(started["args_hash"], value_hash({"a": [1, [2, 3]]}))

    def test_ten_megabyte_string_is_journaled_by_hash_only(self):
        big = "x" * TEN_MB
        downstream = Counter()
        self.assertEqual(self.guard.tool_execution("upload", {"blob": big}, downstream,
                                                   session_id="s", tool_call_id="big"), {"ok": True})
        self.assertEqual(downstream.calls, 1)
        size = sum(os.path.getsize(os.path.join(self.data_dir, name))
                   for name in os.listdir(self.data_dir))
        self.assertLess(size, 1024 * 1024, "raw arguments were stored")
        report = self.assertVerifies()
        self.assertEqual(report.events[-2]["args_hash"], value_hash({"blob": big}))

    def test_odd_tool_names_and_session_ids_are_journaled_verbatim(self):
        odd = ["a/b", "..", "../../etc/passwd", "nul\x00inside", "x" * 100_000, "émoji 🚀",
               "/absolute", "C:\\windows", "\n\t"]
        before = set(os.listdir(self.root))
        for index, text in enumerate(odd):
            with self.subTest(index=index):
                downstream = Counter()
                result = self.guard.tool_execution(text, {"i": index}, downstream, session_id=text,
                                                   tool_call_id=text)
                self.assertEqual((result, downstream.calls), ({"ok": True}, 1))
        report = self.assertVerifies()
        started = [event for event in report.events if event["kind"] == "started"][1:]
        self.assertEqual([event["tool"] for event in started], odd)
        self.assertEqual([event["session_id"] for event in started], odd)
        self.assertEqual(set(os.listdir(self.root)), before, "a name escaped the data directory")
        self.assertEqual(report.unresolved(), [])

    def test_invalid_names_and_ids_are_refused(self):
        self.assert_refused({}, "invalid_request", tool="")
        for tool in (None, 7, b"bytes"):
            with self.subTest(tool=tool):
                self.assert_refused({}, "invalid_request", tool=tool)
        for session in (7, b"s", ["s"]):
            with self.subTest(session=session):
                downstream = Counter()
                result = json.loads(self.guard.tool_execution("t", {}, downstream, session_id=session,
                                                              tool_call_id="c"))
                self.assertEqual((result["code"], downstream.calls), ("invalid_request", 0))
        downstream = Counter()
        result = json.loads(self.guard.tool_execution("t", {}, downstream, session_id="\ud800",
                                                      tool_call_id="c"))
        self.assertEqual((result["code"], downstream.calls), ("non_canonical_arguments", 0))
        self.assertVerifies()

    def test_a_lone_surrogate_in_a_tool_name_is_echoed_as_an_escape(self):
        before = logical_snapshot(self)
        for tool in ("pay\udc80", "terminal\ud800"):
            with self.subTest(tool=tool):
                downstream = Counter()
                result = self.guard.tool_execution(tool, {}, downstream, session_id="s",
                                                   tool_call_id="c")
                hook = self.guard.pre_tool_call(tool_name=tool, args={}, session_id="s",
                                                tool_call_id="c")["message"]
                for text in (result, hook):
                    text.encode("utf-8")  # the host can store and send it
                    blocked = json.loads(text)
                    self.assertEqual(blocked["code"], "non_canonical_arguments")
                    self.assertIn(f"The call to {tool} cannot be journaled: its tool name, "
                                  "session id or call id is not valid UTF-8 (a lone surrogate). "
                                  "Nothing was run; tell the user the call was refused.",
                                  blocked["explanation"])
                self.assertEqual(downstream.calls, 0)
        self.assertEqual(logical_snapshot(self), before)
        self.assertVerifies()


# ---------------------------------------------------------------- responses --

ERROR = True
NORMAL = False
RESPONSES = [
    # (label, response, classify.is_error_response)  -- classify.py docstring
    ("error text", {"error": "boom"}, ERROR),
    ("isError true", {"isError": True}, ERROR),
    ("success false", {"success": False}, ERROR),
    ("ok false", {"ok": False}, ERROR),
    ("status error", {"status": "error"}, ERROR),
    ("status failed", {"status": "failed"}, ERROR),
    ("status cancelled", {"status": "cancelled"}, ERROR),
    ("status unknown", {"status": "unknown"}, ERROR),
    ("exit_code 2", {"exit_code": 2}, ERROR),
    ("exit_code 0", {"exit_code": 0}, NORMAL),
    ("exit_code 0.0", {"exit_code": 0.0}, NORMAL),
    ("exit_code null", {"exit_code": None}, NORMAL),
    ("exit_code true", {"exit_code": True}, ERROR),
    ("exit_code '1'", {"exit_code": "1"}, ERROR),
    ("exit_code '0'", {"exit_code": "0"}, ERROR),
    ("exit_code 1.0", {"exit_code": 1.0}, ERROR),
    ("status FAILED", {"status": "FAILED"}, ERROR),
    ("status ' Error '", {"status": " Error "}, ERROR),
    ("status ok", {"status": "ok"}, NORMAL),
    ("error null", {"error": None}, NORMAL),
    ("error empty", {"error": ""}, NORMAL),
    ("error 0", {"error": 0}, NORMAL),
    ("error false", {"error": False}, NORMAL),
    ("error []", {"error": []}, NORMAL),
    ("success 'false'", {"success": "false"}, ERROR),
    ("success 'NO'", {"success": "NO"}, ERROR),
    ("success 0", {"success": 0}, ERROR),
    ("success true", {"success": True}, NORMAL),
    ("isError 'true'", {"isError": "true"}, ERROR),
    ("isError false", {"isError": False}, NORMAL),
    ("MCP isError", {"isError": True, "content": [{"type": "text", "text": "failed"}]}, ERROR),
    ("MCP ok", {"isError": False, "content": [{"type": "text", "text": "done"}]}, NORMAL),
    ("leading whitespace", '  \n {"error": "x"}', ERROR),
    ("BOM", '\ufeff{"ok": false}', ERROR),
    ("BOM normal", '\ufeff{"ok": true}', NORMAL),
    ("JSON array", '[{"error": "x"}]', NORMAL),
    ("python list", [{"error": "x"}], NORMAL),
    ("bytes", b'{"error": "x"}', ERROR),
    ("bytes not UTF-8", b'\xff{"error": "x"}', NORMAL),
    ("double-encoded", json.dumps(json.dumps({"error": "x"})), ERROR),
    ("NaN in text", '{"error": NaN}', ERROR),
    ("NaN value", {"value": float("nan")}, NORMAL),
    ("lone surrogate", {"text": "\ud83d"}, NORMAL),
    ("nested error only", {"data": {"error": "x"}}, NORMAL),
    ("plain text", "Booked flight LIS-OPO", NORMAL),
    ("text mentioning error", "error: none", NORMAL),
    ("None", None, NORMAL),
    ("number", 0, NORMAL),
    ("empty string", "", NORMAL),
    ("deep JSON text", "[" * 100_000 + "]" * 100_000, NORMAL),
    ("deep object", deep(MAX_NESTING + 1, {"error": "x"}), NORMAL),
    ("object containing itself", itself(), NORMAL),
]


class BoolRaises:
    def __bool__(self):
        raise RuntimeError("no truth value")


def guard_outcome(response):
    """(kind, reason, result_hash) the guard journals for ``response``."""
    try:
        return ("uncertain", "error_response", value_hash(response)) if is_error_response(response) \
            else ("returned", "returned", value_hash(response))
    except ValueError:  # no canonical form: not a normal response
        return ("uncertain", "error_response", NO_RESPONSE_HASH)


class Responses(ReliabilityCase):

    def test_classification_decisions(self):
        for label, response, expected in RESPONSES:
            with self.subTest(label):
                self.assertIs(is_error_response(response), expected)
        self.assertIs(is_error_response({"error": BoolRaises()}), True)  # conservative
        self.assertIs(is_error_response(object()), False)

    def test_every_shape_through_the_guard(self):
        guard = RecoveryGuard(self.data_dir)
        shapes = RESPONSES + [("exotic object", object(), None), ("ten MB", "y" * TEN_MB, None),
                              ("bool raises", {"error": BoolRaises()}, None)]
        for index, (label, response, _) in enumerate(shapes):
            with self.subTest(label):
                downstream = Counter(response)
                result = guard.tool_execution("t", {"i": index}, downstream, session_id="s",
                                              tool_call_id=str(index))
                self.assertIs(result, response)  # returned unchanged, never wrapped
                self.assertEqual(downstream.calls, 1)
                journal = guard.gate.opened_journal
                events = journal.events(since=journal.checkpoint()["count"] - 1)
                kind, reason, result_hash = (events[-1][1]["kind"], events[-1][1]["reason"],
                                             events[-1][1]["result_hash"])
                if label == "exotic object":
                    expected = ("uncertain", "error_response", NO_RESPONSE_HASH)
                elif label == "bool raises":
                    expected = ("uncertain", "error_response", NO_RESPONSE_HASH)
                else:
                    expected = guard_outcome(response)
                self.assertEqual((kind, reason, result_hash), expected)
                if kind == "uncertain":
                    operation = journal.unresolved()[0].operation_id
                    journal.resolve(operation, outcome="completed", evidence="checked the service")
        guard.close()
        report = self.assertVerifies()
        self.assertEqual(report.unresolved(), [])

    def test_bytes_and_non_canonical_responses_become_uncertain(self):
        # Pinned: bytes, NaN and lone surrogates cannot be hashed canonically,
        # so the guard records them as uncertain with the null result_hash.
        for response in (b'{"ok": true}', {"value": float("nan")}, {"t": "\ud83d"}):
            self.assertEqual(guard_outcome(response), ("uncertain", "error_response",
                                                       NO_RESPONSE_HASH))


# ----------------------------------------------------------- operator input --

class OperatorInput(ReliabilityCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution("pay", {}, Counter(), session_id="s", tool_call_id="done")
        self.closed = guard.gate.opened_journal.events()[0][1]["operation_id"]
        guard.tool_execution("pay", {}, Counter({"status": "failed"}), session_id="s",
                             tool_call_id="open")
        self.open = guard.gate.opened_journal.unresolved()[0].operation_id
        guard.close()

    def resolve(self, operation, evidence, *extra):
        return run_cli(self.data_dir, "resolve", operation, "--outcome", "not_applied",
                       "--evidence", evidence, *extra)

    def assert_error(self, result, code):
        exit_code, output, text = result
        self.assertEqual(exit_code, 1, text)
        self.assertEqual(output["error"]["code"], code, text)

    def test_bad_operator_input_changes_nothing(self):
        before = logical_snapshot(self)
        self.assert_error(self.resolve(self.open, ""), "invalid_evidence")
        self.assert_error(self.resolve(self.open, "  \n\t "), "invalid_evidence")
        self.assert_error(self.resolve(self.open, "e" * 65537), "invalid_evidence")
        self.assert_error(self.resolve("not-a-uuid", "receipt"), "invalid_operation_id")
        self.assert_error(self.resolve("", "receipt"), "invalid_operation_id")
        self.assert_error(self.resolve("../../etc/passwd", "receipt"), "invalid_operation_id")
        self.assert_error(self.resolve(str(uuid.uuid4()), "receipt"), "unknown_operation")
        self.assert_error(self.resolve(self.closed, "receipt"), "operation_not_open")
        exit_code, output, text = run_cli(self.data_dir, "resolve", self.open, "--outcome", "maybe",
                                          "--evidence", "x")
        self.assertEqual((exit_code, output["error"]["code"]), (1, "usage"), text)
        exit_code, output, _ = run_cli(self.data_dir, "frobnicate")
        self.assertEqual((exit_code, output["error"]["code"]), (1, "usage"))
        # Not UTF-8 from the shell: argv bytes arrive as surrogate escapes.
        completed = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir", self.data_dir,
                                    "resolve", self.open, "--outcome", "not_applied",
                                    "--evidence", b"receipt \xff\xfe"], capture_output=True,
                                   env=dict(os.environ, LC_ALL="C.UTF-8"))
        self.assertEqual(completed.returncode, 1)
        self.assertEqual(json.loads(completed.stdout)["error"]["code"], "invalid_evidence")
        self.assertEqual(logical_snapshot(self), before)
        self.assertEqual(reference.verify(self.data_dir).unresolved(), [self.open])

    def test_multiline_and_large_evidence_is_stored_verbatim(self):
        evidence = "line one\nline two: receipt #42\r\n" + "z" * 60000
        exit_code, output, text = self.resolve(self.open.upper(), evidence)
        self.assertEqual(exit_code, 0, text[-500:])
        self.assertEqual(output["resolved"], self.open)
        report = self.assertVerifies()
        self.assertEqual(report.events[-1]["evidence"], evidence)
        self.assertEqual(report.unresolved(), [])
        self.assert_error(self.resolve(self.open, "again"), "operation_not_open")


if __name__ == "__main__":
    unittest.main()
