"""The canonical encoding's own limits (docs/format.md §Canonical encoding).

``C(x)`` is json.dumps' text, produced by the plugin's own iterative encoder so
that what is admitted is the same on every Python: nesting up to
``MAX_NESTING``, at most ``MAX_VALUES`` values and ``MAX_CANONICAL_BYTES``
bytes (each counted every time it appears), integers up to
``MAX_INTEGER_DIGITS`` digits, and no value that contains itself.  Every
shape ends in a result or a refusal.  Each limit is checked at its exact
boundary against the reference reading (tests/journal_reference.py, written
from the docs) and json.dumps; the guard-level tests run in a child process so
a shape that loops fails the test instead of hanging the suite.
"""
from __future__ import annotations

import copy
import hashlib
import json
import random
import subprocess
import sys
import textwrap
import unittest

from reliability_support import ReliabilityCase
from support import TESTS, reference

from crash_recovery.storage import record
from crash_recovery.storage.errors import EncodingError


def json_text(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def nested(levels, leaf=None, container=list):
    """``levels`` arrays (or objects under key "k") around ``leaf``."""
    value = leaf
    for _ in range(levels):
        value = [value] if container is list else {"k": value}
    return value


def random_value(generator, depth=0):
    """A JSON value of every kind: keys and text with escapes, non-ASCII and
    astral characters; numbers of every sign and size."""
    kind = generator.randrange(9 if depth < 6 else 6)
    if kind == 0:
        return generator.choice([None, True, False])
    if kind == 1:
        return generator.randrange(-10 ** 20, 10 ** 20)
    if kind == 2:
        return generator.choice([0.0, -0.0, 1e-300, 1.5e300, -2.5, 0.1, 1 / 3])
    if kind in (3, 4, 5):
        return random_text(generator)
    if kind in (6, 7):
        return [random_value(generator, depth + 1) for _ in range(generator.randrange(5))]
    return {random_text(generator): random_value(generator, depth + 1)
            for _ in range(generator.randrange(5))}


def random_text(generator):
    alphabet = 'ab"\\\n\t\x00\x1f\u00e9\u2708\U0001f680 /'
    return "".join(generator.choice(alphabet) for _ in range(generator.randrange(8)))


class CanonicalLimits(unittest.TestCase):

    def assertAdmitted(self, value):
        """The product, the reference and json.dumps give the same text."""
        text = record.canonical_text(value)
        self.assertEqual(text, reference.canonical(value))
        self.assertEqual(text, json_text(value))
        self.assertEqual(record.value_hash(value),
                         hashlib.sha256(text.encode("utf-8")).hexdigest())
        return text

    def assertRefused(self, value):
        """The product and the reference both refuse; the product's error."""
        with self.assertRaises(reference.NotCanonical):
            reference.canonical(value)
        with self.assertRaises(EncodingError) as caught:
            record.value_hash(value)
        self.assertEqual(caught.exception.code, "non_canonical_value")
        with self.assertRaises(EncodingError):
            record.canonical_text(value)
        return caught.exception.message

    def test_the_text_is_json_dumps_text(self):
        generator = random.Random(26)
        for index in range(300):
            with self.subTest(index=index):
                self.assertAdmitted(random_value(generator))
        # Subclasses encode like their base types, tuples like lists.
        class Text(str):
            pass

        class Number(int):
            pass
        self.assertEqual(self.assertAdmitted({Text("b"): Number(7), "a": (1, (2,))}),
                         '{"a":[1,[2]],"b":7}')

    def test_flat_objects_and_scalars_give_the_same_text_and_refusals(self):
        # Plain scalars and flat objects of them take the json module's C
        # encoder (storage/record.py); its text and its refusals must be the
        # iterative encoder's.
        texts = ["", "plain", 'q"uote', "back\\slash", "\n\r\t\b\f", "\x00\x1f\x7f",
                 "\u2028\u2029", "\u00e9\u4e2d\U0001f600", "</script>"]
        numbers = [0, -1, 2 ** 63, -(2 ** 64) - 1, 10 ** record.MAX_INTEGER_DIGITS - 1, 0.0, -0.0,
                   1e16, 1.5e-7, 5e-324, 1.7976931348623157e308, True, False, None]
        for index, value in enumerate(texts + numbers):
            with self.subTest(index=index):
                self.assertAdmitted(value)
        flat = {text or "empty": value for text, value in zip(texts * 2, numbers + texts)}
        self.assertAdmitted(flat)
        self.assertAdmitted({})
        for value in ({"s": "\ud800"}, {"\udfff": 1}, {"f": float("nan")}, {"f": float("inf")},
                      {1: "a"}, {True: "a"}, {None: "a"}, {"n": 10 ** record.MAX_INTEGER_DIGITS},
                      "\ud800x", float("-inf")):
            with self.subTest(kind=type(value).__name__):
                self.assertRefused(value)
        saved = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(640)  # json.dumps refuses here; ours must not
        try:
            found = record.canonical_text({"n": 10 ** 700})
        finally:
            sys.set_int_max_str_digits(saved)
        self.assertEqual(found, '{"n":1' + "0" * 700 + "}")

    def test_nesting_up_to_the_limit_is_admitted_one_more_is_refused(self):
        for container in (list, dict):
            with self.subTest(container=container.__name__):
                self.assertAdmitted(nested(record.MAX_NESTING, 1, container))
                self.assertRefused(nested(record.MAX_NESTING + 1, 1, container))
        message = self.assertRefused({"x": nested(record.MAX_NESTING)})
        self.assertEqual(message, "the value at $.x[0][0][0][0][0]...(502 more)...[0][0][0][0] "
                                  "is nested deeper than 512 arrays and objects")

    def test_the_interpreter_recursion_limit_does_not_decide(self):
        deepest = nested(record.MAX_NESTING, "leaf")
        expected = record.value_hash(deepest)
        saved = sys.getrecursionlimit()
        sys.setrecursionlimit(150)  # far below the nesting the encoder admits
        try:
            found = record.value_hash(deepest)
            with self.assertRaises(EncodingError):
                record.value_hash([deepest])
        finally:
            sys.setrecursionlimit(saved)
        self.assertEqual(found, expected)

    def test_values_that_contain_themselves_are_refused(self):
        itself = {"amount": 5}
        itself["self"] = itself
        listed = [1, 2]
        listed.append(listed)
        deeper = {"order": {"lines": []}}
        deeper["order"]["lines"].append({"back": deeper})
        through_tuple = ([],)
        through_tuple[0].append(through_tuple)
        left, right = [], []
        left.append(right)
        right.append(left)
        messages = {label: self.assertRefused(value) for label, value in (
            ("dict", itself), ("list", listed), ("deeper", deeper),
            ("tuple", through_tuple), ("two lists", left))}
        self.assertEqual(messages, {
            "dict": "the value at $.self is the object at $ again: a value that contains "
                    "itself has no JSON form",
            "list": "the value at $[2] is the array at $ again: a value that contains itself "
                    "has no JSON form",
            "deeper": "the value at $.order.lines[0].back is the object at $ again: a value "
                      "that contains itself has no JSON form",
            "tuple": "the value at $[0][0] is the array at $ again: a value that contains "
                     "itself has no JSON form",
            "two lists": "the value at $[0][0] is the array at $ again: a value that "
                         "contains itself has no JSON form"})
        inner = {"id": 1}
        inner["loop"] = [inner]
        self.assertIn("is the object at $.x again",
                      self.assertRefused({"x": inner, "y": 2}))

    def test_shared_sub_objects_are_encoded_at_each_place(self):
        line = {"sku": "A-1", "price": 5}
        pair = [line, line]
        shared = {"lines": pair, "first": line, "again": [pair, {"last": line}], "t": (line,)}
        text = self.assertAdmitted(shared)
        self.assertEqual(text, record.canonical_text(copy.deepcopy(shared)))
        self.assertEqual(text.count('{"price":5,"sku":"A-1"}'), 7)

    def test_value_count_limit_counts_every_appearance(self):
        self.assertAdmitted([0] * (record.MAX_VALUES - 1))  # the list is a value too
        message = self.assertRefused([0] * record.MAX_VALUES)
        self.assertEqual(message, "the whole value holds more than 1,000,000 values (each "
                                  "counted every time it appears), passed at $[999999]")
        doubling = []
        for _ in range(100):  # 2**100 appearances of the empty array
            doubling = [doubling, doubling]
        self.assertIn("more than 1,000,000 values", self.assertRefused(doubling))

    def test_byte_limit_counts_utf8_bytes(self):
        limit = record.MAX_CANONICAL_BYTES
        self.assertAdmitted("x" * (limit - 2))  # the two quotes
        self.assertRefused("x" * (limit - 1))
        self.assertAdmitted("\u00e9" * ((limit - 2) // 2))  # two bytes each
        self.assertRefused("\u00e9" * ((limit - 2) // 2) + "x")
        megabyte = "y" * (1024 * 1024)
        message = self.assertRefused({"copies": [megabyte] * 64})
        self.assertEqual(message, "the whole value holds more than 64 MiB of canonical JSON, "
                                  "passed at $.copies[63]")

    def test_integer_digits_limit_is_ours(self):
        largest = 10 ** record.MAX_INTEGER_DIGITS - 1
        self.assertEqual(self.assertAdmitted([largest, -largest]),
                         "[" + str(largest) + ",-" + str(largest) + "]")
        self.assertEqual(self.assertRefused({"n": largest + 1}),
                         "the value at $.n is an integer of more than 4300 digits")
        saved = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(640)  # the interpreter told to convert fewer digits
        try:
            found = record.canonical_text(largest)
        finally:
            sys.set_int_max_str_digits(saved)
        self.assertEqual(found, str(largest))

    def test_refusals_say_what_and_where(self):
        cases = {
            "nan": ({"a": [0, {"b": float("nan")}]},
                    "the value at $.a[1].b is NaN, a number JSON cannot carry"),
            "infinity": ([float("-inf")], "the value at $[0] is -Infinity, a number JSON "
                                          "cannot carry"),
            "key": ({"x": {1: "a"}}, 'the value at $.x has a key of type int (1), not text: '
                                     'JSON would turn 1 and "1" into the same key'),
            "surrogate": ({"a b": "\ud800"}, 'the value at $["a b"] holds the lone surrogate '
                                            "U+D800, which UTF-8 cannot encode"),
            "surrogate key": ({"\udc00": 1}, 'the key at $["\\udc00"] holds the lone '
                                            "surrogate U+DC00, which UTF-8 cannot encode"),
            "type": ({"blob": b"x"}, "the value at $.blob is of type bytes, not a JSON value "
                                     "(text, number, true, false, null, array or object with "
                                     "text keys)"),
        }
        for label, (value, expected) in cases.items():
            with self.subTest(label):
                self.assertEqual(self.assertRefused(value), expected)
                # The message itself is valid UTF-8: a model can be shown it.
                expected.encode("utf-8")


# Every shape through a real guard (middleware and hook), in a child process:
# prints {label: [middleware's code or "ran", downstream calls, hook's code or None]}.
SHAPES_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.guard import RecoveryGuard
    from crash_recovery.storage.record import MAX_NESTING, MAX_VALUES

    def nested(levels):
        value = None
        for _ in range(levels):
            value = [value]
        return value

    itself = {{"amount": 5}}
    itself["self"] = itself
    looped = [1]
    looped.append({{"back": looped}})
    line = {{"sku": "A-1"}}
    doubling = []
    for _ in range(100):
        doubling = [doubling, doubling]
    shapes = {{
        "contains itself": itself, "contains itself deeper": {{"order": looped}},
        "shared, not a cycle": {{"a": line, "b": [line, line]}},
        "nested to the limit": {{"x": nested(MAX_NESTING - 1)}},
        "nested past the limit": {{"x": nested(MAX_NESTING)}},
        "too many values": {{"xs": [0] * MAX_VALUES}},
        "exponentially shared": {{"x": doubling}},
        "too many bytes": {{"blob": ["y" * (1024 * 1024)] * 64}},
    }}
    guard = RecoveryGuard(sys.argv[1])
    found = {{}}
    for index, (label, args) in enumerate(shapes.items()):
        calls = []
        result = guard.tool_execution("send_payment", args, lambda: calls.append(1) or "paid",
                                      session_id="s", tool_call_id=str(index))
        hook = guard.pre_tool_call(tool_name="send_payment", args=args, session_id="s",
                                   tool_call_id=str(index))
        code = "ran" if result == "paid" else json.loads(result)["code"]
        hook_code = None if hook is None else json.loads(hook["message"])["code"]
        found[label] = [code, len(calls), hook_code]
    # A response that contains itself is recorded, and returned unchanged.
    response = {{"status": "ok"}}
    response["self"] = response
    returned = guard.tool_execution("send_payment", {{"n": 1}}, lambda: response,
                                    session_id="s", tool_call_id="response")
    found["response contains itself"] = returned is response
    guard.close()
    print(json.dumps(found))
""")


class ArgumentShapesThroughTheGuard(ReliabilityCase):
    # Seconds for the child's whole list of shapes (about 11 s quiet; a CI lane on a
    # loaded, slower machine took over 60).
    shapes_timeout = 300

    def test_every_shape_ends_in_a_result_or_a_refusal(self):
        completed = subprocess.run(
            [sys.executable, "-c", SHAPES_CHILD.format(tests=TESTS), self.data_dir],
            capture_output=True, text=True, timeout=self.shapes_timeout)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        refused = ["non_canonical_arguments", 0, "non_canonical_arguments"]
        self.assertEqual(json.loads(completed.stdout), {
            "contains itself": refused, "contains itself deeper": refused,
            "shared, not a cycle": ["ran", 1, None],
            "nested to the limit": ["ran", 1, None], "nested past the limit": refused,
            "too many values": refused, "exponentially shared": refused,
            "too many bytes": refused, "response contains itself": True})
        report = self.assertVerifies()
        # Nothing was journaled for a refused call; the response with no
        # canonical form left its call uncertain (hash of null).
        started = [event["tool_call_id"] for event in report.events if event["kind"] == "started"]
        self.assertEqual(started, ["2", "3", "response"])
        last = report.events[-1]
        self.assertEqual((last["kind"], last["reason"], last["result_hash"]),
                         ("uncertain", "error_response", record.value_hash(None)))


if __name__ == "__main__":
    unittest.main()
