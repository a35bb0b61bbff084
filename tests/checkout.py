"""The checkout as the package ``crash_recovery``, for tests and the scripts
they start: ``from checkout import load_module`` (with ``tests/`` on
``sys.path``), then e.g. ``load_module("storage.record")``.

The product's own loader is ``host/standalone.py``; it is loaded by path
(``runpy``) so no folder of the plugin lands on ``sys.path``.
"""
from __future__ import annotations

import os
import runpy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_standalone = runpy.run_path(os.path.join(REPO, "host", "standalone.py"))
load_package = _standalone["load_package"]
load_module = _standalone["load_module"]
