"""The operator side: settling unknown outcomes and looking after the journal
(docs/cli.md; the modules: README §Project layout).  Imports ``reports`` and
``storage``.
"""
