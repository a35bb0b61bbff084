"""The same settings give the same protection on every Hermes host
(docs/guard.md §Settings, "The same on every host"): the ``settings``
subtree wins whole over a leftover legacy ``config`` subtree, even where the
host's ``ctx.get_config`` falls back key by key (0.20+); a ``${VAR}`` the host
did not expand (0.19, or an unset variable) fails closed and says so; a tool
list stored as a string (``hermes config set`` on 0.19/0.20) or as a real list
(0.22) reads the same.  The real hosts are in tests/test_host_refusals.py."""
from __future__ import annotations

import os
import sys
import types
import unittest
from unittest import mock

import support  # noqa: F401  (loads the checkout as crash_recovery)

from crash_recovery.admission.settings import parse_settings
from crash_recovery.host.hermes import settings_reader


def hermes_config(entry):
    """``hermes_cli.config`` whose ``read_raw_config`` returns a profile with
    ``entry`` as the plugin's entry, as written."""
    cli = types.ModuleType("hermes_cli")
    config = types.ModuleType("hermes_cli.config")
    config.read_raw_config = lambda: {"plugins": {"entries": {"crash-recovery": entry}}}
    cli.config = config
    return {"hermes_cli": cli, "hermes_cli.config": config}


class NewerHostContext:
    """``ctx.get_config`` as Hermes 0.20.1 and 0.22.2 implement it: the
    ``settings`` value, else the legacy ``config`` value of the same key, with
    ``${VAR}`` expanded from the environment (unset ones kept as written)."""

    def __init__(self, entry):
        self.entry = entry

    def get_config(self, key, default=None):
        for subtree in ("settings", "config"):
            values = self.entry.get(subtree)
            if isinstance(values, dict) and key in values:
                return self.expand(values[key])
        return default

    def expand(self, value):
        if isinstance(value, list):
            return [self.expand(item) for item in value]
        return os.path.expandvars(value) if isinstance(value, str) else value


class OldHostContext:
    """Hermes 0.19: no ``get_config``."""


def read_on(host, entry):
    with mock.patch.dict(sys.modules, hermes_config(entry)):
        return parse_settings(settings_reader(host(entry) if host is NewerHostContext
                                              else host())())


class SettingsAcrossHostsTests(unittest.TestCase):

    def test_leftover_legacy_config_beside_settings_is_not_both_modes(self):
        entry = {"settings": {"protected_tools": ["send_payment"]},
                 "config": {"read_only_tools": ["read_file"], "busy_timeout": 9}}
        for host in (NewerHostContext, OldHostContext):
            with self.subTest(host=host.__name__):
                parsed = read_on(host, entry)
                self.assertIsNone(parsed.problem)
                self.assertEqual((parsed.mode, sorted(parsed.tools), parsed.busy_timeout),
                                 ("protected_tools", ["send_payment"], 5))

    def test_legacy_config_alone_is_still_read(self):
        entry = {"config": {"protected_tools": ["send_payment"]}}
        for host in (NewerHostContext, OldHostContext):
            with self.subTest(host=host.__name__):
                parsed = read_on(host, entry)
                self.assertEqual((parsed.mode, sorted(parsed.tools), parsed.problem),
                                 ("protected_tools", ["send_payment"], None))

    def test_variable_reference_expanded_by_the_host_protects_that_tool(self):
        entry = {"settings": {"protected_tools": ["${PAY_TOOL}"]}}
        with mock.patch.dict(os.environ, {"PAY_TOOL": "send_payment"}):
            parsed = read_on(NewerHostContext, entry)
        self.assertEqual((sorted(parsed.tools), parsed.problem), (["send_payment"], None))

    def test_unexpanded_variable_reference_fails_closed_and_says_so(self):
        entry = {"settings": {"protected_tools": ["${PAY_TOOL}"]}}
        environment = {key: value for key, value in os.environ.items() if key != "PAY_TOOL"}
        with mock.patch.dict(os.environ, environment, clear=True):
            for host in (NewerHostContext, OldHostContext):  # unset, or 0.19
                with self.subTest(host=host.__name__):
                    parsed = read_on(host, entry)
                    self.assertIn("unexpanded ${...} reference", parsed.problem)
                    self.assertTrue(parsed.is_protected("send_payment"))
                    self.assertTrue(parsed.is_protected("anything_else"))

    def test_tool_list_as_string_or_list_reads_the_same(self):
        as_string = read_on(OldHostContext, {"settings": {"protected_tools": '["a", "b"]'}})
        as_list = read_on(NewerHostContext, {"settings": {"protected_tools": ["a", "b"]}})
        self.assertEqual(as_string, as_list)
        self.assertIsNone(as_list.problem)

    def test_a_settings_subtree_that_is_not_a_mapping_stays_a_problem(self):
        parsed = read_on(NewerHostContext, {"settings": "protected_tools: [a]",
                                            "config": {"protected_tools": ["a"]}})
        self.assertIn("must be a mapping", parsed.problem)


if __name__ == "__main__":
    unittest.main()
