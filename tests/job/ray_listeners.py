"""Every TCP port a job's Ray processes listen on, and what each answers a caller without the
job's token (and, as a control, with it).

Each port is named from the job's port plan (``kind_of_port``) and knocked on with one real,
read-only request of the service Ray runs there: a gRPC method sent as raw bytes (an empty
message is a valid request of any method), or an HTTP request. Ray's C++ servers check the
token before the method runs; its Python servers in an interceptor or middleware.
"""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping

import psutil

GRPC_METHODS = {
    "gcs": "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "raylet": "/ray.rpc.NodeManagerService/GetNodeStats",
    "object_manager": "/ray.rpc.ObjectManagerService/Pull",
    "dashboard_agent_grpc": "/ray.rpc.LogService/ListLogs",
    "client_server": "/ray.rpc.RayletDriver/ClusterInfo",
    "worker": "/ray.rpc.CoreWorkerService/NumPendingTasks",
}
HTTP_REQUESTS = {
    "runtime_env_agent": ("POST", "/get_or_create_runtime_env"),
    "dashboard_agent_http": ("GET", "/api/v0/logs"),
    "metrics": ("GET", "/"),  # Prometheus text: read-only, Ray serves it without a token
}
# Ray's head also serves its dashboard's and autoscaler's metrics on these fixed ports
# (DASHBOARD_METRIC_PORT, AUTOSCALER_METRIC_PORT in Ray 2.60), on all interfaces.
RAY_FIXED_METRICS_PORTS = (44227, 44217)
REFUSED = {"UNAUTHENTICATED", "401", "403"}


def job_processes(roots: Iterable[psutil.Process]) -> list[psutil.Process]:
    found = {}
    for root in roots:
        try:
            for process in [root, *root.children(recursive=True)]:
                found[process.pid] = process
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def listening_ports(processes: Iterable[psutil.Process]) -> dict[int, tuple[str, str]]:
    """``{port: (listen address, process name)}`` of the processes' listening TCP sockets.

    Read from ``/proc/<pid>/net/tcp{,6}``, which shows the process's own network namespace
    (psutil reads the caller's: it would miss the test cluster's nodes). A port bound on
    several addresses keeps a non-loopback one: the same server answers on each.
    """
    ports: dict[int, tuple[str, str]] = {}
    for process in processes:
        try:
            sockets = listening_tcp_sockets(process.pid)
            name = process.name()
        except (psutil.NoSuchProcess, FileNotFoundError, PermissionError):
            continue
        for ip, port in sockets:
            known = ports.get(port)
            if known is None or known[0].startswith("127."):
                ports[port] = (ip, name)
    return ports


def listening_tcp_sockets(pid: int) -> list[tuple[str, int]]:
    """``(address, port)`` of every TCP socket the process listens on, in its own namespace."""
    inodes = _socket_inodes(pid)
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    hex_ip, hex_port = fields[1].split(":")
                    found.append((_ip_from_proc(hex_ip, family), int(hex_port, 16)))
    return found


def listening_unix_sockets(pid: int) -> list[str]:
    """Paths of the unix sockets the process listens on (``@name``: abstract, no file)."""
    inodes = _socket_inodes(pid)
    found = []
    with open(f"/proc/{pid}/net/unix") as lines:
        next(lines)  # Num RefCount Protocol Flags Type St Inode Path
        for line in lines:
            fields = line.split()
            listening = int(fields[3], 16) & 0x10000  # __SO_ACCEPTCON
            if listening and fields[6] in inodes and len(fields) > 7:
                found.append(fields[7])
    return found


def _socket_inodes(pid: int) -> set[str]:
    fd_dir = f"/proc/{pid}/fd"
    inodes = set()
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _ip_from_proc(hex_ip: str, family: int) -> str:
    """``/proc/net/tcp*`` writes addresses as 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, words).removeprefix("::ffff:")  # IPv4 on an IPv6 socket


def reachable_ip(listen_ip: str, node_ip: str) -> str:
    """Where to knock: the listening address, or the node's own for an any-address socket."""
    return node_ip if listen_ip in ("0.0.0.0", "::") else listen_ip


PORT_KINDS = {
    "gcs_port": "gcs", "node_manager_port": "raylet", "object_manager_port": "object_manager",
    "runtime_env_agent_port": "runtime_env_agent", "metrics_export_port": "metrics",
    "dashboard_agent_grpc_port": "dashboard_agent_grpc",
    "dashboard_agent_listen_port": "dashboard_agent_http",
    "client_server_port": "client_server", "dashboard_port": "dashboard",
}  # fmt: skip


def port_kinds(named_ports: Mapping[str, int], min_worker_port: int, max_worker_port: int):
    """``{port: kind}`` of one node's Ray ports (``RayPortsCfg`` field names) and Ray's fixed
    metrics ports."""
    kinds = {port: PORT_KINDS[field] for field, port in named_ports.items() if field in PORT_KINDS}
    kinds |= dict.fromkeys(range(min_worker_port, max_worker_port + 1), "worker")
    return kinds | dict.fromkeys(RAY_FIXED_METRICS_PORTS, "metrics")


def knock_every_listener(
    listeners: Mapping[int, tuple[str, str]], kinds: Mapping[int, str], node_ip: str, token: str
) -> dict[str, tuple[str, str]]:
    """Knock on every listener without the token, then with it; ``{kind: (without, with)}``.

    Asserts that every listener is one of the job's planned ports, that each refuses the
    request without the token and passes the check with it (Ray's metrics exporters aside:
    read-only, served to anyone), so a refusal cannot come from a closed or wrong port or a
    request the service does not know.
    """
    unknown = [
        f"{ip}:{port} ({name})" for port, (ip, name) in listeners.items() if port not in kinds
    ]
    assert unknown == [], f"listeners outside the job's port plan: {unknown}"
    answers = {}
    for port, (ip, name) in sorted(listeners.items()):
        kind, host = kinds[port], reachable_ip(ip, node_ip)
        without, with_token = knock(host, port, kind), knock(host, port, kind, token)
        answers[kind] = (without, with_token)
        if kind == "metrics":
            assert (without, with_token) == ("200", "200"), (port, name, without, with_token)
            continue
        assert without in REFUSED, (port, kind, name, without)
        assert with_token not in REFUSED, (port, kind, name, with_token)
    return answers


def knock(ip: str, port: int, kind: str, token: str | None = None) -> str:
    """What the service answers one request: a gRPC status name or an HTTP status code."""
    if kind in GRPC_METHODS:
        return _knock_grpc(ip, port, GRPC_METHODS[kind], token)
    method, path = HTTP_REQUESTS[kind]
    request = urllib.request.Request(f"http://{ip}:{port}{path}", method=method, data=b"" if
                                     method == "POST" else None)  # fmt: skip
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(response.status)
    except urllib.error.HTTPError as error:
        return str(error.code)


def _knock_grpc(ip: str, port: int, method: str, token: str | None) -> str:
    import grpc

    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    with grpc.insecure_channel(f"{ip}:{port}") as channel:
        call = channel.unary_unary(method)  # no serializers: the request is raw bytes
        try:
            call(b"", timeout=10, metadata=metadata)
        except grpc.RpcError as error:
            return error.code().name
    return "OK"
