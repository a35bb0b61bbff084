"""Where an operator's evidence comes from: ``--evidence TEXT`` or
``--evidence-file PATH`` (``-``: standard input), for receipts and log
excerpts too long or too awkward to quote on a command line (docs/cli.md
§Evidence).  Reads only; the caller checks the text itself."""
from __future__ import annotations

import argparse
import os
import stat
import sys


def read_evidence(args: argparse.Namespace, max_chars: int) -> str:
    """The evidence text of ``args``: ``args.evidence``, or the content of
    ``args.evidence_file`` (UTF-8; one trailing newline dropped).  Raises
    ``ValueError`` with a sentence for the person when the file cannot be
    read, is not a regular file, a pipe or standard input, is not UTF-8, or
    holds more than ``max_chars`` characters."""
    path = getattr(args, "evidence_file", None)
    if path is None:
        return args.evidence
    limit = max_chars * 4 + 1  # each character takes up to 4 UTF-8 bytes; +1 notices more
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(limit)
        else:
            descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(descriptor, "rb") as stream:
                mode = os.fstat(stream.fileno()).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
                    raise ValueError(f"{path} is not a regular file")
                os.set_blocking(stream.fileno(), True)
                raw = stream.read(limit)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    source = "standard input" if path == "-" else path
    if len(raw) >= limit:
        raise ValueError(f"{source} holds more than {max_chars} characters of evidence")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{source} is not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text
