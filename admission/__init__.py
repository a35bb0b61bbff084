"""The admission side: whether a call may run.  The settings and protection
modes (``settings``), the admission binding that tells re-entry, nested calls
and siblings apart (``binding``), and the gate with its refusals and
inspection tools (``gate``, the base of ``guard.RecoveryGuard``).  Imports
``reports`` and ``storage`` (docs/guard.md).
"""
