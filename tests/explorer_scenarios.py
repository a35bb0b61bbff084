#!/usr/bin/env python3
"""What the crash-state explorer runs and checks: scenarios, their initial
states, the traced programs, the checker, and the invariants.

    explorer_scenarios.py setup STEP HOME WITNESS      build (part of) an initial state
    explorer_scenarios.py call HOME WITNESS [--raise]  the traced guard program
    explorer_scenarios.py checker                      serve check requests (JSON lines)

A *state root* ``HOME`` holds the data directory ``HOME/plugin-data/crash-recovery``
(the layout of a Hermes profile); everything under ``HOME`` is the crash state.
``WITNESS`` is a directory outside it where the programs leave evidence the
explorer reads back from the trace: ``progress`` (one line per fact, e.g.
``APPENDED started OP`` once the append has returned), ``side-effect`` (the
tool's own side effect, written with open/write/fsync), ``stdout`` (an operator
command's output) and ``base.json`` (what a setup step left behind).
:func:`facts_by_point` turns that evidence into what must hold at each trace
point; :func:`evaluate` checks it against what the product said.

The checker (``checker``) imports the product once and then runs every step of
a request -- an operator command or one protected call -- in a forked child:
a process that has imported the product but never opened a journal, i.e. a
fresh process without the interpreter start-up cost.  See tests/crash_explorer.py
and docs/persistence.md.  Test-only: installed nowhere.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Optional


TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
import journal_reference as reference  # noqa: E402  (never imports the product)

OPERATOR_CLI = os.path.join(REPO, "operator_cli.py")
DATA_SUBDIR = os.path.join("plugin-data", "crash-recovery")
SIDE_EFFECT, PROGRESS, STDOUT, BASE_INFO = "side-effect", "progress", "stdout", "base.json"
TOOL = "book_trip"
EVIDENCE = "crash explorer: the service shows no booking for this call"
STEP_TIMEOUT_SECONDS = 60
# Verdicts a crash may leave: docs/format.md §Append (ok, checkpoint_ahead), a crash
# before creation (journal_absent), and a crash inside archive's switch, which
# the next writer finishes or undoes (archive_interrupted, archive.py).
CRASH_VERDICTS = {"ok", "checkpoint_ahead", "journal_absent", "archive_interrupted"}


def data_dir(home: str) -> str:
    """The data directory inside a state root."""
    return os.path.join(home, DATA_SUBDIR)


@dataclass(frozen=True)
class Scenario:
    """One traced program and the initial state it starts from.

    ``setup``: the setup steps that build the initial state, in order (each runs
    in its own process; ``*`` marks a step that ends in SIGKILL).  ``program``:
    ``call`` / ``call_raises`` (the guard program below) or an operator
    command (``resolve``, ``repair-checkpoint``, ``archive``,
    ``restart-journal``).  ``requires``: an operator command that must exist,
    else the scenario is skipped.  ``verdicts``: verdicts besides
    CRASH_VERDICTS that a crash of this program may leave (the initial
    state's own, for a program that replaces a damaged journal)."""
    name: str
    doc: str
    setup: tuple
    program: str
    requires: str = ""
    verdicts: tuple = ()


SCENARIOS = (
    Scenario("call", "a protected call that returns: started, tool, returned",
             ("seed",), "call"),
    Scenario("call_uncertain", "a protected call whose tool raises: started, tool, uncertain",
             ("seed",), "call_raises"),
    Scenario("first_call", "the first protected call of a fresh profile: creation, started, "
             "tool, returned", (), "call"),
    Scenario("resolve", "operator_cli.py resolve OP --outcome not_applied on a journal whose "
             "worker died mid-call (pending)", ("seed", "*pending"), "resolve"),
    Scenario("repair", "operator_cli.py repair-checkpoint after a crash between the head.json "
             "replace and COMMIT of `returned` (the tool ran)",
             ("seed", "*ahead_returned"), "repair-checkpoint"),
    Scenario("repair_lost_started", "operator_cli.py repair-checkpoint after a crash between "
             "the head.json replace and COMMIT of `started` (the tool never ran)",
             ("seed", "*ahead_started"), "repair-checkpoint"),
    Scenario("archive", "operator_cli.py archive on a journal with closed operations",
             ("seed", "seed"), "archive", requires="archive"),
    Scenario("restart", "operator_cli.py restart-journal on a journal whose head.json was "
             "deleted while a call it journaled was pending (its side effect done): the pending "
             "operation carried over, one lost operation brought back",
             ("seed", "*pending", "lose_head"), "restart-journal", requires="restart-journal",
             verdicts=("checkpoint_missing", "restart_interrupted")),
    Scenario("restart_marker", "operator_cli.py restart-journal on a journal whose marker was "
             "overwritten while a call it journaled was pending: head.json kept by a hard link, "
             "the pending operation carried over, nothing lost",
             ("seed", "*pending", "corrupt_marker"), "restart-journal",
             requires="restart-journal", verdicts=("marker_corrupt", "restart_interrupted")),
)
SCENARIO_NAMES = tuple(scenario.name for scenario in SCENARIOS)


def scenario_named(name: str) -> Scenario:
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIO_NAMES)}")


