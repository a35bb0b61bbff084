"""Only a person settles: the writing operator commands refuse to run from
inside an agent of the profile (docs/cli.md §Who may settle), and every
operator event records how it was run and who ran it from the OS.

Real processes and /proc: a command whose ancestor has the journal open (a
worker running the guard) or that carries Hermes' markers for a tool's
subprocess is refused with ``run_by_agent`` and changes nothing; the same
command from the operator's own shell works and records ``via: cli`` and the
uid with the password database's name for it (never ``$USER``).
"""
from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import unittest

from support import OPERATOR_CLI, TESTS, operator_argv, run_cli
from test_operator import OperatorTestCase

from crash_recovery.reconciliation import caller
from crash_recovery.reconciliation.caller import TOOL_SUBPROCESS_MARKERS, peer_caller

LINUX = os.path.isdir("/proc/self/fd")
EVIDENCE = "no charge for session U in the bank portal, checked 07:55"


@unittest.skipUnless(LINUX, "reads /proc (Linux)")
class FromInsideAnAgent(OperatorTestCase):
    """This test process holds the journal open through a guard, as a worker
    does; a command it starts is a command of that worker's tools."""

    def setUp(self):
        super().setUp()
        self.operation_id = self.make_uncertain()
        self.worker = self.guard()
        self.worker.status_report()  # the worker has the journal open now

    def refused(self, *words, env=None):
        before = self.snapshot()
        code, document, text = run_cli(self.data_dir, *words, env=env, from_here=True)
        self.assertEqual((code, document["error"]["code"]), (1, "run_by_agent"), text)
        self.assertEqual(self.snapshot(), before)
        return document["error"]

    def test_every_writing_command_is_refused_and_changes_nothing(self):
        for words in (("resolve", self.operation_id, "--outcome", "not_applied", "--evidence",
                       EVIDENCE),
                      ("resolve", self.operation_id, "--outcome", "completed", "--evidence",
                       EVIDENCE, "--force"),
                      ("acknowledge", self.operation_id, "--evidence", EVIDENCE),
                      ("repair-checkpoint", "--evidence", EVIDENCE),
                      ("restart-journal", "--evidence", EVIDENCE),
                      ("archive",)):
            with self.subTest(command=words[0]):
                error = self.refused(*words)
                self.assertEqual(error["agent"]["pid"], os.getpid())
                self.assertIn("run this from your own shell", error["message"])
                self.assertIn("has this profile's journal open", error["message"])
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "operator.log")))

    def test_a_cleaned_environment_does_not_hide_the_parent(self):
        self.refused("resolve", self.operation_id, "--outcome", "not_applied", "--evidence",
                     EVIDENCE, env={"PATH": os.environ.get("PATH", "")})

    def test_reading_commands_still_answer(self):
        code, document, text = run_cli(self.data_dir, "show", self.operation_id, from_here=True)
        self.assertEqual((code, document["operation"]["state"]), (0, "uncertain"), text)

    def test_the_same_command_from_the_operators_own_shell_works_and_says_who(self):
        forged = dict(os.environ, USER="mallory", LOGNAME="mallory")
        code, document, text = run_cli(self.data_dir, "resolve", self.operation_id, "--outcome",
                                       "not_applied", "--evidence", EVIDENCE, env=forged)
        self.assertEqual(code, 0, text)
        expected = {"via": "cli", "uid": os.getuid(), "user": pwd.getpwuid(os.getuid()).pw_name,
                    "host": socket.gethostname()}
        self.worker.close()
        [resolved] = [event for event in self.assertVerifies().events
                      if event["kind"] == "resolved"]
        self.assertEqual(resolved["operator"], expected)
        [logged] = self.operator_log()
        self.assertEqual(logged["operator"], expected)


