#!/usr/bin/env python3
"""Real kills: SIGKILL an operator command before each of its file-system
calls on the state root, then follow the documented next steps.

The crash-state explorer (tests/crash_explorer.py) models what a kill leaves
("everything issued"); this runs the real thing.  For a scenario of
tests/explorer_scenarios.py whose program is an operator command
(``restart-journal``, ``repair-checkpoint``):

1. record the program once under strace (crash_explorer.record), and list every
   call it makes on the state root -- opens, writes, truncates, fsyncs, renames,
   links, unlinks, mkdirs -- ours and SQLite's, with the number of that call
   in the process (strace counts ``when=`` per syscall and process);
2. for each of them, run the program again on a fresh copy of the initial
   state under ``strace -e inject=CALL:signal=KILL:when=N``: the kernel
   delivers SIGKILL on entering that call, so it never runs.  The killed
   call is read back from that run's own trace and must be the one aimed at;
3. on what the kill left, in fresh processes: ``status``, one protected call,
   then the command ``status`` names in ``next`` (run again, as the
   documentation says), then ``status``, a protected call and the reference
   reading (tests/journal_reference.py) again.

Checked at every kill point (``evaluate``): one JSON document per command
with a documented code; the verdict is one a crash of the program may leave
and names the program as its next step; no protected call runs while the
side effect of an open operation may exist; the next step succeeds; after it
the journal verifies, every operation open before keeps its id, tool,
session, call id and start time, exactly the lost operations the program
brings back are there, and -- for restart-journal -- the evidence folder holds
the old journal's files byte for byte, one folder, no staging folder or intent
left, one operator.log line.

    python tests/kill_points.py [--scenario NAME]... [--every N] [--jobs N]

Test-only; needs strace (tests/test_restart_killed.py samples it).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Callable, Optional

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
import crash_explorer as explorer  # noqa: E402
import explorer_scenarios as scenarios  # noqa: E402

# The scenarios whose program is an operator command that moves files.
KILL_SCENARIOS = ("restart", "restart_marker", "repair_lost_started", "repair")
# The calls a kill is aimed before: every call that touches a file or a name.
AIMED_CALLS = ("openat", "open", "creat", "write", "pwrite64", "ftruncate", "truncate", "fsync",
               "fdatasync", "rename", "renameat", "renameat2", "link", "linkat", "unlink",
               "unlinkat", "mkdir", "mkdirat", "rmdir")
# Same interpreter behaviour in every run: the call counts must line up.
STEADY_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
_CALL = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
_RESUMED = re.compile(r"^\d+\s+<\.\.\. \w+ resumed>")
_HEX = re.compile(r"((?:\\x[0-9a-f]{2})+)")
_VARYING = ((re.compile(r"\.\d+-[0-9a-f]{8}"), ".PID-HEX"),
            (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "UUID"),
            (re.compile(r"\d{8}T\d{6}Z"), "TIME"), (re.compile(r"/proc/\d+/"), "/proc/PID/"))


def _decoded(text: str) -> str:
    return _HEX.sub(lambda match: bytes.fromhex(match.group(1).replace("\\x", "")).decode(
        "utf-8", "replace"), text)


def call_shape(line: str, home: str) -> str:
    """What identifies a call across runs: its name and the paths it names
    (the state root, pids, random hex, journal ids and times replaced); for a
    write, only the file written."""
    match = _CALL.match(line.strip())
    if not match:
        return ""
    name, arguments = match.group(2), _decoded(match.group(3).split(") = ")[0])
    if name in ("write", "pwrite64"):
        arguments = arguments.split(", ")[0]
    arguments = re.sub(r"^\d+<", "<", arguments.replace(home, "HOME"))
    arguments = re.sub(r"AT_FDCWD<[^>]*>", "AT_FDCWD", arguments)
    for pattern, replacement in _VARYING:
        arguments = pattern.sub(replacement, arguments)
    return f"{name}({arguments[:300]}"


def kill_targets(recording: explorer.Recording) -> list:
    """``[(index, call, n, shape)]``: every aimed call of the recorded program
    on its state root, in order, with ``n`` = its number among the calls of
    that name in its process (strace's ``when=``)."""
    counts, targets = defaultdict(int), []
    with open(recording.trace, encoding="ascii", errors="replace") as stream:
        for text in stream:
            match = _CALL.match(text.strip())
            if not match or _RESUMED.match(text):
                continue
            pid, name = int(match.group(1)), match.group(2)
            counts[(pid, name)] += 1
            shape = call_shape(text, recording.home)
            if name in AIMED_CALLS and "HOME" in shape:  # the file it names, not its data
                targets.append((len(targets), name, counts[(pid, name)], shape))
    return targets


@contextlib.contextmanager
def own_device(directory: str):
    """A tmpfs of its own at ``directory`` for the block, where this process
    may mount (root): the program lists other processes' open files when the
    kernel shows a lock on its data directory's device it cannot account for
    (storage/call_lock.py, deleted call locks), so a lock another program
    holds on a shared device would add calls and move the kill point.  Yields
    whether the directory is a device of its own."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m,mode=0700", "tmpfs",
                              directory], capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", directory], capture_output=True)


def run_killed(recording: explorer.Recording, target: tuple, root: str) -> dict:
    """Run the program on a copy of the initial state, killed before
    ``target``; returns ``{"home", "returncode", "killed_shape"}``."""
    _, name, number, _ = target
    # As deep as the recorded run's state root (SCRATCH/NAME/run/home): the
    # directories fsynced on the way up are counted calls too.
    home, witness = os.path.join(root, "run", "home"), os.path.join(root, "run", "witness")
    recording.base.write_to(home)
    os.makedirs(witness)
    trace = os.path.join(root, "kill-trace.txt")
    argv = scenarios.program_argv(recording.scenario, home, witness, recording.base_info)
    with open(os.path.join(witness, scenarios.STDOUT), "wb") as output:
        completed = subprocess.run(
            ["strace", "-f", "-y", "-xx", "-s", "256", "-e", f"trace={name}",
             "-e", f"inject={name}:signal=KILL:when={number}", "-o", trace, *argv],
            cwd=root, stdout=output, stderr=subprocess.PIPE, timeout=300,
            env={**os.environ, **STEADY_ENV})
    with open(trace, encoding="ascii", errors="replace") as stream:
        calls = [text for text in stream if _CALL.match(text.strip())
                 and not _RESUMED.match(text)]
    return {"home": home, "returncode": completed.returncode,
            "killed_shape": call_shape(calls[-1], home) if calls else ""}


def follow_up(home: str, program: str, checker: scenarios.CheckerProcess) -> dict:
    """What a person does after the kill (docs/cli.md: an interrupted command
    is run again): ``status`` (a protected call comes in meanwhile), the
    command again, then ``status`` and a protected call again.  ``next``: the
    command ``status`` names, when it is not ok."""
    data = scenarios.data_dir(home)
    marker = os.path.join(os.path.dirname(home), "probe-ran")  # outside the state root
    found = {"intent": None}
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(data, "restart.json"), encoding="utf-8") as stream:
            found["intent"] = json.load(stream)  # what the killed run meant to do
    found["status"], found["probe"] = checker.run(
        [{"cli": ["--data-dir", data, "status"]}, {"probe": data, "marker": marker}])
    if os.path.exists(marker):
        os.unlink(marker)
    found["next"] = _next_words(_document(found["status"]), data)
    [found["again"]] = checker.run([{"cli": ["--data-dir", data, program, "--evidence",
                                             scenarios.EVIDENCE]}])
    found["after"], found["probe_after"] = checker.run(
        [{"cli": ["--data-dir", data, "status"]}, {"probe": data, "marker": marker}])
    found["ref"] = scenarios.reference_summary(data)
    return found


def _document(result: dict) -> dict:
    try:
        document = json.loads(result.get("stdout", ""))
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def _next_words(document: dict, data: str) -> Optional[list]:
    """The operator command words of ``error.next`` (after ``--data-dir
    DIR``), placeholders filled in; None when status is ok."""
    if document.get("ok") is True:
        return None
    text = str((document.get("error") or {}).get("next") or "")
    marker = f"--data-dir {data} "
    if marker not in text:
        return ["<no next step>"]
    words = shlex.split(text.split(marker, 1)[1])
    return [scenarios.EVIDENCE if word.startswith("<") else word for word in words]


def _files_below(directory: str) -> dict:
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            if name.endswith("-shm"):
                continue
            with open(os.path.join(root, name), "rb") as stream:
                found[os.path.relpath(os.path.join(root, name), directory)] = stream.read()
    return found


def evaluate(recording: explorer.Recording, target: tuple, killed: dict, found: dict,
             codes: set) -> list:
    """The invariants of one kill point: ``[(invariant, message)]``."""
    problems = []
    scenario, info = recording.scenario, recording.base_info
    if killed["returncode"] not in (-9, 137):
        problems.append(("not_killed", f"the program exited {killed['returncode']} instead of "
                         "being killed"))
    if killed["killed_shape"] != target[3]:
        problems.append(("kill_point", f"killed at {killed['killed_shape']!r}, aimed at "
                         f"{target[3]!r}"))
    verdict, issues = scenarios.cli_verdict(found["status"], codes)
    problems += [("bad_outcome", f"status: {issue}") for issue in issues]
    if verdict not in scenarios.CRASH_VERDICTS | set(scenario.verdicts):
        problems.append(("crash_verdict", f"status says {verdict}"))
    exposed = bool(info.get("side_effect"))
    for key in ("probe", "probe_after"):
        probe, more = scenarios.probe_verdict(found[key], codes)
        problems += [("bad_outcome", f"{key}: {issue}") for issue in more]
        if exposed and probe == "ran":
            problems.append(("gate_opened", f"{key}: a protected call ran while the side effect "
                             f"of {info.get('subject')} may exist (status said {verdict})"))
    if found["next"] is not None and found["next"][:1] != [scenario.program]:
        problems.append(("next_step", f"status said {verdict} and named {found['next'][:1]}, "
                         f"not {scenario.program}"))
    again, more = scenarios.cli_verdict(found["again"], codes)
    problems += [("bad_outcome", f"{scenario.program} again: {issue}") for issue in more]
    finished = again == "ok" or (verdict == "ok" and _document(found["again"]).get(
        "integrity") == "ok" and again.endswith("_not_applicable"))
    if not finished:
        problems.append(("next_step_failed", f"status said {verdict}; {scenario.program} run "
                         f"again answered {again}"))
    if found["intent"] is not None:
        # The rerun finishes the killed run's restart: its very result.
        meant, done = found["intent"]["result"], _document(found["again"])
        same = ("found", "replaced_journal_id", "last_verified_checkpoint", "evidence_directory",
                "carried_over", "lost_operation", "archive_anchor", "checkpoint_after")
        if done.get("resumed") is not True or any(done.get(key) != meant[key] for key in same):
            problems.append(("not_resumed", f"restart.json meant {[meant[key] for key in same]}"
                             f", the rerun did {[done.get(key) for key in same]} (resumed: "
                             f"{done.get('resumed')})"))
    after, more = scenarios.cli_verdict(found["after"], codes)
    problems += [("bad_outcome", f"status after: {issue}") for issue in more]
    if after != "ok" or not found["ref"]["ok"]:
        problems.append(("not_settled", f"after the next step status says {after}, the reference "
                         f"{found['ref']['errors']}"))
        return problems
    facts = scenarios.Facts(exposed, info.get("subject"), kept_open=tuple(
        json.dumps(operation, sort_keys=True) for operation in info.get("open", ())))
    problems += scenarios._identity_problems(facts, found["after"], "after the next step ")
    listed = _document(found["after"]).get("unresolved") or []
    lost = [operation for operation in listed if operation.get("tool") == "unknown"]
    if len(lost) != recording_lost(recording):
        problems.append(("lost_operation", f"{len(lost)} operations of tool unknown, expected "
                         f"{recording_lost(recording)}"))
    problems += _leftover_problems(recording, killed["home"])
    return problems


def _kept_copy(path: str, scratch: str) -> str:
    """A copy of a file or folder of the recording outside its own device."""
    copy = os.path.join(scratch, "recorded-" + os.path.basename(path))
    (shutil.copytree if os.path.isdir(path) else shutil.copy2)(path, copy)
    return copy


def recording_lost(recording: explorer.Recording) -> int:
    """How many lost operations the uninterrupted program brings back."""
    with open(os.path.join(recording.witness, scenarios.STDOUT), encoding="utf-8") as stream:
        document = json.load(stream)
    return 1 if document.get("lost_operation") else 0


def _leftover_problems(recording: explorer.Recording, home: str) -> list:
    """The files around the journal: evidence byte for byte, nothing half-done."""
    data = scenarios.data_dir(home)
    problems, program = [], recording.scenario.program
    try:
        with open(os.path.join(data, "operator.log"), encoding="utf-8") as stream:
            actions = [json.loads(line).get("action") for line in stream if line.strip()]
    except FileNotFoundError:
        actions = []
    # restart-journal writes its line before its last step: exactly one.  Any
    # other command killed between its change and its line leaves none (the
    # journal is the source of truth, docs/cli.md §operator.log): at most one.
    wanted = (1,) if program == "restart-journal" else (0, 1)
    if actions.count(program) not in wanted:
        problems.append(("audit", f"operator.log holds {actions.count(program)} {program} lines"))
    if program != "restart-journal":
        return problems
    leftovers = [name for name in os.listdir(data)
                 if name.endswith(".tmp") or name == "restart.json"]
    if leftovers:
        problems.append(("leftover", f"left in the data directory: {leftovers}"))
    folders = os.listdir(os.path.join(data, "replaced"))
    if len(folders) != 1:
        problems.append(("evidence", f"{len(folders)} evidence folders: {folders}"))
    elif _kept(os.path.join(data, "replaced", folders[0])) != _kept(recording.base_data):
        problems.append(("evidence", f"the evidence folder holds "
                         f"{_kept(os.path.join(data, 'replaced', folders[0]))}, not the old "
                         f"journal's {_kept(recording.base_data)}"))
    return problems


def _kept(directory: str) -> dict:
    """The old journal as kept: its rows (read from a copy: a refusal in
    between may have folded its WAL, docs/format.md; issue 28 item 4), the
    other files byte for byte."""
    files = {name: content for name, content in _files_below(directory).items()
             if "/" not in name and name.startswith(("head.json", "initialized", "journal."))}
    kept = {name: content for name, content in files.items()
            if not name.startswith("journal.sqlite3")}
    kept["rows"] = scenarios.reference.snapshot_rows(directory) if (
        "journal.sqlite3" in files) else None
    return kept


def explore_kills(name: str, scratch: str, *, every: int = 1, jobs: int = 4,
                  choose: Optional[Callable[[list], list]] = None) -> dict:
    """Kill the scenario's program before each aimed call (every ``every``-th,
    or the indices ``choose(targets)`` returns); returns ``{"scenario",
    "targets", "killed", "violations": [...], "seconds"}``."""
    started = time.monotonic()
    saved = {key: os.environ.get(key) for key in STEADY_ENV}
    os.environ.update(STEADY_ENV)
    try:
        recorded = os.path.join(scratch, name)  # where record() puts it (same depth as a kill)
        os.makedirs(recorded)
        with own_device(recorded):  # the recording's calls, free of other programs' locks
            recording = explorer.record(scenarios.scenario_named(name), scratch)
            recording.trace = _kept_copy(recording.trace, scratch)
            recording.witness = _kept_copy(recording.witness, scratch)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    recording.base_data = os.path.join(scratch, f"{name}-base")
    recording.base.write_to(recording.base_data)
    recording.base_data = scenarios.data_dir(recording.base_data)
    targets = kill_targets(recording)
    aimed = [targets[index] for index in choose(targets)] if choose else targets[::every]
    codes = scenarios.documented_codes()
    checkers, violations = explorer.Checkers(), []

    def one(target: tuple) -> list:
        root = tempfile.mkdtemp(dir=scratch, prefix=f"kill-{target[0]}-")
        try:
            with own_device(root):
                killed = run_killed(recording, target, root)
                found = follow_up(killed["home"], recording.scenario.program, checkers.get())
                return [{"index": target[0], "call": target[3], "invariant": invariant,
                         "message": message, "status": found["status"].get("stdout", "")[:600]}
                        for invariant, message in evaluate(recording, target, killed, found,
                                                           codes)]
        finally:
            shutil.rmtree(root, ignore_errors=True)

    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            for found in pool.map(one, aimed):
                violations += found
    finally:
        checkers.close()
    return {"scenario": name, "targets": len(targets), "killed": len(aimed),
            "violations": sorted(violations, key=lambda item: item["index"]),
            "seconds": time.monotonic() - started}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", choices=KILL_SCENARIOS)
    parser.add_argument("--every", type=int, default=1, help="aim at every N-th call only")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--show", type=int, default=5)
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace is not installed; nothing killed", file=sys.stderr)
        return 2
    scratch = tempfile.mkdtemp(prefix="kill-points-", dir=explorer.FAST_TMP)
    total = 0
    try:
        for name in args.scenario or KILL_SCENARIOS:
            result = explore_kills(name, scratch, every=args.every, jobs=args.jobs)
            print(f"{name} ({scenarios.scenario_named(name).program}): {result['targets']} calls "
                  f"on the state root, {result['killed']} kill points, "
                  f"{len({v['index'] for v in result['violations']})} violating, "
                  f"{result['seconds']:.1f} s", flush=True)
            for violation in result["violations"][:args.show]:
                print(f"  VIOLATION {violation['invariant']} killed before #{violation['index']} "
                      f"{violation['call']}: {violation['message']}\n    status: "
                      f"{violation['status'][:300]}", flush=True)
            total += len(result["violations"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"total: {total} violations")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
