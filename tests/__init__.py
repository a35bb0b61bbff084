
# `python -m unittest tests.test_demo` from the repository root imports the test
# modules as a package; they import their helpers (support, journal_reference) by
# plain name, as `discover -s tests` does.
import os as _os
import sys as _sys

_TESTS = _os.path.dirname(_os.path.abspath(__file__))
if _TESTS not in _sys.path:
    _sys.path.insert(0, _TESTS)
