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
