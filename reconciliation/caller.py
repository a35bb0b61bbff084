"""Who runs this operator command: a person or an agent of this profile
(docs/cli.md §Who may settle).  Writing commands refuse (``run_by_agent``)
from inside an agent, as ``/proc`` shows: an ancestor (for the dashboard, of
the requesting process) holding this profile's ``journal.sqlite3`` open, or
Hermes' markers in a start-time environment (:data:`TOOL_SUBPROCESS_MARKERS`,
:data:`HERMES_PROCESS_MARKERS`).  Operator events record :func:`os_identity`
(password database, never ``$USER``) and ``via`` (``cli``, ``dashboard``).
Reads ``/proc`` only; never raises for a vanished or unreadable process.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

try:
    import pwd
except ImportError:  # Windows: no password database
    pwd = None  # type: ignore[assignment]

PROC = "/proc"
# How an operator command was run (docs/format.md §Events, ``operator.via``).
VIA_CLI, VIA_DASHBOARD = "cli", "dashboard"
# Variables Hermes puts into the environment of its tools' subprocesses, and
# where (0.19.0, 0.20.1, 0.22.2; every child of such a process inherits them).
# Each maps to the value it must have (None: any value).
TOOL_SUBPROCESS_MARKERS: Mapping[str, Optional[str]] = {
    # execute_code's child: tools/code_execution_tool.py (child_env / env_map).
    "HERMES_RPC_TOKEN": None, "HERMES_RPC_SOCKET": None, "HERMES_RPC_DIR": None,
    "HERMES_KERNEL_SENTINEL": None,  # 0.22's code kernel
    # terminal and execute_code children: hermes_constants.apply_subprocess_home_env.
    "HERMES_REAL_HOME": None,
}
# Variables a Hermes process sets in its *own* environment, for every child
# (0.20+: ``_advertise_agent_env``), read only from a start-time environment,
# where a command's own Hermes process cannot have added them.
HERMES_PROCESS_MARKERS: Mapping[str, Optional[str]] = {
    "HERMES_AGENT": None, "AI_AGENT": "hermes-agent",
}
# More ancestors than any real process tree has (a loop guard).
MAX_ANCESTORS = 128


def os_identity(uid: Optional[int] = None) -> dict:
    """``{"uid", "user", "host"}`` of ``uid`` (default: this process's real
    uid): ``user`` is the name the password database gives it (None when it
    has none, e.g. a container's bare uid)."""
    if uid is None:
        uid = os.getuid() if hasattr(os, "getuid") else None
    return {"uid": uid, "user": user_name(uid), "host": socket.gethostname()}


def user_name(uid: Optional[int]) -> Optional[str]:
    """The password database's name of ``uid``, or None."""
    if uid is None or pwd is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


@dataclass(frozen=True)
class Evidence:
    """Why a process counts as inside an agent: ``pid``, its ``program``
    (the kernel's name for it), and ``why`` (a phrase)."""
    pid: int
    program: str
    why: str

    def to_json(self) -> dict:
        """``{"pid", "program", "why"}``."""
        return {"pid": self.pid, "program": self.program, "why": self.why}


@dataclass(frozen=True)
class Caller:
    """Who runs an operator command.  ``via``: ``cli`` or ``dashboard``;
    ``start_pid``: the first process examined with its parent chain (the CLI's
    parent, the dashboard request's peer), or None; ``environ``: the command's
    own start-time environment (None: read nothing); ``peer``: the dashboard
    request's ``{"pid", "uid", "user"}``; ``problem``: why the caller could
    not be identified (the command is then refused)."""
    via: str
    start_pid: Optional[int] = None
    environ: Optional[Mapping[str, str]] = None
    peer: Optional[dict] = None
    problem: Optional[str] = None

    def agent_evidence(self, data_dir: str) -> Optional[Evidence]:
        """The first sign that this caller is inside an agent of the profile
        whose data directory is ``data_dir``, or None."""
        if self.environ is not None:
            marker = _marker_in(self.environ, trusted_start=_proc_available())
            if marker is not None:
                return _marker_evidence(os.getpid(), marker)
        if self.start_pid is None:
            return None
        return agent_in_chain(self.start_pid, data_dir)

    def identity(self) -> dict:
        """What the journal event and operator.log record about who acted."""
        found = {**os_identity(), "via": self.via}
        if self.peer is not None:
            found["peer"] = self.peer
        return found


def this_process(via: str = VIA_CLI) -> Caller:
    """The caller of a command run in this process from a shell: examined
    from its parent up, with its own start-time environment."""
    return Caller(via=via, start_pid=os.getppid() if hasattr(os, "getppid") else None,
                  environ=_own_start_environment())


def agent_in_chain(pid: int, data_dir: str) -> Optional[Evidence]:
    """Walk from ``pid`` up its parent chain: the first process that has this
    profile's journal open or whose start-time environment carries a Hermes
    tool marker, as :class:`Evidence`; None when there is none (or no /proc)."""
    journal = _file_identity(os.path.join(data_dir, "journal.sqlite3"))
    for current in _chain(pid):
        if journal is not None and _has_open(current, journal):
            return Evidence(current, _program(current), "has this profile's journal open (a "
                            "worker running the guard)")
        environ = _start_environment(current)
        marker = _marker_in(environ, trusted_start=True) if environ is not None else None
        if marker is not None:
            return _marker_evidence(current, marker)
    return None


def _marker_evidence(pid: int, marker: str) -> Evidence:
    return Evidence(pid, _program(pid),
                    f"carries {marker}, which Hermes sets for its tools' subprocesses")


def _chain(pid: int) -> Iterator[int]:
    seen = set()
    while pid > 0 and pid not in seen and len(seen) < MAX_ANCESTORS:
        seen.add(pid)
        yield pid
        pid = _parent_of(pid)


def _parent_of(pid: int) -> int:
    """The parent pid from /proc/PID/stat (0 when gone or unknown)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as stream:
            text = stream.read().decode("utf-8", "replace")
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        return int(text[text.rindex(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _program(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/comm", "rb") as stream:
            return stream.read().decode("utf-8", "replace").strip() or "?"
    except OSError:
        return "?"


def _file_identity(path: str) -> Optional[tuple]:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)


def _descriptors(pid: int) -> Iterator[str]:
    """The /proc paths of process ``pid``'s descriptors; none for a process
    we may not inspect."""
    directory = f"{PROC}/{pid}/fd"
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        yield f"{directory}/{name}"


def _has_open(pid: int, identity: tuple) -> bool:
    """Whether process ``pid`` has a descriptor on the file ``identity``."""
    return any(_file_identity(path) == identity for path in _descriptors(pid))


def _proc_available() -> bool:
    return os.path.isdir(f"{PROC}/self/fd")


def _start_environment(pid: int) -> Optional[dict]:
    """The environment process ``pid`` was started with, or None."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as stream:
            raw = stream.read()
    except OSError:
        return None
    found = {}
    for entry in raw.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals:
            found[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return found


def _own_start_environment() -> Mapping[str, str]:
    """This process's environment as it was started (Hermes adds markers to
    its own os.environ later); without /proc, ``os.environ``, of which only
    the tool-subprocess markers are then read."""
    found = _start_environment(os.getpid()) if _proc_available() else None
    return found if found is not None else dict(os.environ)


def _marker_in(environ: Mapping[str, str], *, trusted_start: bool) -> Optional[str]:
    """The first Hermes marker in ``environ`` (``NAME`` or ``NAME=value``), or
    None.  ``trusted_start``: ``environ`` is a start-time environment, so the
    markers a Hermes process sets in its own environment count too."""
    markers = dict(TOOL_SUBPROCESS_MARKERS)
    if trusted_start:
        markers.update(HERMES_PROCESS_MARKERS)
    for name, value in markers.items():
        found = environ.get(name)
        if found is not None and (value is None or found == value):
            return name if value is None else f"{name}={value}"
    return None


def loopback(address: Optional[str]) -> bool:
    """Whether ``address`` is a loopback address (``127.0.0.0/8``, ``::1``,
    ``::ffff:127.x``)."""
    try:
        return _unmapped(ipaddress.ip_address(str(address))).is_loopback
    except ValueError:
        return False


def _unmapped(address: Any) -> Any:
    """An IPv4-mapped IPv6 address as IPv4, any other as it is."""
    return getattr(address, "ipv4_mapped", None) or address


def peer_caller(client: Optional[tuple], server: Optional[tuple]) -> Caller:
    """The caller of a dashboard request from the TCP connection's two ends
    (``(host, port)``).  A loopback peer is found in /proc/net/tcp{,6} (its
    socket's inode, then the process holding it) and examined like a shell
    command's parent chain; one that cannot be found, or unknown ends, is a
    ``problem`` (the request is refused).  A non-loopback peer is another
    machine: nothing here to examine."""
    if not _proc_available() or (client and not loopback(client[0])):
        return Caller(via=VIA_DASHBOARD)  # no /proc (not Linux), or another machine
    socket_entry = _socket_of(client, server) if client and server else None
    if socket_entry is None:
        return Caller(via=VIA_DASHBOARD, problem=(
            "the process that sent this request could not be found"))
    uid, inode = socket_entry
    pid = _process_holding(inode)
    peer = {"pid": pid, "uid": uid, "user": user_name(uid)}
    if pid is None and uid == (os.getuid() if hasattr(os, "getuid") else None):
        # Our own user's process, hidden from us: it cannot be examined.
        return Caller(via=VIA_DASHBOARD, peer=peer, problem=(
            "the process that sent this request could not be examined"))
    return Caller(via=VIA_DASHBOARD, start_pid=pid, peer=peer,
                  environ={} if pid is None else None)


def _socket_of(client: tuple, server: tuple) -> Optional[tuple]:
    """``(uid, inode)`` of the socket whose local end is ``client`` and remote
    end ``server`` (the request's peer side), from /proc/net/tcp and tcp6."""
    wanted = (_endpoint(client), _endpoint(server))
    if None in wanted:
        return None
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{PROC}/net/{table}", encoding="ascii", errors="replace") as stream:
                lines = stream.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            if (_parse_endpoint(fields[1]), _parse_endpoint(fields[2])) == wanted:
                try:
                    return int(fields[7]), int(fields[9])
                except ValueError:
                    return None
    return None


def _endpoint(address: tuple) -> Optional[tuple]:
    """``(ip address, port)`` normalised (an IPv4-mapped IPv6 address as IPv4)."""
    try:
        return (_unmapped(ipaddress.ip_address(str(address[0]))), int(address[1]))
    except (ValueError, TypeError, IndexError):
        return None


def _parse_endpoint(text: str) -> Optional[tuple]:
    """A /proc/net/tcp{,6} ``ADDRESS:PORT`` (the address in the kernel's
    native byte order, 32-bit words) as :func:`_endpoint` gives it."""
    try:
        address, port = text.split(":")
        raw = bytes.fromhex(address)
        words = b"".join(raw[index:index + 4][::-1] if socket.htonl(1) != 1 else
                         raw[index:index + 4] for index in range(0, len(raw), 4))
        return (_unmapped(ipaddress.ip_address(words)), int(port, 16))
    except (ValueError, TypeError):
        return None


def _process_holding(inode: int) -> Optional[int]:
    """The pid of a process (of those we may inspect) with a descriptor on
    socket ``inode``, or None."""
    target = f"socket:[{inode}]"
    try:
        pids = [name for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        for path in _descriptors(pid):
            try:
                if os.readlink(path) == target:
                    return int(pid)
            except OSError:
                continue
    return None
