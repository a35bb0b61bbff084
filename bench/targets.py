"""The targets and the printed tables.

``evaluate_targets`` turns the report into one row per target (name, measured,
target, met; met is None where the run cannot measure it, e.g. too few events
for a ratio); ``format_tables`` renders the targets and every measurement as
the Markdown tables pasted into bench/RESULTS.md.  Only ratios measured within
one run are targets: absolute times on a shared machine are noisy.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from busy_workers import BUSY_WORKERS, format_busy_workers
from cli_costs import CLI_COMMANDS
from lock_mechanisms import format_lock_mechanisms
from os_calls import format_os_call_table
from runtime_lines import format_runtime_lines
from side_by_side import format_side_by_side
from stats import milliseconds, ratio
from workers import LOCK_TEST_BUSY_TIMEOUT_SECONDS

# Targets (this round's, and those kept from the first round's benchmark).
TARGET_VERIFY_RATIO = 1.5
TARGET_VERIFY_EVENTS_PER_SECOND = 500_000
TARGET_RSS_MB = 64.0
TARGET_WORKER_RATIO = 2.0
TARGET_LOCK_HOLD_P99_MS = 50.0
TARGET_AFTER_ARCHIVE_EXTRA_MS = 20.0
TARGET_OVERHEAD_RATIO = 1.5
TARGET_FSYNCS_PER_APPEND = 3
TARGET_STATUS_SECONDS = 2.5       # first-round target
TARGET_FIRST_CALL_SECONDS = 2.5   # first-round target
TARGET_EVENTS = 1_000_000
RATIO_MIN_EVENTS = 10_000        # below this, verification times are too small for a ratio
# Issue 27's targets.
TARGET_CALL_RATIO_DISK = 1.25     # protected call p50 / protocol floor p50, on disk
TARGET_CALL_RATIO_TMPFS = 3.0     # the same on tmpfs
TARGET_FIRST_CALL_TO_VERIFY = 1.0
TARGET_REFUSAL_P99_MS = 20.0      # refused because another call is in flight, 8 busy workers
TARGET_CPU_TO_BASELINE = 0.5      # "CPU per protected call halved"
TARGET_LOCK_MECHANISMS = 4
TARGET_RUNTIME_LINES = 9_300
TARGET_STATS_PER_FILE_PER_READ = 1


def issue_27_rows(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The rows of issue 27's targets (each row's name says what it compares)."""
    rows: List[Dict[str, Any]] = []
    largest = report["sizes"][-1]
    at = f"{largest['events']:,} events"
    short = "; history smaller than the targets' 1M" if largest["events"] < TARGET_EVENTS else ""

    def add(name: str, measured: Any, target: str, met: Optional[bool], note: str) -> None:
        rows.append({"name": name, "measured": measured, "target": target, "met": met, "note": note})

    side = report.get("side_by_side") or {"filesystems": {}}
    for system, limit in (("disk", TARGET_CALL_RATIO_DISK), ("tmpfs", TARGET_CALL_RATIO_TMPFS)):
        entry = side["filesystems"].get(system)
        for key, label in (("middleware", "middleware"), ("hook_and_middleware", "hook + middleware")):
            name = f"protected call on {system}, fresh journal, {label} p50 / protocol floor p50 (issue 27)"
            if entry is None:
                add(name, None, f"<= {limit}", None, side.get("not_measured", {}).get(system, "not measured"))
                continue
            series, floor = entry["series"][key], entry["series"]["floor"]
            value = series["wall_ratio_to_floor_p50"]
            add(name, value, f"<= {limit}", value <= limit,
                f"{series['wall']['p50_ms']:.2f} ms vs floor {floor['wall']['p50_ms']:.2f} ms, interleaved "
                f"with the peers, {series['wall']['n']} calls each")
    overhead = largest["overhead"]
    for prefix, label in (("protected_call", "middleware"), ("hook_and_protected_call", "hook + middleware")):
        value = overhead[f"{prefix}_overhead_ratio_p50"]
        add(f"protected call on disk at {at}, one process, {label} p50 / protocol floor p50 (issue 27)",
            value, f"<= {TARGET_CALL_RATIO_DISK}", value <= TARGET_CALL_RATIO_DISK,
            f"{overhead[f'{prefix}_p50_ms']:.2f} ms vs floor {overhead['floor_call_p50_ms']:.2f} ms" + short)
    versus = largest["first_call_vs_verify"]
    value = versus["ratio_process_to_verify"]
    add(f"fresh process's first protected call at {at} / `verify` (whole processes, alternating)", value,
        f"<= {TARGET_FIRST_CALL_TO_VERIFY}",
        (value <= TARGET_FIRST_CALL_TO_VERIFY) if largest["events"] >= RATIO_MIN_EVENTS and value else None,
        f"{versus['first_call_process_seconds']:.3f} s vs {versus['verify_process_seconds']:.3f} s, median of "
        f"{versus['pairs']} pairs; guard to first call's return alone {versus['first_call_seconds']:.3f} s "
        f"({show(versus['ratio_first_call_to_verify'], 3)} x)" + short)
    busy = largest.get("busy_workers")
    if busy:
        refusal = busy["in_flight_refusal"]
        p99 = refusal["p99_ms"] if refusal else None
        together, alone = busy["together"], busy["alone"]
        add(f"refusal because another call is in flight, p99 with {BUSY_WORKERS} busy workers at {at} (ms)",
            p99, f"<= {TARGET_REFUSAL_P99_MS:.0f}", (p99 <= TARGET_REFUSAL_P99_MS) if p99 is not None else None,
            (f"p50 {refusal['p50_ms']:.2f} ms, max {refusal['max_ms']:.2f} ms over {refusal['n']} refusals"
             if refusal else "no call was refused operation_in_flight")
            + f"; other refusals: {together['refused'] - (refusal['n'] if refusal else 0)}" + short)
        add(f"throughput of {BUSY_WORKERS} busy workers / one worker at {at} (admitted calls/s)",
            busy["throughput_ratio"], "printed (no target)", None,
            f"{together['admitted_per_second']} vs {alone['admitted_per_second']} calls/s, "
            f"{busy['seconds_per_phase']} s per phase, {busy['pause_after_refusal_seconds'] * 1000:.0f} ms "
            "pause after a refusal" + short)
    baseline = report["settings"].get("cpu_baseline_us")
    for system in ("disk", "tmpfs"):
        entry = side["filesystems"].get(system)
        if entry is None:
            continue
        product, floor = entry["series"]["hook_and_middleware"], entry["series"]["floor"]
        cpu_us = round(product["cpu"]["mean_ms"] * 1000, 1)
        add(f"CPU per protected call on {system} (hook + middleware, mean, µs) / protocol floor's",
            product["cpu_ratio_to_floor_mean"], "printed (no target)", None,
            f"{cpu_us} µs vs floor {floor['cpu']['mean_ms'] * 1000:.1f} µs; extra "
            f"{product['extra_cpu_over_floor_mean_ms'] * 1000:.1f} µs")
        measured_baseline = entry["series"].get("baseline")
        if measured_baseline:  # the code before, measured in this run
            reference = round(measured_baseline["cpu"]["mean_ms"] * 1000, 1)
            source = f"the baseline series (--baseline-root, same run) {reference} µs"
        else:
            reference = baseline.get(system) if baseline else None
            source = f"baseline {reference} µs (--cpu-baseline-us)"
        add(f"CPU per protected call on {system} / the baseline before issue 27 (\"halved\")",
            ratio(cpu_us, reference), f"<= {TARGET_CPU_TO_BASELINE}",
            (cpu_us / reference <= TARGET_CPU_TO_BASELINE) if reference else None,
            f"{cpu_us} µs vs {source}" if reference
            else f"{cpu_us} µs; no baseline given (--baseline-root DIR, or --cpu-baseline-us DISK[,TMPFS])")
        if measured_baseline:  # the part above the floor, the one the code can change
            extra, extra_before = (product["extra_cpu_over_floor_mean_ms"] * 1000,
                                   (measured_baseline["cpu"]["mean_ms"] - floor["cpu"]["mean_ms"]) * 1000)
            add(f"CPU per protected call above the protocol floor on {system} / the baseline's above "
                "the same floor", ratio(extra, extra_before), f"<= {TARGET_CPU_TO_BASELINE}",
                (extra / extra_before <= TARGET_CPU_TO_BASELINE) if extra_before > 0 else None,
                f"{extra:.1f} µs vs {extra_before:.1f} µs above the floor's {floor['cpu']['mean_ms'] * 1000:.1f} µs "
                "(the floor's own share is what two durable appends cost, whatever the code)")
    locks = report["lock_mechanisms"]
    add("cross-process lock mechanisms (from the source and a traced run)", locks["count"],
        f"<= {TARGET_LOCK_MECHANISMS}", locks["count"] <= TARGET_LOCK_MECHANISMS,
        "; ".join(f"{entry['kind']} on {entry['file']}" for entry in locks["mechanisms"]))
    lines = report["runtime_lines"]
    add("runtime Python lines (every .py outside tests/ and bench/)", lines["lines"],
        f"<= {TARGET_RUNTIME_LINES:,}", lines["lines"] <= TARGET_RUNTIME_LINES,
        f"{lines['files']} files; " + ", ".join(f"{name} {part['lines']:,}" for name, part in lines["parts"].items()))
    counted = largest["os_calls"]
    worst = max((counted[kind] for kind in ("read", "read_unchanged")), key=lambda entry: entry["most_stats_of_one_file"])
    add(f"stat-family calls (stat + lstat + fstat) of one file per read at {at}", worst["most_stats_of_one_file"],
        f"<= {TARGET_STATS_PER_FILE_PER_READ}", worst["most_stats_of_one_file"] <= TARGET_STATS_PER_FILE_PER_READ,
        f"`{worst['most_statted_file']}`; per read after a write: "
        + ", ".join(f"{name} {value:g}" for name, value in counted["read"]["stats_per_file"].items())
        + f"; per protected call: stat {counted['protected_call']['per_function']['stat']:g}, lstat "
        f"{counted['protected_call']['per_function']['lstat']:g}, fstat "
        f"{counted['protected_call']['per_function']['fstat']:g}, open "
        f"{counted['protected_call']['per_function']['open']:g}" + short)
    return rows


