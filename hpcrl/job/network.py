"""TCP readiness checks: is a port free here, does a remote port accept connections yet.

Readiness is always polled with short intervals against a deadline, never assumed after a
fixed sleep: on a busy node the head may take 2 s or 20 s to come up.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable

CONNECT_TIMEOUT_S = 1.0


def port_accepts(ip: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """True when something listens on ip:port and accepts a TCP connection."""
    try:
        with socket.create_connection((ip, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def port_is_free(ip: str, port: int) -> bool:
    """True when a listening socket could bind ip:port now.

    SO_REUSEADDR makes a port whose old connections linger in TIME_WAIT (a Ray that just
    stopped) count as free, like Ray's own servers see it; a live listener still blocks it.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((ip, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def first_busy_port(ip: str, ports: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """The first ``(name, port)`` that is already bound on ip, or None when all are free."""
    for name, port in ports:
        if not port_is_free(ip, port):
            return name, port
    return None


UNKNOWN_HOLDER = "unknown (not visible to this user)"
HOLDER_COMMAND_MAX_CHARS = 160


def port_holder(ip: str, port: int) -> str:
    """Who holds TCP ``ip:port``: ``pid N (name): command line`` (truncated), or why not known.

    Only asked once a port was found busy (it lists the node's sockets and maps them to
    processes through /proc): a busy port otherwise gives no clue which process to look for
    (CI, 2026-12-05: port 10001 busy at a job's start, holder never found). Another user's
    sockets are listed without their process.
    """
    import psutil  # the job's dependency; imported here, the free-port path never needs it

    try:
        sockets = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # where listing needs root (macOS)
        return UNKNOWN_HOLDER
    holders = [
        found for found in sockets
        if found.laddr and found.laddr.port == port and found.laddr.ip in (ip, "0.0.0.0", "::")
    ]  # fmt: skip
    # A listener is the one that blocks a bind; connections of other sockets only share it.
    holders.sort(key=lambda found: found.status != psutil.CONN_LISTEN)
    pids = [found.pid for found in holders if found.pid is not None]
    if not pids:
        return UNKNOWN_HOLDER if holders else "unknown (no socket on it was listed a moment later)"
    return _describe_process(pids[0])


def _describe_process(pid: int) -> str:
    import psutil

    try:
        process = psutil.Process(pid)
        name = process.name()
        # One line (it goes into the attempt's one-line cause): newlines of a `-c` script too.
        command = " ".join(" ".join(process.cmdline()).split())
    except psutil.NoSuchProcess:
        return f"pid {pid} (exited since)"
    except psutil.AccessDenied:
        return f"pid {pid} ({UNKNOWN_HOLDER})"
    if len(command) > HOLDER_COMMAND_MAX_CHARS:
        command = command[: HOLDER_COMMAND_MAX_CHARS - 3] + "..."
    return f"pid {pid} ({name}): {command}"
