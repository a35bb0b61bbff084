"""The layout shows the architecture: the design card's files at the top, every
other runtime module in the folder of its layer, and imports that only point
down (README §Project layout).

The floors, bottom to top: ``storage``; ``reports``; ``admission`` and
``reconciliation`` (side by side, neither imports the other); ``host``; the
top level (``guard``, ``journal``, ``classify``, ``operator_cli``,
``__init__``).  A module may import its own folder and any folder on a lower
floor, never one on its own floor or above; nothing below the top imports a
top-level module.
"""
from __future__ import annotations

import ast
import os
import subprocess
import unittest

from support import REPO

FLOORS = {"storage": 0, "reports": 1, "admission": 2, "reconciliation": 2, "host": 3, "": 4}
# The design card's top level (plus the repository's own folders and files).
CARD_FILES = {"plugin.yaml", "__init__.py", "guard.py", "journal.py", "classify.py",
              "operator_cli.py", "demo.py", "README.md", "LICENSE", "pyproject.toml"}
OTHER_TOP_LEVEL = {"tests", "docs", "bench", "dashboard", ".ci", ".gitignore", ".git"}
MAX_MODULE_LINES = 600


def runtime_modules() -> dict:
    """``{"storage/record.py": folder, ...}`` for every runtime module."""
    modules = {name: "" for name in os.listdir(REPO)
               if name.endswith(".py") and name != "demo.py"}
    for folder in FLOORS:
        if folder:
            for name in os.listdir(os.path.join(REPO, folder)):
                if name.endswith(".py"):
                    modules[f"{folder}/{name}"] = folder
    return modules


def imported_folders(path: str, folder: str) -> list:
    """``(line, target folder or "" for the top level, module)`` for each
    relative import of the module at ``path`` inside ``folder``."""
    with open(path, encoding="utf-8") as stream:
        tree = ast.parse(stream.read(), path)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        # Resolve the relative import against the package root.
        base = [folder] if folder else []
        base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
        parts = base + (node.module.split(".") if node.module else [])
        if not parts:  # `from . import x` at the top level
            parts = [node.names[0].name]
        target = parts[0] if parts[0] in FLOORS else ""
        found.append((node.lineno, target, ".".join(parts)))
    return found


def top_level_names() -> set:
    """What the repository holds at its top: in a git checkout, what git
    tracks or would add (generated files it ignores -- venvs, demo output, CI
    artifacts -- are not the repository's); in an export, what is there."""
    if os.path.exists(os.path.join(REPO, ".git")):  # a file in a linked worktree
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, text=True, check=True).stdout
        return {path.split("/", 1)[0] for path in listed.splitlines() if path}
    return set(os.listdir(REPO)) - {"__pycache__"}


class LayoutTests(unittest.TestCase):

    def test_top_level_holds_only_the_card_and_the_folders(self):
        names = top_level_names()
        self.assertEqual(sorted(names - CARD_FILES - OTHER_TOP_LEVEL - set(FLOORS)), [])

    def test_every_folder_is_a_package_with_a_docstring(self):
        for folder in (name for name in FLOORS if name):
            with open(os.path.join(REPO, folder, "__init__.py"), encoding="utf-8") as stream:
                self.assertIsNotNone(ast.get_docstring(ast.parse(stream.read())), folder)

    def test_imports_point_down(self):
        upward = []
        for path, folder in runtime_modules().items():
            for line, target, module in imported_folders(os.path.join(REPO, path), folder):
                if target == folder:
                    continue
                if FLOORS[target] >= FLOORS[folder]:
                    upward.append(f"{path}:{line} imports {module}")
        self.assertEqual(upward, [])

    def test_the_floors_are_really_used(self):
        # The check above cannot pass vacuously: each folder is imported from above.
        imported = {target for path, folder in runtime_modules().items()
                    for _, target, _ in imported_folders(os.path.join(REPO, path), folder)
                    if target != folder}
        self.assertEqual(imported, {name for name in FLOORS if name})

    def test_modules_are_readable_in_one_sitting(self):
        long = {}
        for path in runtime_modules():
            with open(os.path.join(REPO, path), encoding="utf-8") as stream:
                lines = sum(1 for _ in stream)
            if lines > MAX_MODULE_LINES:
                long[path] = lines
        self.assertEqual(long, {})


if __name__ == "__main__":
    unittest.main()
