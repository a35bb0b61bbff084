#!/usr/bin/env python3
"""Native crash demo: unmodified ``hermes chat -q …`` processes, SIGKILL mid-tool.

    python tests/native_demo.py [--directory NEW_DIR] [--gateway auto|on|off]

An isolated Hermes profile loads crash-recovery and a fictional booking plugin
(its own SQLite service). A scripted OpenAI-compatible provider on 127.0.0.1
plays the model (through Tool Search's ``tool_call`` where the host offers
plugin tools only that way). When the machine allows it, everything runs
inside a fresh network namespace (``unshare -rn``, only ``lo`` up). The host's
own program runs (``hermes``, or ``hermesx`` on 0.20.1), with ``-Q``, or on
0.22 with ``--format stream-json``, whose ``tool_result`` events are checked
too (tests/host/stream_json.py).

1. session 1: the model calls ``book_trip``; the service commits the booking,
   then the harness SIGKILLs Hermes' whole process group before the tool
   response is recorded;
2. session 2 (a new ``hermes chat``): the model calls ``book_trip`` again and
   receives the blocked JSON; ``lookup_receipt`` (configured read-only) works;
3. with no worker left, the operator CLI resolves the operation from the
   service's receipt; session 3 books another trip.

With ``--gateway`` (auto: when aiohttp, Hermes' ``messaging`` extra, is
importable) the same scenario runs against ``hermes gateway run`` with the
loopback ``api_server`` platform, the gateway killed mid-tool.

Evidence is the tool messages the provider received, the service database and
the journal, never the model's narration. Prints one JSON verdict; exits 1 on
any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

HOST_DIR = Path(__file__).resolve().parent / "host"
sys.path.insert(0, str(HOST_DIR))

import evidence  # noqa: E402
import stream_json  # noqa: E402
from evidence import (BOOKING_PLUGIN_DIR, PLUGIN_NAME, blocked_document,  # noqa: E402
                      data_dir_of, kinds, read_events, service_counts)
from mock_provider import ScriptedProvider  # noqa: E402

BOOKING = "booking-service"
READ_ONLY_TOOLS = ["read_file", "search_files", "lookup_receipt"]
TRAVELER, DESTINATION = "Ada", "Lisbon"
LATER_TRAVELER, LATER_DESTINATION = "Grace", "Porto"
CRASH_WAIT_SECONDS = 90
SESSION_TIMEOUT_SECONDS = 150
PROVIDER_TIMEOUT_SECONDS = 600


class Findings:
    """Collected facts and failures of one scenario run."""

    def __init__(self) -> None:
        self.failures: List[str] = []
        self.facts: Dict[str, Any] = {}

    def expect(self, condition: Any, failure: str) -> bool:
        if not condition:
            self.failures.append(failure)
        return bool(condition)


def tool_message(provider: ScriptedProvider, call_id: str) -> Optional[str]:
    """Content of the ``role: tool`` message the model received for a call id."""
    for message in provider.tool_messages():
        if message.get("tool_call_id") == call_id:
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return None


def wait_for_file(path: Path, process: subprocess.Popen, seconds: float) -> bool:
    """Wait until ``path`` exists (False on timeout or when the process exits first)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if process.poll() is not None:
            return path.exists()
        time.sleep(0.05)
    return False


def kill_group(process: subprocess.Popen, how: int = signal.SIGKILL, wait: float = 30) -> Optional[int]:
    """Signal the process's whole group and reap it; returns the exit status."""
    try:
        os.killpg(process.pid, how)
    except ProcessLookupError:
        pass
    try:
        return process.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait(timeout=wait)


