"""Error classification (docs/guard.md §Error classification) and the edge decisions in classify.py's docstring."""
from __future__ import annotations

import json
import unittest

import support  # noqa: F401  (loads this checkout as the package crash_recovery)
from reliability_support import ProtectedCallCase, Tool

from crash_recovery.classify import MAX_DECODE_DEPTH, is_error_response
from crash_recovery.guard import RecoveryGuard


class _ExplodingBool:
    def __bool__(self):
        raise RuntimeError("no truth value")


class SpecRowTests(unittest.TestCase):
    """Every docs/guard.md §Error classification row, as a dict and as JSON text."""

    ROWS = [
        # truthy error
        ({"error": "boom"}, True),
        ({"error": True}, True),
        ({"error": {"message": "x"}}, True),
        ({"error": 1}, True),
        ({"error": ["x"]}, True),
        ({"error": None}, False),
        ({"error": ""}, False),
        ({"error": 0}, False),
        ({"error": False}, False),
        ({"error": []}, False),
        ({"error": {}}, False),
        # isError: true
        ({"isError": True}, True),
        ({"isError": False}, False),
        ({"isError": None}, False),
        # success: false
        ({"success": False}, True),
        ({"success": True}, False),
        # ok: false
        ({"ok": False}, True),
        ({"ok": True}, False),
        # status values
        ({"status": "error"}, True),
        ({"status": "failed"}, True),
        ({"status": "cancelled"}, True),
        ({"status": "unknown"}, True),
        ({"status": "ok"}, False),
        ({"status": "confirmed"}, False),
        ({"status": "canceled"}, False),  # only the documented spelling
        ({"status": "failure"}, False),
        ({"status": ""}, False),
        ({"status": None}, False),
        # integer exit_code other than 0
        ({"exit_code": 0}, False),
        ({"exit_code": 1}, True),
        ({"exit_code": -9}, True),
        ({"exit_code": 127}, True),
        # anything else is returned
        ({}, False),
        ({"result": "booked", "id": 7}, False),
        ({"output": "exit_code 1 printed in text"}, False),
    ]

    def test_dict_rows(self):
        for response, expected in self.ROWS:
            with self.subTest(response=response):
                self.assertIs(is_error_response(response), expected)

    def test_json_text_rows(self):
        for response, expected in self.ROWS:
            with self.subTest(response=response):
                self.assertIs(is_error_response(json.dumps(response)), expected)

    def test_several_fields_any_error_wins(self):
        self.assertIs(is_error_response({"ok": True, "status": "failed"}), True)
        self.assertIs(is_error_response({"success": True, "exit_code": 2}), True)
        self.assertIs(is_error_response({"ok": True, "success": True, "status": "done",
                                         "exit_code": 0, "error": None, "isError": False}), False)