def command_exists(command: str) -> bool:
    """Whether ``operator_cli.py`` has ``command`` (its ``--help`` exits 0;
    an unknown command is a usage error, exit 1)."""
    return subprocess.run([sys.executable, OPERATOR_CLI, command, "--help"], capture_output=True,
                          text=True, timeout=60).returncode == 0


def program_argv(scenario: Scenario, home: str, witness: str, base: dict) -> list:
    """The command line the explorer traces for ``scenario``."""
    if scenario.program in ("call", "call_raises"):
        extra = ["--raise"] if scenario.program == "call_raises" else []
        return [sys.executable, os.path.abspath(__file__), "call", home, witness, *extra]
    words = [sys.executable, OPERATOR_CLI, "--data-dir", data_dir(home), scenario.program]
    if scenario.program == "resolve":
        words += [base["subject"], "--outcome", "not_applied"]
    if scenario.program != "archive" or "--evidence" in command_help("archive"):
        words += ["--evidence", EVIDENCE]
    return words


def command_help(command: str) -> str:
    """``operator_cli.py COMMAND --help`` (the options a newer command takes)."""
    return subprocess.run([sys.executable, OPERATOR_CLI, command, "--help"], capture_output=True,
                          text=True, timeout=60).stdout


# ------------------------------------------------------------ the programs --

def _product():
    """Load this checkout as the package ``crash_recovery``; return (guard, durable)."""
    sys.path.insert(0, TESTS)
    from checkout import load_module
    return load_module("guard"), load_module("storage.durable")


def _binding():
    """The product's admission binding module (loaded like :func:`_product`)."""
    from checkout import load_module
    return load_module("admission.binding")