def group_gone(process: subprocess.Popen) -> bool:
    """True when no process of the group is left."""
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return True
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Profile:
    """An isolated Hermes profile with crash-recovery and the booking service."""

    def __init__(self, root: Path, base_url: str) -> None:
        self.root = root
        self.home = root / "profile"
        self.service = root / "service.sqlite3"
        self.arm = root / "crash.arm"
        self.signal = root / "crash.signal"
        self.workdir = root / "workdir"
        self.workdir.mkdir(parents=True)
        evidence.copy_plugin_checkout(self.home / "plugins" / PLUGIN_NAME)
        shutil.copytree(BOOKING_PLUGIN_DIR, self.home / "plugins" / BOOKING)
        evidence.write_profile(self.home, base_url=base_url, enabled=[BOOKING, PLUGIN_NAME],
                               entries={PLUGIN_NAME: {"settings": {"read_only_tools": READ_ONLY_TOOLS}}})
        self.data_dir = data_dir_of(self.home)

    def environment(self, **extra: str) -> Dict[str, str]:
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("HERMES_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_",
                                              "API_SERVER_"))}
        environment.update(HERMES_HOME=str(self.home), BOOKING_SERVICE_DB=str(self.service),
                           BOOKING_CRASH_ARM=str(self.arm), BOOKING_CRASH_SIGNAL=str(self.signal),
                           PYTHONDONTWRITEBYTECODE="1", **extra)
        return environment

    def events(self) -> List[Dict[str, Any]]:
        return read_events(self.data_dir)


def crash_turns(prefix: str) -> List[Dict[str, Any]]:
    return [{"tool_calls": [{"id": f"{prefix}_book", "name": "book_trip",
                             "arguments": {"traveler": TRAVELER, "destination": DESTINATION}}]},
            {"text": "FINAL: booked."}]


def repeat_turns(prefix: str) -> List[Dict[str, Any]]:
    return [{"tool_calls": [{"id": f"{prefix}_book", "name": "book_trip",
                             "arguments": {"traveler": TRAVELER, "destination": DESTINATION}}]},
            {"tool_calls": [{"id": f"{prefix}_lookup", "name": "lookup_receipt",
                             "arguments": {"traveler": TRAVELER}}]},
            {"text": "FINAL: the earlier booking must be checked by a person."}]


def later_turns(prefix: str) -> List[Dict[str, Any]]:
    return [{"tool_calls": [{"id": f"{prefix}_book", "name": "book_trip",
                             "arguments": {"traveler": LATER_TRAVELER,
                                           "destination": LATER_DESTINATION}}]},
            {"text": "FINAL: booked."}]


def check_crash_state(profile: Profile, provider: ScriptedProvider, findings: Findings,
                      prefix: str, exit_status: Optional[int], process: subprocess.Popen) -> Optional[str]:
    """After the kill: one booking, a durable pending ``started``, no tool response seen."""
    findings.expect(exit_status == -signal.SIGKILL, f"{prefix}: host exit status {exit_status}, "
                    "expected death by SIGKILL")
    findings.expect(group_gone(process), f"{prefix}: processes of the killed group survive")
    receipt = None
    if profile.signal.exists():
        receipt = json.loads(profile.signal.read_text(encoding="utf-8"))["receipt"]
    findings.expect(receipt, f"{prefix}: the tool never signalled the committed booking")
    counts = service_counts(profile.service, TRAVELER)
    findings.expect(counts == {"bookings": 1, "attempts": 1},
                    f"{prefix}: service after the crash holds {counts}")
    events = profile.events()
    findings.expect(kinds(events) == ["started"],
                    f"{prefix}: journal after the crash is {kinds(events)}, expected [started]")
    findings.expect(tool_message(provider, f"{prefix}_book") is None,
                    f"{prefix}: the model received a tool response although the host was killed")
    operation_id = events[0]["operation_id"] if kinds(events) == ["started"] else None
    findings.facts.update(receipt=receipt, operation_id=operation_id,
                          crashed_session_id=events[0].get("session_id") if events else None)
    return operation_id