class EdgeDecisionTests(unittest.TestCase):
    """The decisions classify.py's docstring lists, each pinned."""

    def test_status_case_insensitive_and_trimmed(self):
        for status in ("FAILED", "Error", " cancelled ", "UNKNOWN\n"):
            with self.subTest(status=status):
                self.assertIs(is_error_response({"status": status}), True)
        self.assertIs(is_error_response({"status": 0}), False)
        self.assertIs(is_error_response({"status": ["failed"]}), False)

    def test_exit_code_edges(self):
        cases = [(0, False), (0.0, False), (None, False), (True, True), (False, True),
                 ("0", True), ("1", True), (1.0, True), (0.5, True), ([], True), ({}, True)]
        for value, expected in cases:
            with self.subTest(exit_code=value):
                self.assertIs(is_error_response({"exit_code": value}), expected)

    def test_success_and_ok_edges(self):
        for key in ("success", "ok"):
            cases = [(False, True), (0, True), (0.0, True), ("false", True), ("FALSE", True),
                     (" False ", True), ("0", True), ("no", True), ("No", True),
                     (True, False), (1, False), ("true", False), ("yes", False), (None, False),
                     ("", False), ([], False)]
            for value, expected in cases:
                with self.subTest(key=key, value=value):
                    self.assertIs(is_error_response({key: value}), expected)

    def test_is_error_edges(self):
        cases = [(True, True), (1, True), (1.0, True), ("true", True), ("TRUE", True),
                 ("1", True), ("yes", True), (False, False), (0, False), ("false", False),
                 (None, False), ("", False), (2, False)]
        for value, expected in cases:
            with self.subTest(value=value):
                self.assertIs(is_error_response({"isError": value}), expected)

    def test_error_value_whose_truth_raises_is_conservative(self):
        self.assertIs(is_error_response({"error": _ExplodingBool()}), True)

    def test_text_with_bom_and_whitespace(self):
        self.assertIs(is_error_response('\ufeff  {"ok": false}  \n'), True)
        self.assertIs(is_error_response('\ufeff{"ok": true}'), False)

    def test_double_encoded_json(self):
        once = json.dumps({"status": "failed"})
        self.assertIs(is_error_response(json.dumps(once)), True)
        self.assertIs(is_error_response(json.dumps(json.dumps(once))), True)
        self.assertIs(is_error_response(json.dumps(json.dumps({"status": "ok"}))), False)

    def test_decode_depth_is_bounded(self):
        text = json.dumps({"error": "x"})
        for _ in range(MAX_DECODE_DEPTH):
            text = json.dumps(text)
        # MAX_DECODE_DEPTH string layers around the object: still decoded.
        self.assertIs(is_error_response(text), True)
        self.assertIs(is_error_response(json.dumps(text)), False)

    def test_nan_in_text_is_tolerated(self):
        self.assertIs(is_error_response('{"ok": false, "value": NaN}'), True)
        self.assertIs(is_error_response('{"ok": true, "value": NaN}'), False)

    def test_bytes(self):
        self.assertIs(is_error_response(b'{"status": "error"}'), True)
        self.assertIs(is_error_response(bytearray(b'{"success": false}')), True)
        self.assertIs(is_error_response(b'{"status": "ok"}'), False)
        self.assertIs(is_error_response(b'\xff\xfe{"error": "x"}'), False)  # not UTF-8

    def test_non_objects_are_normal(self):
        for response in ([{"error": "x"}], '[{"error": "x"}]', 42, 0, -1, 1.5, None, True, False,
                         "", "   ", "error", "failed", "Traceback: ValueError", '"just text"',
                         "{not json", '{"error": "x"', "null", "[]", b"", object()):
            with self.subTest(response=response):
                self.assertIs(is_error_response(response), False)

    def test_nested_errors_do_not_count(self):
        self.assertIs(is_error_response({"data": {"error": "x", "ok": False}}), False)
        self.assertIs(is_error_response({"results": [{"status": "failed"}]}), False)

    def test_never_raises(self):
        deep = "[" * 100000 + "]" * 100000
        hostile = ["{" * 100000, '{"a":' * 50000, deep, '"' + "\\" * 3, {1: 2}, {None: "x"},
                   {"error": float("nan")}, {"exit_code": float("nan")}, {"ok": float("nan")}]
        for response in hostile:
            with self.subTest(response=repr(response)[:40]):
                self.assertIn(is_error_response(response), (True, False))
        self.assertIs(is_error_response({"error": float("nan")}), True)  # NaN is truthy
        self.assertIs(is_error_response({"exit_code": float("nan")}), True)
        self.assertIs(is_error_response({"ok": float("nan")}), False)


class DisguisedErrorResponseTests(unittest.TestCase):
    """Error responses behind invisible characters, double-encoded, or with a
    watched key repeated, are errors."""

    def test_every_invisible_prefix_is_stripped(self):
        prefixes = ["\n\ufeff", "\ufeff\ufeff", "\u200b", "\u2060", "\u200c\u200d", "\u00a0",
                    "\u00ad", "\u180e", "\u202a", "\r\n\t\ufeff \u200b", "\u3000"]
        for prefix in prefixes:
            for body in ('{"error": "boom"}', '{"ok": false}', '{"exit_code": 2}'):
                with self.subTest(prefix=repr(prefix), body=body):
                    text = prefix + body + prefix
                    self.assertTrue(is_error_response(text))
                    self.assertTrue(is_error_response(text.encode("utf-8")))
                    self.assertTrue(is_error_response(json.dumps(text)))  # double-encoded
        self.assertFalse(is_error_response("\u200b" + '{"status": "ok"}'))

    def test_repeated_watched_keys_are_an_error(self):
        for text in ('{"error": "boom", "error": null}', '{"error": null, "error": "boom"}',
                     '{"ok": false, "ok": true}', '{"ok": true, "ok": true}',
                     '{"success": true, "success": false}', '{"isError": false, "isError": false}',
                     '{"status": "ok", "status": "failed"}', '{"exit_code": 0, "exit_code": 0}'):
            with self.subTest(text):
                self.assertTrue(is_error_response(text))
                self.assertTrue(is_error_response(text.encode("utf-8")))
        # Repeats of other keys, or inside a nested object, do not count.
        self.assertFalse(is_error_response('{"note": 1, "note": 2, "ok": true}'))
        self.assertFalse(is_error_response('{"data": {"error": 1, "error": 2}}'))