def evaluate_targets(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per target: name, measured, target, met (None = not measurable)."""
    sizes = report["sizes"]
    smallest, largest = sizes[0], sizes[-1]
    at = f"{largest['events']:,} events"
    short_history = largest["events"] < TARGET_EVENTS
    rows: List[Dict[str, Any]] = issue_27_rows(report)

    def add(name: str, measured: Any, target: str, met: Optional[bool], note: str = "") -> None:
        if short_history:
            note = (note + "; " if note else "") + "history smaller than the targets' 1M"
        rows.append({"name": name, "measured": measured, "target": target, "met": met, "note": note})

    verification = largest["verification"]
    rate, verify_ratio = verification["product_events_per_second"], verification["ratio_to_reference"]
    measurable = largest["events"] >= RATIO_MIN_EVENTS
    add(f"full verification / chain-only reference at {at}", verify_ratio,
        f"<= {TARGET_VERIFY_RATIO}", (verify_ratio <= TARGET_VERIFY_RATIO) if measurable and verify_ratio else None,
        f"{verification['product_seconds']:.3f} s vs {verification['reference_chain_only_seconds']:.3f} s"
        + ("" if measurable else f"; too few events to compare (< {RATIO_MIN_EVENTS:,})"))
    add(f"full verification at {at} (events/s)", rate, f">= {TARGET_VERIFY_EVENTS_PER_SECOND:,}",
        (rate >= TARGET_VERIFY_EVENTS_PER_SECOND) if measurable and rate else None,
        f"reference loop here: {verification['reference_chain_only_events_per_second']:,} events/s"
        if verification["reference_chain_only_events_per_second"] else "")
    for words in CLI_COMMANDS:
        entry = largest["cli"]["commands"].get(words)
        if entry is None:
            add(f"peak RSS of `{words}` at {at} (MB)", None, f"<= {TARGET_RSS_MB:.0f}", None, "no operation to show")
            continue
        add(f"peak RSS of `{words}` at {at} (MB)", entry["peak_rss_mb"], f"<= {TARGET_RSS_MB:.0f}",
            entry["peak_rss_mb"] <= TARGET_RSS_MB, f"{entry['seconds']:.2f} s")
    workers = largest["workers"]
    for mode, label in (("alternating", "two warm workers alternating"), ("single", "one warm worker alone")):
        phase = workers[mode]
        for key, what in (("middleware", "middleware"), ("hook_and_middleware", "hook + middleware")):
            value = phase[f"{key}_ratio_p50"]
            add(f"{label} at {at}, {what} p50 / floor p50", value, f"<= {TARGET_WORKER_RATIO}",
                value is not None and value <= TARGET_WORKER_RATIO,
                f"{phase[key]['p50_ms']:.2f} ms (p99 {phase[key]['p99_ms']:.2f}) vs floor "
                f"{phase['floor']['p50_ms']:.2f} ms (p99 {phase['floor']['p99_ms']:.2f})")
    hold = workers["alternating"]["lock_hold"]["started"]
    add(f"writer-lock hold of an admission at {at}, p99 (ms), two workers", hold["p99_ms"],
        f"<= {TARGET_LOCK_HOLD_P99_MS:.0f}", hold["p99_ms"] is not None and hold["p99_ms"] <= TARGET_LOCK_HOLD_P99_MS,
        f"p50 {hold['p50_ms']} ms, max {hold['max_ms']} ms over {hold['n']} admissions; one bare "
        f"durable append (floor / 2) p50 {workers['alternating']['floor']['p50_ms'] / 2:.2f} ms")
    gate = workers.get("gate_under_writer_lock")
    if gate:
        answered = (gate["warm_hook_verdict"] == "allow" and gate["fresh_hook_verdict"] == "allow"
                    and gate["warm_hook_ms"] < 1000 * LOCK_TEST_BUSY_TIMEOUT_SECONDS)
        add(f"gate check (pre_tool_call) while another connection holds the writer lock, at {at} (ms)",
            gate["warm_hook_ms"], "answers without the lock", answered,
            f"warm hook {gate['warm_hook_verdict']} in {gate['warm_hook_ms']:.2f} ms; fresh guard's hook "
            f"{gate['fresh_hook_verdict']} in {gate['fresh_hook_ms']:.0f} ms; its protected call "
            f"{gate['call_result']} ({gate['call_refusal_code']}) after {gate['call_ms']:.0f} ms")
    archived = report.get("archive")
    if archived:
        after = archived["fresh_process"]["first_call_seconds"]
        baseline = archived["empty_journal_fresh_process"]["first_call_seconds"]
        extra = milliseconds(after - baseline)
        add(f"first protected call of a fresh process after archiving {archived['archived_events']:,} events, "
            "minus the same on an empty journal (ms)", extra, f"<= {TARGET_AFTER_ARCHIVE_EXTRA_MS:.0f}",
            extra <= TARGET_AFTER_ARCHIVE_EXTRA_MS,
            f"{milliseconds(after):.1f} ms with {archived['live_events_after_archive']} live event(s) vs "
            f"{milliseconds(baseline):.1f} ms on an empty journal, alternating, median of "
            f"{archived['fresh_process']['repeats']} each")
    first = largest["fresh_process"]["first_call_seconds"]
    add(f"first protected call of a fresh process at {at}, no archive (s, first-round target)", first,
        f"<= {TARGET_FIRST_CALL_SECONDS}", first <= TARGET_FIRST_CALL_SECONDS,
        f"import of the plugin {largest['fresh_process']['import_seconds']:.3f} s apart")
    status = largest["cli"]["status_seconds"]
    add(f"operator_cli.py status at {at} (s, first-round target)", status, f"<= {TARGET_STATUS_SECONDS}",
        status <= TARGET_STATUS_SECONDS, f"python start-up alone {report['python_startup_seconds']} s")
    for entry in (smallest, largest) if smallest is not largest else (smallest,):
        overhead = entry["overhead"]
        for prefix, label in (("protected_call", "middleware"),
                              ("hook_and_protected_call", "pre_tool_call hook + middleware")):
            value = overhead[f"{prefix}_overhead_ratio_p50"]
            rows.append({"name": f"overhead in one process at {entry['events']:,} events, {label} "
                                 "(p50 / floor p50, first-round target)",
                         "measured": value, "target": f"<= {TARGET_OVERHEAD_RATIO}",
                         "met": value <= TARGET_OVERHEAD_RATIO,
                         "note": f"{overhead[f'{prefix}_p50_ms']:.2f} ms vs floor "
                                 f"{overhead['floor_call_p50_ms']:.2f} ms"})
    traced = [entry["overhead"].get("product_sync_syscalls_per_append") for entry in sizes]
    traced = [value for value in traced if value is not None]
    python_fsyncs = max(entry["overhead"]["python_fsync_per_append"] for entry in sizes)
    if traced:
        worst = max(traced)
        rows.append({"name": "fsyncs per append (Python os.fsync + SQLite fsync/fdatasync, strace, first-round target)",
                     "measured": worst, "target": f"<= {TARGET_FSYNCS_PER_APPEND}",
                     "met": worst <= TARGET_FSYNCS_PER_APPEND,
                     "note": f"Python os.fsync alone: {python_fsyncs}; worst over traced sizes"})
    else:
        rows.append({"name": "fsyncs per append (Python os.fsync only; strace unavailable, first-round target)",
                     "measured": python_fsyncs, "target": f"<= {TARGET_FSYNCS_PER_APPEND}",
                     "met": None, "note": "SQLite's own fsyncs not counted"})
    return rows


# ---------------------------------------------------------------- tables --

def show(value: Any, digits: int = 2) -> str:
    """A number for the table, or '-' when it was not measured."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_tables(report: Dict[str, Any]) -> str:
    """Human-readable tables (also pasted into bench/RESULTS.md)."""
    sizes = report["sizes"]
    header = "| | " + " | ".join(f"{entry['events']:,} events" for entry in sizes) + " |"
    rule = "|---|" + "---|" * len(sizes)

    def row(label: str, values: List[Any], digits: int = 2) -> str:
        return f"| {label} | " + " | ".join(show(value, digits) for value in values) + " |"

    lines = ["### Targets", "", "| target | measured | target | met | note |", "|---|---|---|---|---|"]
    for target in report["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[target["met"]]
        lines.append(f"| {target['name']} | {show(target['measured'], 3)} | {target['target']} | {met} "
                     f"| {target['note']} |")

    lines += ["", "### Verification (full, one fresh `Journal` each) vs the chain-only reference", "",
              header, rule]
    verification = [entry["verification"] for entry in sizes]
    lines += [
        row("product full verification (s, median)", [v["product_seconds"] for v in verification], 3),
        row("chain-only reference loop (s, median)", [v["reference_chain_only_seconds"] for v in verification], 3),
        row("ratio product / reference", [v["ratio_to_reference"] for v in verification], 3),
        row("product events/s", [v["product_events_per_second"] for v in verification]),
        row("reference events/s", [v["reference_chain_only_events_per_second"] for v in verification]),
        row("diagnostic: only fetch the rows (s)", [v["reference_iterate_rows_seconds"] for v in verification], 3),
        row("diagnostic: only fetch the rows with the product's query (s)",
            [v["product_query_fetch_seconds"] for v in verification], 3),
        row("diagnostic: fetch bytes + hash with quote escaping (s)",
            [v["reference_bytes_hash_seconds"] for v in verification], 3),
    ]

    lines += ["", "### Fresh processes and the operator CLI (wall time incl. interpreter start-up)", "",
              header, rule]
    fresh = [entry["fresh_process"] for entry in sizes]
    lines += [
        row("first protected call of a fresh process (ms, median)",
            [milliseconds(f["first_call_seconds"]) for f in fresh], 1),
        row("its second call (ms)", [milliseconds(f["second_call_seconds"]) for f in fresh], 1),
        row("import of the plugin (ms)", [milliseconds(f["import_seconds"]) for f in fresh], 1),
    ]
    for words in CLI_COMMANDS:
        entries = [entry["cli"]["commands"].get(words) for entry in sizes]
        lines.append(row(f"`{words}`: s / peak RSS MB",
                         [f"{e['seconds']:.2f} / {e['peak_rss_mb']:.1f}" if e else None for e in entries]))

    lines += ["", "### Warm workers (hook + middleware per call, timed in the worker; floor from "
              "the coordinator, interleaved)", "", header, rule]
    for mode, label in (("alternating", "two alternating"), ("single", "one alone")):
        phases = [entry["workers"][mode] for entry in sizes]
        lines += [
            row(f"{label}: middleware p50 / p99 (ms)",
                [f"{p['middleware']['p50_ms']:.2f} / {p['middleware']['p99_ms']:.2f}" for p in phases]),
            row(f"{label}: hook + middleware p50 / p99 (ms)",
                [f"{p['hook_and_middleware']['p50_ms']:.2f} / {p['hook_and_middleware']['p99_ms']:.2f}"
                 for p in phases]),
            row(f"{label}: floor p50 / p99 (ms)",
                [f"{p['floor']['p50_ms']:.2f} / {p['floor']['p99_ms']:.2f}" for p in phases]),
            row(f"{label}: ratio p50 middleware / hook+mw",
                [f"{show(p['middleware_ratio_p50'])} / {show(p['hook_and_middleware_ratio_p50'])}"
                 for p in phases]),
            row(f"{label}: writer lock held by `started` p50 / p99 / max (ms)",
                [f"{show(p['lock_hold']['started']['p50_ms'])} / {show(p['lock_hold']['started']['p99_ms'])}"
                 f" / {show(p['lock_hold']['started']['max_ms'])}" for p in phases]),
            row(f"{label}: writer lock held by `returned` p50 / p99 / max (ms)",
                [f"{show(p['lock_hold']['returned']['p50_ms'])} / {show(p['lock_hold']['returned']['p99_ms'])}"
                 f" / {show(p['lock_hold']['returned']['max_ms'])}" for p in phases]),
        ]
    lines.append(row("warm worker's next call right after an operator `status` ran / the call after (ms)",
                     [f"{entry['workers']['call_after_operator_status_ms']:.2f} / "
                      f"{entry['workers']['call_after_that_ms']:.2f}" for entry in sizes]))
    lines.append(row("first pre_tool_call of each worker, A / B at once (ms)",
                     [" / ".join(f"{value:.0f}" for value in entry["workers"]["warmup_first_hook_ms"])
                      for entry in sizes]))

    lines += ["", "### One process: overhead against the floor, fsyncs, size", "", header, rule]
    overhead = [entry["overhead"] for entry in sizes]
    lines += [
        row("middleware p50 / p99 (ms)",
            [f"{o['protected_call_p50_ms']:.2f} / {o['protected_call_p99_ms']:.2f}" for o in overhead]),
        row("hook + middleware p50 / p99 (ms)",
            [f"{o['hook_and_protected_call_p50_ms']:.2f} / {o['hook_and_protected_call_p99_ms']:.2f}"
             for o in overhead]),
        row("floor p50 / p99 (ms)", [f"{o['floor_call_p50_ms']:.2f} / {o['floor_call_p99_ms']:.2f}"
                                     for o in overhead]),
        row("ratio p50: middleware / hook+mw",
            [f"{o['protected_call_overhead_ratio_p50']:.2f} / {o['hook_and_protected_call_overhead_ratio_p50']:.2f}"
             for o in overhead]),
        row("full_verification mode, call p50 (ms)", [o.get("full_verification_mode_call_p50_ms") for o in overhead], 1),
        row("os.fsync + os.replace per append",
            [f"{o['python_fsync_per_append']:.2f} + {o['python_replace_per_append']:.2f}" for o in overhead]),
        row("fsync syscalls per append, product / floor (strace)",
            [f"{show(o.get('product_sync_syscalls_per_append'))} / {show(o.get('floor_sync_syscalls_per_append'))}"
             for o in overhead]),
        row("bytes per event (as built)", [entry["journal_bytes_per_event"] for entry in sizes], 1),
        row("bulk build of the journal (s)", [entry["bulk_write_seconds"] for entry in sizes], 1),
    ]
    lines += ["", "### Side by side: the floor, the product and the peers (fresh journals; disk and "
              "tmpfs; one loop, interleaved)", "", format_side_by_side(report["side_by_side"])]
    lines += ["", "### A fresh process's first call against `verify` (whole processes, alternating)", "",
              header, rule]
    versus = [entry["first_call_vs_verify"] for entry in sizes]
    lines += [
        row("first call: process wall, median (s)", [v["first_call_process_seconds"] for v in versus], 3),
        row("`verify`: process wall, median (s)", [v["verify_process_seconds"] for v in versus], 3),
        row("ratio first call / `verify` (whole processes)", [v["ratio_process_to_verify"] for v in versus], 3),
        row("guard built to first call's return (s) / ratio to `verify`",
            [f"{v['first_call_seconds']:.3f} / {show(v['ratio_first_call_to_verify'], 3)}" for v in versus]),
    ]
    busy = format_busy_workers(sizes)
    if busy:
        lines += ["", f"### Busy workers: one alone, then {BUSY_WORKERS} at once (no-op tool, 5 ms pause "
                  "after a refusal)", "", busy]
    lines += ["", "### File-system calls per protected call (hook + middleware) / per read right after a "
              "write (the hook), warm guard", "", format_os_call_table(sizes)]
    lines += ["", "### Cross-process lock mechanisms", "", format_lock_mechanisms(report["lock_mechanisms"])]
    lines += ["", "### Runtime size", "", format_runtime_lines(report["runtime_lines"])]
    gate = sizes[-1]["workers"].get("gate_under_writer_lock")
    if gate:
        lines += ["", f"Gate check while another connection held `BEGIN IMMEDIATE` ({sizes[-1]['events']:,} "
                  f"events): warm worker's `pre_tool_call` {gate['warm_hook_verdict']} in "
                  f"{gate['warm_hook_ms']:.2f} ms; a fresh guard's `pre_tool_call` {gate['fresh_hook_verdict']} "
                  f"in {gate['fresh_hook_ms']:.1f} ms; that guard's protected call {gate['call_result']} "
                  f"(`{gate['call_refusal_code']}`) after {gate['call_ms']:.1f} ms (busy timeout "
                  f"{gate['busy_timeout_seconds']} s), downstream run {gate['call_downstream_ran']} times; "
                  f"after the lock was released the next call took {gate['call_after_release_ms']:.2f} ms. "
                  f"(Before the lock was taken, the holder connection's first read made the warm worker's "
                  f"next `pre_tool_call` take {gate['hook_after_foreign_open_ms']:.2f} ms; running as uid "
                  f"{report['machine']['euid']}.)"]
    archived = report.get("archive")
    if archived:
        lines += ["", f"Archive of {archived['archived_events']:,} events: `operator_cli.py archive` "
                  f"{archived['archive_seconds']:.2f} s (process {archived['archive_process_seconds']:.2f} s, "
                  f"peak RSS {archived['archive_peak_rss_mb']:.1f} MB), writer lock held "
                  f"{show(archived['archive_writer_lock_hold_ms'], 1)} ms (boundaries reached after "
                  f"`begin`, ms: {', '.join(f'{name} {value:.1f}' for name, value in (archived['archive_writer_lock_phases_ms'] or {}).items())}); "
                  f"live segment afterwards "
                  f"{archived['live_events_after_archive']} events in a {archived['live_journal_bytes']:,}-byte "
                  f"database file (data directory {archived['data_dir_bytes']:,} bytes). First protected call "
                  f"of a fresh process: {milliseconds(archived['fresh_process']['first_call_seconds']):.1f} ms "
                  f"(median of {archived['fresh_process']['repeats']}; samples "
                  f"{', '.join(f'{milliseconds(s):.1f}' for s in archived['fresh_process']['samples'])} ms), "
                  f"on an empty journal in alternation "
                  f"{milliseconds(archived['empty_journal_fresh_process']['first_call_seconds']):.1f} ms (samples "
                  f"{', '.join(f'{milliseconds(s):.1f}' for s in archived['empty_journal_fresh_process']['samples'])}"
                  f" ms); "
                  f"`status` {archived['status_seconds']:.3f} s; `verify --all` {archived['verify_all_seconds']:.2f} s "
                  f"(peak RSS {archived['verify_all_peak_rss_mb']:.1f} MB)."]
    load = report["load"]
    lines += ["", f"Python start-up alone: {report['python_startup_seconds']} s. Load: loadavg "
              f"{load.get('loadavg_1min_min')}-{load.get('loadavg_1min_max')} (1 min), CPU pressure avg10 "
              f"{load.get('cpu_pressure_avg10_min')}-{load.get('cpu_pressure_avg10_max')} %; other processes used "
              f"{load.get('other_processes_cpu_seconds')} CPU s ({show(load.get('other_processes_cpu_share'), 3)} "
              f"of the machine) while the benchmark used {load.get('bench_cpu_seconds')} CPU s over "
              f"{load.get('wall_seconds')} s."]
    return "\n".join(lines)