def check_repeat(profile: Profile, provider: ScriptedProvider, findings: Findings, prefix: str,
                 operation_id: Optional[str]) -> None:
    """Session 2: the repeat is refused with the pending operation; lookup works."""
    content = tool_message(provider, f"{prefix}_book")
    refusal = blocked_document(content) if content else None
    repeat_blocked = findings.expect(
        refusal is not None and refusal.get("blocked") is True
        and refusal.get("operation_ids") == [operation_id],
        f"{prefix}: repeat book_trip tool message was {content!r:.400}")
    if refusal:
        states = [o.get("state") for o in refusal.get("operations", [])]
        findings.expect(states == ["pending"], f"{prefix}: refusal states {states}")
    counts = service_counts(profile.service, TRAVELER)
    findings.expect(counts == {"bookings": 1, "attempts": 1},
                    f"{prefix}: service after the repeat holds {counts}")
    lookup_text = tool_message(provider, f"{prefix}_lookup")
    try:
        lookup = json.loads(lookup_text or "")
    except ValueError:
        lookup = {}
    read_only_ok = findings.expect(
        lookup.get("count") == 1 and [b["receipt"] for b in lookup.get("bookings", [])]
        == [findings.facts.get("receipt")],
        f"{prefix}: lookup_receipt tool message was {lookup_text!r:.400}")
    findings.expect(kinds(profile.events()) == ["started"],
                    f"{prefix}: refusal or lookup changed the journal: {kinds(profile.events())}")
    findings.facts.update(repeat_blocked=repeat_blocked, read_only_inspection=read_only_ok,
                          refusal_code=(refusal or {}).get("code"))


def resolve_from_evidence(profile: Profile, findings: Findings, operation_id: Optional[str]) -> None:
    """The operator step: status, then resolve ``completed`` citing the service row."""
    code, status = evidence.operator_cli(profile.data_dir, "status")
    unresolved = [(o.get("operation_id"), o.get("tool"), o.get("state"))
                  for o in status.get("unresolved", [])]
    findings.expect(code == 0 and unresolved == [(operation_id, "book_trip", "pending")],
                    f"operator status before resolution: exit {code}, {unresolved}")
    receipt = findings.facts.get("receipt")
    code, resolved = evidence.operator_cli(
        profile.data_dir, "resolve", str(operation_id), "--outcome", "completed", "--evidence",
        f"booking service row {receipt} for {TRAVELER} to {DESTINATION} exists "
        "(lookup_receipt and bookings table)")
    findings.expect(code == 0, f"operator resolve failed: exit {code}, {resolved}")
    code, status = evidence.operator_cli(profile.data_dir, "status")
    findings.facts["unresolved_after_resolution"] = len(status.get("unresolved", [None]))
    findings.expect(code == 0 and status.get("unresolved") == [],
                    f"operator status after resolution: exit {code}, {status}")


def check_after_resolution(profile: Profile, provider: ScriptedProvider, findings: Findings,
                           prefix: str) -> None:
    """Session 3: a protected call runs again and is journaled normally."""
    content = tool_message(provider, f"{prefix}_book")
    try:
        document = json.loads(content or "")
    except ValueError:
        document = {}
    allowed = findings.expect(document.get("status") == "booked",
                              f"{prefix}: book_trip after resolution returned {content!r:.400}")
    findings.facts["protected_call_after_resolution"] = allowed
    findings.expect(kinds(profile.events()) == ["started", "resolved", "started", "returned"],
                    f"{prefix}: final journal {kinds(profile.events())}")
    findings.expect(service_counts(profile.service, TRAVELER)["bookings"] == 1,
                    f"{prefix}: {TRAVELER} holds more than one booking")
    findings.expect(service_counts(profile.service) == {"bookings": 2, "attempts": 2},
                    f"{prefix}: service totals {service_counts(profile.service)}")


def check_integrity(profile: Profile, findings: Findings, prefix: str) -> bool:
    valid, report = evidence.run_verifier(profile.data_dir)
    code, verified = evidence.operator_cli(profile.data_dir, "verify")
    ok = code == 0 and verified.get("ok", True) is not False and valid
    findings.expect(ok, f"{prefix}: integrity verifier={valid} {report if not valid else ''} "
                    f"operator verify exit {code}")
    findings.facts["independent_verifier"] = valid
    return ok


# --------------------------------------------------------------------------
# The hermes chat scenario
# --------------------------------------------------------------------------

def chat_command(prompt: str) -> List[str]:
    """An unmodified one-shot ``hermes chat`` (``hermesx`` on 0.20.1), with
    ``--format stream-json`` where the host has it (0.22), else ``-Q``."""
    return [evidence.hermes_program(), "chat", "-q", prompt, *stream_json.chat_flags()]


