"""The crash-recovery page in a real browser: headless Chromium (Debian's
package) against the real ``hermes dashboard`` of 0.19.0 on 127.0.0.1, the
plugin installed as a copied directory, operations made by real protected
calls in worker processes, everything done by clicking and typing as an
operator would.

Screenshots of each state go to ``$CRASH_RECOVERY_ARTIFACTS`` (default: a new
temporary directory, kept).  The Hermes installed beside this interpreter must
ship its built web UI (0.19.0 does; 0.20.1's wheel has none: its routes are
tested through HTTP in tests/test_dashboard_api.py).  Skips, saying why,
without Hermes or Chromium, unless CRASH_RECOVERY_REQUIRE_HOST=1 /
CRASH_RECOVERY_REQUIRE_BROWSER=1::

    /work/venvs/h019/bin/python -m unittest tests.test_dashboard_browser -v
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

from support import JournalTestCase, reference, run_cli
from cdp_browser import Browser, chromium_program
from dashboard_support import (PROFILE, REQUIRE_HOST, Dashboard, HeldCall, dashboard_program,
                               data_dir_of, has_web_ui, make_home, run_worker)

REQUIRE_BROWSER = os.environ.get("CRASH_RECOVERY_REQUIRE_BROWSER", "") == "1"
PROGRAM, MISSING = dashboard_program()
CHROMIUM = chromium_program()
FRAME_WAIT_SECONDS = 60


def setUpModule():
    if PROGRAM is None:
        if REQUIRE_HOST:
            raise RuntimeError(f"CRASH_RECOVERY_REQUIRE_HOST=1 but {MISSING}")
        raise unittest.SkipTest(MISSING)
    if not has_web_ui():
        raise unittest.SkipTest("this Hermes wheel ships no built web UI (the API routes are "
                                "tested through HTTP in test_dashboard_api)")
    try:
        import websockets.sync.client  # noqa: F401
    except ImportError as exc:
        problem = f"no websockets client for the DevTools protocol ({exc})"
    else:
        problem = None if CHROMIUM else "no chromium on PATH (apt-get install chromium)"
    if problem:
        if REQUIRE_BROWSER:
            raise RuntimeError(f"CRASH_RECOVERY_REQUIRE_BROWSER=1 but {problem}")
        raise unittest.SkipTest(problem)


def gate_is(state: str) -> str:
    return f"document.querySelector('[data-testid=cr-gate]')?.dataset.gate === '{state}'"


def shown(test_id: str) -> str:
    return f"!!document.querySelector('[data-testid=\"{test_id}\"]')"


def gone(test_id: str) -> str:
    return f"!document.querySelector('[data-testid=\"{test_id}\"]')"


class OperatorInTheBrowser(JournalTestCase):
    """An operator settles stuck calls on the page; the banner follows the gate."""

    def setUp(self):
        super().setUp()
        self.artifacts = os.environ.get("CRASH_RECOVERY_ARTIFACTS") or tempfile.mkdtemp(
            prefix="crash-recovery-screenshots-")
        os.makedirs(self.artifacts, exist_ok=True)
        self.shots = []

    def open_dashboard(self, home: str) -> None:
        """The real dashboard for the Hermes home ``home``, and a browser."""
        self.data_dir = data_dir_of(home)
        self.dashboard = Dashboard(PROGRAM, home, os.path.join(self.root, "dashboard.log"))
        self.addCleanup(self.dashboard.stop)
        self.browser = Browser(CHROMIUM, width=1280, height=1500)
        self.addCleanup(self.browser.close)

    def shot(self, name: str) -> None:
        path = os.path.join(self.artifacts, f"dashboard-{self.id().rsplit('.', 1)[1][5:25]}-"
                                            f"{len(self.shots) + 1:02d}-{name}.png")
        self.browser.screenshot(path)
        self.shots.append(path)

    def open_tab(self) -> None:
        self.browser.navigate(self.dashboard.url + "/crash-recovery")
        self.browser.wait_for(shown("cr-gate") + " && document.querySelector("
                              "'[data-testid=cr-gate]').dataset.gate !== 'loading'", "the gate")

    def test_an_operator_settles_every_stuck_call_from_the_page(self):
        self.open_dashboard(make_home(self.root))
        page = self.browser
        # 0. No protected call yet: healthy, and nothing on the page says otherwise.
        self.open_tab()
        page.wait_for(gate_is("open"), "gate open on a fresh profile")
        self.assertIn("no journal yet", page.text_of("cr-integrity"))
        self.assertFalse(page.evaluate("document.body.innerText.includes('journal_absent')"))
        self.assertEqual(page.evaluate("document.querySelector('[data-testid=cr-gate]')"
                                       ".dataset.needsPerson"), "false")
        self.shot("fresh-profile")
        # 1. A payment whose service answered with an error: uncertain.
        run_worker("error", self.data_dir, "send_payment", "call-payment")
        (uncertain,) = run_cli(self.data_dir, "status")[1]["unresolved"]
        uncertain = uncertain["operation_id"]
        self.open_tab()
        page.wait_for(gate_is("closed"), "gate closed")
        self.assertEqual(page.text_of("cr-profile"), PROFILE)
        self.assertEqual(page.text_of(f"cr-op-state-{uncertain}"), "uncertain")
        self.assertIn("send_payment", page.text_of(f"cr-op-{uncertain}"))
        self.assertIn("error_response", page.text_of(f"cr-op-{uncertain}"))
        page.wait_for(shown("cr-banner"), "the banner")
        self.shot("uncertain-payment")

        # The banner is on every page, and leads to the tab.
        page.navigate(self.dashboard.url + "/sessions")
        page.wait_for(shown("cr-banner"), "the banner on the sessions page")
        self.assertIn(f"protected tools are blocked in profile {PROFILE}",
                      page.text_of("cr-banner"))
        self.shot("banner-on-another-page")
        page.follow("cr-banner-link")
        page.wait_for(shown(f"cr-op-{uncertain}"), "the tab, from the banner")

        # 2. Settling needs evidence: the CLI's refusal, the gate stays closed.
        page.click(f"cr-settle-open-{uncertain}")
        page.click(f"cr-outcome-not_applied-{uncertain}")
        page.type_into(f"cr-evidence-{uncertain}", "   ")
        page.click(f"cr-submit-{uncertain}")
        page.wait_for(f"document.querySelector('[data-testid=\"cr-answer-{uncertain}\"]')"
                      "?.dataset.code === 'invalid_evidence'", "invalid_evidence")
        page.wait_for(gate_is("closed"))
        self.shot("evidence-required")
        page.type_into(f"cr-evidence-{uncertain}", "no charge in the ledger for call-payment")
        page.click(f"cr-submit-{uncertain}")
        page.wait_for(gate_is("open"), "gate open after settling")
        page.wait_for(gone("cr-banner"), "no banner once all is settled")
        self.shot("settled-gate-open")

        # 3. A booking still running: nothing to settle; only force is offered,
        # the form says why, and it records nothing until force is ticked.
        held = HeldCall(self.data_dir, "book_trip", "call-trip")
        try:
            page.wait_for(gate_is("busy"), "gate busy")
            self.assertEqual(page.text_of(f"cr-op-owner-{held.operation_id}"),
                             f"running (pid {held.process.pid})")
            self.assertIn("nothing to settle while it runs",
                          page.text_of(f"cr-op-running-{held.operation_id}"))
            self.assertEqual(page.text_of(f"cr-settle-open-{held.operation_id}"),
                             "Force a resolution...")
            page.click(f"cr-settle-open-{held.operation_id}")
            page.click(f"cr-outcome-completed-{held.operation_id}")
            page.type_into(f"cr-evidence-{held.operation_id}",
                           "PNR ABC123 in the airline portal; the worker hangs on a dead socket")
            submit = f"document.querySelector('[data-testid=\"cr-submit-{held.operation_id}\"]')"
            self.assertTrue(page.evaluate(submit + ".disabled"))
            self.assertIn("tick force first", page.evaluate(submit + ".textContent"))
            self.assertIn("can only be resolved by force",
                          page.text_of(f"cr-force-needed-{held.operation_id}"))
            self.shot("running-call-needs-force")
            page.click(f"cr-force-{held.operation_id}")
            page.click(f"cr-submit-{held.operation_id}")
            page.wait_for(f"document.querySelector('[data-testid=\"cr-answer-"
                          f"{held.operation_id}\"]')?.dataset.ok === 'true'", "forced")
            # The forced call still runs: the page says so, not only the JSON.
            page.click("cr-refresh")
            page.wait_for(shown("cr-resolved-running"), "the call resolved while it runs")
            self.assertIn(f"operation {held.operation_id}, pid {held.process.pid}",
                          page.text_of("cr-resolved-running"))
            self.shot("resolved-call-still-runs")
        finally:
            held.finish()
        # 4. Its tool ended after all: a late outcome to acknowledge, as loud as
        # a closed gate: the box, the reasons and the banner on every page.
        page.wait_for(shown(f"cr-late-{held.operation_id}"), "the late outcome")
        page.wait_for("document.querySelector('[data-testid=cr-gate]')?.dataset.needsPerson "
                      "=== 'true'", "the gate box needs a person")
        self.assertEqual(page.evaluate("document.querySelector('[data-testid=cr-gate]')"
                                       ".dataset.gate"), "open")
        self.assertIn(f"late_outcome: operation {held.operation_id}",
                      page.text_of("cr-needs-person"))
        page.wait_for(shown("cr-banner"), "the banner for a late outcome")
        self.assertIn("needs a person in profile", page.text_of("cr-banner"))
        self.shot("late-outcome")
        page.type_into(f"cr-ack-evidence-{held.operation_id}",
                       "late result matches the resolution: one booking ABC123")
        page.click(f"cr-ack-submit-{held.operation_id}")
        page.wait_for(shown("cr-no-attention"), "no late outcome left")

        # 5. A booking killed mid-call: pending; a second operator settles it
        # in a shell while this page shows the form; the page gets the CLI's answer.
        killed = HeldCall(self.data_dir, "book_trip", "call-trip-2")
        killed.kill()
        page.wait_for(shown(f"cr-op-{killed.operation_id}"), "the pending operation")
        page.wait_for(gate_is("closed"))
        self.assertEqual(page.text_of(f"cr-op-owner-{killed.operation_id}"), "gone")
        page.wait_for(shown("cr-banner"), "the banner again")
        self.shot("pending-after-kill")
        page.click(f"cr-history-open-{killed.operation_id}")
        page.wait_for(shown("cr-event-started"), "the operation's history")
        page.click(f"cr-settle-open-{killed.operation_id}")
        page.click(f"cr-outcome-not_applied-{killed.operation_id}")
        page.type_into(f"cr-evidence-{killed.operation_id}", "no booking for call-trip-2")
        exit_code, _, _ = run_cli(self.data_dir, "resolve", killed.operation_id, "--outcome",
                                  "not_applied", "--evidence", "checked the portal: nothing")
        self.assertEqual(exit_code, 0)
        page.click(f"cr-submit-{killed.operation_id}")
        page.wait_for(f"document.querySelector('[data-testid=\"cr-answer-"
                      f"{killed.operation_id}\"]')?.dataset.code === 'operation_not_open'",
                      "operation_not_open")
        self.shot("stale-page-refused")
        page.wait_for(gate_is("open"))
        page.wait_for(gone("cr-banner"), "no banner once all is settled")
        self.shot("all-settled")

        # The journal verifies; operator.log holds each action, the page's marked.
        self.assertEqual(self.assertVerifies().kinds(), [
            "started", "uncertain", "resolved", "started", "resolved", "late_outcome",
            "acknowledged", "started", "resolved"])
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            lines = [json.loads(line) for line in stream]
        self.assertEqual([(line["action"], line["operation_id"], line.get("forced"),
                           line["operator"].get("via")) for line in lines],
                         [("resolve", uncertain, False, "dashboard"),
                          ("resolve", held.operation_id, True, "dashboard"),
                          ("acknowledge", held.operation_id, None, "dashboard"),
                          ("resolve", killed.operation_id, False, "cli")])

        # 6. Someone edits the journal: the page says it cannot be trusted and
        # what to do next; the banner is back.
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = "
                              "replace(payload, 'book_trip', 'book_trap') WHERE seq = 4")
        page.click("cr-refresh")
        page.wait_for(gate_is("untrusted"), "the journal cannot be trusted")
        self.assertEqual(page.evaluate("document.querySelector('[data-testid=cr-integrity]')"
                                       ".dataset.integrity"), "hash_mismatch")
        self.assertIn("restart-journal", page.text_of("cr-integrity"))
        page.wait_for(shown("cr-banner"), "the banner for an untrusted journal")
        self.shot("journal-cannot-be-trusted")
        self.assertEqual(len(self.shots), 12)
        for path in self.shots:
            self.assertGreater(os.path.getsize(path), 10000, path)


    def test_the_page_settles_nothing_inside_a_frame(self):
        # Another page could lay itself over a framed page's buttons: inside a
        # frame the page shows what it knows, says so, and sends nothing.
        self.open_dashboard(make_home(self.root))
        page = self.browser
        run_worker("error", self.data_dir, "send_payment", "call-framed")
        (operation,) = run_cli(self.data_dir, "status")[1]["unresolved"]
        framed_id = operation["operation_id"]
        self.open_tab()
        page.evaluate("document.body.innerHTML = '<iframe id=\"frame\" src=\"/crash-recovery\" "
                      "width=\"1260\" height=\"1400\"></iframe>'; true")
        inner = "document.getElementById('frame').contentDocument"

        def inside(test_id: str) -> str:
            return f"{inner}.querySelector('[data-testid=\"{test_id}\"]')"

        def wait_inside(condition: str, what: str) -> None:
            # The page's own wait watches the top document; the frame's changes
            # are looked at until they show (bounded, never a pass on timeout).
            for _ in range(int(FRAME_WAIT_SECONDS * 10)):
                if page.evaluate(f"(() => {{ try {{ return !!({condition}); }} "
                                 f"catch (error) {{ return false; }} }})()"):
                    return
                time.sleep(0.1)
            self.fail(f"the framed page never showed {what}")
        wait_inside(inside("cr-framed"), "its notice that it is framed")
        self.assertIn("settles nothing", page.evaluate(f"{inside('cr-framed')}.innerText"))
        wait_inside(inside(f"cr-settle-open-{framed_id}"), "the operation")
        page.evaluate(f"{inside(f'cr-settle-open-{framed_id}')}.click(); true")
        wait_inside(inside(f"cr-outcome-not_applied-{framed_id}"), "the settle form")
        page.evaluate(f"{inside(f'cr-outcome-not_applied-{framed_id}')}.click(); true")
        page.evaluate(f"{inside(f'cr-evidence-{framed_id}')}.focus(); true")
        page.send("Input.insertText", session=True, text="clicked through someone's frame")
        wait_inside(f"!{inside(f'cr-submit-{framed_id}')}.disabled", "an enabled submit")
        page.evaluate(f"{inside(f'cr-submit-{framed_id}')}.click(); true")
        wait_inside(f"{inside(f'cr-answer-{framed_id}')}?.dataset.code === 'framed'",
                    "the framed refusal")
        self.shot("framed-page-settles-nothing")
        self.assertEqual([op["operation_id"] for op in run_cli(self.data_dir, "status")[1]
                          ["unresolved"]], [framed_id])
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "operator.log")))

    def test_a_named_profile_with_a_typo_in_protected_tools(self):
        # The tab serves profile `work`; Hermes' own header shows `default`
        # (its selector starts at the sticky profile). The typo protects
        # nothing: the page, its banner and the CLI say so.
        home = make_home(self.root, profile="work",
                         settings="protected_tools: [send_paymnet]")
        self.data_dir = data_dir_of(home)
        self.dashboard = Dashboard(PROGRAM, home, os.path.join(self.root, "dashboard.log"),
                                   user_home=self.root, isolated=True)
        self.addCleanup(self.dashboard.stop)
        self.browser = Browser(CHROMIUM, width=1280, height=1500)
        self.addCleanup(self.browser.close)
        page = self.browser
        self.open_tab()
        page.wait_for(shown("cr-unmatched-tools"), "the unmatched tool name")
        self.assertEqual(page.text_of("cr-profile"), "work")
        self.assertIn("send_paymnet", page.text_of("cr-unmatched-tools"))
        self.assertIn("unmatched_tools: protected_tools names send_paymnet",
                      page.text_of("cr-needs-person"))
        self.assertEqual(page.evaluate("document.querySelector('[data-testid=cr-gate]')"
                                       ".dataset.needsPerson"), "true")
        page.wait_for(shown("cr-profile-other"), "Hermes' pages show another profile")
        self.assertIn("Hermes' own pages here show profile default",
                      page.text_of("cr-profile-other"))
        self.assertIn("always serve profile work", page.text_of("cr-profile-other"))
        page.wait_for(shown("cr-banner"), "the banner for a typo")
        self.assertIn("needs a person in profile work", page.text_of("cr-banner"))
        self.shot("typo-in-a-named-profile")
        code, document, _ = run_cli(self.data_dir, "status", "--check")
        self.assertEqual((code, document["journal"]), (0, "absent"))  # stand-alone: no record
        self.assertEqual(len(self.shots), 1)

    def test_a_hermes_chat_killed_mid_tool_closes_the_gate_until_settled_on_the_page(self):
        # tests/native_demo.py's scenario: an unmodified `hermes chat` whose
        # booking tool commits in its service, SIGKILLed before the tool's
        # response is recorded; the model is a scripted provider on 127.0.0.1.
        import native_demo as demo
        with demo.ScriptedProvider([], timeout_seconds=demo.PROVIDER_TIMEOUT_SECONDS) as provider:
            profile = demo.Profile(Path(self.root), provider.base_url)
            provider.load_script(demo.crash_turns("s1"))
            profile.arm.write_text("arm\n", encoding="utf-8")
            chat = subprocess.Popen(demo.chat_command("Book a trip to Lisbon for Ada."),
                                    env=profile.environment(), cwd=str(profile.workdir),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            committed = demo.wait_for_file(profile.signal, chat, demo.CRASH_WAIT_SECONDS)
            self.assertEqual((committed, demo.kill_group(chat)), (True, -signal.SIGKILL))
        receipt = json.loads(profile.signal.read_text(encoding="utf-8"))["receipt"]
        self.open_dashboard(str(profile.home))
        page = self.browser
        page.navigate(self.dashboard.url + "/crash-recovery")
        page.wait_for(gate_is("closed"), "gate closed after the killed chat")
        (operation,) = run_cli(self.data_dir, "status")[1]["unresolved"]
        operation_id = operation["operation_id"]
        self.assertEqual((page.text_of(f"cr-op-state-{operation_id}"),
                          page.text_of(f"cr-op-owner-{operation_id}"),
                          page.text_of("cr-profile")), ("pending", "gone", "custom"))
        self.assertIn("book_trip", page.text_of(f"cr-op-{operation_id}"))
        page.wait_for(shown("cr-banner"), "the banner")
        self.shot("killed-hermes-chat")
        page.click(f"cr-settle-open-{operation_id}")
        page.click(f"cr-outcome-completed-{operation_id}")
        page.type_into(f"cr-evidence-{operation_id}", f"booking service receipt {receipt}")
        page.click(f"cr-submit-{operation_id}")
        page.wait_for(gate_is("open"), "gate open after settling")
        page.wait_for(gone("cr-banner"), "no banner once settled")
        self.shot("killed-hermes-chat-settled")
        resolved = run_cli(self.data_dir, "show", operation_id)[1]["events"][-1]
        self.assertEqual((resolved["outcome"], resolved["evidence"], resolved["operator"]["via"]),
                         ("completed", f"booking service receipt {receipt}", "dashboard"))
        self.assertEqual(self.assertVerifies().kinds(), ["started", "resolved"])


if __name__ == "__main__":
    unittest.main()
