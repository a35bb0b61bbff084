"""register(ctx) (docs/guard.md §Inside Hermes, §Inspection tools) against a stub host, loaded the way Hermes
loads a directory plugin (a package named hermes_plugins.crash_recovery)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

from support import REPO, JournalTestCase

PACKAGE = "hermes_plugins.crash_recovery"
TOOL_NAMES = ("crash_recovery_status", "crash_recovery_verify")
# What Hermes needs to load a directory plugin, plus the modules it imports.
PLUGIN_FILES = ("plugin.yaml", *sorted(name for name in os.listdir(REPO) if name.endswith(".py")))
# The runtime's layers: every folder of the plugin that is a Python package.
PLUGIN_FOLDERS = tuple(sorted(name for name in os.listdir(REPO)
                              if os.path.isfile(os.path.join(REPO, name, "__init__.py"))
                              and name != "tests"))


class StubContext:
    """Records every registration; like Hermes 0.19.0 it has no get_config."""

    def __init__(self):
        self.calls = []

    def register_middleware(self, kind, callback):
        self.calls.append(("middleware", kind, callback))

    def register_hook(self, hook_name, callback):
        self.calls.append(("hook", hook_name, callback))

    def register_tool(self, name, toolset, schema, handler, check_fn=None, requires_env=None,
                      is_async=False, description="", emoji="", override=False):
        self.calls.append(("tool", name, dict(toolset=toolset, schema=schema, handler=handler,
                                              check_fn=check_fn, is_async=is_async,
                                              description=description, override=override)))

    def __getattr__(self, name):
        # Any other host method would be a surprise: record it and fail loudly.
        raise AttributeError(f"StubContext has no {name}")


class ConfigContext(StubContext):
    """A newer host: settings through ctx.get_config."""

    def __init__(self, settings):
        super().__init__()
        self.settings = settings
        self.config_reads = []

    def get_config(self, key, default=None):
        self.config_reads.append((key, default))
        return self.settings.get(key, default)


def load_package(directory=REPO, name=PACKAGE):
    """Import ``directory`` as the package ``name`` (Hermes' _load_directory_module)."""
    parent_name = name.rpartition(".")[0]
    if parent_name not in sys.modules:
        parent = types.ModuleType(parent_name)
        parent.__path__ = []
        sys.modules[parent_name] = parent
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(directory, "__init__.py"), submodule_search_locations=[directory])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def unload_package(name=PACKAGE):
    for module_name in list(sys.modules):
        if module_name == name or module_name.startswith(name + ".") or module_name == "hermes_plugins":
            del sys.modules[module_name]


def fake_host_modules(hermes_home, plugin_data_dir=None, raw_config=None):
    """sys.modules entries standing in for the host: ``hermes_constants``,
    ``plugins.plugin_storage`` (None = absent, like 0.19.0), ``hermes_cli.config``."""
    constants = types.ModuleType("hermes_constants")
    constants.get_hermes_home = lambda: Path(hermes_home)
    modules = {"hermes_constants": constants, "plugins.plugin_storage": None}
    if plugin_data_dir is not None:
        storage = types.ModuleType("plugins.plugin_storage")

        def data_dir(name):
            path = Path(plugin_data_dir) / name
            path.mkdir(parents=True, exist_ok=True)
            return path

        storage.plugin_data_dir = data_dir
        modules["plugins.plugin_storage"] = storage
    cli = types.ModuleType("hermes_cli")
    config = types.ModuleType("hermes_cli.config")
    config.read_raw_config = lambda: raw_config
    cli.config = config
    modules.update({"hermes_cli": cli, "hermes_cli.config": config})
    return modules


