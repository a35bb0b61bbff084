"""How big the runtime is: its Python lines, counted from the checkout.

The runtime is every ``.py`` file of the plugin outside ``tests/`` and
``bench/``: the top-level modules (``__init__.py``, ``guard.py``,
``journal.py``, ``operator_cli.py``, ``classify.py``, ``demo.py``) and the
packages (``storage/``, ``admission/``, ``reconciliation/``, ``reports/``,
``host/``, ``dashboard/``).  Left out: ``tests/``, ``bench/``, ``docs/``,
every hidden directory (``.git``, ``.ci``, ``.venv-*``), any directory holding
a virtual environment (``pyvenv.cfg``) and ``__pycache__``; files that are not
Python (the dashboard's built JavaScript, ``plugin.yaml``) are not counted.
Lines are physical lines, as ``wc -l`` counts them; blank lines are reported
apart.  Issue 27's target: at most 9,300 lines.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from product import REPOSITORY_ROOT

EXCLUDED_DIRECTORIES = frozenset({"tests", "bench", "docs", "__pycache__"})


def runtime_files(root: str = REPOSITORY_ROOT) -> List[str]:
    """Paths (relative to ``root``, sorted) of every runtime ``.py`` file."""
    found: List[str] = []
    for directory, subdirectories, files in os.walk(root):
        relative = os.path.relpath(directory, root)
        subdirectories[:] = sorted(
            name for name in subdirectories
            if not name.startswith(".")
            and not (relative == "." and name in EXCLUDED_DIRECTORIES)
            and name != "__pycache__"
            and not os.path.exists(os.path.join(directory, name, "pyvenv.cfg")))
        for name in files:
            if name.endswith(".py"):
                found.append(os.path.normpath(os.path.join(relative, name)))
    return sorted(found)


def count_lines(path: str) -> Dict[str, int]:
    with open(path, "rb") as stream:
        text = stream.read()
    lines = text.splitlines()
    return {"lines": text.count(b"\n") + (0 if not text or text.endswith(b"\n") else 1),
            "blank_lines": sum(1 for line in lines if not line.strip())}


def part_of(path: str) -> str:
    """The package a file belongs to (``storage``, ...), or ``top level``."""
    head = path.split(os.sep, 1)
    return head[0] if len(head) == 2 else "top level"


def measure_runtime_lines(root: str = REPOSITORY_ROOT) -> Dict[str, Any]:
    """Lines of the runtime: in total, per package, per file."""
    files = {path: count_lines(os.path.join(root, path)) for path in runtime_files(root)}
    total = sum(entry["lines"] for entry in files.values())
    parts: Dict[str, Dict[str, int]] = {}
    for path, entry in files.items():
        part = parts.setdefault(part_of(path), {"files": 0, "lines": 0})
        part["files"] += 1
        part["lines"] += entry["lines"]
    for part in parts.values():
        part["share"] = round(part["lines"] / total, 3) if total else None
    return {"counted": "every .py of the plugin outside tests/ and bench/ (hidden directories, "
                       "virtual environments and __pycache__ left out), physical lines as wc -l",
            "files": len(files), "lines": total,
            "blank_lines": sum(entry["blank_lines"] for entry in files.values()),
            "parts": dict(sorted(parts.items(), key=lambda item: -item[1]["lines"])),
            "per_file": {path: entry["lines"] for path, entry in files.items()},
            "largest_files": sorted(({"path": path, "lines": entry["lines"]} for path, entry in files.items()),
                                    key=lambda item: -item["lines"])[:5]}


def format_runtime_lines(measured: Dict[str, Any]) -> str:
    lines = [f"Runtime: {measured['lines']:,} lines in {measured['files']} files "
             f"({measured['blank_lines']:,} of them blank); counted: {measured['counted']}.", "",
             "| part | files | lines | share |", "|---|---|---|---|"]
    for name, part in measured["parts"].items():
        lines.append(f"| {name} | {part['files']} | {part['lines']:,} | {part['share']:.0%} |")
    return "\n".join(lines)
