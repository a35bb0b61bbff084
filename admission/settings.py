"""The plugin's settings: which tools are protected, and how hard to verify
(docs/guard.md §Settings).

A tool list may be a YAML list, JSON list text or comma-separated text.  What
cannot be read exactly is a *settings problem*: every tool but the inspection
tools is protected and ``status`` shows it.  Pure functions; no I/O.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..storage.database import DEFAULT_BUSY_TIMEOUT_SECONDS
from ..storage.errors import short
from ..storage.snapshot import DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS

# Exempt by default in the read-only-tools mode; a configured list replaces them.
DEFAULT_READ_ONLY_TOOLS = ("read_file", "search_files")
# Always exempt, whatever the configuration says: the model's own inspection tools.
INSPECTION_TOOLS = ("crash_recovery_status", "crash_recovery_verify")
MODE_READ_ONLY_TOOLS = "read_only_tools"
MODE_PROTECTED_TOOLS = "protected_tools"
KNOWN_KEYS = ("read_only_tools", "protected_tools", "allowed_while_closed", "full_verification",
              "full_verification_interval", "archive_after_events", "busy_timeout")
# Tool Search's catalog reads (admission/bridge.py): they run whatever the gate says.
CATALOG_TOOLS = ("tool_search", "tool_describe")
# SQLite's busy timeout is a 32-bit count of milliseconds: a longer one reads as
# no wait at all, or does not convert.
MAX_BUSY_TIMEOUT_SECONDS = (2**31 - 1) // 1000
# Hermes' read-only built-ins (its _PARALLEL_SAFE_TOOLS and NO_EFFECT_TOOL_NAMES): a
# tool running while closed that is not listed may reach the journal and settings.
KNOWN_READ_ONLY_TOOLS = frozenset((
    "read_file", "search_files", "session_search", "skill_view", "skills_list", "web_search",
    "web_extract", "vision_analyze", "ha_get_state", "ha_list_entities", "ha_list_services",
    "browser_snapshot", "browser_get_images", "browser_console", "read_terminal"))
# Run while closed in every mode: the inspection tools and the catalog reads.
_ALWAYS_WHILE_CLOSED = frozenset(INSPECTION_TOOLS + CATALOG_TOOLS)


@dataclass(frozen=True)
class Settings:
    """Parsed settings.  ``mode``: ``read_only_tools`` (all but ``tools`` are
    protected) or ``protected_tools`` (only ``tools``); intervals in seconds;
    ``archive_after_events``: None is off; ``problem``: why the configuration
    could not be used (the rest are then fail-closed values)."""
    mode: str = MODE_READ_ONLY_TOOLS
    tools: frozenset = frozenset(DEFAULT_READ_ONLY_TOOLS)
    allowed_while_closed: frozenset = frozenset()
    full_verification: bool = False
    full_verification_interval: float = DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS
    archive_after_events: Optional[int] = None
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS
    problem: Optional[str] = None
    raw: dict = field(default_factory=dict, compare=False)

    def is_protected(self, tool_name: Any) -> bool:
        """Whether calls of ``tool_name`` are journaled and gated (non-text: yes)."""
        if not isinstance(tool_name, str):
            return True
        if tool_name in INSPECTION_TOOLS:
            return False
        if self.mode == MODE_PROTECTED_TOOLS:
            return tool_name in self.tools
        return tool_name not in self.tools

    def while_closed(self) -> frozenset:
        """The tools that run while the gate is closed (docs/guard.md §While the
        gate is closed): the unprotected read-only and ``allowed_while_closed``
        tools, the inspection tools and the catalog reads."""
        read_only = (frozenset(DEFAULT_READ_ONLY_TOOLS) if self.mode == MODE_PROTECTED_TOOLS
                     else self.tools)
        unprotected = {name for name in read_only | self.allowed_while_closed
                       if not self.is_protected(name)}
        return frozenset(unprotected) | _ALWAYS_WHILE_CLOSED

    def runs_while_closed(self, tool_name: Any) -> bool:
        """Whether ``tool_name`` is text in :meth:`while_closed`."""
        return isinstance(tool_name, str) and tool_name in self.while_closed()

    def reaching_tools(self) -> list:
        """Sorted tools that run while closed and are not known to be read-only."""
        return sorted(self.while_closed() - KNOWN_READ_ONLY_TOOLS - _ALWAYS_WHILE_CLOSED)

    def to_json(self) -> dict:
        """The settings as ``status`` shows them (docs/cli.md §status)."""
        shown = {"mode": self.mode, self.mode: sorted(self.tools),
                 "allowed_while_closed": sorted(self.allowed_while_closed),
                 "while_closed": sorted(self.while_closed()),
                 "agent_reaches_journal": self.reaching_tools(),
                 "full_verification": self.full_verification,
                 "full_verification_interval": self.full_verification_interval,
                 "archive_after_events": self.archive_after_events,
                 "busy_timeout": self.busy_timeout}
        if self.problem:
            shown["problem"] = self.problem
        return shown


FAIL_CLOSED = Settings(tools=frozenset())


def parse_tool_list(value: Any, key: str) -> tuple:
    """A tuple of names from a list, JSON list text or comma-separated text;
    else ``ValueError`` naming ``key`` and the value."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{", '"')):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                raise ValueError(f"{key} is text that starts like JSON but is not valid "
                                 f"JSON: {_shown(value)}") from None
        else:
            value = [name.strip() for name in text.split(",") if name.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(name, str) and name.strip()
                                                for name in value):
        names = tuple(name.strip() for name in value)
        for name in names:
            problem = _name_problem(name)
            if problem:
                raise ValueError(f"{key} holds {_shown(name)}, which {problem}; list the tool "
                                 f"names themselves, e.g. [send_payment, book_trip]")
        return names
    raise ValueError(f"{key} must be a list of tool names (or a JSON list / comma-separated "
                     f"string), got {_shown(value)}")


