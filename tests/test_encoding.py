"""Canonical encoding and hashes (docs/format.md §Hashes): golden vectors computed by hand.

Every expected value below is SHA-256 over a JSON byte string typed into this
file (and pinned as a hex literal), never produced by the product's encoder.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import os
import sys
import unittest

from support import JournalTestCase

from crash_recovery.storage import record
from crash_recovery.guard import NO_RESPONSE_HASH, RecoveryGuard
from crash_recovery.storage.errors import EncodingError

JOURNAL_ID = "123e4567-e89b-42d3-a456-426614174000"
SCHEMA = "hermes.crash-recovery.v1"

GENESIS_BYTES = b'{"journal_id":"123e4567-e89b-42d3-a456-426614174000","schema":"hermes.crash-recovery.v1"}'
GENESIS_HEX = "0ce6fc0c4176397b590ef7535647aba74c0dbc76fe84f433b13a2c0678ef71b2"

ARGS = {"to": "LIS", "passengers": 2, "date": "2026-12-24"}
ARGS_BYTES = b'{"date":"2026-12-24","passengers":2,"to":"LIS"}'
ARGS_HEX = "5e01b573ee25797130f744788e8c08511b460dcc2b039a341301c15ce5abbc4f"
FINGERPRINT_BYTES = b'{"args":{"date":"2026-12-24","passengers":2,"to":"LIS"},"tool":"book_trip"}'
FINGERPRINT_HEX = "a4b28af3ffd8607fb4551377efa172e4c73e9fa7ae78a0314d4629f8ec5391b9"

RESULT_OK_BYTES = b'"ok"'
RESULT_OK_HEX = "c48b5b1a9776c84602de2306d7903a7241158a5077e7a8519af75c33441b8334"
NULL_BYTES = b"null"
NULL_HEX = "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"
# A response that is JSON *text*: hashed as a JSON string, not as the object it carries.
RESULT_JSON_TEXT = '{"status":"ok"}'
RESULT_JSON_TEXT_BYTES = b'"{\\"status\\":\\"ok\\"}"'
RESULT_JSON_TEXT_HEX = "ba303821226c2ed711ff26186fe2c64bc8610909ea2f2fbcbb2ac7ae9828b963"

NON_ASCII = {"note": "\u2708 \u65c5", "city": "Z\u00fcrich"}
NON_ASCII_BYTES = b'{"city":"Z\xc3\xbcrich","note":"\xe2\x9c\x88 \xe6\x97\x85"}'
NON_ASCII_HEX = "d327b77692796bdcf7a2ac5a7c969a81eda297330ced1cfa888a829a7b6d75fd"

OPERATION_ID = "0b9f6a1e-5d1c-4f43-9a57-0c1d2e3f4a5b"
# p_1, the canonical payload text of a `started` event, typed by hand.
STARTED_PAYLOAD = (
    b'{"args_hash":"5e01b573ee25797130f744788e8c08511b460dcc2b039a341301c15ce5abbc4f",'
    b'"fingerprint":"a4b28af3ffd8607fb4551377efa172e4c73e9fa7ae78a0314d4629f8ec5391b9",'
    b'"kind":"started","operation_id":"0b9f6a1e-5d1c-4f43-9a57-0c1d2e3f4a5b",'
    b'"schema":"hermes.crash-recovery.v1","session_id":"s-1",'
    b'"timestamp_ns":1700000000000000000,"tool":"book_trip","tool_call_id":"call-1"}')
# C({"previous": H0, "payload": p_1}): keys sorted, p_1 embedded as a JSON string.
EVENT_1_BYTES = (
    b'{"payload":"{\\"args_hash\\":\\"5e01b573ee25797130f744788e8c08511b460dcc2b039a341301c15ce5abbc4f\\",'
    b'\\"fingerprint\\":\\"a4b28af3ffd8607fb4551377efa172e4c73e9fa7ae78a0314d4629f8ec5391b9\\",'
    b'\\"kind\\":\\"started\\",\\"operation_id\\":\\"0b9f6a1e-5d1c-4f43-9a57-0c1d2e3f4a5b\\",'
    b'\\"schema\\":\\"hermes.crash-recovery.v1\\",\\"session_id\\":\\"s-1\\",'
    b'\\"timestamp_ns\\":1700000000000000000,\\"tool\\":\\"book_trip\\",\\"tool_call_id\\":\\"call-1\\"}",'
    b'"previous":"0ce6fc0c4176397b590ef7535647aba74c0dbc76fe84f433b13a2c0678ef71b2"}')
# p_2: a `resolved` event whose evidence holds non-ASCII text and a newline
# (escaped once inside the payload, twice inside the event hash input).
RESOLVED_PAYLOAD = (
    b'{"evidence":"Z\xc3\xbcrich \xe2\x9c\x88\\nrow 7","kind":"resolved",'
    b'"operation_id":"0b9f6a1e-5d1c-4f43-9a57-0c1d2e3f4a5b","outcome":"completed",'
    b'"schema":"hermes.crash-recovery.v1","timestamp_ns":1700000000000000001}')


def sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


class GoldenVectorTests(unittest.TestCase):

    def test_hand_vectors_are_self_consistent(self):
        # Pins the typed bytes to their digests, so a typo in either is caught.
        for raw, expected in ((GENESIS_BYTES, GENESIS_HEX), (ARGS_BYTES, ARGS_HEX),
                              (FINGERPRINT_BYTES, FINGERPRINT_HEX), (RESULT_OK_BYTES, RESULT_OK_HEX),
                              (NULL_BYTES, NULL_HEX), (RESULT_JSON_TEXT_BYTES, RESULT_JSON_TEXT_HEX),
                              (NON_ASCII_BYTES, NON_ASCII_HEX)):
            self.assertEqual(sha(raw), expected)

    def test_genesis_hash(self):
        self.assertEqual(record.genesis_hash(JOURNAL_ID), GENESIS_HEX)
        self.assertEqual(record.genesis_hash(JOURNAL_ID, SCHEMA), GENESIS_HEX)

    def test_args_hash_and_fingerprint(self):
        self.assertEqual(record.value_hash(ARGS), ARGS_HEX)
        self.assertEqual(record.canonical_bytes(ARGS), ARGS_BYTES)
        self.assertEqual(record.fingerprint("book_trip", ARGS), FINGERPRINT_HEX)

    def test_result_hash_of_string_is_hash_of_json_string(self):
        self.assertEqual(record.value_hash("ok"), RESULT_OK_HEX)
        self.assertEqual(record.value_hash(RESULT_JSON_TEXT), RESULT_JSON_TEXT_HEX)
        # Not the hash of the object the text carries.
        self.assertNotEqual(record.value_hash(RESULT_JSON_TEXT), sha(b'{"status":"ok"}'))

    def test_result_hash_of_null(self):
        self.assertEqual(record.value_hash(None), NULL_HEX)
        self.assertEqual(NO_RESPONSE_HASH, NULL_HEX)

    def test_non_ascii_is_utf8_not_escaped(self):
        self.assertEqual(record.canonical_bytes(NON_ASCII), NON_ASCII_BYTES)
        self.assertEqual(record.value_hash(NON_ASCII), NON_ASCII_HEX)
        self.assertNotIn(b"\\u", record.canonical_bytes(NON_ASCII))

    def test_event_hash(self):
        payload_text = STARTED_PAYLOAD.decode("utf-8")
        self.assertEqual(record.event_hash(GENESIS_HEX, payload_text), sha(EVENT_1_BYTES))
        # The general encoder gives the same bytes as the hand-built fast path.
        self.assertEqual(record.value_hash({"previous": GENESIS_HEX, "payload": payload_text}),
                         sha(EVENT_1_BYTES))

    def test_event_hash_with_non_ascii_and_escapes(self):
        previous = sha(EVENT_1_BYTES)
        outer = (b'{"payload":"{\\"evidence\\":\\"Z\xc3\xbcrich \xe2\x9c\x88\\\\nrow 7\\",'
                 b'\\"kind\\":\\"resolved\\",\\"operation_id\\":\\"0b9f6a1e-5d1c-4f43-9a57-0c1d2e3f4a5b\\",'
                 b'\\"outcome\\":\\"completed\\",\\"schema\\":\\"hermes.crash-recovery.v1\\",'
                 b'\\"timestamp_ns\\":1700000000000000001}","previous":"' + previous.encode() + b'"}')
        self.assertEqual(record.event_hash(previous, RESOLVED_PAYLOAD.decode("utf-8")), sha(outer))

    def test_checkpoint_and_marker_text(self):
        self.assertEqual(
            record.canonical_bytes(record.checkpoint_of(JOURNAL_ID, 0, GENESIS_HEX)),
            b'{"count":0,"head":"0ce6fc0c4176397b590ef7535647aba74c0dbc76fe84f433b13a2c0678ef71b2",'
            b'"journal_id":"123e4567-e89b-42d3-a456-426614174000","schema":"hermes.crash-recovery.v1"}')
        self.assertEqual(record.marker_text(JOURNAL_ID).encode("utf-8"), GENESIS_BYTES + b"\n")

    def test_tuples_encode_like_lists(self):
        self.assertEqual(record.canonical_bytes((1, "x", None)), b'[1,"x",null]')
        self.assertEqual(record.value_hash({"a": (1, (2, 3))}), sha(b'{"a":[1,[2,3]]}'))
        self.assertEqual(record.value_hash({"a": (1, 2)}), record.value_hash({"a": [1, 2]}))

    def test_numbers_and_literals(self):
        self.assertEqual(record.canonical_bytes({"b": True, "a": False, "c": None, "d": 1.5, "e": -0}),
                         b'{"a":false,"b":true,"c":null,"d":1.5,"e":0}')


class CanonicalRefusalTests(unittest.TestCase):
    REFUSED = {
        "nan": float("nan"),
        "inf": float("inf"),
        "-inf": float("-inf"),
        "nested nan": {"a": [1, {"b": float("nan")}]},
        "lone surrogate": "\ud800",
        "lone surrogate key": {"\udfff": 1},
        "bytes": b"secret",
        "bytearray": bytearray(b"x"),
        "set": {1, 2},
        "frozenset": frozenset({"a"}),
        "object": object(),
        "int key": {1: "a"},
        "colliding keys": {1: "a", "1": "b"},
        "bool key": {True: "x"},
        "none key": {None: "x"},
        "nested int key": {"outer": [{"inner": {2: "x"}}]},
        "tuple key": {("a",): 1},
    }

    def test_every_non_canonical_value_is_refused_with_code(self):
        for label, value in self.REFUSED.items():
            with self.subTest(label):
                for function in (record.canonical_text, record.canonical_bytes, record.value_hash):
                    with self.assertRaises(EncodingError) as caught:
                        function(value)
                    self.assertEqual(caught.exception.code, "non_canonical_value")
                    self.assertIsInstance(caught.exception, ValueError)
                with self.assertRaises(EncodingError):
                    record.fingerprint("book_trip", {"x": value})

    def test_deep_nesting_is_refused_not_crashing(self):
        deep = []
        for _ in range(sys.getrecursionlimit() * 4):
            deep = [deep]
        nested_dict = {}
        for _ in range(sys.getrecursionlimit() * 4):
            nested_dict = {"k": nested_dict}
        for value in (deep, nested_dict):
            with self.assertRaises(EncodingError) as caught:
                record.value_hash(value)
            self.assertEqual(caught.exception.code, "non_canonical_value")


class GuardUsesVectorsTests(JournalTestCase):
    """The hashes the guard stores for a real call equal the hand vectors."""

    def rows(self):
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        try:
            return connection.execute("SELECT seq, payload, previous, hash FROM events "
                                      "ORDER BY seq").fetchall()
        finally:
            connection.close()

    def test_stored_hashes_match_hand_vectors(self):
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args=dict(ARGS),
                                              next_call=lambda: "ok", session_id="s-1",
                                              tool_call_id="call-1"), "ok")
        with self.assertRaises(RuntimeError):
            def explode():
                raise RuntimeError("boom")
            guard.tool_execution(tool_name="book_trip", args=dict(ARGS), next_call=explode,
                                 session_id="s-1", tool_call_id="call-2")
        rows = self.rows()
        self.assertEqual([row[0] for row in rows], [1, 2, 3, 4])
        payloads = [json.loads(row[1]) for row in rows]
        self.assertEqual(payloads[0]["args_hash"], ARGS_HEX)
        self.assertEqual(payloads[0]["fingerprint"], FINGERPRINT_HEX)
        self.assertEqual(payloads[1]["result_hash"], RESULT_OK_HEX)
        self.assertEqual(payloads[3]["result_hash"], NULL_HEX)
        with open(os.path.join(self.data_dir, "initialized"), "rb") as stream:
            marker = json.loads(stream.read())
        genesis = sha(b'{"journal_id":"' + marker["journal_id"].encode()
                      + b'","schema":"hermes.crash-recovery.v1"}')
        self.assertEqual(rows[0][2], genesis)
        for index, (seq, payload, previous, stored) in enumerate(rows):
            # The payload is stored canonically: sorted keys, no spaces, raw UTF-8.
            self.assertNotIn(", ", payload)
            self.assertEqual(list(json.loads(payload)), sorted(json.loads(payload)))
            if index:
                self.assertEqual(previous, rows[index - 1][3])
            escaped = payload.replace("\\", "\\\\").replace('"', '\\"')
            self.assertEqual(stored, sha(('{"payload":"%s","previous":"%s"}'
                                          % (escaped, previous)).encode("utf-8")))
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
