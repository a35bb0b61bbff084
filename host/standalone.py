"""The stand-alone host: run the plugin's files as scripts from a checkout
(``python operator_cli.py``, ``python demo.py``).

Every module of crash-recovery uses relative imports: inside Hermes the
plugin directory is the package ``hermes_plugins.crash_recovery``, after ``pip
install`` it is ``crash_recovery``.  A file run directly from a checkout has no
package, so the scripts load this file by path (``runpy.run_path``, which puts
nothing on ``sys.path``) and call :func:`load_package` or :func:`load_module`:
they import the plugin directory -- this folder's parent -- as the package
``crash_recovery`` (whatever the directory is called, e.g.
``crash-recovery``).  Standard library only; imports nothing of ours.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

PACKAGE_NAME = "crash_recovery"
DIRECTORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_package(name: str = PACKAGE_NAME) -> ModuleType:
    """This checkout as the package ``name`` (default ``crash_recovery``;
    loaded once, or found already loaded from this directory; an installed
    copy of the same name is never used instead).  The dashboard's
    ``plugin_api.py`` passes the name Hermes gives the plugin, so that one
    process never holds two copies of the storage layer's per-process state."""
    loaded = sys.modules.get(name)
    if loaded is not None and [os.path.realpath(path) for path in getattr(
            loaded, "__path__", ())] == [os.path.realpath(DIRECTORY)]:
        return loaded
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(DIRECTORY, "__init__.py"),
        submodule_search_locations=[DIRECTORY])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return package


def load_module(name: str) -> ModuleType:
    """``crash_recovery.<name>`` from this checkout, e.g. ``load_module("guard")``
    or ``load_module("storage.record")``."""
    load_package()
    return importlib.import_module(f"{PACKAGE_NAME}.{name}")