# "Nothing" or "everything", never a tool: YAML nulls arriving as text, and globs.
_NOT_A_NAME = frozenset(("null", "none", "~", "nil", "*", "all", "any"))


def _name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be one tool name, or None."""
    if name.lower() in _NOT_A_NAME:
        return "means nothing or everything, not a tool"
    if "${" in name:
        return ("is an unexpanded ${...} reference (Hermes 0.19 does not expand them in "
                "plugin settings; newer releases leave an unset variable as written)")
    if any(character.isspace() for character in name):
        return "holds spaces (several names separated by spaces? separate them with commas)"
    if any(character in "*?[]" for character in name):
        return "is a pattern; patterns are not supported"
    return None


def parse_settings(raw: Any) -> Settings:
    """:class:`Settings` from the raw ``settings`` mapping (None: nothing set).
    Never raises: a problem gives :data:`FAIL_CLOSED` with ``problem`` set."""
    try:
        return _parse(raw)
    except Exception as exc:  # e.g. a mapping whose iteration raises: fail closed
        return _failed(f"the settings could not be read ({type(exc).__name__}: "
                       f"{_shown(str(exc))})", {})


def settings_view(settings: Any, registered: Optional[Callable[[], Any]] = None, *,
                  partial: bool = True) -> dict:
    """The parsed ``settings()`` as ``status`` shows them (docs/cli.md §status);
    never raises.  ``registered``, ``partial``: as :func:`tool_names_view`."""
    try:
        raw = settings()
    except Exception as exc:  # the same fail-closed reading as the guard's
        raw = f"<unreadable: {type(exc).__name__}: {exc}>"
    parsed = parse_settings(raw)
    return with_attention({**parsed.to_json(), **tool_names_view(parsed, registered,
                                                                 partial=partial)})


def with_attention(view: dict) -> dict:
    """``view`` with ``needs_attention`` (read by ``status --check`` and the gauge)."""
    return {**view, "needs_attention": needs_attention(view)}


def tool_names_view(settings: Settings, registered: Optional[Callable[[], Any]], *,
                    partial: bool = False) -> dict:
    """``{"tool_list": "host"|"unknown", "unmatched_tools"}`` (docs/guard.md
    §Settings): names matching no tool of ``registered()``; ``partial``:
    ``mcp_...`` names are not judged.  Never raises."""
    try:
        names = registered() if registered is not None else None
        known = None if not names else {name for name in names if isinstance(name, str)}
    except Exception:
        known = None
    if not known:
        return {"tool_list": "unknown", "unmatched_tools": None}
    unmatched = sorted(name for name in settings.tools if name not in known
                       and name not in INSPECTION_TOOLS
                       and not (partial and name.startswith("mcp_")))
    return {"tool_list": "host", "unmatched_tools": unmatched}


def needs_attention(view: dict) -> bool:
    """Whether a person must act: a problem, or a protected name matching no tool."""
    return bool(view.get("problem") or (view.get("mode") == MODE_PROTECTED_TOOLS
                                        and view.get("unmatched_tools")))


def _parse(raw: Any) -> Settings:
    if raw is None:
        return Settings()
    if not isinstance(raw, dict):
        return _failed(f"plugins.entries.crash-recovery.settings must be a mapping, got "
                       f"{_shown(raw)}", raw)
    try:
        unknown = sorted(str(key) for key in raw if key not in KNOWN_KEYS)
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)} (known: "
                             f"{', '.join(KNOWN_KEYS)})")
        if raw.get("read_only_tools") is not None and raw.get("protected_tools") is not None:
            raise ValueError("read_only_tools and protected_tools are both set; choose one mode")
        mode, tools = MODE_READ_ONLY_TOOLS, DEFAULT_READ_ONLY_TOOLS
        for key in (MODE_READ_ONLY_TOOLS, MODE_PROTECTED_TOOLS):
            if raw.get(key) is not None:
                mode, tools = key, parse_tool_list(raw[key], key)
        if mode == MODE_PROTECTED_TOOLS and not tools:
            raise ValueError("protected_tools is empty, which would protect nothing; list the "
                             "tools to protect, or remove it for the default mode")
        allowed = raw.get("allowed_while_closed")
        allowed = () if allowed is None else parse_tool_list(allowed, "allowed_while_closed")
        protected = sorted(name for name in allowed if name not in INSPECTION_TOOLS and (
            name not in tools if mode == MODE_READ_ONLY_TOOLS else name in tools))
        if protected:
            # Refused while closed anyway: a silent no-op would hide the intent.
            raise ValueError(f"allowed_while_closed names {', '.join(protected)}, which {mode} "
                             "protects; a protected tool never runs while the gate is closed. "
                             "List only unprotected tools there (in read_only_tools mode, the "
                             "read_only_tools list is what runs while closed)")
        return Settings(
            mode=mode, tools=frozenset(tools), allowed_while_closed=frozenset(allowed),
            full_verification=_flag(raw.get("full_verification", False), "full_verification"),
            full_verification_interval=_seconds(
                raw.get("full_verification_interval", DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS),
                "full_verification_interval"),
            archive_after_events=_count(raw.get("archive_after_events"), "archive_after_events"),
            busy_timeout=_seconds(raw.get("busy_timeout", DEFAULT_BUSY_TIMEOUT_SECONDS),
                                  "busy_timeout", most=MAX_BUSY_TIMEOUT_SECONDS),
            raw=dict(raw))
    except ValueError as exc:
        return _failed(str(exc), raw)


def _failed(problem: str, raw: Any) -> Settings:
    return Settings(tools=frozenset(), full_verification=True, problem=problem,
                    raw=raw if isinstance(raw, dict) else {})


def _flag(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{key} must be true or false, got {_shown(value)}")


def _number(value: Any, key: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {_shown(value)}")
    try:
        number = float(value)  # an int too large for a float raises OverflowError
    except OverflowError:
        raise ValueError(f"{key} is too large: {_shown(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{key} must be a finite number, got {_shown(value)}")
    return number


def _seconds(value: Any, key: str, most: Optional[float] = None) -> float:
    seconds = _number(value, key)
    if seconds <= 0:
        raise ValueError(f"{key} must be more than 0 seconds, got {_shown(value)}")
    if most is not None and seconds > most:
        raise ValueError(f"{key} must be at most {most} seconds, got {_shown(value)}")
    return seconds


def _count(value: Any, key: str) -> Optional[int]:
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in (
            "", "null", "none", "~", "off", "false", "no")):
        return None  # off, however it is spelled
    number = _number(value, key)
    if number != int(number) or number < 2:
        raise ValueError(f"{key} must be a whole number of at least 2 (or null), got "
                         f"{_shown(value)}")
    return int(number)


def _shown(value: Any) -> str:
    return short(repr(value))