class UndecodableErrorResponses(ProtectedCallCase):
    """JSON that Python cannot decode (a huge integer, deep nesting) or objects
    that raise when inspected never open the gate: they count as errors."""

    HUGE_INT = '{"error": "payment declined", "trace_id": ' + "1" * 5000 + "}"
    DEEP = '{"status": "failed", "detail": ' + "[" * 1000 + "]" * 1000 + "}"

    def test_classifier_is_conservative(self):
        self.assertTrue(is_error_response(self.HUGE_INT))
        self.assertTrue(is_error_response(self.DEEP))
        # A syntax error means plain text, as before.
        self.assertFalse(is_error_response("{not json"))
        self.assertFalse(is_error_response("{'a': 1}"))

    def test_exotic_objects_never_raise(self):
        class Raising(dict):
            def __contains__(self, key):
                raise RuntimeError("boom")

            def items(self):
                raise RuntimeError("boom")

        self.assertTrue(is_error_response(Raising(a=1)))
        guard = RecoveryGuard(self.data_dir)
        result = self.call(guard, Tool(Raising(a=1)))
        self.assertIsInstance(result, Raising)
        states = [operation.state for operation in guard.gate.opened_journal.unresolved()]
        self.assertEqual(states, ["uncertain"])
        guard.close()
        self.assertVerifies()

    def test_gate_closes_after_undecodable_error(self):
        guard = RecoveryGuard(self.data_dir)
        for index, response in enumerate((self.HUGE_INT, self.DEEP)):
            with self.subTest(index):
                if index:
                    operation = guard.gate.opened_journal.unresolved()[0].operation_id
                    guard.gate.opened_journal.resolve(operation, outcome="not_applied", evidence="checked")
                self.assertEqual(self.call(guard, Tool(response), f"call-{index}"), response)
                again = Tool()
                self.assertEqual(self.blocked_code(self.call(guard, again, f"retry-{index}")),
                                 "unresolved_operations")
                self.assertEqual(again.calls, 0)
        guard.close()
        self.assertVerifies()


class TrailingTextTests(unittest.TestCase):
    """An object followed by more text is not a clean result."""

    def test_an_object_followed_by_more_text_is_an_error(self):
        for text in ('{"status": "failed"}\n{"status": "retrying"}', '{"error": "x"}\x00',
                     '{"error": "timeout"} (request id 7f3a)', '{"ok": true} trailing'):
            with self.subTest(text=text):
                self.assertTrue(is_error_response(text))
        self.assertFalse(is_error_response('{"ok": true}  \n'))


# Blank by design although their category says letter or symbol: Hangul fillers, braille blank.
BLANK_LETTERS = "\u115f\u1160\u3164\uffa0\u2800"


def unseen_before_json(character):
    """What this test counts as invisible in front of a JSON value, read from the
    Unicode database directly (the classifier must agree): whitespace, every
    control, format, surrogate, private-use, unassigned and separator code
    point, every combining mark, and the blank letters."""
    import unicodedata
    return (character.isspace() or character in BLANK_LETTERS
            or unicodedata.category(character)[0] in "CZM")


class InvisiblePrefixTests(unittest.TestCase):
    """Whatever a JSON decoder or a person would not see before the ``{`` never
    changes the verdict: every such code point, alone or in runs."""

    ERRORS = ('{"error": "card declined"}', '{"ok": false}', '{"status": "failed"}')

    def test_every_unseen_code_point_before_an_error_leaves_it_an_error(self):
        # Planes 4-13 hold nothing but unassigned code points: every 251st stands for them.
        points = [*range(0x40000), *range(0x40000, 0xE0000, 251), *range(0xE0000, 0x110000)]
        unseen = [chr(point) for point in points if unseen_before_json(chr(point))]
        self.assertGreater(len(unseen), 280_000)
        missed = [hex(ord(character)) for character in unseen
                  if not is_error_response(character + self.ERRORS[0])]
        self.assertEqual(missed, [])
        # Each class, in text, as double-encoded text and in runs of mixed members.
        samples = ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\u0301", "\u20dd", "\ufe0f",
                   "\U000e0041", "\ue000", "\U0010fffd", "\u0378", "\u2028", "\u2029",
                   "\u3000", "\u115f", "\u3164", "\u2800", "\u034f", "\u180b", "\ufeff"]
        for body in self.ERRORS:
            for sample in samples:
                with self.subTest(prefix=hex(ord(sample)), body=body):
                    self.assertTrue(is_error_response(sample + body))
                    self.assertTrue(is_error_response(json.dumps(sample + body)))
                    self.assertFalse(is_error_response(sample + '{"status": "ok"}'))
            run = "".join(samples) + "".join(reversed(samples))
            self.assertTrue(is_error_response(run + body))
            self.assertTrue(is_error_response((run + body).encode("utf-8")))

    def test_bytes_are_read_as_a_json_decoder_reads_them(self):
        for encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32",
                         "utf-32-le", "utf-32-be"):
            for body in self.ERRORS:
                with self.subTest(encoding=encoding, body=body):
                    self.assertEqual(json.loads(body.encode(encoding)), json.loads(body))
                    self.assertTrue(is_error_response(body.encode(encoding)))
                    if encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-32"):  # a BOM, or UTF-8
                        self.assertTrue(is_error_response(("\u200b\x00" + body).encode(encoding)))
            self.assertFalse(is_error_response('{"status": "ok"}'.encode(encoding)))

    def test_visible_text_before_the_object_is_plain_text(self):
        for prefix in ("x", "Result: ", "\ufffd", "\u00a9", "1"):
            with self.subTest(prefix=prefix):
                self.assertFalse(is_error_response(prefix + '{"error": "x"}'))


if __name__ == "__main__":
    unittest.main()
