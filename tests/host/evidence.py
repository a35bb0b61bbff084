"""Shared helpers for the host checks: profiles, journal evidence, operator CLI.

Standard library only; nothing here imports Hermes or the plugin, so the
harness reads the journal the way an independent checker would.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
REPO_ROOT = TESTS_DIR.parent
PLUGIN_NAME = "crash-recovery"
BOOKING_PLUGIN_DIR = HOST_DIR / "booking_plugin"
PROBE_PLUGIN_DIR = HOST_DIR / "probe_plugin"
OPERATOR_CLI = REPO_ROOT / "operator_cli.py"
# The workspace's independent checker, an extra cross-check where it exists
# (CI has it beside the clone); CRASH_RECOVERY_VERIFIER names another copy.
VERIFIER = Path(os.environ.get("CRASH_RECOVERY_VERIFIER")
                or REPO_ROOT.parent / "shared" / "tools" / "verify_journal.py")
REQUIRE_HOST_VARIABLE = "CRASH_RECOVERY_REQUIRE_HOST"
REQUIRE_VERIFIER_VARIABLE = "CRASH_RECOVERY_REQUIRE_VERIFIER"


def host_required() -> bool:
    """True when CRASH_RECOVERY_REQUIRE_HOST=1 turns every skip into a failure."""
    return os.environ.get(REQUIRE_HOST_VARIABLE, "") == "1"


def data_dir_of(home: Path) -> Path:
    """The plugin data directory of a profile (docs/format.md §Files)."""
    return Path(home) / "plugin-data" / PLUGIN_NAME


def plugin_source_files() -> List[Path]:
    """The plugin's own files: every regular file at the repository top level."""
    return sorted(path for path in REPO_ROOT.iterdir()
                  if path.is_file() and not path.name.startswith("."))


def copy_plugin_checkout(destination: Path) -> Path:
    """Copy the plugin's top-level files to ``destination`` (install path 2)."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in plugin_source_files():
        shutil.copy2(path, destination / path.name)
    return destination


def write_profile(home: Path, *, base_url: str = "http://127.0.0.1:9/v1",
                  enabled: Sequence[str] = (PLUGIN_NAME,),
                  entries: Optional[Dict[str, Any]] = None) -> Path:
    """Write an isolated profile's config.yaml (JSON is valid YAML)."""
    home.mkdir(parents=True, exist_ok=True)
    config: Dict[str, Any] = {
        "model": {"provider": "custom", "base_url": base_url, "default": "mock-model",
                  "api_key": "sk-mock"},
        "security": {"allow_lazy_installs": False},
        "plugins": {"enabled": list(enabled)},
    }
    if entries:
        config["plugins"]["entries"] = entries
    path = home / "config.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def read_events(data_dir: Path) -> List[Dict[str, Any]]:
    """Journal payloads in ``seq`` order (each with ``seq`` added); [] if absent."""
    database = Path(data_dir) / "journal.sqlite3"
    if not database.exists():
        return []
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        rows = connection.execute("SELECT seq, payload FROM events ORDER BY seq").fetchall()
    finally:
        connection.close()
    events = []
    for seq, payload in rows:
        event = json.loads(payload)
        event["seq"] = seq
        events.append(event)
    return events


def kinds(events: List[Dict[str, Any]]) -> List[str]:
    """The ``kind`` of each event, in order."""
    return [event["kind"] for event in events]


def run_verifier(data_dir: Path) -> Tuple[bool, Dict[str, Any]]:
    """Check a data dir independently of the plugin: ``tests/journal_reference.py``
    always, and the workspace checker too where it exists (required when
    CRASH_RECOVERY_REQUIRE_VERIFIER=1).  Returns (every check passed, report)."""
    sys.path.insert(0, str(TESTS_DIR))
    import journal_reference  # standard library only; never imports the plugin
    reference = journal_reference.verify(str(data_dir))
    report: Dict[str, Any] = {"reference_ok": reference.ok, "reference_errors": reference.errors}
    if not VERIFIER.exists():
        report["workspace_checker"] = f"not found at {VERIFIER}"
        required = os.environ.get(REQUIRE_VERIFIER_VARIABLE, "") == "1"
        return reference.ok and not required, report
    completed = subprocess.run([sys.executable, str(VERIFIER), "--allow-unknown-kinds",
                                str(data_dir)], capture_output=True, text=True, timeout=60)
    try:
        report["workspace_checker"] = json.loads(completed.stdout)
    except ValueError:
        report["workspace_checker"] = {"stdout": completed.stdout[-2000:],
                                       "stderr": completed.stderr[-2000:]}
    return reference.ok and completed.returncode == 0, report


