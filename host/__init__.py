"""The hosts the plugin runs in: Hermes (``hermes``: data directory, settings
source, profile-aware command lines, ``/crash-recovery``) and a plain
checkout (``standalone``, loaded by path by the scripts).  Imports
``admission``, ``reports`` and ``storage``.
"""
