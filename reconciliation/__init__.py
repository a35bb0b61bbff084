"""The operator side: settling unknown outcomes and looking after the journal
(``commands``: status, show, log, verify, checkpoint, resolve, acknowledge,
repair-checkpoint, archive).  Imports ``reports`` and ``storage``
(docs/cli.md).
"""
