#!/usr/bin/env python3
"""Crash-state explorer: every state a power loss may leave, not only process death.

After ALICE (Pillai et al., OSDI 2014), CrashMonkey (OSDI 2018) and LazyFS:

1. **Record.**  Run a real program (tests/explorer_scenarios.py) under
   ``strace`` on a copy of a prepared initial state, and keep every file-system
   call on the state root with its data: open/creat (O_CREAT, O_TRUNC),
   write/pwrite64 (offset and bytes), ftruncate, fsync/fdatasync, rename,
   unlink, mkdir -- ours and SQLite's alike.
2. **Model.**  docs/persistence.md: at trace point ``k`` (the first ``k`` calls
   completed) what an fsync made durable survives; of the rest, any per-object
   prefix (with a torn last write at 512-byte sectors) or any subset of whole
   operations.  SQLite's ``-shm`` is never persistent.
3. **Check.**  On a copy of each distinct state, the product's own recovery
   in fresh processes: ``verify``, ``status``, one protected call; and
   ``repair-checkpoint`` on another copy wherever it is offered.  The
   invariants are ``explorer_scenarios.evaluate``.

Command line (``--exhaustive`` takes about a minute; the default samples)::

    python tests/crash_explorer.py [--exhaustive] [--scenario NAME]... [--mutant NAME]
                                   [--seed N] [--budget N] [--jobs N] [--keep DIR]

It prints, per scenario, the trace length, the crash points, the crash states
enumerated and the distinct states checked, and every violation with its trace
point, the operations kept, dropped and torn, and the files' contents.
Test-only; standard library only.
"""
from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Iterable, Optional

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
import explorer_scenarios as scenarios  # noqa: E402

STRACE_CALLS = ("openat,open,creat,write,pwrite64,writev,pwritev,pwritev2,sendfile,"
                "copy_file_range,splice,ftruncate,truncate,"
                "fsync,fdatasync,rename,renameat,renameat2,link,linkat,unlink,unlinkat,mkdir,mkdirat,"
                "rmdir,"
                "close,lseek,dup,dup2,dup3,fcntl")
SECTOR = 512
CONTENT_KINDS, NAME_KINDS = ("write", "trunc"), ("creat", "rename", "link", "unlink", "mkdir",
                                                 "rmdir")
# Exhaustive mode: at most this many prefix combinations / subsets per crash point.
EXHAUSTIVE_CAP = 4096
FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
# A check mostly waits (the product's read-only commands retry a checkpoint
# that is ahead for ~0.4 s, expecting a live writer), so run more than cores.
DEFAULT_JOBS = min(16, 4 * (os.cpu_count() or 2))


class TraceError(Exception):
    """The trace holds something the model cannot represent (never ignored)."""


# ------------------------------------------------------------------ states --

@dataclasses.dataclass
class FsState:
    """A directory tree as names -> inode, inode -> bytes, and directories
    (paths relative to the state root; ``""`` is the root itself)."""
    names: dict
    contents: dict
    dirs: set

    @classmethod
    def from_directory(cls, root: str) -> "FsState":
        names, contents, dirs = {}, {}, set()
        for directory, subdirs, files in os.walk(root):
            relative = os.path.relpath(directory, root)
            prefix = "" if relative == "." else relative + "/"
            dirs.update(prefix + name for name in subdirs)
            for name in files:
                if name.endswith("-shm"):
                    continue  # never persistent state (docs/persistence.md)
                with open(os.path.join(directory, name), "rb") as stream:
                    contents[len(contents) + 1] = stream.read()
                names[prefix + name] = len(contents)
        return cls(names, contents, dirs)

    def files(self) -> dict:
        """``{path: bytes}`` of every name whose directories exist."""
        return {path: bytes(self.contents.get(inode, b"")) for path, inode in self.names.items()
                if _reachable(os.path.dirname(path), self.dirs)}

    def visible_dirs(self) -> frozenset:
        return frozenset(path for path in self.dirs if _reachable(path, self.dirs))

    def key(self) -> str:
        digest = hashlib.sha256()
        for path, data in sorted(self.files().items()):
            digest.update(f"F{path}\0{hashlib.sha256(data).hexdigest()}\0".encode())
        for path in sorted(self.visible_dirs()):
            digest.update(f"D{path}\0".encode())
        return digest.hexdigest()

    def write_to(self, root: str) -> None:
        os.makedirs(root, exist_ok=True)
        for path in sorted(self.visible_dirs()):
            os.makedirs(os.path.join(root, path), exist_ok=True)
        for path, data in self.files().items():
            with open(os.path.join(root, path), "wb") as stream:
                stream.write(data)


def _reachable(path: str, dirs: set) -> bool:
    while path:
        if path not in dirs:
            return False
        path = os.path.dirname(path)
    return True


# ------------------------------------------------------------------ the trace --