@unittest.skipUnless(LINUX, "reads /proc (Linux)")
class HermesMarkers(OperatorTestCase):
    """A command started from an agent's terminal or code tool carries the
    variables Hermes sets for them, wherever its parent chain was cut."""

    def setUp(self):
        super().setUp()
        self.operation_id = self.make_uncertain()

    def from_own_shell(self, **variables):
        return run_cli(self.data_dir, "resolve", self.operation_id, "--outcome", "not_applied",
                       "--evidence", EVIDENCE, env=dict(os.environ, **variables))

    def test_each_marker_is_recognised_after_a_double_fork(self):
        markers = [(name, value or "1") for name, value in TOOL_SUBPROCESS_MARKERS.items()]
        markers += [("HERMES_AGENT", "true"), ("AI_AGENT", "hermes-agent")]
        for name, value in markers:
            with self.subTest(marker=name):
                code, document, text = self.from_own_shell(**{name: value})
                self.assertEqual((code, document["error"]["code"]), (1, "run_by_agent"), text)
                self.assertIn(name, document["error"]["message"])
        self.assertEqual(self.cli("status")["unresolved"][0]["operation_id"], self.operation_id)

    def test_another_agents_name_and_a_persons_terminal_setting_are_not_markers(self):
        code, document, text = self.from_own_shell(AI_AGENT="some-other-harness",
                                                   TERMINAL_ENV="docker")
        self.assertEqual(code, 0, text)

    def test_markers_in_an_ancestors_environment_count_too(self):
        # A tool's shell (markers) runs `env -i python3 operator_cli.py ...`.
        shell = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.run("
                 "['env', '-i', 'PATH=/usr/bin:/bin'] + sys.argv[1:]).returncode)",
                 sys.executable, OPERATOR_CLI, "--data-dir", self.data_dir, "resolve",
                 self.operation_id, "--outcome", "not_applied", "--evidence", EVIDENCE]
        completed = subprocess.run(operator_argv(shell, ["resolve"]), capture_output=True,
                                   text=True, env=dict(os.environ, HERMES_RPC_TOKEN="t"),
                                   timeout=60)
        self.assertEqual(json.loads(completed.stdout)["error"]["code"], "run_by_agent",
                         completed.stdout + completed.stderr)


@unittest.skipUnless(LINUX, "reads /proc/net/tcp (Linux)")
class DashboardPeers(OperatorTestCase):
    """The process behind a loopback TCP connection is found and examined."""

    PEER = ("import socket, sys\n"
            "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
            "sys.stdout.write('connected\\n'); sys.stdout.flush(); sys.stdin.read()")

    def connect(self, family, host):
        server = socket.socket(family, socket.SOCK_STREAM)
        self.addCleanup(server.close)
        server.bind((host, 0))
        server.listen(1)
        peer = subprocess.Popen([sys.executable, "-c", self.PEER, host,
                                 str(server.getsockname()[1])], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(self._reap, peer)
        connection, client = server.accept()
        self.addCleanup(connection.close)
        self.assertEqual(peer.stdout.readline(), "connected\n")
        return peer, client[:2], connection.getsockname()[:2]

    def test_the_peer_process_of_ipv4_and_ipv6_connections(self):
        self.make_uncertain()
        guard = self.guard()
        guard.status_report()  # this process, the peer's parent, has the journal open
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with self.subTest(host=host):
                peer, client, server = self.connect(family, host)
                found = peer_caller(client, server)
                self.assertEqual((found.problem, found.peer["pid"], found.peer["uid"]),
                                 (None, peer.pid, os.getuid()))
                evidence = found.agent_evidence(self.data_dir)
                self.assertEqual(evidence.pid, os.getpid())
        guard.close()
        peer, client, server = self.connect(socket.AF_INET, "127.0.0.1")
        self.assertIsNone(peer_caller(client, server).agent_evidence(self.data_dir))

    def test_a_loopback_peer_that_cannot_be_found_is_refused(self):
        found = peer_caller(("127.0.0.1", 1), ("127.0.0.1", 2))
        self.assertEqual(found.problem, "the process that sent this request could not be found")

    def test_a_remote_peer_has_no_process_here(self):
        found = peer_caller(("192.0.2.7", 50000), ("192.0.2.1", 9119))
        self.assertEqual((found.problem, found.start_pid, found.peer), (None, None, None))


class Identity(unittest.TestCase):

    def test_the_name_comes_from_the_password_database_never_the_environment(self):
        saved = dict(os.environ)
        self.addCleanup(os.environ.update, saved)
        os.environ.update(USER="mallory", LOGNAME="mallory")
        self.assertEqual(caller.os_identity()["user"], pwd.getpwuid(os.getuid()).pw_name)
        self.assertIsNone(caller.user_name(2 ** 31 - 3))  # a uid with no name


if __name__ == "__main__":
    unittest.main()
