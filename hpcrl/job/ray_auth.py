"""Who can reach the job's Ray: its token (which file, how Ray finds it) and its private folder.

With ``ray_auth: token`` (the default) every Ray process of the job runs with
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH=<run_dir>/auth/ray_token``: each node's
``ray start`` (its GCS, raylet, dashboard agent, runtime-env agent and worker processes inherit
the variables) and node 0's driver process (its GCS node-table reader and ``ray.init``). Ray then
refuses every gRPC call and HTTP request without the token on all of them. Only the path
travels in environments; the token stays in the file (mode 0600 in a 0700 folder), which is why
``RAY_AUTH_TOKEN`` (a value Ray prefers over the file) is removed from what Ray inherits.

The token file is normally written with the run folder (``hpcrl.run.ray_token``); node 0
creates it when there is none (a node entrypoint run directly), before its Ray starts, and the
other nodes read it only after node 0 announced its head. With ``ray_auth: none`` the mode is set
to ``disabled`` explicitly: Ray 2.60 otherwise turns token auth on whenever a user's
``~/.ray/auth_token`` exists, which the job's nodes and driver do not share.

Ray's unix sockets (raylet, object store) take no token: they sit in a folder only the job's
user can enter (``make_private_ray_dir``).
"""

from __future__ import annotations

import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from hpcrl.job.errors import BootstrapError
from hpcrl.job.settings import NodeSettings
from hpcrl.run.jobspec import RAY_AUTH_VARIABLES, token_path
from hpcrl.run.ray_token import (
    TokenFileError,
    ensure_token_file,
    make_private_dir,
    private_path_problem,
    token_file_problem,
)


class RayTokenUnusable(BootstrapError):
    """The job's token file is missing, not private, or cannot be created."""


class RayDirUnusable(BootstrapError):
    """The folder for this node's Ray files is not this user's alone."""


def job_token_path(settings: NodeSettings) -> str | None:
    """The token file every Ray process of the job reads (None: authentication is off)."""
    return token_path(str(settings.run_dir)) if settings.ray_auth == "token" else None


def prepare_job_token(settings: NodeSettings) -> None:
    """Node 0: create the token file unless the run folder has one. Every node: check that it
    is private and well formed before this node's Ray reads it."""
    path = job_token_path(settings)
    if path is None:
        return
    try:
        if settings.is_head:
            ensure_token_file(path)
            return
        problem = token_file_problem(path)
    except (TokenFileError, OSError) as error:
        problem = str(error)
    if problem is not None:
        raise RayTokenUnusable(
            f"node {settings.task.node_name} cannot use the job's Ray token: {problem}"
        )


def apply_ray_auth(env: Mapping[str, str], settings: NodeSettings) -> dict[str, str]:
    """``env`` with Ray's authentication variables as this job's ``ray_auth`` says, and no
    inherited ones (a submitting shell's ``RAY_AUTH_TOKEN`` would replace the job's token)."""
    result = {name: value for name, value in env.items() if name not in RAY_AUTH_VARIABLES}
    path = job_token_path(settings)
    if path is None:
        result["RAY_AUTH_MODE"] = "disabled"
    else:
        result |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}
    return result


def make_private_ray_dir(settings: NodeSettings) -> None:
    """An empty ``ray_private_dir`` that only this user can enter, for Ray's temp dir.

    Ray makes every folder it creates writable by everyone (0777), the one holding its raylet
    and object-store unix sockets included: another user of the node could replace a socket.
    Its name is predictable, so a folder someone else made there is refused, not used.
    """
    path = settings.ray_private_dir
    shutil.rmtree(path, ignore_errors=True)  # an earlier crash's (someone else's stays)
    make_private_dir(Path(path))
    problem = private_path_problem(Path(path), stat.S_ISDIR, "this node's Ray sockets and logs")
    if problem is not None:
        raise RayDirUnusable(
            f"node {settings.task.node_name} cannot keep Ray's files private: {problem}; remove "
            "it, or set HPCRL_RAY_TEMP_ROOT in the job's environment to a folder of your own"
        )