def operator_cli(data_dir: Path, *words: str) -> Tuple[int, Any]:
    """Run ``operator_cli.py --data-dir DIR ...``; returns (exit code, parsed JSON)."""
    completed = subprocess.run([sys.executable, str(OPERATOR_CLI), "--data-dir", str(data_dir),
                                *words], capture_output=True, text=True, timeout=60)
    try:
        document = json.loads(completed.stdout)
    except ValueError:
        document = {"stdout": completed.stdout[-2000:], "stderr": completed.stderr[-2000:]}
    return completed.returncode, document


def service_counts(service_db: Path, traveler: Optional[str] = None) -> Dict[str, int]:
    """Rows in the booking service: bookings (optionally one traveler's) and handler runs."""
    if not Path(service_db).exists():
        return {"bookings": 0, "attempts": 0}
    connection = sqlite3.connect(f"file:{service_db}?mode=ro", uri=True, timeout=10)
    try:
        if traveler is None:
            bookings = connection.execute("SELECT COUNT(*) FROM bookings").fetchone()[0]
            attempts = connection.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
        else:
            bookings = connection.execute("SELECT COUNT(*) FROM bookings WHERE traveler = ?",
                                          (traveler,)).fetchone()[0]
            attempts = connection.execute("SELECT COUNT(*) FROM attempts WHERE traveler = ?",
                                          (traveler,)).fetchone()[0]
    finally:
        connection.close()
    return {"bookings": bookings, "attempts": attempts}


def decode_json_text(text: str) -> Any:
    """Decode JSON text, also when Hermes framed it (e.g. ``<untrusted_tool_result>``)."""
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise
        return json.loads(text[start:end + 1])


def blocked_document(tool_result: Any) -> Optional[Dict[str, Any]]:
    """The crash-recovery refusal inside a tool result, or None.

    Accepts the middleware's direct JSON and the hook path's
    ``{"error": "<that JSON text>"}`` wrapping."""
    document = tool_result
    for _ in range(3):
        if isinstance(document, str):
            try:
                document = decode_json_text(document)
            except ValueError:
                return None
        if not isinstance(document, dict):
            return None
        if document.get("error") == "crash_recovery_blocked":
            return document
        document = document.get("error")
    return None


def hermes_version() -> str:
    """Installed hermes-agent version, or "" when it is not installed."""
    try:
        from importlib.metadata import version
        return version("hermes-agent")
    except Exception:
        return ""


NAMESPACE_PREFIX = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


def network_isolation() -> Tuple[List[str], str]:
    """Argv prefix that runs a command in a fresh network namespace with only
    loopback up, and its label; ([], "loopback-only") when unshare is refused."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return [], "loopback-only (unshare or ip missing)"
    try:
        probe = subprocess.run(NAMESPACE_PREFIX + ["true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"loopback-only (unshare failed: {exc})"
    if probe.returncode != 0:
        reason = probe.stderr.decode("utf-8", "replace").strip()[:200]
        return [], f"loopback-only (unshare failed: {reason})"
    return list(NAMESPACE_PREFIX), "unshare -rn (fresh network namespace, lo only)"


def hermes_core_modifications() -> Tuple[int, List[str]]:
    """Compare every hashed file of the installed hermes-agent with its RECORD.

    Returns (files checked, files whose content differs or is missing); an
    empty list means the host is exactly what pip installed."""
    import base64
    import hashlib
    from importlib.metadata import distribution
    dist = distribution("hermes-agent")
    checked, changed = 0, []
    for entry in dist.files or []:
        if not entry.hash or entry.hash.mode != "sha256":
            continue
        path = Path(entry.locate())
        checked += 1
        try:
            digest = hashlib.sha256(path.read_bytes()).digest()
        except OSError:
            changed.append(str(entry))
            continue
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii") != entry.hash.value:
            changed.append(str(entry))
    return checked, changed
