"""The stand-alone host: run the plugin's files as scripts from a checkout
(``python operator_cli.py``, ``python demo.py``).  The modules use relative
imports, so a script loads this file by path (``runpy.run_path``) and it
imports the plugin directory, whatever its name, as the package
``crash_recovery``.  Imports nothing of ours.
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
    """This checkout as the package ``name``, loaded once (an installed copy of
    that name is never used).  ``plugin_api.py`` passes Hermes' name for the
    plugin: one process never holds two copies of the storage layer's state."""
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
    """``crash_recovery.<name>`` from this checkout, e.g. ``load_module("storage.record")``."""
    load_package()
    return importlib.import_module(f"{PACKAGE_NAME}.{name}")