class RegisterTests(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.addCleanup(unload_package)
        self.plugin = load_package()
        self.home = os.path.join(self.root, "home")
        os.makedirs(self.home)

    def registered(self, ctx):
        self.plugin.register(ctx)
        return ctx.calls

    def test_relative_imports_resolve_inside_the_package(self):
        self.assertEqual(self.plugin.__name__, PACKAGE)
        for submodule in ("guard", "journal", "classify", "storage.call_lock", "reports.messages",
                          "admission.gate", "reconciliation.commands", "host.hermes"):
            self.assertIn(f"{PACKAGE}.{submodule}", sys.modules)
        self.assertEqual(self.plugin.RecoveryGuard.__module__, f"{PACKAGE}.guard")
        guard_module = sys.modules[f"{PACKAGE}.guard"]
        self.assertEqual(guard_module.Journal.__module__, f"{PACKAGE}.journal")
        self.assertEqual(guard_module.is_error_response.__module__, f"{PACKAGE}.classify")
        self.assertEqual(guard_module.command_line.__module__, f"{PACKAGE}.reports.messages")
        self.assertEqual(guard_module.Gate.__module__, f"{PACKAGE}.admission.gate")

    def test_registers_exactly_middleware_two_hooks_and_two_tools(self):
        calls = self.registered(StubContext())
        self.assertEqual([(kind, name) for kind, name, _ in calls],
                         [("middleware", "tool_execution"), ("hook", "pre_tool_call"),
                          ("hook", "post_tool_call"), ("tool", "crash_recovery_status"),
                          ("tool", "crash_recovery_verify")])
        middleware, hook, observer = calls[0][2], calls[1][2], calls[2][2]
        self.assertIs(middleware.__self__, hook.__self__)  # one guard for both gates
        self.assertIs(observer.__self__, hook.__self__)  # and for the host's refusal reports
        for _, name, options in calls[3:]:
            self.assertEqual(options["schema"]["name"], name)
            self.assertEqual(options["schema"]["parameters"]["type"], "object")
            self.assertTrue(options["schema"]["description"])
            self.assertFalse(options["is_async"])
            self.assertFalse(options["override"])
            self.assertIs(options["handler"].__self__, middleware.__self__)

    def test_registration_touches_no_disk(self):
        environment = {"HOME": self.home, "HERMES_HOME": self.home}
        with mock.patch.dict(os.environ, environment), \
                mock.patch.dict(sys.modules, fake_host_modules(self.home)):
            self.registered(StubContext())
            self.registered(ConfigContext({"read_only_tools": ["x"]}))
        self.assertEqual(os.listdir(self.home), [])

    def test_registration_reads_no_settings(self):
        ctx = ConfigContext({"read_only_tools": ["lookup_receipt"]})
        self.registered(ctx)
        self.assertEqual(ctx.config_reads, [])  # read lazily, at the first call

    def test_settings_via_get_config(self):
        ctx = ConfigContext({"read_only_tools": ["lookup_receipt"], "busy_timeout": 2})
        guard = self.registered(ctx)[0][2].__self__
        self.assertEqual(ctx.config_reads, [])  # registration reads nothing
        settings = guard.settings()
        self.assertEqual((settings.mode, settings.tools, settings.busy_timeout, settings.problem),
                         ("read_only_tools", frozenset({"lookup_receipt"}), 2.0, None))
        self.assertIn(("read_only_tools", None), ctx.config_reads)
        self.assertTrue(guard.is_protected("read_file"))
        self.assertFalse(guard.is_protected("lookup_receipt"))

    def test_get_config_without_the_key_keeps_defaults(self):
        guard = self.registered(ConfigContext({}))[0][2].__self__
        self.assertEqual(guard.settings().tools, frozenset({"read_file", "search_files"}))
        self.assertFalse(any(guard.is_protected(name) for name in TOOL_NAMES))

    def test_settings_via_host_config_loader_without_get_config(self):
        def entry(settings, subtree="settings"):
            return {"plugins": {"entries": {"crash-recovery": {subtree: settings}}}}

        cases = [
            (entry({"read_only_tools": ["lookup_receipt"]}), "read_only_tools",
             {"lookup_receipt"}, None),
            (entry({"read_only_tools": ["legacy_tool"]}, "config"), "read_only_tools",
             {"legacy_tool"}, None),
            # what `hermes config set ... '["a","b"]'` stores: a string
            (entry({"protected_tools": '["book_trip", "send_payment"]'}), "protected_tools",
             {"book_trip", "send_payment"}, None),
            (entry({"protected_tools": "book_trip, send_payment"}), "protected_tools",
             {"book_trip", "send_payment"}, None),
            (entry({"read_only_tool": ["read_file"]}), "read_only_tools", set(), "read_only_tool"),
            ({}, "read_only_tools", {"read_file", "search_files"}, None),
            (None, "read_only_tools", {"read_file", "search_files"}, None),
        ]
        for raw_config, mode, tools, problem in cases:
            with self.subTest(raw_config=raw_config):
                with mock.patch.dict(sys.modules, fake_host_modules(self.home, raw_config=raw_config)):
                    guard = self.registered(StubContext())[0][2].__self__
                    settings = guard.settings()
                    self.assertEqual((settings.mode, settings.tools), (mode, frozenset(tools)))
                    if problem is None:
                        self.assertIsNone(settings.problem)
                    else:
                        self.assertIn(problem, settings.problem)

    def test_data_dir_from_hermes_home(self):
        ctx = StubContext()
        with mock.patch.dict(sys.modules, fake_host_modules(self.home)):
            calls = self.registered(ctx)
            middleware = calls[0][2]
            ran = []
            self.assertEqual(middleware(tool_name="book_trip", args={"to": "LIS"},
                                        next_call=lambda: ran.append(1) or "ok",
                                        session_id="s", tool_call_id="c", task_id="t"), "ok")
            self.assertEqual(ran, [1])
            status_handler = calls[3][2]["handler"]
            status = json.loads(status_handler({}, task_id="t", session_id="s", user_task="u"))
        data_dir = os.path.join(self.home, "plugin-data", "crash-recovery")
        self.assertNotIn("data_dir", status)  # no path reaches a chat
        self.assertEqual((status["ok"], status["integrity"], status["unresolved"]), (True, "ok", []))
        self.assertVerifies(data_dir)

    def test_data_dir_from_plugin_storage(self):
        storage_root = os.path.join(self.root, "storage")
        with mock.patch.dict(sys.modules, fake_host_modules(self.home,
                                                            plugin_data_dir=storage_root)):
            calls = self.registered(StubContext())
            calls[0][2](tool_name="book_trip", args={}, next_call=lambda: "ok")
        self.assertVerifies(os.path.join(storage_root, "crash-recovery"))
        self.assertEqual(os.listdir(self.home), [])

    def test_tool_handlers_return_json_strings(self):
        with mock.patch.dict(sys.modules, fake_host_modules(self.home)):
            calls = self.registered(StubContext())
            middleware = calls[0][2]
            handlers = {name: options["handler"] for kind, name, options in calls if kind == "tool"}
            middleware(tool_name="book_trip", args={}, next_call=lambda: "ok")
            status = json.loads(handlers["crash_recovery_status"]({}, task_id="t"))
            verified = json.loads(handlers["crash_recovery_verify"]({}, task_id="t"))
            checkpoint = verified["checkpoint"]
            genesis = dict(checkpoint, count=0, head=sys.modules[f"{PACKAGE}.journal"].genesis_hash(
                checkpoint["journal_id"]))
            ancestor = json.loads(handlers["crash_recovery_verify"]({"checkpoint": genesis}))
            not_ancestor = json.loads(handlers["crash_recovery_verify"](
                {"checkpoint": dict(genesis, head=checkpoint["head"])}))
            foreign = json.loads(handlers["crash_recovery_verify"](
                {"checkpoint": dict(checkpoint, journal_id="00000000-0000-4000-8000-000000000000")}))
            # Inspection tools are exempt even when called through the middleware.
            through = middleware(tool_name="crash_recovery_status", args={},
                                 next_call=lambda: handlers["crash_recovery_status"]({}))
        self.assertEqual((status["ok"], status["unresolved"]), (True, []))
        self.assertEqual((verified["ok"], verified["integrity"], checkpoint["count"]), (True, "ok", 2))
        self.assertEqual((ancestor["ok"], ancestor["external_checkpoint"]), (True, "ancestor"))
        self.assertEqual((not_ancestor["ok"], not_ancestor["integrity"]),
                         (False, "checkpoint_not_ancestor"))
        self.assertEqual((foreign["ok"], foreign["integrity"]), (False, "checkpoint_not_ancestor"))
        self.assertEqual(json.loads(through)["ok"], True)
        self.assertVerifies(os.path.join(self.home, "plugin-data", "crash-recovery"))

    def test_handlers_outside_hermes_report_instead_of_raising(self):
        # No host modules at all: the data directory cannot be resolved.
        with mock.patch.dict(sys.modules, {"hermes_constants": None, "plugins.plugin_storage": None,
                                           "hermes_cli": None, "hermes_cli.config": None}), \
                self.assertLogs(f"{PACKAGE}.guard", "WARNING"):  # settings unreadable
            calls = self.registered(StubContext())
            results = [json.loads(options["handler"]({})) for kind, _, options in calls
                       if kind == "tool"]
            blocked = json.loads(calls[0][2](tool_name="book_trip", args={}, next_call=lambda: "ran"))
            directive = calls[1][2](tool_name="book_trip", args={}, session_id="s", tool_call_id="c")
        for result in results:
            self.assertEqual((result["ok"], result["integrity"]), (False, "storage_unavailable"))
        self.assertEqual((blocked["blocked"], blocked["code"]), (True, "storage_unavailable"))
        self.assertEqual(directive["action"], "block")
        self.assertEqual(json.loads(directive["message"])["code"], "storage_unavailable")


class InstalledLayoutTests(unittest.TestCase):
    """The plugin copied to $HERMES_HOME/plugins/crash-recovery/ and imported in a
    fresh, isolated interpreter: no checkout on sys.path, so a relative import
    that only worked through the top-level fallback would fail here."""

    def test_loads_from_hyphenated_directory_in_isolated_interpreter(self):
        root = tempfile.mkdtemp(prefix="crash-recovery-install-")
        self.addCleanup(shutil.rmtree, root, True)
        plugin_dir = os.path.join(root, "home", "plugins", "crash-recovery")
        os.makedirs(plugin_dir)
        for name in PLUGIN_FILES:
            shutil.copy(os.path.join(REPO, name), plugin_dir)
        for name in PLUGIN_FOLDERS:
            shutil.copytree(os.path.join(REPO, name), os.path.join(plugin_dir, name),
                            ignore=shutil.ignore_patterns("__pycache__"))
        home = os.path.join(root, "home")
        script = f"""
import importlib.util, json, os, sys, types
assert {REPO!r} not in sys.path
sys.modules["hermes_plugins"] = types.ModuleType("hermes_plugins")
sys.modules["hermes_plugins"].__path__ = []
constants = types.ModuleType("hermes_constants")
constants.get_hermes_home = lambda: {home!r}
sys.modules["hermes_constants"] = constants
sys.modules["plugins.plugin_storage"] = None
spec = importlib.util.spec_from_file_location(
    "hermes_plugins.crash_recovery", os.path.join({plugin_dir!r}, "__init__.py"),
    submodule_search_locations=[{plugin_dir!r}])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
calls = []
class Ctx:
    def register_middleware(self, kind, cb): calls.append(("middleware", kind, cb))
    def register_hook(self, name, cb): calls.append(("hook", name, cb))
    def register_tool(self, name, toolset, schema, handler, **kw): calls.append(("tool", name, handler))
module.register(Ctx())
before = sorted(os.listdir({home!r}))
result = calls[0][2](tool_name="book_trip", args={{"to": "LIS"}}, next_call=lambda: "booked",
                     session_id="s", tool_call_id="c")
print(json.dumps({{"registered": [c[:2] for c in calls], "before": before, "result": result,
                  "modules": sorted(m for m in sys.modules if m in ("guard", "journal", "storage", "admission",
                                                                    "reports", "host", "reconciliation",
                                                                    "classify", "owner", "record",
                                                                    "chain", "durable", "database",
                                                                    "errors", "crash_recovery"))}}))
"""
        completed = subprocess.run([sys.executable, "-I", "-c", script], cwd=root,
                                   capture_output=True, text=True, timeout=60)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        output = json.loads(completed.stdout)
        self.assertEqual(output["registered"],
                         [["middleware", "tool_execution"], ["hook", "pre_tool_call"],
                          ["hook", "post_tool_call"], ["tool", "crash_recovery_status"],
                          ["tool", "crash_recovery_verify"]])
        self.assertEqual(output["before"], ["plugins"])  # registration wrote nothing
        self.assertEqual(output["result"], "booked")
        self.assertEqual(output["modules"], [])  # no top-level fallback imports
        from support import reference
        report = reference.verify(os.path.join(home, "plugin-data", "crash-recovery"))
        self.assertTrue(report.ok, report.errors)
        self.assertEqual(report.kinds(), ["started", "returned"])


if __name__ == "__main__":
    unittest.main()
