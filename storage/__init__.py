"""The storage floor: the journal's bytes on disk and how they are checked.

The record format and its hashes (``record``), the exception family
(``errors``), durable files (``durable``: head.json, the marker, atomic
replace with fsync), the SQLite schema, connection and opening checks
(``schema``, ``database``, ``opening``), the verified chain (``chain``),
archives (``archive``), the read side (``snapshot``), the writer's side
(``store``), the locks -- one per running call (``call_lock``), the head lock
(``head_lock``), the WAL keeper (``wal_keeper``) -- what the kernel says of
lock holders (``lock_holders``), log lines (``log_lines``) and fork safety (``forksafe``).
Imports nothing above it (docs/format.md, docs/persistence.md).
"""