def run_chat(profile: Profile, prompt: str) -> subprocess.CompletedProcess:
    return subprocess.run(chat_command(prompt), env=profile.environment(), capture_output=True,
                          text=True, timeout=SESSION_TIMEOUT_SECONDS, cwd=str(profile.workdir),
                          stdin=subprocess.DEVNULL, start_new_session=True)


def session_id_of(completed: subprocess.CompletedProcess) -> Optional[str]:
    for line in (completed.stderr + completed.stdout).splitlines():
        if line.strip().startswith("session_id:"):
            return line.split(":", 1)[1].strip()
    return None


def chat_scenario(root: Path, provider: ScriptedProvider) -> Findings:
    findings = Findings()
    profile = Profile(root, provider.base_url)

    provider.load_script(crash_turns("s1"))
    profile.arm.write_text("arm\n", encoding="utf-8")
    crashed_stdout = root / "s1.stdout"
    with open(crashed_stdout, "w", encoding="utf-8") as stdout:
        process = subprocess.Popen(chat_command("Book a trip to Lisbon for Ada."),
                                   env=profile.environment(), cwd=str(profile.workdir),
                                   stdin=subprocess.DEVNULL, stdout=stdout,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
    signalled = wait_for_file(profile.signal, process, CRASH_WAIT_SECONDS)
    exit_status = kill_group(process)
    findings.expect(signalled, "session 1: book_trip never committed a booking")
    operation_id = check_crash_state(profile, provider, findings, "s1", exit_status, process)

    provider.load_script(repeat_turns("s2"))
    completed = run_chat(profile, "Book a trip to Lisbon for Ada.")
    findings.expect(completed.returncode == 0, f"session 2 exit {completed.returncode}: "
                    f"{completed.stderr[-800:]}")
    second_session = session_id_of(completed)
    repeated = stream_json.events(completed.stdout)
    findings.facts["restarted_session_id"] = second_session
    findings.expect(second_session and second_session != findings.facts.get("crashed_session_id"),
                    "session 2 did not run as a new Hermes session")
    check_repeat(profile, provider, findings, "s2", operation_id)

    resolve_from_evidence(profile, findings, operation_id)

    provider.load_script(later_turns("s3"))
    completed = run_chat(profile, "Book a trip to Porto for Grace.")
    findings.expect(completed.returncode == 0, f"session 3 exit {completed.returncode}: "
                    f"{completed.stderr[-800:]}")
    check_after_resolution(profile, provider, findings, "s3")
    if stream_json.supported():
        stream_json.check_sessions(findings, stream_json.events_in(crashed_stdout), repeated,
                                   stream_json.events(completed.stdout), operation_id)
    findings.facts["integrity_ok"] = check_integrity(profile, findings, "chat")
    findings.facts["bookings"] = service_counts(profile.service, TRAVELER)["bookings"]
    return findings


# --------------------------------------------------------------------------
# The gateway scenario (api_server platform on loopback)
# --------------------------------------------------------------------------

class Gateway:
    """``hermes gateway run`` with the api_server platform on a loopback port."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.port = free_port()
        self.key = secrets.token_hex(24)
        self.process: Optional[subprocess.Popen] = None
        self.log = profile.root / "gateway.log"

    def start(self) -> bool:
        environment = self.profile.environment(
            API_SERVER_ENABLED="1", API_SERVER_KEY=self.key, API_SERVER_HOST="127.0.0.1",
            API_SERVER_PORT=str(self.port))
        with open(self.log, "a", encoding="utf-8") as log_file:
            self.process = subprocess.Popen(
                [evidence.hermes_program(), "gateway", "run"], env=environment,
                cwd=str(self.profile.workdir), stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                time.sleep(0.25)
        return False

    def chat(self, prompt: str, timeout: float = SESSION_TIMEOUT_SECONDS) -> Dict[str, Any]:
        body = json.dumps({"model": "hermes-agent", "stream": False,
                           "messages": [{"role": "user", "content": prompt}]}).encode("utf-8")
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return {"status": answer.status, "body": answer.read().decode("utf-8", "replace")}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "body": exc.read().decode("utf-8", "replace")}
        except (urllib.error.URLError, OSError) as exc:
            return {"status": None, "error": f"{type(exc).__name__}: {exc}"}

    def stop(self, how: int = signal.SIGTERM) -> Optional[int]:
        if self.process is None:
            return None
        status = kill_group(self.process, how)
        return status


def gateway_available() -> tuple:
    """(True, "") when Hermes' api_server platform can run here (aiohttp importable)."""
    probe = subprocess.run([sys.executable, "-c", "import aiohttp"], capture_output=True)
    if probe.returncode != 0:
        return False, ("aiohttp is not installed; Hermes' only loopback gateway platform "
                       "(api_server) needs it (extra 'messaging')")
    return True, ""


def gateway_scenario(root: Path, provider: ScriptedProvider) -> Findings:
    profile = Profile(root, provider.base_url)
    gateway = Gateway(profile)
    try:
        return gateway_steps(profile, gateway, provider)
    finally:
        if gateway.process is not None and not group_gone(gateway.process):
            kill_group(gateway.process)


def gateway_steps(profile: Profile, gateway: "Gateway", provider: ScriptedProvider) -> Findings:
    findings = Findings()

    provider.load_script(crash_turns("g1"))
    profile.arm.write_text("arm\n", encoding="utf-8")
    if not findings.expect(gateway.start(), "gateway 1 did not become healthy"):
        gateway.stop(signal.SIGKILL)
        return findings
    pending_request: Dict[str, Any] = {}
    requester = threading.Thread(target=lambda: pending_request.update(
        gateway.chat("Book a trip to Lisbon for Ada.", timeout=CRASH_WAIT_SECONDS + 30)),
        daemon=True)
    requester.start()
    signalled = wait_for_file(profile.signal, gateway.process, CRASH_WAIT_SECONDS)
    exit_status = gateway.stop(signal.SIGKILL)
    requester.join(30)
    findings.expect(signalled, "gateway 1: book_trip never committed a booking")
    findings.expect(pending_request.get("status") is None,
                    f"gateway 1: the client got an answer although the gateway was killed: "
                    f"{pending_request}")
    operation_id = check_crash_state(profile, provider, findings, "g1", exit_status,
                                     gateway.process)

    provider.load_script(repeat_turns("g2"))
    if findings.expect(gateway.start(), "gateway 2 (restart) did not become healthy"):
        answer = gateway.chat("Book a trip to Lisbon for Ada.")
        findings.expect(answer.get("status") == 200, f"gateway 2 chat answered {answer}")
    gateway.stop()
    findings.expect(group_gone(gateway.process), "gateway 2 left processes behind")
    check_repeat(profile, provider, findings, "g2", operation_id)

    resolve_from_evidence(profile, findings, operation_id)

    provider.load_script(later_turns("g3"))
    if findings.expect(gateway.start(), "gateway 3 did not become healthy"):
        answer = gateway.chat("Book a trip to Porto for Grace.")
        findings.expect(answer.get("status") == 200, f"gateway 3 chat answered {answer}")
    gateway.stop()
    check_after_resolution(profile, provider, findings, "g3")
    findings.facts["integrity_ok"] = check_integrity(profile, findings, "gateway")
    return findings


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

def run_demo(directory: Path, gateway_mode: str, network: str) -> Dict[str, Any]:
    started = time.monotonic()
    checked, changed = evidence.hermes_core_modifications()
    verdict: Dict[str, Any] = {
        "native_cli_crash_and_restart": False,
        "live_model": False,
        "core_patched": bool(changed),
        "bookings": None,
        "repeat_blocked": False,
        "read_only_inspection": False,
        "integrity_ok": False,
        "unresolved_after_resolution": None,
        "hermes_version": evidence.hermes_version(),
        "network": network,
        "host_files_checked_against_record": checked,
    }
    failures: List[str] = []
    if changed:
        failures.append(f"hermes-agent files differ from its RECORD: {changed[:10]}")
    with ScriptedProvider([], timeout_seconds=PROVIDER_TIMEOUT_SECONDS) as provider:
        verdict["model_base_url"] = provider.base_url
        chat = chat_scenario(directory / "cli", provider)
        failures.extend(f"cli: {failure}" for failure in chat.failures)
        facts = chat.facts
        verdict.update(
            native_cli_crash_and_restart=not chat.failures,
            bookings=facts.get("bookings"),
            repeat_blocked=bool(facts.get("repeat_blocked")),
            read_only_inspection=bool(facts.get("read_only_inspection")),
            integrity_ok=bool(facts.get("integrity_ok")),
            unresolved_after_resolution=facts.get("unresolved_after_resolution"),
            protected_call_after_resolution=bool(facts.get("protected_call_after_resolution")),
            refusal_code=facts.get("refusal_code"),
            operation_id=facts.get("operation_id"),
            receipt=facts.get("receipt"),
            sessions={"crashed": facts.get("crashed_session_id"),
                      "restarted": facts.get("restarted_session_id")},
            independent_verifier=facts.get("independent_verifier"),
            killed_with="SIGKILL to the hermes process group after the booking committed",
            chat_output="stream-json" if stream_json.supported() else "quiet",
            stream_json_events=facts.get("stream_json"),
            model_calls_through_tool_call=sorted(provider.bridged),
        )
        cli_seconds = round(time.monotonic() - started, 1)
        available, reason = gateway_available()
        if gateway_mode == "off" or (gateway_mode == "auto" and not available):
            verdict["gateway_crash_and_restart"] = "skipped: " + (reason or "--gateway off")
        elif not available:
            verdict["gateway_crash_and_restart"] = False
            failures.append(f"gateway: {reason}")
        else:
            gateway = gateway_scenario(directory / "gateway", provider)
            failures.extend(f"gateway: {failure}" for failure in gateway.failures)
            verdict["gateway_crash_and_restart"] = not gateway.failures
            verdict["gateway_refusal_code"] = gateway.facts.get("refusal_code")
        verdict["agent_loop_requests"] = len(provider.chat_requests())
        (directory / "provider_requests.json").write_text(
            json.dumps(provider.requests, indent=1), encoding="utf-8")
    verdict["failures"] = failures
    verdict["ok"] = not failures
    verdict["seconds"] = {"cli": cli_seconds, "total": round(time.monotonic() - started, 1)}
    verdict["directory"] = str(directory)
    return verdict


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="crash-recovery native Hermes crash demo")
    parser.add_argument("--directory", help="a new directory for profiles, service and journal "
                        "(default: a temporary one, removed afterwards)")
    parser.add_argument("--gateway", choices=("auto", "on", "off"), default="auto",
                        help="also run the gateway scenario (auto: when aiohttp is importable)")
    parser.add_argument("--inside-namespace", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)

    if not evidence.hermes_version():
        print(json.dumps({"ok": False,
                          "error": f"Hermes (hermes_cli) is not importable in {sys.executable}"}))
        return 2
    if options.inside_namespace is None:
        prefix, network = evidence.network_isolation()
        if prefix:
            forwarded = [arg for arg in (argv if argv is not None else sys.argv[1:])]
            completed = subprocess.run(prefix + [sys.executable, str(Path(__file__).resolve()),
                                                 *forwarded, "--inside-namespace", network])
            return completed.returncode
    else:
        network = options.inside_namespace

    keep = options.directory is not None
    if keep:
        directory = Path(options.directory).resolve()
        directory.mkdir(parents=True, exist_ok=False)
    else:
        directory = Path(tempfile.mkdtemp(prefix="crash-recovery-native-"))
    try:
        verdict = run_demo(directory, options.gateway, network)
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)
    if not keep:
        verdict["directory"] = None
    print(json.dumps(verdict, indent=2))
    ok = verdict["ok"] and verdict["native_cli_crash_and_restart"] is True \
        and verdict["bookings"] == 1 and verdict["repeat_blocked"] and verdict["integrity_ok"] \
        and verdict["unresolved_after_resolution"] == 0 and not verdict["core_patched"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