@dataclasses.dataclass
class Op:
    """One recorded call.  ``kind``: write, trunc (content of ``inode``);
    creat, rename, link, unlink, mkdir, rmdir (names; ``path`` is the new name,
    ``source`` the old one); sync (fsync/fdatasync of ``objects[0]``);
    witness_open / witness_write (the programs' evidence, never state).
    ``objects``: what must be fsynced to make it durable (``ino:N`` or
    ``dir:PATH``).  ``path`` of a content op or sync is the file's name then."""
    index: int
    kind: str
    objects: tuple = ()
    path: str = ""
    source: str = ""
    inode: int = 0
    offset: int = 0
    data: bytes = b""
    size: int = 0
    line: int = 0
    call: str = ""

    def label(self) -> str:
        where = {"write": f" [{self.offset}:{self.offset + len(self.data)})",
                 "trunc": f" to {self.size}", "rename": f" from {self.source}",
                 "link": f" to {self.source}"}.get(self.kind, "")
        return f"#{self.index} {self.call or self.kind} {self.path}{where} (strace line {self.line})"

    def cuts(self) -> list:
        """Sector boundaries strictly inside a write (where it may tear)."""
        if self.kind != "write":
            return []
        start, end = self.offset, self.offset + len(self.data)
        return list(range((start // SECTOR + 1) * SECTOR, end, SECTOR))


LINE = re.compile(r"^(\d+)\s+(.*)$")
CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(?:<([^>]*)>)?")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
FD_ARG = re.compile(r"^(-?\d+|AT_FDCWD)(?:<([^>]*)>)?(?:\(deleted\))?$")
STRING_ARG = re.compile(r'^"((?:\\x[0-9a-f]{2})*)"$')


def _text(annotation: str) -> str:
    """A ``-xx`` hex string as text (other annotations, e.g. pipe:[N], as they are)."""
    if re.fullmatch(r"(?:\\x[0-9a-f]{2})*", annotation):
        return bytes.fromhex(annotation.replace("\\x", "")).decode("utf-8", "surrogateescape")
    return annotation


def _bytes(argument: str) -> bytes:
    match = STRING_ARG.match(argument)
    if not match:
        raise TraceError(f"not a complete -xx string: {argument[:80]}")
    return bytes.fromhex(match.group(1).replace("\\x", ""))


def _split(arguments: str) -> list:
    """Top-level comma-separated arguments (strings are hex, so no quoting games)."""
    parts, depth, current = [], 0, []
    for char in arguments:
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


@dataclasses.dataclass
class _Fd:
    what: str            # file, dir, witness, ignored
    path: str = ""
    inode: int = 0
    offset: int = 0
    append: bool = False


class TraceParser:
    """strace ``-f -y -xx`` output -> :class:`Op` list for one state root.

    Calls outside ``home`` and ``witness`` are dropped; ``*-shm`` files are
    ignored.  Anything on the state root the model cannot represent (writev,
    a write to a descriptor opened before the trace, a directory rename)
    raises :class:`TraceError` rather than being skipped."""

    def __init__(self, home: str, witness: str, cwd: str, base: FsState):
        self.home, self.witness, self.cwd = home, witness, cwd
        self.names, self.dirs = dict(base.names), set(base.dirs)
        self.sizes = {inode: len(data) for inode, data in base.contents.items()}
        self.next_inode = max(base.contents, default=0) + 1
        self.fds: dict = {}
        self.partial: dict = {}
        self.ops: list = []
        self.line = 0

    def parse(self, lines: Iterable[str]) -> list:
        for self.line, text in enumerate(lines, start=1):
            match = LINE.match(text.rstrip("\n"))
            if not match:
                continue
            pid, rest = int(match.group(1)), match.group(2)
            if rest.endswith("<unfinished ...>"):
                self.partial[pid] = rest[:-len("<unfinished ...>")].rstrip()
                continue
            resumed = RESUMED.match(rest)
            if resumed:
                rest = self.partial.pop(pid, "") + resumed.group(2)
            call = CALL.match(rest)
            if call is None or call.group(3) == "?" or int(call.group(3)) < 0:
                continue  # signals, exits, failed calls
            handler = getattr(self, "_on_" + call.group(1), None)
            if handler is not None:
                handler(pid, _split(call.group(2)), int(call.group(3)),
                        _text(call.group(4) or ""))
        return self.ops

    # ------------------------------------------------------------ helpers --

    def _emit(self, kind: str, objects: tuple = (), **fields) -> None:
        """Append one :class:`Op` (``fields`` as Op's; ``call`` names the syscall)."""
        self.ops.append(Op(len(self.ops), kind, objects, line=self.line, **fields))

    def _where(self, path: str) -> tuple:
        path = os.path.normpath(path)
        for root, area in ((self.home, "home"), (self.witness, "witness")):
            if path == root or path.startswith(root + "/"):
                relative = os.path.relpath(path, root)
                return area, "" if relative == "." else relative
        return None, None

    def _resolve(self, directory: Optional[str], argument: str) -> str:
        path = _bytes(argument).decode("utf-8", "surrogateescape")
        if not os.path.isabs(path):
            base = self.cwd
            if directory is not None:
                match = FD_ARG.match(directory)
                base = _text(match.group(2)) if match and match.group(2) else base
            path = os.path.join(base, path)
        return os.path.normpath(path)

    def _fd(self, pid: int, argument: str) -> Optional[_Fd]:
        match = FD_ARG.match(argument)
        number = int(match.group(1)) if match and match.group(1) != "AT_FDCWD" else None
        known = self.fds.get((pid, number))
        if known is not None:
            return known
        area, relative = self._where(_text(match.group(2) or "")) if match else (None, None)
        if area == "witness":
            return _Fd("witness", relative)
        if area == "home" and not relative.endswith("-shm"):
            raise TraceError(f"line {self.line}: descriptor {argument[:60]} was opened before "
                             "the trace started")
        return None

    @staticmethod
    def _parent(path: str) -> str:
        return "dir:" + os.path.dirname(path)

    # -------------------------------------------------------------- opens --

    def _on_openat(self, pid, args, fd, path):
        self._opened(pid, fd, path, args[2])

    def _on_open(self, pid, args, fd, path):
        self._opened(pid, fd, path, args[1])

    def _on_creat(self, pid, args, fd, path):
        self._opened(pid, fd, path, "O_WRONLY|O_CREAT|O_TRUNC")

    def _opened(self, pid: int, fd: int, path: str, flags: str) -> None:
        area, relative = self._where(path)
        self.fds.pop((pid, fd), None)
        if area == "witness":
            self.fds[(pid, fd)] = _Fd("witness", relative)
            if "O_CREAT" in flags:
                self._emit("witness_open", path=relative, call="openat")
        if area != "home":
            return
        if relative.endswith("-shm"):
            self.fds[(pid, fd)] = _Fd("ignored", relative)
        elif relative in self.dirs or relative == "" or "O_DIRECTORY" in flags:
            self.fds[(pid, fd)] = _Fd("dir", relative)
        else:
            inode = self.names.get(relative)
            if inode is None:
                if "O_CREAT" not in flags:
                    raise TraceError(f"line {self.line}: {relative} opened but never created")
                inode, self.next_inode = self.next_inode, self.next_inode + 1
                self.names[relative], self.sizes[inode] = inode, 0
                self._emit("creat", (self._parent(relative),), path=relative, inode=inode,
                           call="openat(O_CREAT)")
            elif "O_TRUNC" in flags and self.sizes[inode]:
                self.sizes[inode] = 0
                self._emit("trunc", (f"ino:{inode}",), path=relative, inode=inode,
                           call="openat(O_TRUNC)")
            self.fds[(pid, fd)] = _Fd("file", relative, inode, 0, "O_APPEND" in flags)

    def _on_close(self, pid, args, ret, path):
        match = FD_ARG.match(args[0])
        if match and match.group(1) != "AT_FDCWD":
            self.fds.pop((pid, int(match.group(1))), None)

    def _on_dup(self, pid, args, new_fd, path):
        known = self._fd(pid, args[0])
        if known is not None:
            self.fds[(pid, new_fd)] = known  # shares the offset, as dup does

    _on_dup2 = _on_dup3 = _on_dup

    def _on_fcntl(self, pid, args, ret, path):
        if len(args) > 1 and args[1] in ("F_DUPFD", "F_DUPFD_CLOEXEC"):  # a dup (os.scandir)
            self._on_dup(pid, args, ret, path)

    # ------------------------------------------------------------- content --

    def _write(self, pid: int, fd_argument: str, data: bytes, offset: Optional[int]) -> None:
        fd = self._fd(pid, fd_argument)
        if fd is None or fd.what in ("ignored", "dir"):
            return
        if fd.what == "witness":
            self._emit("witness_write", path=fd.path, data=data, call="write")
            return
        at = offset if offset is not None else (self.sizes[fd.inode] if fd.append else fd.offset)
        self.sizes[fd.inode] = max(self.sizes[fd.inode], at + len(data))
        if offset is None:
            fd.offset = at + len(data)
        self._emit("write", (f"ino:{fd.inode}",), path=fd.path, inode=fd.inode, offset=at,
                   data=data, call="write" if offset is None else "pwrite64")

    def _on_write(self, pid, args, written, path):
        self._write(pid, args[0], _bytes(args[1])[:written], None)

    def _on_pwrite64(self, pid, args, written, path):
        self._write(pid, args[0], _bytes(args[1])[:written], int(args[3]))

    def _unsupported(self, pid, args, ret, path):
        fd = self._fd(pid, args[0])
        if fd is not None and fd.what in ("file", "witness"):
            raise TraceError(f"line {self.line}: vectored write to {fd.path} is not modelled")

    _on_writev = _on_pwritev = _on_pwritev2 = _unsupported

    def _kernel_copy(self, pid, target):
        # The kernel copies between descriptors: no bytes in the trace.
        fd = self._fd(pid, target)
        if fd is not None and fd.what in ("file", "witness"):
            raise TraceError(f"line {self.line}: {fd.path} written by a kernel copy "
                             "(sendfile/copy_file_range/splice) is not modelled")

    def _on_sendfile(self, pid, args, ret, path):
        self._kernel_copy(pid, args[0])  # sendfile(out_fd, in_fd, ...)

    def _on_copy_file_range(self, pid, args, ret, path):
        self._kernel_copy(pid, args[2])  # (fd_in, off_in, fd_out, ...)

    _on_splice = _on_copy_file_range

    def _on_lseek(self, pid, args, offset, path):
        fd = self._fd(pid, args[0])
        if fd is not None and fd.what == "file":
            fd.offset = offset

    def _truncate(self, inode: int, relative: str, size: int, call: str) -> None:
        self.sizes[inode] = size
        self._emit("trunc", (f"ino:{inode}",), path=relative, inode=inode, size=size, call=call)

    def _on_ftruncate(self, pid, args, ret, path):
        fd = self._fd(pid, args[0])
        if fd is not None and fd.what == "file":
            self._truncate(fd.inode, fd.path, int(args[1]), "ftruncate")

    def _on_truncate(self, pid, args, ret, path):
        area, relative = self._where(self._resolve(None, args[0]))
        if area == "home" and relative in self.names:
            self._truncate(self.names[relative], relative, int(args[1]), "truncate")

    def _on_fsync(self, pid, args, ret, path, call="fsync"):
        fd = self._fd(pid, args[0])
        if fd is not None and fd.what == "file":
            self._emit("sync", (f"ino:{fd.inode}",), path=fd.path, inode=fd.inode, call=call)
        elif fd is not None and fd.what == "dir":
            self._emit("sync", ("dir:" + fd.path,), path=fd.path or ".", call=call + "(dir)")

    def _on_fdatasync(self, pid, args, ret, path):
        self._on_fsync(pid, args, ret, path, call="fdatasync")

    # --------------------------------------------------------------- names --

    def _rename(self, source: str, target: str) -> None:
        source_area, old = self._where(source)
        target_area, new = self._where(target)
        if source_area != "home" and target_area != "home":
            return
        if old.endswith("-shm") and new.endswith("-shm"):
            return  # never persistent state (a restart moves the old journal's)
        if source_area != target_area or old in self.dirs:
            raise TraceError(f"line {self.line}: rename {source} -> {target} is not modelled")
        if old not in self.names:
            raise TraceError(f"line {self.line}: rename of unknown {old}")
        inode = self.names.pop(old)
        self.names[new] = inode
        objects = tuple(dict.fromkeys((self._parent(new), self._parent(old))))
        self._emit("rename", objects, path=new, source=old, inode=inode, call="rename")

    def _on_rename(self, pid, args, ret, path):
        self._rename(self._resolve(None, args[0]), self._resolve(None, args[1]))

    def _on_renameat(self, pid, args, ret, path):
        self._rename(self._resolve(args[0], args[1]), self._resolve(args[2], args[3]))

    _on_renameat2 = _on_renameat

    def _link(self, source: str, target: str) -> None:
        source_area, old = self._where(source)
        target_area, new = self._where(target)
        if source_area != "home" and target_area != "home":
            return
        if source_area != target_area or old not in self.names:
            raise TraceError(f"line {self.line}: link {source} -> {target} is not modelled")
        inode = self.names[old]
        self.names[new] = inode
        self._emit("link", (self._parent(new),), path=new, source=old, inode=inode, call="link")

    def _on_link(self, pid, args, ret, path):
        self._link(self._resolve(None, args[0]), self._resolve(None, args[1]))

    def _on_linkat(self, pid, args, ret, path):
        self._link(self._resolve(args[0], args[1]), self._resolve(args[2], args[3]))

    def _remove(self, target: str, directory: bool) -> None:
        area, relative = self._where(target)
        if area != "home" or relative.endswith("-shm"):
            return
        if directory:
            self.dirs.discard(relative)
            self._emit("rmdir", (self._parent(relative),), path=relative, call="rmdir")
        else:
            if relative not in self.names:
                raise TraceError(f"line {self.line}: unlink of unknown {relative}")
            self._emit("unlink", (self._parent(relative),), path=relative,
                       inode=self.names.pop(relative), call="unlink")

    def _on_unlink(self, pid, args, ret, path):
        self._remove(self._resolve(None, args[0]), False)

    def _on_unlinkat(self, pid, args, ret, path):
        self._remove(self._resolve(args[0], args[1]), "AT_REMOVEDIR" in args[2])

    def _on_rmdir(self, pid, args, ret, path):
        self._remove(self._resolve(None, args[0]), True)

    def _mkdir(self, target: str) -> None:
        area, relative = self._where(target)
        if area == "home":
            self.dirs.add(relative)
            self._emit("mkdir", (self._parent(relative),), path=relative, call="mkdir")

    def _on_mkdir(self, pid, args, ret, path):
        self._mkdir(self._resolve(None, args[0]))

    def _on_mkdirat(self, pid, args, ret, path):
        self._mkdir(self._resolve(args[0], args[1]))


# ------------------------------------------------------------------ the model --

class CrashModel:
    """What a crash at trace point ``k`` may leave (docs/persistence.md)."""

    def __init__(self, base: FsState, ops: list):
        self.base, self.ops = base, ops
        syncs = defaultdict(list)
        for op in ops:
            if op.kind == "sync":
                syncs[op.objects[0]].append(op.index)
        # synced_by[i]: the sync after which op i is durable (None: never).
        self.synced_by = []
        for op in ops:
            found = []
            for obj in op.objects:
                after = syncs.get(obj, [])
                position = bisect.bisect_right(after, op.index)
                found.append(after[position] if position < len(after) else None)
            self.synced_by.append(None if None in found or not found else max(found))

    def durable(self, index: int, k: int) -> bool:
        synced = self.synced_by[index]
        return synced is not None and synced < k

    def pending(self, k: int) -> list:
        """Indices of state-changing ops issued before ``k`` and not yet durable,
        leaving out the content of files no crash state at ``k`` can show: every
        name the inode ever had was durably removed (a scratch copy deleted,
        its directory fsynced), so whichever of its writes survive, no state
        differs."""
        hidden = self._unnamed_inodes(k)
        return [op.index for op in self.ops[:k]
                if op.kind in CONTENT_KINDS + NAME_KINDS and not self.durable(op.index, k)
                and not (op.kind in CONTENT_KINDS and op.inode in hidden)]

    def _unnamed_inodes(self, k: int) -> set:
        """Inodes whose every name operation before ``k`` is durable and which
        have no name in the durable state at ``k``: nameless in every state."""
        named_by = defaultdict(list)
        for op in self.ops[:k]:
            if op.kind in ("creat", "rename", "link", "unlink"):
                named_by[op.inode].append(op.index)
        settled = {inode for inode, indices in named_by.items()
                   if all(self.durable(index, k) for index in indices)}
        if not settled:
            return set()
        return settled - set(self.materialize(k, frozenset(), {}).names.values())

    def materialize(self, k: int, keep: frozenset, torn: dict) -> FsState:
        names, dirs = dict(self.base.names), set(self.base.dirs)
        contents = {inode: bytearray(data) for inode, data in self.base.contents.items()}
        for op in self.ops[:k]:
            if op.kind not in CONTENT_KINDS + NAME_KINDS:
                continue
            if not (op.index in keep or self.durable(op.index, k)):
                continue
            if op.kind == "write":
                data = op.data
                if op.index in torn:
                    data = data[:op.cuts()[torn[op.index] - 1] - op.offset]
                buffer = contents.setdefault(op.inode, bytearray())
                if len(buffer) < op.offset:
                    buffer.extend(bytes(op.offset - len(buffer)))
                buffer[op.offset:op.offset + len(data)] = data
            elif op.kind == "trunc":
                buffer = contents.setdefault(op.inode, bytearray())
                del buffer[op.size:]
                buffer.extend(bytes(op.size - len(buffer)))
            elif op.kind in ("creat", "rename", "link"):  # a name for the inode
                if op.kind == "rename" and names.get(op.source) == op.inode:
                    del names[op.source]
                names[op.path] = op.inode
                contents.setdefault(op.inode, bytearray())
            elif op.kind == "unlink":
                if names.get(op.path) == op.inode:
                    del names[op.path]
            elif op.kind == "mkdir":
                dirs.add(op.path)
            elif op.kind == "rmdir":
                dirs.discard(op.path)
        return FsState(names, {inode: bytes(data) for inode, data in contents.items()}, dirs)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One crash state: trace point ``k``, the pending ops kept, torn writes
    (op index -> sectors kept) and how it was chosen."""
    k: int
    keep: frozenset
    torn: tuple
    how: str


def _object_options(model: CrashModel, indices: list) -> list:
    """Per-object choices: every in-order prefix, and each prefix whose last
    op is a write torn after each sector boundary inside it."""
    options = [((), ())]
    for length in range(1, len(indices) + 1):
        kept, last = tuple(indices[:length]), model.ops[indices[length - 1]]
        options.append((kept, ()))
        options.extend((kept, ((last.index, sectors),))
                       for sectors in range(1, len(last.cuts()) + 1))
    return options


def crash_plans(model: CrashModel, k: int, *, exhaustive: bool, rng: random.Random,
                samples: int) -> tuple:
    """``(plans, capped)``: the crash states enumerated (exhaustive) or sampled
    at trace point ``k``; ``capped``: exhaustive mode had to sample because
    there were more than EXHAUSTIVE_CAP prefix combinations or subsets."""
    pending = model.pending(k)
    plans = [Plan(k, frozenset(), (), "durable only"),
             Plan(k, frozenset(pending), (), "everything issued")]
    if not pending:
        return plans[:1], False
    groups = defaultdict(list)
    for index in pending:
        groups[model.ops[index].objects].append(index)
    per_object = [_object_options(model, indices) for indices in groups.values()]
    combinations = 1
    for options in per_object:
        combinations *= len(options)

    def combo(choice) -> Plan:
        return Plan(k, frozenset(itertools.chain.from_iterable(kept for kept, _ in choice)),
                    tuple(itertools.chain.from_iterable(torn for _, torn in choice)), "prefix")

    def subset(bits: Iterable[bool]) -> Plan:
        return Plan(k, frozenset(i for i, bit in zip(pending, bits) if bit), (), "subset")

    if exhaustive and combinations <= EXHAUSTIVE_CAP:
        plans += [combo(choice) for choice in itertools.product(*per_object)]
    else:
        count = EXHAUSTIVE_CAP if exhaustive else samples
        plans += [combo([rng.choice(options) for options in per_object]) for _ in range(count)]
    if exhaustive and 2 ** len(pending) <= EXHAUSTIVE_CAP:
        plans += [subset(bits) for bits in itertools.product((False, True), repeat=len(pending))]
    else:
        count = EXHAUSTIVE_CAP if exhaustive else samples
        plans += [subset(rng.random() < 0.5 for _ in pending) for _ in range(count)]
    capped = exhaustive and (combinations > EXHAUSTIVE_CAP or 2 ** len(pending) > EXHAUSTIVE_CAP)
    return plans, capped


# ------------------------------------------------------------------ mutants --

def _drop_dir_fsync_after_checkpoint(ops: list) -> list:
    """Remove the directory fsync that follows each rename onto head.json."""
    dropped, waiting = set(), set()
    for op in ops:
        if op.kind == "rename" and os.path.basename(op.path) == "head.json":
            waiting.add("dir:" + os.path.dirname(op.path))
        elif op.kind == "sync" and op.objects[0] in waiting:
            waiting.discard(op.objects[0])
            dropped.add(op.index)
    return [op for op in ops if op.index not in dropped]


def _drop_wal_sync(ops: list) -> list:
    """Remove every fsync/fdatasync of SQLite's WAL (the sync at COMMIT)."""
    return [op for op in ops if not (op.kind == "sync" and op.path.endswith(".sqlite3-wal"))]


def _drop_source_dir_fsync(ops: list) -> list:
    """Remove the fsync of the source directory that follows each rename
    between two directories (the rename is durable only once both are)."""
    dropped, waiting = set(), set()
    for op in ops:
        if op.kind == "rename" and os.path.dirname(op.path) != os.path.dirname(op.source):
            waiting.add("dir:" + os.path.dirname(op.source))
        elif op.kind == "sync" and op.objects[0] in waiting:
            waiting.discard(op.objects[0])
            dropped.add(op.index)
    return [op for op in ops if op.index not in dropped]


MUTANTS = {"no_dir_fsync_after_checkpoint": _drop_dir_fsync_after_checkpoint,
           "no_wal_fsync": _drop_wal_sync, "no_source_dir_fsync": _drop_source_dir_fsync}


def mutate(ops: list, mutant: Optional[str]) -> list:
    """``ops`` with one durability step removed (re-indexed), or unchanged."""
    if mutant is None:
        return list(ops)
    kept = MUTANTS[mutant](ops)
    if len(kept) == len(ops):
        raise TraceError(f"mutant {mutant} found nothing to remove in this trace")
    return [dataclasses.replace(op, index=index) for index, op in enumerate(kept)]


# ------------------------------------------------------------------ recording --

@dataclasses.dataclass
class Recording:
    """A scenario's initial state (``base``, all durable), what its setup left
    (``base_info``), and the recorded calls."""
    scenario: scenarios.Scenario
    base: FsState
    base_info: dict
    ops: list
    strace_lines: int
    seconds: float
    trace: str = ""   # the strace output (tests/kill_points.py reads it again)
    home: str = ""    # the state root the program ran on
    witness: str = ""

    def counts(self) -> dict:
        found = defaultdict(int)
        for op in self.ops:
            found[op.kind] += 1
        return dict(found)


def _run(argv: list, *, killed: bool = False, **options) -> None:
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=300, **options)
    if completed.returncode != (-9 if killed else 0):
        raise RuntimeError(f"{' '.join(argv[1:3])} exited {completed.returncode}: "
                           f"{completed.stdout[-400:]} {completed.stderr[-1500:]}")


def record(scenario: scenarios.Scenario, scratch: str) -> Recording:
    """Build the scenario's initial state, run its program under strace on a
    copy, parse the trace, and check the parse: replaying every call from the
    initial state must give exactly the files the program left."""
    started = time.monotonic()
    root = os.path.realpath(os.path.join(scratch, scenario.name))
    setup_home, setup_witness = os.path.join(root, "setup", "home"), os.path.join(root, "setup", "w")
    os.makedirs(setup_home)
    for step in scenario.setup:
        _run([sys.executable, scenarios.__file__, "setup", step.lstrip("*"), setup_home,
              setup_witness], killed=step.startswith("*"))
    info_path = os.path.join(setup_witness, scenarios.BASE_INFO)
    base_info = {}
    if os.path.exists(info_path):
        with open(info_path, encoding="utf-8") as stream:
            base_info = json.load(stream)
    base = FsState.from_directory(setup_home)
    base_info["open"] = scenarios.open_operations(setup_home)
    home, witness = os.path.join(root, "run", "home"), os.path.join(root, "run", "witness")
    base.write_to(home)
    os.makedirs(witness)
    trace = os.path.join(root, "strace.txt")
    with open(os.path.join(witness, scenarios.STDOUT), "wb") as output:
        completed = subprocess.run(
            ["strace", "-f", "-y", "-xx", "-s", "1000000", "-e", "trace=" + STRACE_CALLS,
             "-o", trace, *scenarios.program_argv(scenario, home, witness, base_info)],
            cwd=root, stdout=output, stderr=subprocess.PIPE, text=True, timeout=300)
    if completed.returncode != 0:
        raise RuntimeError(f"{scenario.name}: the traced program exited {completed.returncode}: "
                           f"{completed.stderr[-1500:]}")
    with open(trace, encoding="ascii", errors="replace") as stream:
        lines = stream.readlines()
    ops = TraceParser(home, witness, root, base).parse(lines)
    replayed = CrashModel(base, ops).materialize(len(ops), frozenset(range(len(ops))), {})
    actual = FsState.from_directory(home)
    if replayed.files() != actual.files() or replayed.visible_dirs() != actual.visible_dirs():
        differ = sorted(path for path in set(replayed.files()) | set(actual.files())
                        if replayed.files().get(path) != actual.files().get(path))
        raise TraceError(f"{scenario.name}: replaying the trace does not give the files the "
                         f"program left: {differ}")
    return Recording(scenario, base, base_info, ops, len(lines), time.monotonic() - started,
                     trace, home, witness)


# ------------------------------------------------------------------ exploring --

@dataclasses.dataclass
class Result:
    """What one exploration did and found."""
    scenario: str
    mutant: Optional[str]
    mode: str
    trace_length: int
    crash_points: int
    plans: int
    distinct: int
    checked: int
    violations: list
    seconds: float
    capped: int = 0

    def summary(self) -> str:
        by_invariant = defaultdict(int)
        for violation in self.violations:
            by_invariant[violation["invariant"]] += 1
        found = ", ".join(f"{name} {count}" for name, count in sorted(by_invariant.items()))
        return (f"{self.scenario}{' [mutant ' + self.mutant + ']' if self.mutant else ''} "
                f"({self.mode}): trace {self.trace_length} calls, {self.crash_points} crash "
                f"points{f' ({self.capped} capped)' if self.capped else ''}, {self.plans} "
                f"crash states enumerated, {self.distinct} distinct, "
                f"{self.checked} checked, {len(self.violations)} violating states"
                f"{' (' + found + ')' if found else ''}, {self.seconds:.1f} s")


class Checkers:
    """One checker process per worker thread, closed together."""

    def __init__(self):
        self.local, self.all, self.lock = threading.local(), [], threading.Lock()

    def get(self) -> scenarios.CheckerProcess:
        if not hasattr(self.local, "checker"):
            self.local.checker = scenarios.CheckerProcess()
            with self.lock:
                self.all.append(self.local.checker)
        return self.local.checker

    def close(self) -> None:
        for checker in self.all:
            checker.close()


def explore(recording: Recording, *, exhaustive: bool = False, seed: int = 13,
            samples: int = 2, budget: Optional[int] = None, jobs: int = 2,
            mutant: Optional[str] = None, stop_at_first: bool = False) -> Result:
    """Enumerate (or sample) the crash states of a recording, check each
    distinct one once, and evaluate the invariants for every trace point that
    leads to it.  The "durable only" and "everything issued" states of every
    point are always checked; ``budget`` caps the other (random) distinct
    states at a seeded sample of that many.  ``mutant``: remove one
    durability step first (MUTANTS).  ``stop_at_first``: stop at the first
    violating state (the fixed states are checked first)."""
    started = time.monotonic()
    ops = mutate(recording.ops, mutant)
    model = CrashModel(recording.base, ops)
    facts = scenarios.facts_by_point(ops, recording.base_info, recording.scenario)
    codes = scenarios.documented_codes()
    rng = random.Random(seed)
    groups, first, later, plans, capped = {}, [], [], 0, 0
    for k in range(len(ops) + 1):
        at_k, sampled = crash_plans(model, k, exhaustive=exhaustive, rng=rng, samples=samples)
        capped += sampled
        for plan in at_k:
            plans += 1
            key = model.materialize(plan.k, plan.keep, dict(plan.torn)).key()
            if key not in groups:
                groups[key] = {}
                (first if plan.how in ("durable only", "everything issued") else later).append(key)
            groups[key].setdefault(facts[plan.k], plan)  # the earliest point per facts
    if budget is not None and len(later) > budget:
        later = rng.sample(later, budget)
    chosen = first + later
    scratch = tempfile.mkdtemp(prefix="crash-explorer-states-", dir=FAST_TMP)
    checkers, violations, seen = Checkers(), [], set()

    def check(key: str) -> tuple:
        plan = next(iter(groups[key].values()))
        state = model.materialize(plan.k, plan.keep, dict(plan.torn))
        directory = tempfile.mkdtemp(dir=scratch)
        return key, state, scenarios.check_state(state.write_to, directory, checkers.get())

    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            futures = [pool.submit(check, key) for key in chosen]
            for future in concurrent.futures.as_completed(futures):
                key, state, outcome = future.result()
                files = state.files()
                for fact, plan in sorted(groups[key].items(), key=lambda item: item[1].k):
                    for invariant, message in scenarios.evaluate(fact, outcome, codes, files):
                        if (invariant, key) not in seen:
                            seen.add((invariant, key))
                            violations.append(_describe(recording, ops, model, plan, state,
                                                        outcome, invariant, message, mutant))
                if stop_at_first and violations:
                    for pending in futures:
                        pending.cancel()
                    break
    finally:
        checkers.close()
        shutil.rmtree(scratch, ignore_errors=True)
    violations.sort(key=lambda found: (found["invariant"], found["k"]))
    return Result(recording.scenario.name, mutant, "exhaustive" if exhaustive else "sampled",
                  len(ops), len(ops) + 1, plans, len(groups), len(chosen), violations,
                  time.monotonic() - started, capped)


def _describe(recording, ops, model, plan, state, outcome, invariant, message, mutant) -> dict:
    """A violation: where the crash happened, what survived, what the product said."""
    pending, torn = model.pending(plan.k), dict(plan.torn)
    verdicts = {name: scenarios.cli_verdict(outcome[name], None)[0] for name in ("verify", "status")}
    verdicts["protected call"] = scenarios.probe_verdict(outcome["probe"], set())[0]
    if outcome.get("repair"):
        verdicts["repair-checkpoint"] = scenarios.cli_verdict(outcome["repair"]["repair"], None)[0]
        verdicts["protected call after repair"] = scenarios.probe_verdict(
            outcome["repair"]["probe"], set())[0]
    return {"scenario": recording.scenario.name, "mutant": mutant, "invariant": invariant,
            "message": message, "k": plan.k, "how": plan.how,
            "last_op": ops[plan.k - 1].label() if plan.k else "(none: the initial state)",
            "kept": [ops[i].label() for i in pending if i in plan.keep and i not in torn],
            "torn": [f"{ops[i].label()} torn after {torn[i]} of {len(ops[i].cuts()) + 1} "
                     "sectors" for i in torn],
            "dropped": [ops[i].label() for i in pending if i not in plan.keep],
            "files": _file_summary(state.files(), outcome["ref"]), "verdicts": verdicts}


def _file_summary(files: dict, ref: dict) -> list:
    lines = []
    for path, data in sorted(files.items()):
        line = f"{path}: {len(data)} bytes sha256 {hashlib.sha256(data).hexdigest()[:12]}"
        if path.endswith((".json", "initialized", "operator.log")) and len(data) < 2000:
            line += f" = {data.decode('utf-8', 'replace')[:400]!r}"
        lines.append(line)
    events = ", ".join(f"{kind} {str(op)[:8]}" for kind, op in ref["events"])
    lines.append(f"database rows (reference reading): {ref['count']} [{events}]"
                 f"{' errors ' + str(ref['errors']) if ref['errors'] else ''}")
    return lines


def format_violation(violation: dict) -> str:
    parts = [f"VIOLATION {violation['invariant']} in {violation['scenario']}"
             f"{' [mutant ' + violation['mutant'] + ']' if violation['mutant'] else ''} at trace "
             f"point {violation['k']} ({violation['how']}): {violation['message']}",
             f"  crash after: {violation['last_op']}",
             f"  verdicts: {json.dumps(violation['verdicts'])}"]
    for title in ("kept", "torn", "dropped"):
        if violation[title]:
            parts.append(f"  not yet durable, {title}:")
            parts += [f"    {label}" for label in violation[title]]
    parts.append("  files:")
    parts += [f"    {line}" for line in violation["files"]]
    return "\n".join(parts)


# ------------------------------------------------------------------ command --

def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exhaustive", action="store_true",
                        help="enumerate every crash state (docs/persistence.md) instead of sampling")
    parser.add_argument("--scenario", action="append", choices=scenarios.SCENARIO_NAMES,
                        help="only this scenario (repeatable; default all)")
    parser.add_argument("--mutant", choices=sorted(MUTANTS),
                        help="remove one durability step from the trace first")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--samples", type=int, default=2,
                        help="sampled mode: random states per crash point (besides the two fixed)")
    parser.add_argument("--budget", type=int, default=None,
                        help="check at most this many random distinct states per scenario "
                             "besides the fixed ones (default: all)")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                        help=f"checker processes (default {DEFAULT_JOBS}: checks mostly wait)")
    parser.add_argument("--show", type=int, default=2,
                        help="violations printed in full per scenario and invariant")
    parser.add_argument("--keep", metavar="DIR", help="record into DIR and keep it")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace is not installed; nothing explored", file=sys.stderr)
        return 2
    scratch = args.keep or tempfile.mkdtemp(prefix="crash-explorer-", dir=FAST_TMP)
    total, started = 0, time.monotonic()
    try:
        for name in args.scenario or scenarios.SCENARIO_NAMES:
            scenario = scenarios.scenario_named(name)
            if scenario.requires and not scenarios.command_exists(scenario.requires):
                print(f"{name}: skipped, operator_cli.py has no {scenario.requires!r} command")
                continue
            recording = record(scenario, scratch)
            result = explore(recording, exhaustive=args.exhaustive, seed=args.seed,
                             samples=args.samples, budget=args.budget, jobs=args.jobs,
                             mutant=args.mutant)
            print(result.summary() + f"; recorded in {recording.seconds:.1f} s from "
                  f"{recording.strace_lines} strace lines {recording.counts()}", flush=True)
            shown = defaultdict(int)
            for violation in result.violations:
                shown[violation["invariant"]] += 1
                if shown[violation["invariant"]] <= args.show:
                    print(format_violation(violation), flush=True)
            total += len(result.violations)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"total: {total} violating states, {time.monotonic() - started:.1f} s")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
