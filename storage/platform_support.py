"""Whether this platform can give the journal's guarantees (README
§Supported platforms, docs/guard.md §Platforms).

Needed: ``fcntl`` (the owner lock; absent on native Windows), ``fsync`` of a
directory (created and renamed files survive a power loss), and a local file
system (WAL mode and POSIX locks are unreliable over NFS, SMB, sshfs...; known
only from Linux's ``/proc/mounts``, else the check passes, as in a chroot whose
table lists no mount holding the directory).  Where one is missing, protected
calls are refused (``platform_unsupported``) and ``status`` says why.
"""
from __future__ import annotations

import errno
import importlib
import os
from typing import Optional

# File systems that are network or cluster mounts (``/proc/mounts`` type names).
NETWORK_FILE_SYSTEMS = frozenset((
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "coda", "9p",
    "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "davfs",
    "fuse.sshfs", "sshfs", "fuse.glusterfs", "fuse.cephfs", "fuse.s3fs", "fuse.gcsfuse",
    "fuse.rclone", "fuse.davfs2", "fuse.juicefs", "fuse.mfs", "fuse.lizardfs",
))
MOUNTS_TABLE = "/proc/mounts"
WHAT_TO_DO = ("Run Hermes on Linux or macOS (on Windows: inside WSL2) with the profile on a "
              "local disk; unprotected tools still run.")


def platform_problem(data_dir: str) -> Optional[str]:
    """Why the guarantees cannot hold for ``data_dir`` (or its nearest
    existing parent), with what to do, or None.  Never raises."""
    try:
        importlib.import_module("fcntl")
    except ImportError:
        return ("This platform has no fcntl module (native Windows), so crash-recovery cannot "
                "lock the journal's owner or tell a running call from a dead one. "
                + WHAT_TO_DO)
    directory = _nearest_existing(os.path.abspath(os.fspath(data_dir)))
    file_system = mounted_file_system(directory)
    if file_system in NETWORK_FILE_SYSTEMS:
        return (f"The data directory {data_dir} is on a network file system ({file_system}), "
                "where SQLite's locks and WAL mode are not reliable. " + WHAT_TO_DO)
    error = _directory_fsync_error(directory)
    if error is not None:
        return (f"This file system cannot fsync a directory ({error}), so a journal file "
                f"created or renamed under {data_dir} could vanish at a power loss. "
                + WHAT_TO_DO)
    return None


def mounted_file_system(path: str) -> Optional[str]:
    """The file system type of ``path`` from the Linux mount table (longest
    mount point prefix of its real path); None without a readable table."""
    try:
        with open(MOUNTS_TABLE, encoding="utf-8", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, found = -1, None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = _unescape(fields[1])
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > best:
            best, found = len(mount_point), fields[2]
    return found


def _unescape(field: str) -> str:
    # The mount table writes space, tab, newline and backslash as octal escapes.
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def _nearest_existing(path: str) -> str:
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


# A directory fsync's "unsupported" answers; others (EIO, ENOSPC) are storage failures.
UNSUPPORTED_FSYNC_ERRNOS = frozenset(
    code for code in (getattr(errno, name, None) for name in ("EINVAL", "ENOTSUP", "EOPNOTSUPP"))
    if code is not None)


def _directory_fsync_error(directory: str) -> Optional[str]:
    """The error saying the platform cannot fsync ``directory``, else None."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None  # permissions or storage: reported as such when the journal opens
    try:
        os.fsync(descriptor)
    except OSError as exc:
        if exc.errno in UNSUPPORTED_FSYNC_ERRNOS:
            return f"{type(exc).__name__}: {exc.strerror or exc}"
    finally:
        os.close(descriptor)
    return None
