"""Whether this platform can give the journal's guarantees (README
§Supported platforms, docs/guard.md §Platforms).

The guarantees need three things of the operating system and the file system
under the data directory:

* ``fcntl`` (``flock``): the owner lock that tells a running call from a dead
  one and keeps two workers from running protected calls at once (absent on
  native Windows);
* ``fsync`` of a directory: a created or renamed file (``head.json``, the
  journal) survives a power loss (refused on some platforms and file systems);
* a local file system: SQLite's WAL mode and POSIX locks are not reliable over
  a network file system (NFS, SMB/CIFS, sshfs, ...).  Detected on Linux from
  ``/proc/mounts``; elsewhere it cannot be detected, nor where that table lists
  no mount holding the data directory (inside a chroot whose root is not a
  mount point the kernel leaves out every mount outside it): the check then
  passes, as on macOS, rather than refuse every protected call in every such
  chroot.

:func:`platform_problem` names the first that is missing, with what to do.
Where one is missing the plugin still loads: protected calls are refused
(``platform_unsupported``) and ``status`` says why; unprotected tools run.
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
    """Why the journal's guarantees cannot hold for ``data_dir`` here (with
    what to do), or None.  Never raises; checks the directory itself or, before
    it exists, its nearest existing parent."""
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
    """The type of the file system ``path`` is on, from the Linux mount table
    (the mount point that is the longest prefix of its real path); None where
    there is no mount table or it cannot be read."""
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


# What fsync of a directory answers where the platform or file system does not
# support it; any other error (EIO, ENOSPC, ...) is a storage failure, reported
# as storage_unavailable when the journal writes, never as a platform verdict.
UNSUPPORTED_FSYNC_ERRNOS = frozenset(
    code for code in (getattr(errno, name, None) for name in ("EINVAL", "ENOTSUP", "EOPNOTSUPP"))
    if code is not None)


def _directory_fsync_error(directory: str) -> Optional[str]:
    """None when ``directory`` can be fsynced (or fails for a reason that is
    not the platform's: reported when the journal opens or writes), else the
    error that says the platform cannot."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None  # permissions or storage: reported as such when the journal opens
    try:
        os.fsync(descriptor)
    except OSError as exc:
        if exc.errno in UNSUPPORTED_FSYNC_ERRNOS:
            return f"{type(exc).__name__}: {exc.strerror or exc}"
        return None
    finally:
        os.close(descriptor)
    return None