class Progress:
    """Appends facts to ``WITNESS/progress``: one ``os.write`` per line, so each
    fact is one write syscall in the trace, at the instant it became true."""

    def __init__(self, witness: str):
        self.descriptor = os.open(os.path.join(witness, PROGRESS),
                                  os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def say(self, *words: str) -> None:
        os.write(self.descriptor, (" ".join(words) + "\n").encode("utf-8"))


def side_effect(witness: str, operation_id: str) -> None:
    """The tool's side effect: a marker file written and fsynced by the tool."""
    descriptor = os.open(os.path.join(witness, SIDE_EFFECT),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(descriptor, f"booked by {operation_id}\n".encode("utf-8"))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def run_call(home: str, witness: str, raises: bool, kill: Optional[str] = None) -> int:
    """One protected call through ``RecoveryGuard(data_dir).tool_execution``.

    The tool announces ``APPENDED started OP`` (its admission returned, so the
    started event is durable), then ``SIDE_EFFECT OP``, then writes the side
    effect; it returns a normal response or raises.  Afterwards the program
    announces ``APPENDED returned|uncertain OP`` and, once the guard is closed,
    ``DONE``.  ``kill``: a setup step -- SIGKILL this process at a point
    (``tool``: inside the tool after the side effect; ``BOUNDARY:KIND``: at a
    durable boundary, see durable.set_boundary_hook)."""
    guard_module, durable = _product()
    progress = Progress(witness)
    seen = {}
    if kill and kill != "tool":
        boundary, kind = kill.split(":")

        def hook(reached: str, reached_kind: str) -> None:
            if (reached, reached_kind) == (boundary, kind):
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(10)
        durable.set_boundary_hook(hook)
        if kind == "started":  # the tool never runs: nothing to protect
            _write_base_info(witness, {"subject": None, "side_effect": False})

    def tool():
        operation_id = _binding().ADMISSION.get().operation_id
        seen["operation_id"] = operation_id
        progress.say("APPENDED", "started", operation_id)
        if kill:
            _write_base_info(witness, {"subject": operation_id, "side_effect": True})
        progress.say("SIDE_EFFECT", operation_id)
        side_effect(witness, operation_id)
        if kill == "tool":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)
        if raises:
            raise RuntimeError("the booking service reset the connection")
        return {"status": "confirmed", "booking": operation_id}

    guard = guard_module.RecoveryGuard(data_dir(home))
    try:
        result = guard.tool_execution(TOOL, {"destination": "LIS", "raises": raises}, tool,
                                      session_id="explorer", tool_call_id="call-1")
    except RuntimeError:
        result = "raised"
    operation_id = seen.get("operation_id")
    if operation_id is None:
        progress.say("REFUSED")
    elif result == "raised":
        progress.say("APPENDED", "uncertain", operation_id)
    elif isinstance(result, dict) and result.get("booking") == operation_id:
        progress.say("APPENDED", "returned", operation_id)
    else:
        progress.say("RECORD_FAILED", operation_id)
    guard.close()
    progress.say("DONE")
    return 0


def _write_base_info(witness: str, info: dict) -> None:
    with open(os.path.join(witness, BASE_INFO), "w", encoding="utf-8") as stream:
        json.dump(info, stream)
        stream.flush()
        os.fsync(stream.fileno())


def run_setup(step: str, home: str, witness: str) -> int:
    """One setup step (its own process): ``seed`` (a returned call), ``pending``
    (killed inside the tool, after the side effect), ``ahead_returned`` /
    ``ahead_started`` (killed between the head.json replace and COMMIT),
    ``lose_head`` (head.json deleted), ``corrupt_marker`` (the marker overwritten)."""
    os.makedirs(witness, exist_ok=True)
    if step == "lose_head":  # the damage restart-journal is for: an unanchored history
        os.unlink(os.path.join(data_dir(home), "head.json"))
        return 0
    if step == "corrupt_marker":  # a verdict with every event still anchored
        with open(os.path.join(data_dir(home), "initialized"), "w", encoding="utf-8") as stream:
            stream.write("not the marker\n")
        return 0
    if step == "seed":
        guard_module, _ = _product()
        guard = guard_module.RecoveryGuard(data_dir(home))
        guard.tool_execution("send_receipt", {"to": "ada"}, lambda: {"status": "sent"},
                             session_id="setup", tool_call_id=f"seed-{time.time_ns()}")
        guard.close()
        return 0
    kill = {"pending": "tool", "ahead_returned": "checkpoint_replaced:returned",
            "ahead_started": "checkpoint_replaced:started"}[step]
    return run_call(home, witness, raises=False, kill=kill)


# ------------------------------------------------------------- the checker --

def _capture_tracebacks() -> list:
    """Collect log records that carry a traceback (logger.exception)."""
    found: list = []

    class Collector(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info:
                found.append(self.format(record))

    root = logging.getLogger()
    root.handlers = [Collector()]
    root.setLevel(logging.WARNING)
    return found


def _run_step(step: dict, modules: dict) -> dict:
    """Run one step in this (forked) process; returns a JSON-safe result."""
    logged = _capture_tracebacks()
    if "cli" in step:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = modules["operator_cli"].main(step["cli"])
            except SystemExit as exc:
                code = f"SystemExit({exc.code})"
        return {"exit": code, "stdout": out.getvalue(), "logged": logged}
    marker = step["marker"]

    def probe():
        with open(marker, "w", encoding="utf-8") as stream:
            stream.write("the probe tool ran\n")
        return {"status": "probed"}

    guard = modules["guard"].RecoveryGuard(step["probe"])
    try:
        result = guard.tool_execution("probe_tool", {"probe": True}, probe,
                                      session_id="explorer-probe", tool_call_id="probe-1")
    finally:
        guard.close()
    return {"ran": os.path.exists(marker), "result": result if isinstance(result, str)
            else json.dumps(result, sort_keys=True, default=str), "logged": logged}


def _in_child(step: dict, modules: dict) -> dict:
    """Fork; the child runs ``step`` and sends its result through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        signal.alarm(STEP_TIMEOUT_SECONDS)
        try:
            result = _run_step(step, modules)
        except BaseException:  # noqa: BLE001 - every escape is a violation
            result = {"traceback": traceback.format_exc()}
        data = json.dumps(result).encode("utf-8")
        while data:
            data = data[os.write(write_end, data):]
        os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"traceback": f"the checker child died (wait status {status}): a hang or a "
                             "crash of the interpreter"}
    return json.loads(b"".join(chunks))


def serve() -> int:
    """The checker: one JSON request per stdin line, ``{"steps": [...]}``, each
    step ``{"cli": [argv...]}`` or ``{"probe": DATA_DIR, "marker": PATH}``; one
    JSON list of results per stdout line."""
    sys.path.insert(0, TESTS)
    from checkout import load_module
    modules = {"operator_cli": load_module("operator_cli"), "guard": load_module("guard")}
    for line in sys.stdin:
        request = json.loads(line)
        replies = [_in_child(step, modules) for step in request["steps"]]
        sys.stdout.write(json.dumps(replies) + "\n")
        sys.stdout.flush()
    return 0


class CheckerProcess:
    """The explorer's handle on one checker process (not thread-safe: one per thread)."""

    def __init__(self):
        self.errors = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "checker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.errors, text=True, cwd=TESTS)

    def run(self, steps: list) -> list:
        try:
            self.process.stdin.write(json.dumps({"steps": steps}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.errors.seek(0)
            raise RuntimeError("the checker process exited: "
                               + self.errors.read()[-2000:].decode("utf-8", "replace"))
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self.errors.close()


# ------------------------------------------------------- checking a state --

def documented_codes() -> set:
    """Every code docs/cli.md §Verdict codes names (integrity verdicts, refusals,
    operator command errors)."""
    with open(os.path.join(REPO, "docs", "cli.md"), encoding="utf-8") as stream:
        text = stream.read()
    section = text[text.index("## Verdict codes"):]
    end = section.find("\n## ", 1)
    return set(re.findall(r"`([a-z_]+)`", section if end < 0 else section[:end]))


def reference_summary(data: str) -> dict:
    """The journal as tests/journal_reference.py reads it (never the product)."""
    summary = {"ok": False, "errors": [], "events": [], "closed": [], "unresolved": [],
               "count": 0}
    if not os.path.isfile(os.path.join(data, "journal.sqlite3")):
        summary["errors"] = ["no journal.sqlite3"]
        return summary
    try:
        report = reference.verify(data)
        if report.count == 0 and report.errors == ["head.json missing"]:
            # docs/format.md §Creation: an empty journal whose creator died
            # before writing head.json is not damaged.
            report = reference.verify(data, require_head=False)
    except Exception as exc:  # noqa: BLE001 - an unreadable state is a state too
        summary["errors"] = [f"reference check raised {type(exc).__name__}: {exc}"]
        return summary
    summary.update(ok=report.ok, errors=report.errors[:3], count=report.count,
                   events=[[event["kind"], event.get("operation_id")] for event in report.events],
                   closed=[op for op, record in report.operations.items()
                           if record["state"] in ("returned", "resolved")],
                   unresolved=report.unresolved())
    return summary


def open_operations(home: str) -> list:
    """The open operations of the journal under a state root, as the
    reference reads them: ``[{operation_id, tool, session_id, tool_call_id,
    timestamp_ns}]`` (what a restart must carry over unchanged)."""
    report = reference.verify(data_dir(home), require_head=False)
    return [{"operation_id": operation_id, **{key: report.operations[operation_id][key] for key in
                                              ("tool", "session_id", "tool_call_id",
                                               "timestamp_ns")}}
            for operation_id in report.unresolved()]


def fingerprint(root: str) -> dict:
    """``{path: sha256}`` of the files under ``root`` (SQLite's -shm and an
    empty -wal, which any reader may create, left out)."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if name.endswith("-shm") or (name.endswith("-wal") and os.path.getsize(path) == 0):
                continue
            with open(path, "rb") as stream:
                found[os.path.relpath(path, root)] = hashlib.sha256(stream.read()).hexdigest()
    return found


def _cli(data: str, *words: str) -> dict:
    return {"cli": ["--data-dir", data, *words]}


def check_state(write_state, scratch: str, checker: CheckerProcess) -> dict:
    """Run the product's recovery on copies of one crash state.

    ``write_state(home)`` writes the state under a new state root.  On the first
    copy: ``verify`` and ``status`` (read-only: no file may change), then one
    protected call (the probe tool writes ``scratch/probe-ran``).  Where
    ``verify`` reports ``checkpoint_ahead``, on a second copy:
    ``repair-checkpoint``, ``verify`` and the protected call again.  Returns
    every result and the reference reading before each product run."""
    home = os.path.join(scratch, "state")
    write_state(home)
    data = data_dir(home)
    outcome = {"ref": reference_summary(data)}
    before = fingerprint(home)
    outcome["verify"], outcome["status"] = checker.run([_cli(data, "verify"),
                                                        _cli(data, "status")])
    after = fingerprint(home)
    outcome["readonly_changed"] = sorted(path for path in before.keys() | after.keys()
                                         if before.get(path) != after.get(path))
    marker = os.path.join(scratch, "probe-ran")
    [outcome["probe"]] = checker.run([{"probe": data, "marker": marker}])
    if cli_verdict(outcome["verify"], None)[0] == "checkpoint_ahead":
        home = os.path.join(scratch, "repaired")
        write_state(home)
        data = data_dir(home)
        [repair] = checker.run([_cli(data, "repair-checkpoint", "--evidence", EVIDENCE)])
        outcome["repair"] = {"repair": repair, "ref": reference_summary(data)}
        marker = os.path.join(scratch, "probe-after-repair-ran")
        outcome["repair"]["verify"], outcome["repair"]["probe"] = checker.run(
            [_cli(data, "verify"), {"probe": data, "marker": marker}])
    verdict, _ = cli_verdict(outcome["verify"], None)
    if verdict not in CRASH_VERDICTS and "restart-journal" in str(_next(outcome["verify"])):
        # The documented next step of every other verdict: restart-journal.
        home = os.path.join(scratch, "restarted")
        write_state(home)
        data = data_dir(home)
        [restart] = checker.run([_cli(data, "restart-journal", "--evidence", EVIDENCE)])
        marker = os.path.join(scratch, "probe-after-restart-ran")
        outcome["restart"] = {"restart": restart, "ref": reference_summary(data)}
        outcome["restart"]["status"], outcome["restart"]["probe"] = checker.run(
            [_cli(data, "status"), {"probe": data, "marker": marker}])
    shutil.rmtree(scratch, ignore_errors=True)
    return outcome


def _next(result: dict) -> Optional[str]:
    """``error.next`` of one command's document, or None."""
    try:
        return json.loads(result.get("stdout", "")).get("error", {}).get("next")
    except (ValueError, AttributeError):
        return None


def cli_verdict(result: dict, codes: Optional[set]) -> tuple:
    """``(verdict, problems)`` of one operator command: ``ok``, or the
    integrity/error code it reported; problems are what docs/cli.md does not
    allow (a traceback, no JSON, an undocumented code; ``codes`` None: no
    check)."""
    problems = [f"traceback: {text.strip().splitlines()[-1]}" for text in
                [result.get("traceback")] + result.get("logged", []) if text]
    try:
        document = json.loads(result.get("stdout", ""))
    except ValueError:
        return "no_output", problems + [f"not one JSON document: {result.get('stdout', '')[:200]!r}"]
    if result.get("exit") == 0 and document.get("ok") is True:
        return "ok", problems
    if result.get("exit") != 1:
        problems.append(f"exit {result.get('exit')} with ok={document.get('ok')}")
    error = document.get("error") if isinstance(document.get("error"), dict) else {}
    verdict = document.get("integrity") if document.get("integrity") not in (None, "ok") \
        else error.get("code", "no_code")
    for code in {verdict, error.get("code")} - {None}:
        if codes is not None and code not in codes:
            problems.append(f"undocumented code {code!r}")
    return verdict, problems


def probe_verdict(result: dict, codes: set) -> tuple:
    """``(verdict, problems)`` of the protected call: ``ran`` or ``blocked:CODE``."""
    problems = [f"traceback: {text.strip().splitlines()[-1]}" for text in
                [result.get("traceback")] + result.get("logged", []) if text]
    if result.get("ran"):
        return "ran", problems
    try:
        document = json.loads(result.get("result", ""))
    except ValueError:
        document = {}
    code = document.get("code") if isinstance(document, dict) else None
    if not (isinstance(document, dict) and document.get("blocked") is True):
        problems.append(f"neither ran nor blocked: {str(result.get('result'))[:200]}")
    elif code not in codes or code == "internal_error":
        problems.append(f"blocked with code {code!r}")
    return f"blocked:{code}", problems


# ------------------------------------------------------ facts and invariants --

@dataclass(frozen=True)
class Facts:
    """What the programs had established by a trace point (from the witness
    calls in the trace and the setup's ``base.json``).

    ``side_effect``: the tool had begun its side effect (opened the marker),
    so the side effect may exist.  ``subject``: that operation.  ``events``:
    ``(kind, operation_id)`` whose append had returned to the caller.
    ``settled``: the program had finished successfully (a guard program after
    ``DONE``, an operator command once it printed ``"ok": true``), so the
    journal must verify.  ``audit``: an operator.log action that must be there.
    ``verdicts``: what else than CRASH_VERDICTS this program may leave;
    ``kept_open``: the operations open in the initial state that every
    journal the program leaves (after its documented next step) keeps open
    with the same identity (a restart carries them over)."""
    side_effect: bool
    subject: Optional[str]
    events: tuple = ()
    settled: bool = False
    audit: Optional[str] = None
    verdicts: tuple = ()
    kept_open: tuple = ()


def facts_by_point(ops: list, base_info: dict, scenario: Scenario) -> list:
    """``Facts`` for every trace point 0..len(ops)."""
    program = scenario.program
    side, subject = bool(base_info.get("side_effect")), base_info.get("subject")
    events, settled, audit, output = [], False, None, b""
    constant = {"verdicts": scenario.verdicts,
                "kept_open": tuple(json.dumps(operation, sort_keys=True) for operation in
                                   base_info.get("open", ())) if program == "restart-journal"
                else ()}
    found = [Facts(side, subject, **constant)]
    for op in ops:
        if op.kind == "witness_open" and op.path == SIDE_EFFECT:
            side = True
        elif op.kind == "witness_write" and op.path == PROGRESS:
            for line in op.data.decode("utf-8", "replace").splitlines():
                words = line.split()
                if words[:1] == ["APPENDED"]:
                    events.append((words[1], words[2]))
                elif words[:1] == ["SIDE_EFFECT"]:
                    subject = words[1]
                elif words == ["DONE"]:
                    settled = True
        elif op.kind == "witness_write" and op.path == STDOUT:
            output += op.data
            try:
                document = json.loads(output)
            except ValueError:
                document = None
            if isinstance(document, dict) and document.get("ok") is True:
                settled, audit = True, program
                if document.get("resolved"):
                    events.append(("resolved", document["resolved"]))
                if document.get("lost_operation"):
                    events += [("started", document["lost_operation"]),
                               ("uncertain", document["lost_operation"])]
                events += [("started", operation_id)
                           for operation_id in document.get("carried_over") or ()]
        found.append(Facts(side, subject, tuple(events), settled, audit, **constant))
    return found


def _operator_log_actions(files: dict) -> list:
    """The actions in the state's operator.log (``files``: path -> bytes)."""
    text = files.get(os.path.join(DATA_SUBDIR, "operator.log"), b"").decode("utf-8", "replace")
    actions = []
    for line in text.splitlines():
        try:
            actions.append(json.loads(line).get("action"))
        except (ValueError, AttributeError):
            actions.append(None)
    return actions


def evaluate(facts: Facts, outcome: dict, codes: set, files: dict) -> list:
    """The invariants of one crash state (``files``: its path -> bytes):
    ``[(invariant, message)]``.

    * ``bad_outcome``: every command answers with one JSON document and a code
      of docs/cli.md §Verdict codes; no traceback, no internal_error;
    * ``ok_but_unverifiable``: ``verify`` says ok only when the reference
      reading accepts the journal, and ``status`` lists what it lists as open;
    * ``crash_verdict``: the verdict is one a crash may leave (CRASH_VERDICTS);
    * ``gate_opened``: where the side effect may exist and the journal does not
      close its operation, the new protected call is refused;
    * ``event_lost``: every event whose append returned is in the database;
    * ``not_settled``: once the program finished, the journal verifies;
    * ``audit_lost``: an operator command that reported success left its
      operator.log line;
    * ``readonly_wrote``: verify and status change no file;
    * ``repair_*``: where repair-checkpoint is offered it succeeds, leaves a
      verifying journal, loses no returned event and opens no gate."""
    found = []
    verify, problems = cli_verdict(outcome["verify"], codes)
    status, more = cli_verdict(outcome["status"], codes)
    probe, probe_problems = probe_verdict(outcome["probe"], codes)
    found += [("bad_outcome", f"{name}: {problem}") for name, issues in
              (("verify", problems), ("status", more), ("protected call", probe_problems))
              for problem in issues]
    ref = outcome["ref"]
    if verify != status:
        found.append(("bad_outcome", f"verify says {verify} but status says {status}"))
    if verify == "ok" and not ref["ok"]:
        found.append(("ok_but_unverifiable", f"verify ok, reference: {ref['errors']}"))
    if verify == "ok" and status == "ok" and ref["ok"]:
        listed = json.loads(outcome["status"]["stdout"]).get("unresolved", [])
        if sorted(op.get("operation_id") for op in listed) != sorted(ref["unresolved"]):
            found.append(("ok_but_unverifiable", f"status lists {len(listed)} open, the "
                          f"reference {ref['unresolved']}"))
    if verify not in CRASH_VERDICTS | set(facts.verdicts):
        found.append(("crash_verdict", f"verify reports {verify}, which is not a state the "
                      f"documentation says a crash can leave (protected call: {probe})"))
    if verify == "ok" and status == "ok":
        found += _identity_problems(facts, outcome["status"], "")
    exposed = facts.side_effect and facts.subject not in ref["closed"]
    if exposed and probe == "ran":
        found.append(("gate_opened", f"the side effect of {facts.subject} may exist, the journal "
                      f"does not close it (verify: {verify}), and a new protected call ran"))
    present = {tuple(event) for event in ref["events"]}
    lost = [event for event in facts.events if event not in present]
    if lost:
        found.append(("event_lost", f"appends that had returned are missing: {lost} "
                      f"(verify: {verify}, database holds {ref['count']} events)"))
    if facts.settled and verify != "ok":
        found.append(("not_settled", f"the program had finished, but verify reports {verify}"))
    if facts.audit and facts.audit not in _operator_log_actions(files):
        found.append(("audit_lost", f"{facts.audit} reported success, but operator.log has no "
                      f"{facts.audit} line"))
    if outcome["readonly_changed"]:
        found.append(("readonly_wrote", f"verify/status changed {outcome['readonly_changed']}"))
    repair = outcome.get("repair")
    if repair is not None:
        repaired, issues = cli_verdict(repair["repair"], codes)
        after, later = cli_verdict(repair["verify"], codes)
        probe_after, last = probe_verdict(repair["probe"], codes)
        found += [("bad_outcome", f"after repair: {problem}") for problem in issues + later + last]
        if repaired != "ok" or after != "ok":
            found.append(("repair_failed", f"checkpoint_ahead, but repair-checkpoint says "
                          f"{repaired} and verify after it {after}"))
        if exposed and probe_after == "ran":
            found.append(("repair_opened_gate", f"after repair-checkpoint a new protected call "
                          f"ran although the side effect of {facts.subject} may exist"))
        gone = [event for event in facts.events
                if event in present and event not in {tuple(e) for e in repair["ref"]["events"]}]
        if gone:
            found.append(("event_lost", f"repair-checkpoint removed returned events {gone}"))
    restart = outcome.get("restart")
    if restart is not None:
        restarted, issues = cli_verdict(restart["restart"], codes)
        after, later = cli_verdict(restart["status"], codes)
        probe_after, last = probe_verdict(restart["probe"], codes)
        found += [("bad_outcome", f"after restart: {problem}")
                  for problem in issues + later + last]
        if restarted != "ok" or after != "ok" or not restart["ref"]["ok"]:
            found.append(("restart_failed", f"verify says {verify} and names restart-journal, "
                          f"which says {restarted}; status after it {after}, reference "
                          f"{restart['ref']['errors']}"))
        if exposed and probe_after == "ran":
            found.append(("restart_opened_gate", f"after restart-journal a new protected call "
                          f"ran although the side effect of {facts.subject} may exist"))
        found += _identity_problems(facts, restart["status"], "after restart-journal ")
    return found


def _identity_problems(facts: Facts, status: dict, when: str) -> list:
    """``identity_lost``: an operation open in the initial state is not open
    in ``status`` with the same id, tool, session, call id and start time."""
    if not facts.kept_open:
        return []
    try:
        listed = {operation["operation_id"]: operation
                  for operation in json.loads(status.get("stdout", "")).get("unresolved", [])}
    except (ValueError, AttributeError, KeyError, TypeError):
        return [("identity_lost", f"{when}status lists no operations")]
    problems = []
    for text in facts.kept_open:
        wanted = json.loads(text)
        shown = listed.get(wanted["operation_id"])
        seen = None if shown is None else {
            "operation_id": shown["operation_id"], "tool": shown.get("tool"),
            "session_id": shown.get("session_id"), "tool_call_id": shown.get("tool_call_id"),
            "timestamp_ns": shown.get("started_ns")}
        if seen != wanted:
            problems.append(("identity_lost", f"{when}status shows {seen} for the operation "
                             f"open before as {wanted}"))
    return problems


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["checker"]:
        return serve()
    if argv[:1] == ["setup"] and len(argv) == 4:
        return run_setup(argv[1], argv[2], argv[3])
    if argv[:1] == ["call"] and len(argv) in (3, 4):
        return run_call(argv[1], argv[2], raises=argv[3:] == ["--raise"])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
